"""`analyze` end to end: what it is pointed at (flows/inputs.analysis_inputs: trace files, run folders,
profile windows, a sweep's runs, stored summaries) -> each profile's summary (analysis/summarize.py,
under the catalog chosen once before), and the files asked for: summary.json (--json FILE, DIR/ or
'-'), the per-GPU-op timeline (--timeline), the parquet tables (--tables); or, with --list-markers,
the spans that could mark iterations.

Nothing here prints: notes and warnings go to `note` and `warn` as they come, each file's "wrote"
line to `wrote` once it is written, summary.json for stdout to `stdout`. What is left to print, the
profiles' tables and the catalog's line, is returned (Analysis) for the command line to render
after every file is written (a reader that stops early, `| head`, must not cost a file)."""

from __future__ import annotations

import io
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Optional

from profkit.errors import OutputError, UsageError
from profkit.flows.outputs import is_json_dir, summary_in

Say = Callable[[str], Any]
Doc = Mapping[str, Any]  # a summary.json as analysis/summarize.py builds it (read here, never changed)
Markers = list[tuple[Path, list[dict[str, object]]]]  # per trace file: analysis/iterations.list_markers' rows


def _quiet(_: str) -> None:
    pass


@dataclass
class Analysis:
    """What `analyze` leaves to print. `how`: "one" (one run: its table), "several" (the runs one input
    held, each under a rule), "each" (several things pointed at: profile windows, a sweep's runs,
    stored summaries, each under its name), "markers" (--list-markers: `markers` only)."""

    how: str
    profiles: list[tuple[str, Doc]] = field(default_factory=list)  # (label, summary), in order
    catalog_line: str = ""  # which catalog classified the kernels, and how it was chosen
    markers: Markers = field(default_factory=list)
    several_runs: str = ""  # "several": the line naming the runs one input held


def analyze(paths: list[Path], *, window: Optional[int] = None, marker: Optional[str] = None, min_bubble_us: float = 2.0,
            catalog: Optional[str] = None, json_out: Optional[str] = None, timeline: Optional[Path] = None, tables: Optional[Path] = None,
            cache: bool = True, jobs: Optional[int] = None, captures: Optional[list[Path]] = None, peaks: Optional[Path] = None,
            list_markers: bool = False, note: Say = _quiet, wrote: Say = _quiet, stdout: Say = _quiet,
            before_runs: Say = _quiet) -> Analysis:
    """`profkit analyze` (see the module doc). `before_runs` gets the line naming the runs one input held
    (inputs of several unrelated runs), before any of them is written."""
    from profkit.ingest import early

    try:
        return _analyze(paths, window=window, marker=marker, min_bubble_us=min_bubble_us, catalog=catalog, json_out=json_out,
                        timeline=timeline, tables=tables, cache=cache, jobs=jobs, captures=captures, peaks=peaks,
                        list_markers=list_markers, note=note, wrote=wrote, stdout=stdout, before_runs=before_runs)
    finally:
        early.drop_ahead()  # a decode the CLI began ahead (flows/ahead.py) that nothing took stops here


def _analyze(paths: list[Path], *, window: Optional[int], marker: Optional[str], min_bubble_us: float, catalog: Optional[str],
             json_out: Optional[str], timeline: Optional[Path], tables: Optional[Path], cache: bool, jobs: Optional[int],
             captures: Optional[list[Path]], peaks: Optional[Path], list_markers: bool, note: Say, wrote: Say, stdout: Say,
             before_runs: Say) -> Analysis:
    from profkit.analysis.catalog import choose_catalog
    from profkit.analysis.summarize import SummarizeOptions, summarize_runs
    from profkit.flows.inputs import analysis_inputs

    pointed, notes = analysis_inputs(paths, window)
    for n in notes:
        note(n)
    if len(pointed) == 1 and pointed[0].traces:
        paths = pointed[0].traces
    elif list_markers:
        paths = [p for x in pointed for p in x.traces]
    if list_markers:
        return Analysis("markers", markers=markers_of(paths))
    if timeline is not None and timeline.suffix not in (".parquet", ".csv"):
        raise UsageError(f"--timeline {timeline}: use a .parquet or .csv file name", hint="e.g. --timeline timeline.parquet")
    choice = choose_catalog(catalog, paths)
    opts = SummarizeOptions(marker=marker, min_bubble_us=min_bubble_us, catalog=choice, captures=tuple(captures) if captures else None,
                            cache=cache, jobs=jobs, frames=timeline is not None or tables is not None, peaks=peaks)
    if len(pointed) > 1 or not pointed[0].traces:
        done = _analyze_each(pointed, opts, json_out=json_out, timeline=timeline, tables=tables, wrote=wrote)
        return Analysis("each", [(label, s) for label, s, _ in done], catalog_line([s for _, s, _ in done], choice.note()))
    # several runs in one folder: each analyzed on its own (refused first where one file must hold them)
    runs = summarize_runs(paths, opts, check=lambda rs: _check_several_runs(rs, json_out, timeline) if len(rs) > 1 else None)
    if len(runs) > 1:
        from profkit.ingest.runs import several_runs_message

        before_runs(several_runs_message([r.run for r in runs], "these inputs", verb="hold"))
        if json_out:  # a folder (checked): one summary.json per run, named by the run
            for r in runs:
                _write_json(summary_in(json_out, r.label), _json_text(r.summary), wrote)
        if tables is not None:
            _write_tables([a for r in runs for a in r.analyses or []], tables, wrote)
        return Analysis("several", [(r.label, r.summary) for r in runs], catalog_line([r.summary for r in runs], choice.note()))
    run = runs[0]
    summary, analyses = run.summary, run.analyses or []
    if json_out:
        text = run.text or _json_text(summary)  # a cached summary: its stored text, not encoded again
        if json_out == "-":
            stdout(text)
        else:
            dest = Path(json_out)
            if is_json_dir(json_out):  # --json DIR/: DIR/<run>.summary.json, as for several runs
                dest = summary_in(dest, run.label)
            _write_json(dest, text, wrote)
    if tables is not None:
        _write_tables(analyses, tables, wrote)
    if timeline is not None:
        _write_timeline(analyses, timeline, wrote)
    return Analysis("one", [(run.label, summary)], catalog_line([summary], choice.note()))


