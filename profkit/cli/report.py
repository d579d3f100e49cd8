"""The `diff`, `report` and `export-perfetto` commands.

Thin: each picks the catalog (flows/options.summarize_options) and says how, calls its flow (flows/diff.py:
the two sides and diff.json; flows/report.py: the diffs and runs of one report; flows/export.py: the
Perfetto files), renders (report/) and writes what it rendered (flows/outputs.py: default names, atomic
writes). Status lines go to stderr; `--json -` puts diff.json on stdout.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.markup import escape

from profkit.cli.common import check_strict, command, err, out
from profkit.cli.options import MD, OUTPUT, WINDOW, Captures, JsonOut, Cdn, CatalogOpt, Marker, MinBubble, PeaksOpt, Strict, Top, Window
from profkit.errors import TraceInputError, UsageError


def _announce(choice: Any) -> None:
    """Say so when the catalog was guessed from the run manifest."""
    note = choice.note()
    if note:
        err.print(f"[dim]{escape(note)}[/]")


def _write_text(path: Path, text: str, *, announce: bool = True) -> None:
    from profkit.flows.outputs import write_text

    write_text(path, text)
    if announce:
        err.print(f"wrote {escape(str(path))}", soft_wrap=True)


@command()
def diff(
    before: Annotated[Path, typer.Argument(readable=False, help="Baseline: a summary.json, a trace file, or a run folder (its window-*/ or repeat-*/ subfolders: profile windows, for noise).")],
    after: Annotated[Path, typer.Argument(readable=False, help="Candidate: same kinds as BEFORE.")],
    opt: Annotated[Optional[str], typer.Option("--opt", help="The optimization the candidate adds (default: from the run manifests) for the expected-effect check; its categories come from --catalog.")] = None,
    catalog: CatalogOpt = None,
    md: Annotated[Optional[Path], MD.option()] = None,
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
    peaks: PeaksOpt = None,
) -> None:
    """Attribute the change between two runs: per-category time, overlap and idle by bubble cause
    (exact, mean per iteration), launches and syncs per iteration, kernels added and removed, and
    the expected-effect check for --opt.

    Example:

        profkit diff reports/RUN_A reports/RUN_B --opt topk_v2 --html diff.html
    """
    from profkit.flows.diff import diff_paths
    from profkit.flows.options import summarize_options
    from profkit.report import Report, get_renderer
    from profkit.report.terminal import TerminalRenderer

    opts, choice = summarize_options(catalog, (before, after), marker=marker, min_bubble_us=min_bubble_us,
                                     captures=tuple(capture) if capture else None, peaks=peaks)
    _announce(choice)
    d, notes, (lb, lc) = diff_paths(before, after, opts, opt=opt, rank=rank, allow_shape_mismatch=allow_shape_mismatch,
                                    warn=lambda w: err.print(f"[yellow]warning:[/] {escape(w)}", soft_wrap=True))
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
        err.print(f"wrote {escape(w)}", soft_wrap=True)
    check_strict(strict, [(lb, d.health.baseline), (lc, d.health.candidate)])


_MD_ONE = "--md writes the comment of one sweep folder or of one diff"
_MD_HINT = "point report at a sweep's folder (the one with sweep.json), or at one diff.json or attribution folder"
REPORT_WINDOW_HELP = ("Of a run folder of profile windows (window-<i>/): report window i only (default: each run's own "
                      "sections show the first window; a sweep's ladder uses every window, as a diff does).")


@command()
def report(
    paths: Annotated[list[Path], typer.Argument(readable=False, help="Run folders, summary.json files, trace files, diff.json files, attribution or sweep folders; several runs make a sweep (ladder).")],
    output: Annotated[Optional[Path], OUTPUT.option("The HTML file to write (default: under reports/).")] = None,
    cdn: Cdn = False,
    marker: Marker = None,
    min_bubble_us: MinBubble = 2.0,
    catalog: CatalogOpt = None,
    window: Annotated[Optional[int], WINDOW.option(REPORT_WINDOW_HELP)] = None,
    md: Annotated[Optional[Path], MD.option("Also write a GitHub Markdown PR comment to FILE: of a sweep folder (its ladder or "
                                            "leave-one-out table first, each step's own term) or of one diff.")] = None,
    peaks: PeaksOpt = None,
) -> None:
    """Write one self-contained HTML report: headline numbers, a representative iteration's timeline,
    time by category, bubbles by cause, launches and syncs per iteration, top kernels, manifests;
    for a diff the decomposition waterfall; for several runs the ladder. --md: a sweep folder's (or one
    diff's) PR comment too.

    Example:

        profkit report traces/base traces/topk -o reports/sweep.html
    """
    from profkit.flows.options import summarize_options
    from profkit.flows.outputs import report_html
    from profkit.flows.report import gather, is_sweep, ladder_steps, read_sweep
    from profkit.documents import sweep_values
    from profkit.report import Report
    from profkit.report.html import HtmlRenderer

    sweep: Any = None
    if md is not None:  # refused before anything is read or written
        if len(paths) == 1 and is_sweep(paths[0]):
            sweep, steps = read_sweep(paths[0])
            missing = [str(row.diff) for row, d in steps if d is None]
            if missing or not steps:
                raise TraceInputError(f"{paths[0]}: " + (f"no diff.json at {missing[0]}" if missing else "sweep.json has no compared steps")
                                      + " (a sweep interrupted, or --capture-only)",
                                      hint="compare its runs with profkit diff RUN_A RUN_B --md FILE, or re-run the sweep")
            if window is not None:
                raise UsageError("--md with --window: a sweep's comment shows each step's diff, the median over every profile window",
                                 hint="leave --window out for --md (the HTML report takes --window on its own)")
        elif len(paths) != 1 or paths[0].is_dir() and not (paths[0] / "diff.json").is_file():
            raise UsageError(_MD_ONE, hint=_MD_HINT)
    opts, choice = summarize_options(catalog, paths, marker=marker, min_bubble_us=min_bubble_us, peaks=peaks)
    _announce(choice)
    diffs, runs, windows = gather(paths, opts, window, note=lambda n: err.print(f"[dim]{escape(n)}[/]", soft_wrap=True))
    if output is None:
        output = report_html(diffs, runs)
    if md is not None and sweep is None and not (len(diffs) == 1 and not runs):
        raise UsageError(_MD_ONE + f"; these inputs hold {len(runs)} run(s) and {len(diffs)} diff(s)", hint=_MD_HINT)
    ladder = ladder_steps(runs, windows=windows)
    _write_text(output, HtmlRenderer(cdn=cdn).render(Report(diffs=diffs, runs=runs, ladder=ladder)))
    if md is not None:
        if sweep is not None:
            from profkit.report.markdown_sweep import SweepMarkdownRenderer

            text = SweepMarkdownRenderer().render(Report(diffs=diffs, runs=runs, ladder=ladder, sweep=sweep_values(sweep)))
        else:
            from profkit.report.markdown import MarkdownRenderer

            text = MarkdownRenderer().render(Report(diffs=diffs))
        _write_text(md, text)


@command("export-perfetto")
def export_perfetto(
    trace: Annotated[Path, typer.Argument(readable=False, help="A trace file, or a run folder of trace files (one per rank; profile windows: one file each).")],
    output: Annotated[Optional[Path], OUTPUT.option("The file to write: gzip-compressed when its name ends in .gz, as the default does (default: "
                                                                   "<trace>.perfetto-trace.gz beside the trace; several windows: one file each, the window in the name).")] = None,
    marker: Marker = None,
    min_bubble_us: MinBubble = 2.0,
    catalog: CatalogOpt = None,
    window: Window = None,
) -> None:
    """Write the trace plus profkit's findings (iterations, GPU windows, bubbles with cause, syncs
    with trigger) as a Perfetto protobuf trace, gzip-compressed (.perfetto-trace.gz; -o NAME without
    .gz writes it plain); open it at ui.perfetto.dev, which reads both.

    Example:

        profkit export-perfetto traces/sample/eager_sync.pt.trace.json.gz
    """
    from profkit.flows.export import export_perfetto as export_flow

    export_flow(trace, output, marker=marker, min_bubble_us=min_bubble_us, catalog=catalog, window=window,
                note=lambda n: err.print(f"[dim]note: {escape(n)}[/]", soft_wrap=True),
                catalog_note=lambda n: err.print(f"[dim]{escape(n)}[/]"),
                wrote=lambda w: err.print(f"wrote {escape(w)}", soft_wrap=True))
