"""`analyze`: trace files or run folders -> summary.json and a terminal table (profkit.analysis.summarize),
plus the optional per-GPU-op timeline, parquet tables and the list of candidate markers."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.markup import escape

from profkit.cli.common import _state, check_strict, command, err, out, safe_name
from profkit.cli.options import Captures, JsonOut, CatalogOpt, Marker, MinBubble, PeaksOpt, Strict, Top, Window
from profkit.errors import OutputError, UsageError


@command()
def analyze(
    paths: Annotated[list[Path], typer.Argument(readable=False, help="Trace files (*.trace.json.gz, *.pt.trace.json) or run folders; one file per rank, or a file that holds several (SGLang's merged trace, a TraceLens fusion).")],
    marker: Marker = None,
    min_bubble_us: MinBubble = 2.0,
    catalog: CatalogOpt = None,
    json_out: JsonOut = None,
    timeline: Annotated[Optional[Path], typer.Option("--timeline", help="Write the per-iteration kernel timeline (.parquet or .csv).")] = None,
    top: Top = 10,
    no_cache: Annotated[bool, typer.Option("--no-cache", help="Neither read nor write the parquet cache beside each trace (<trace>.profkit-cache/).")] = False,
    jobs: Annotated[Optional[int], typer.Option("--jobs", "-j", min=1, help="Worker processes: rank files in parallel, or one large file's chunks (default: min(cores, files)).")] = None,
    capture: Captures = None,
    tables: Annotated[Optional[Path], typer.Option("--tables", help="Write every iteration, GPU op, bubble, sync and launch as parquet under DIR (DIR/<table>/run=<run>/rank=<rank>/, hive layout: DuckDB and Spark read it as it is).")] = None,
    list_markers: Annotated[bool, typer.Option("--list-markers", help="List the CPU spans that could mark iterations (user annotations, engine step spans), with counts and the --marker regex for each; analyze nothing.")] = False,
    window: Window = None,
    strict: Strict = False,
    peaks: PeaksOpt = None,
) -> None:
    """Analyze traces: per-iteration wall, GPU busy/idle, bubbles by cause, syncs, launches, time by category.

    Example:

        profkit analyze traces/sample/eager_sync.pt.trace.json.gz --json summary.json
    """

    from profkit.analysis.catalog import choose_catalog
    from profkit.analysis.summarize import SummarizeOptions, summarize_runs

    _state["quick_exit"] = True  # see common._quick_exit

    from profkit.flows.inputs import analysis_inputs

    pointed, notes = analysis_inputs(paths, window)
    for n in notes:
        err.print(f"[dim]note: {escape(n)}[/]", soft_wrap=True)
    if len(pointed) == 1 and pointed[0].traces:
        paths = pointed[0].traces
    elif list_markers:
        paths = [p for x in pointed for p in x.traces]
    if list_markers:
        _list_markers(paths)
        return
    if timeline is not None and timeline.suffix not in (".parquet", ".csv"):
        raise UsageError(f"--timeline {timeline}: use a .parquet or .csv file name", hint="e.g. --timeline timeline.parquet")
    choice = choose_catalog(catalog, paths)
    opts = SummarizeOptions(marker=marker, min_bubble_us=min_bubble_us, catalog=choice, captures=tuple(capture) if capture else None,
                            cache=not no_cache, jobs=jobs, frames=timeline is not None or tables is not None, peaks=peaks)
    if len(pointed) > 1 or not pointed[0].traces:
        done = _analyze_each(pointed, opts, json_out=json_out, timeline=timeline, tables=tables, top=top, catalog_note=choice.note())
        check_strict(strict, [(label, summary.get("health")) for label, summary in done])
        return
    # several runs in one folder: each analyzed on its own (refused first where one file must hold them)
    runs = summarize_runs(paths, opts, check=lambda rs: _check_several_runs(rs, json_out, timeline) if len(rs) > 1 else None)
    if len(runs) > 1:
        _analyze_several(runs, json_out=json_out, tables=tables, top=top, catalog_note=choice.note())
        check_strict(strict, [(r.label, r.summary.get("health")) for r in runs])
        return
    run = runs[0]
    summary, analyses = run.summary, run.analyses or []
    to_stdout = json_out == "-"
    if json_out:
        from profkit.store import json_text, write_bytes_atomic

        text = run.text or json_text(summary)  # a cached summary: its stored text, not encoded again
        if to_stdout:
            sys.stdout.write(text)
        else:
            dest = Path(json_out)
            if _json_dir(json_out):  # --json DIR/: DIR/<run>.summary.json, as for several runs
                dest = dest / f"{safe_name(run.label)}.summary.json"
            write_bytes_atomic(dest, text.encode())
            err.print(f"wrote {escape(str(dest))}", soft_wrap=True)
    if tables is not None:
        _write_tables(analyses, tables)
    if timeline is not None:
        import io

        from profkit.analysis.summary import timeline_frame
        from profkit.store import write_bytes_atomic

        frame = timeline_frame(analyses)
        buf = io.BytesIO()
        if timeline.suffix == ".parquet":
            frame.write_parquet(buf)
        else:
            frame.write_csv(buf)
        write_bytes_atomic(timeline, buf.getvalue())
        err.print(f"wrote {escape(str(timeline))} ({frame.height} GPU ops)", soft_wrap=True)
    # printed last: every file is written before a reader that stops early (`| head`) can cut the output
    from profkit.report import Report
    from profkit.report.terminal import TerminalRenderer

    TerminalRenderer(err if to_stdout else out, top=top, warn=err).show(Report(runs=[("", summary)]))
    _print_catalog([summary], choice.note())
    check_strict(strict, [(run.label, summary.get("health"))])


def _print_catalog(summaries: list[dict[str, Any]], note: Optional[str]) -> None:
    from profkit.analysis.catalog import picked_note

    picked = sorted({str(r.get("catalog")) for s in summaries for r in s.get("ranks") or []})
    err.print(f"[dim]{escape(note or picked_note(picked))}[/]", soft_wrap=True)


def _write_tables(analyses: list[Any], tables: Path) -> None:
    from profkit.export.tables import write_tables

    try:
        written = write_tables(analyses, tables)
    except OSError as e:
        raise OutputError(f"--tables {tables}: cannot write ({e.strerror or e})", hint="pick a writable folder") from None
    err.print(f"wrote {escape(str(tables))} ({len(written)} parquet files)", soft_wrap=True)


def _check_several_runs(runs: list[Any], json_out: Optional[str], timeline: Optional[Path]) -> None:
    """Inputs that hold several runs: one summary.json cannot hold them (schema v2 is one run), so
    --json FILE and --timeline are refused with the runs named; --json DIR/ writes one per run."""
    from profkit.ingest.runs import several_runs_message

    if json_out and not _json_dir(json_out):
        raise UsageError(several_runs_message(runs, "these inputs", verb="hold") + f"; --json {json_out} would hold one run",
                         hint="pass one run's files per command (e.g. `profkit analyze "
                              + " ".join(str(f) for f in runs[0].files) + " --json a.json`), or --json DIR/ for one summary per run")
    if timeline is not None:
        raise UsageError(several_runs_message(runs, "these inputs", verb="hold") + f"; --timeline {timeline} holds one run",
                         hint="pass one run's files per command")


def _json_dir(json_out: str) -> bool:
    return json_out != "-" and (json_out.endswith(("/", "\\")) or Path(json_out).is_dir())


def _analyze_several(runs: list[Any], *, json_out: Optional[str], tables: Optional[Path], top: int, catalog_note: Optional[str]) -> None:
    """Print (and write) each run on its own: its summary, cross-rank figures across its ranks only."""
    from profkit.ingest.runs import several_runs_message
    from profkit.report import Report
    from profkit.report.terminal import TerminalRenderer
    from profkit.store import json_text, write_bytes_atomic

    err.print(f"[yellow]warning:[/] {escape(several_runs_message([r.run for r in runs], 'these inputs', verb='hold'))}; each is analyzed on its own",
              soft_wrap=True)
    if json_out:  # a folder (checked): one summary.json per run, named by the run
        for r in runs:
            p = Path(json_out) / f"{safe_name(r.label)}.summary.json"
            write_bytes_atomic(p, json_text(r.summary).encode())
            err.print(f"wrote {escape(str(p))}", soft_wrap=True)
    if tables is not None:
        _write_tables([a for r in runs for a in r.analyses or []], tables)
    for k, r in enumerate(runs):
        out.rule(f"run {k + 1} of {len(runs)}: {escape(r.label)}", align="left")
        TerminalRenderer(out, top=top, warn=err).show(Report(runs=[(r.label, r.summary)]))
    _print_catalog([r.summary for r in runs], catalog_note)


def _analyze_each(pointed: list[Any], opts: Any, *, json_out: Optional[str], timeline: Optional[Path], tables: Optional[Path], top: int,
                  catalog_note: Optional[str]) -> list[tuple[str, Any]]:
    """Several things pointed at (profile windows, a sweep's runs, stored summaries): each printed on
    its own, under a rule naming it; --json DIR/ writes one summary per thing."""
    from profkit.flows.inputs import check_summary, read_json
    from profkit.report import Report
    from profkit.report.terminal import TerminalRenderer
    from profkit.store import json_text, write_bytes_atomic
    from profkit.analysis.summarize import summarize_runs

    what = ", ".join(x.label or "the trace files" for x in pointed[:4]) + (f" and {len(pointed) - 4} more" if len(pointed) > 4 else "")
    if len(pointed) > 1:
        if json_out and not _json_dir(json_out):
            raise UsageError(f"these inputs hold {len(pointed)} profiles ({what}); --json {json_out} would hold one",
                             hint="pick one with --window i, or pass --json DIR/ for one summary per profile")
        if timeline is not None:
            raise UsageError(f"these inputs hold {len(pointed)} profiles ({what}); --timeline {timeline} holds one", hint="pick one with --window i")
    done: list[tuple[str, dict[str, Any], list[Any]]] = []
    for x in pointed:
        if x.summary is not None:
            done.append((f"{x.label} (stored summary {x.summary})", check_summary(read_json(x.summary), x.summary), []))
            continue
        runs = summarize_runs(x.traces, opts)
        for r in runs:
            done.append((" · ".join(filter(None, (x.label, r.label if len(runs) > 1 or not x.label else ""))), r.summary, r.analyses or []))
    if json_out:
        for label, summary, _ in done:
            p = Path(json_out) / f"{safe_name(label.split(' (stored')[0])}.summary.json" if _json_dir(json_out) else Path(json_out)
            write_bytes_atomic(p, json_text(summary).encode())
            err.print(f"wrote {escape(str(p))}", soft_wrap=True)
    if tables is not None:
        _write_tables([a for _, _, an in done for a in an], tables)
    # a warning every profile says (a CPU-only trace, in each window of a run) is printed once, before them all
    from profkit.documents import summary_of
    from profkit.report.terminal import summary_warnings

    said: list[str] = []
    if len(done) > 1:
        each = [summary_warnings(summary_of(s)) for _, s, _ in done]
        said = [w for w in dict.fromkeys(each[0]) if all(w in ws for ws in each[1:])]
        for w in said:
            err.print(f"[yellow]warning:[/] {escape(w)} (all {len(done)} profiles)")
    for k, (label, summary, _) in enumerate(done):
        if len(done) > 1:
            out.print(f"[bold]── {k + 1} of {len(done)}: {escape(label)}[/]", soft_wrap=True)
        TerminalRenderer(out, top=top, warn=err, said=said).show(Report(runs=[(label, summary)]))
    _print_catalog([s for _, s, _ in done], catalog_note)
    return [(label, summary) for label, summary, _ in done]


def _list_markers(paths: list[Path]) -> None:
    """`analyze --list-markers`: per file, the spans that could mark iterations, with counts."""
    from profkit.analysis.iterations import list_markers
    from profkit.ingest import load_traces
    from profkit.report.fit import COPY, NUM, TEXT, fit_table

    for t in load_traces(paths):
        found = list_markers(t)
        out.print(f"[bold]{escape(str(t.path))}[/]: spans that could mark iterations (numbers shown as N)", soft_wrap=True)
        if not found:
            out.print("  none: no user annotation or engine step span; the whole trace is one window")
            continue
        out.print(fit_table(out, None, (("count", NUM), ("span", COPY), ("--marker", COPY), ("", TEXT)),
                            [(f"{m['count']:,}", m["name"], m["regex"], "default" if m["default"] else "") for m in found]))