def catalog_line(summaries: list[Doc], note: Optional[str]) -> str:
    """The catalog's line: how it was chosen (CatalogChoice.note), else the ones the ranks picked by their kernel names."""
    from profkit.analysis.catalog import picked_note

    picked = sorted({str(r.get("catalog")) for s in summaries for r in s.get("ranks") or []})
    return note or picked_note(picked)


def markers_of(paths: list[Path]) -> Markers:
    """`analyze --list-markers`: per file, the spans that could mark iterations, with counts."""
    from profkit.analysis.iterations import list_markers
    from profkit.ingest import load_traces

    return [(t.path, list_markers(t)) for t in load_traces(paths)]


def _json_text(summary: Doc) -> str:
    from profkit.store import json_text

    return json_text(summary)


def _write_json(dest: Path, text: str, wrote: Say) -> None:
    from profkit.store import write_bytes_atomic

    write_bytes_atomic(dest, text.encode())
    wrote(str(dest))


def _write_tables(analyses: list[Any], tables: Path, wrote: Say) -> None:
    from profkit.export.tables import write_tables

    try:
        written = write_tables(analyses, tables)
    except OSError as e:
        raise OutputError(f"--tables {tables}: cannot write ({e.strerror or e})", hint="pick a writable folder") from None
    wrote(f"{tables} ({len(written)} parquet files)")


def _write_timeline(analyses: list[Any], timeline: Path, wrote: Say) -> None:
    from profkit.analysis.summary import timeline_frame
    from profkit.store import write_bytes_atomic

    frame = timeline_frame(analyses)
    buf = io.BytesIO()
    if timeline.suffix == ".parquet":
        frame.write_parquet(buf)
    else:
        frame.write_csv(buf)
    write_bytes_atomic(timeline, buf.getvalue())
    wrote(f"{timeline} ({frame.height} GPU ops)")


def _check_several_runs(runs: list[Any], json_out: Optional[str], timeline: Optional[Path]) -> None:
    """Inputs that hold several runs: one summary.json cannot hold them (schema v2 is one run), so
    --json FILE and --timeline are refused with the runs named; --json DIR/ writes one per run."""
    from profkit.ingest.runs import several_runs_message

    if json_out and not is_json_dir(json_out):
        raise UsageError(several_runs_message(runs, "these inputs", verb="hold") + f"; --json {json_out} would hold one run",
                         hint="pass one run's files per command (e.g. `profkit analyze "
                              + " ".join(str(f) for f in runs[0].files) + " --json a.json`), or --json DIR/ for one summary per run")
    if timeline is not None:
        raise UsageError(several_runs_message(runs, "these inputs", verb="hold") + f"; --timeline {timeline} holds one run",
                         hint="pass one run's files per command")


def _analyze_each(pointed: list[Any], opts: Any, *, json_out: Optional[str], timeline: Optional[Path], tables: Optional[Path],
                  wrote: Say) -> list[tuple[str, Doc, list[Any]]]:
    """Several things pointed at (profile windows, a sweep's runs, stored summaries): each summarized
    on its own; --json DIR/ writes one summary per thing."""
    from profkit.analysis.summarize import summarize_runs
    from profkit.flows.inputs import check_summary, read_json

    what = ", ".join(x.label or "the trace files" for x in pointed[:4]) + (f" and {len(pointed) - 4} more" if len(pointed) > 4 else "")
    if len(pointed) > 1:
        if json_out and not is_json_dir(json_out):
            raise UsageError(f"these inputs hold {len(pointed)} profiles ({what}); --json {json_out} would hold one",
                             hint="pick one with --window i, or pass --json DIR/ for one summary per profile")
        if timeline is not None:
            raise UsageError(f"these inputs hold {len(pointed)} profiles ({what}); --timeline {timeline} holds one", hint="pick one with --window i")
    done: list[tuple[str, Doc, list[Any]]] = []
    for x in pointed:
        if x.summary is not None:
            done.append((f"{x.label} (stored summary {x.summary})", check_summary(read_json(x.summary), x.summary), []))
            continue
        runs = summarize_runs(x.traces, opts)
        for r in runs:
            done.append((" · ".join(filter(None, (x.label, r.label if len(runs) > 1 or not x.label else ""))), r.summary, r.analyses or []))
    if json_out:
        for label, summary, _ in done:
            p = summary_in(json_out, label.split(' (stored')[0]) if is_json_dir(json_out) else Path(json_out)
            _write_json(p, _json_text(summary), wrote)
    if tables is not None:
        _write_tables([a for _, _, an in done for a in an], tables, wrote)
    return done
