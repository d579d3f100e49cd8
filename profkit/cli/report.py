"""The `diff`, `report` and `export-perfetto` commands.

Thin: each picks the catalog (catalog.choose_catalog), resolves its inputs (profkit.flows.inputs: traces
and run folders through profkit.analysis.summarize, with the summary cache), calls the library
(attribution, report, export) and writes atomically (profkit.store). Status lines go to stderr;
`--json -` puts diff.json on stdout.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.markup import escape

from profkit.cli.common import check_strict, command, err, out, safe_name
from profkit.cli.options import OUTPUT, Captures, JsonOut, Cdn, CatalogOpt, Marker, MinBubble, Strict, Top, Window
from profkit.errors import TraceInputError, UsageError


def _announce(choice: Any) -> None:
    """Say so when the catalog was guessed from the run manifest."""
    note = choice.note()
    if note:
        err.print(f"[dim]{escape(note)}[/]")


def _write_text(path: Path, text: str, *, announce: bool = True) -> None:
    from profkit.store import write_bytes_atomic

    write_bytes_atomic(path, text.encode("utf-8"))
    if announce:
        err.print(f"wrote {escape(str(path))}")


@command()
def diff(
    before: Annotated[Path, typer.Argument(readable=False, help="Baseline: a summary.json, a trace file, or a run folder (its window-*/ or repeat-*/ subfolders: profile windows, for noise).")],
    after: Annotated[Path, typer.Argument(readable=False, help="Candidate: same kinds as BEFORE.")],
    opt: Annotated[Optional[str], typer.Option("--opt", help="The optimization the candidate adds (default: from the run manifests) for the expected-effect check; its categories come from --catalog.")] = None,
    catalog: CatalogOpt = None,
    md: Annotated[Optional[Path], typer.Option("--md", help="Write a GitHub Markdown PR comment to FILE.")] = None,
    html: Annotated[Optional[Path], typer.Option("--html", help="Write a self-contained HTML report to FILE.")] = None,
    json_out: JsonOut = None,
    marker: Marker = None,
    min_bubble_us: MinBubble = 2.0,
    rank: Annotated[Optional[int], typer.Option("--rank", help="Which rank to compare (default 0; two single-rank sides are compared whatever their ranks).")] = None,
    allow_shape_mismatch: Annotated[bool, typer.Option("--allow-shape-mismatch", help="Compare sides that share no iteration shape (kind, batch size), mixing shapes; refused without it.")] = False,
    cdn: Cdn = False,
    top: Top = 10,
    capture: Captures = None,
    strict: Strict = False,
) -> None:
    """Attribute the change between two runs: per-category time, overlap and idle by bubble cause
    (exact, mean per iteration), launches and syncs per iteration, kernels added and removed, and
    the expected-effect check for --opt.

    Example:

        profkit diff reports/RUN_A reports/RUN_B --opt topk_v2 --html diff.html
    """
    from profkit.attribution.diff import compare_summaries
    from profkit.analysis.catalog import choose_catalog
    from profkit.flows.inputs import align_single_ranks, infer_optimization, load_pair
    from profkit.report import Report, get_renderer
    from profkit.report.terminal import TerminalRenderer
    from profkit.analysis.summarize import SummarizeOptions

    choice = choose_catalog(catalog, (before, after))
    _announce(choice)
    opts = SummarizeOptions(marker=marker, min_bubble_us=min_bubble_us, catalog=choice, captures=tuple(capture) if capture else None)
    b, c, choice, warnings = load_pair(before, after, opts)
    for w in warnings:
        err.print(f"[yellow]warning:[/] {escape(w)}", soft_wrap=True)
    lb, lc = (b.label, c.label) if b.label != c.label else (f"{b.label} (before)", f"{c.label} (after)")
    from profkit.attribution.diff import run_manifest

    opt_name = opt or infer_optimization(run_manifest(b.summary), run_manifest(c.summary))  # load_side put each side's manifest in its summary
    rank, notes = align_single_ranks(b, c, rank)
    d = compare_summaries(
        b.summary, c.summary, opt=opt_name, catalog=choice.for_effect(c.summary, rank) if opt_name else None,
        baseline_repeats=b.repeats, candidate_repeats=c.repeats, rank=rank, labels=(lb, lc),
    )
    if d["shape"].get("kind") is None:
        have = "; ".join(f"{side}: {', '.join(d[side].get('shapes') or {}) or 'none'}" for side in ("baseline", "candidate"))
        if not allow_shape_mismatch:
            raise UsageError(f"the two sides share no iteration shape ({have}): comparing them would mix shapes",
                             hint="compare runs of the same shape, or pass --allow-shape-mismatch to compare all iterations anyway")
        notes.append(f"the two sides share no iteration shape ({have}); comparing all iterations (--allow-shape-mismatch)")
    d.setdefault("warnings", [])
    d["warnings"][:0] = [n for n in notes if n not in d["warnings"]]
    for n in notes:  # before every table: the reader must know what is compared
        err.print(f"[yellow]warning:[/] {escape(n)}", soft_wrap=True)
    to_stdout = json_out == "-"
    result = Report(diffs=[d])
    # the files first: a reader that stops early (`| head -3`) must not cost them
    wrote: list[str] = []
    if json_out and not to_stdout:
        _write_text(Path(json_out), get_renderer("json")().render(result), announce=False)
        wrote.append(json_out)
    if md is not None:
        _write_text(md, get_renderer("markdown")().render(result), announce=False)
        wrote.append(str(md))
    if html is not None:
        _write_text(html, get_renderer("html")(cdn=cdn).render(result), announce=False)
        wrote.append(str(html))
    TerminalRenderer(err if to_stdout else out, top=top).show(result)
    if to_stdout:
        sys.stdout.write(get_renderer("json")().render(result))  # the same text `--json FILE` writes
    for w in wrote:
        err.print(f"wrote {escape(w)}")
    h = d.get("health") or {}
    check_strict(strict, [(lb, h.get("baseline")), (lc, h.get("candidate"))])


@command()
def report(
    paths: Annotated[list[Path], typer.Argument(readable=False, help="Run folders, summary.json files, trace files, diff.json files, attribution or sweep folders; several runs make a sweep (ladder).")],
    output: Annotated[Optional[Path], OUTPUT.option("The HTML file to write (default: under reports/).")] = None,
    cdn: Cdn = False,
    marker: Marker = None,
    min_bubble_us: MinBubble = 2.0,
    catalog: CatalogOpt = None,
    window: Window = None,
) -> None:
    """Write one self-contained HTML report: headline numbers, a representative iteration's timeline,
    time by category, bubbles by cause, launches and syncs per iteration, top kernels, manifests;
    for a diff the decomposition waterfall; for several runs the ladder.

    Example:

        profkit report traces/base traces/topk -o reports/sweep.html
    """
    from profkit.analysis.catalog import choose_catalog
    from profkit.flows.inputs import is_diff_doc, load_side, read_json
    from profkit.attribution import ladder_steps
    from profkit.report import Report
    from profkit.report.html import HtmlRenderer
    from profkit.analysis.summarize import SummarizeOptions

    choice = choose_catalog(catalog, paths)
    _announce(choice)
    opts = SummarizeOptions(marker=marker, min_bubble_us=min_bubble_us, catalog=choice)
    diffs: list[dict[str, Any]] = []
    runs: list[tuple[str, dict[str, Any]]] = []
    def read_diff(p: Path) -> dict[str, Any]:
        doc = read_json(p)
        if doc.get("schema_version") != 1:
            raise TraceInputError(f"{p}: diff.json schema version {doc.get('schema_version')!r}; this profkit reads 1", hint="re-run profkit diff")
        return doc

    expanded: list[Path] = []
    named: dict[Path, str] = {}  # a sweep's runs keep the sweep's labels (baseline, +topk_v2, ...)
    for p in paths:
        if p.is_dir() and (p / "sweep.json").is_file():  # a sweep's folder: its runs, then its compared pairs
            doc = read_json(p / "sweep.json")
            for r in doc.get("runs") or []:
                expanded.append(Path(r["summary"]).parent)
                named[expanded[-1]] = str(r.get("label"))
            diffs += [read_diff(Path(a["diff"])) for a in doc.get("attribution") or [] if Path(a["diff"]).is_file()]
        elif p.is_dir() and (p / "diff.json").is_file():  # an attribution folder (trace's, or one pair of a sweep)
            diffs.append(read_diff(p / "diff.json"))
        else:
            expanded.append(p)
    for p in expanded:
        label = named.get(p)
        if window is not None and p.is_dir():
            from profkit.flows.inputs import profile_windows_of

            wins = profile_windows_of(p)
            hit = [w for w in wins if w.name.split("-")[1] == str(window)]
            if not hit:
                raise TraceInputError(f"{p}: no profile window {window} (it has {', '.join(w.name + '/' for w in wins) or 'none'})",
                                      hint="pick one of those with --window, or leave --window out")
            p = hit[0]
        if p.is_file() and p.suffix == ".json" and not p.name.endswith(".trace.json"):
            doc = read_json(p)
            if is_diff_doc(doc):
                if doc.get("schema_version") != 1:
                    raise TraceInputError(f"{p}: diff.json schema version {doc.get('schema_version')!r}; this profkit reads 1", hint="re-run profkit diff")
                diffs.append(doc)
                continue
        side = load_side(p, opts)
        if side.repeats:
            err.print(f"[dim]{escape(str(p))}: {len(side.repeats)} profile windows; this report shows the first (--window i for another; "
                      f"diff uses every window for noise)[/]", soft_wrap=True)
        runs.append((label or side.label, side.summary))
    labels = [label for label, _ in runs]
    if len(set(labels)) != len(labels):
        runs = [(f"{label} #{i + 1}", s) for i, (label, s) in enumerate(runs)]
    if output is None:
        if diffs and not runs and len(diffs) == 1:
            name = f"diff__{safe_name(diffs[0]['baseline']['label'])}__{safe_name(diffs[0]['candidate']['label'])}.html"
            output = Path("reports") / name
        elif len(runs) == 1 and not diffs:
            output = Path("reports") / safe_name(runs[0][0]) / "report.html"
        else:
            output = Path("reports") / "report.html"
    _write_text(output, HtmlRenderer(cdn=cdn).render(Report(diffs=diffs, runs=runs, ladder=ladder_steps(runs))))


@command("export-perfetto")
def export_perfetto(
    trace: Annotated[Path, typer.Argument(readable=False, help="A trace file, or a run folder of trace files (one per rank; profile windows: one file each).")],
    output: Annotated[Optional[Path], OUTPUT.option("The .perfetto-trace file to write (default: beside the trace; several windows: one file each, the window in the name).")] = None,
    marker: Marker = None,
    min_bubble_us: MinBubble = 2.0,
    catalog: CatalogOpt = None,
    window: Window = None,
) -> None:
    """Write the trace plus profkit's findings (iterations, GPU windows, bubbles with cause, syncs
    with trigger) as a Perfetto protobuf trace; open it at ui.perfetto.dev.

    Example:

        profkit export-perfetto traces/sample/eager_sync.pt.trace.json.gz
    """
    from profkit.analysis import analyze_trace
    from profkit.ingest.identity import short_label
    from profkit.analysis.catalog import choose_catalog
    from profkit.export.perfetto import build_perfetto
    from profkit.ingest import load_traces
    from profkit.store import write_bytes_atomic

    from profkit.flows.inputs import analysis_inputs

    pointed, notes = analysis_inputs([trace], window)
    for n in notes:
        err.print(f"[dim]note: {escape(n)}[/]", soft_wrap=True)
    stored = [x for x in pointed if x.summary is not None]
    if stored:
        raise TraceInputError(f"{stored[0].summary}: a stored summary, no trace events to export",
                              hint="point export-perfetto at the run's traces (traces/<run_id>/, or one of its window-<i>/ folders)")
    choice = choose_catalog(catalog, [trace])
    _announce(choice)
    for x in pointed:
        traces = load_traces(x.traces)
        pairs = [(t, analyze_trace(t, marker=marker, min_bubble_us=min_bubble_us, catalog=choice.catalog, digest=False)) for t in traces]
        data = build_perfetto(pairs)
        src = x.traces[0]
        if output is None:
            dest = (src if src.is_dir() else src.parent) / f"{short_label(trace.name)}.perfetto-trace"
        else:
            dest = output if len(pointed) == 1 else output.with_name(f"{output.name.split('.')[0]}.{safe_name(src.name)}{''.join(output.suffixes) or '.perfetto-trace'}")
        write_bytes_atomic(dest, data)
        err.print(f"wrote {escape(str(dest))} ({len(data):,} bytes, {len(traces)} rank(s)); open it at https://ui.perfetto.dev", soft_wrap=True)
