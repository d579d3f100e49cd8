"""`analyze`: parses its options, calls flows/analyze.py (trace files or run folders -> summary.json, the
optional per-GPU-op timeline, parquet tables or the list of candidate markers) and prints each profile's
terminal table (report/terminal.py) once every file is written."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.markup import escape

from profkit.cli.common import _state, check_strict, command, err, out
from profkit.flows.analyze import Doc, Markers
from profkit.cli.options import Captures, JsonOut, CatalogOpt, Marker, MinBubble, PeaksOpt, Strict, Top, Window


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

    from profkit.flows.analyze import analyze as analyze_flow

    _state["quick_exit"] = True  # see common._quick_exit
    to_stdout = json_out == "-"
    done = analyze_flow(paths, window=window, marker=marker, min_bubble_us=min_bubble_us, catalog=catalog, json_out=json_out,
                        timeline=timeline, tables=tables, cache=not no_cache, jobs=jobs, captures=capture, peaks=peaks,
                        list_markers=list_markers, note=lambda n: err.print(f"[dim]note: {escape(n)}[/]", soft_wrap=True),
                        wrote=lambda w: err.print(f"wrote {escape(w)}", soft_wrap=True), stdout=sys.stdout.write,
                        before_runs=lambda w: err.print(f"[yellow]warning:[/] {escape(w)}; each is analyzed on its own", soft_wrap=True))
    if done.how == "markers":
        _list_markers(done.markers)
        return
    # printed last: every file is written before a reader that stops early (`| head`) can cut the output
    from profkit.report import Report
    from profkit.report.terminal import TerminalRenderer

    if done.how == "one":
        TerminalRenderer(err if to_stdout else out, top=top, warn=err).show(Report(runs=[("", done.profiles[0][1])]))
    elif done.how == "several":
        for k, (label, summary) in enumerate(done.profiles):
            out.rule(f"run {k + 1} of {len(done.profiles)}: {escape(label)}", align="left")
            TerminalRenderer(out, top=top, warn=err).show(Report(runs=[(label, summary)]))
    else:
        _print_each(done.profiles, top)
    err.print(f"[dim]{escape(done.catalog_line)}[/]", soft_wrap=True)
    check_strict(strict, [(label, summary.get("health")) for label, summary in done.profiles])


def _print_each(done: list[tuple[str, Doc]], top: int) -> None:
    """Several things pointed at (profile windows, a sweep's runs, stored summaries): each printed on
    its own, under a rule naming it."""
    from profkit.documents import summary_of
    from profkit.report import Report
    from profkit.report.terminal import TerminalRenderer, summary_warnings

    # a warning every profile says (a CPU-only trace, in each window of a run) is printed once, before them all
    said: list[str] = []
    if len(done) > 1:
        each = [summary_warnings(summary_of(s)) for _, s in done]
        said = [w for w in dict.fromkeys(each[0]) if all(w in ws for ws in each[1:])]
        for w in said:
            err.print(f"[yellow]warning:[/] {escape(w)} (all {len(done)} profiles)")
    for k, (label, summary) in enumerate(done):
        if len(done) > 1:
            out.print(f"[bold]── {k + 1} of {len(done)}: {escape(label)}[/]", soft_wrap=True)
        TerminalRenderer(out, top=top, warn=err, said=said).show(Report(runs=[(label, summary)]))


def _list_markers(found_by_file: Markers) -> None:
    """`analyze --list-markers`: per file, the spans that could mark iterations, with counts."""
    from profkit.report.fit import COPY, NUM, TEXT, fit_table

    for path, found in found_by_file:
        out.print(f"[bold]{escape(str(path))}[/]: spans that could mark iterations (numbers shown as N)", soft_wrap=True)
        if not found:
            out.print("  none: no user annotation or engine step span; the whole trace is one window")
            continue
        out.print(fit_table(out, None, (("count", NUM), ("span", COPY), ("--marker", COPY), ("", TEXT)),
                            [(f"{m['count']:,}", m["name"], m["regex"], "default" if m["default"] else "") for m in found]))
