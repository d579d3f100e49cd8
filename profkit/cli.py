"""The command line's entry point and `analyze`: thin Typer commands over the library. What every
command shares (the app, the consoles, the error-to-exit-code mapping) is in cli_common.py; the
other commands register themselves from cli_capture.py and cli_report.py (imported at the end)."""

from __future__ import annotations

import json
import sys
import traceback
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.markup import escape

from profkit import __version__
from profkit.cli_common import _state, app, err, out, user_errors  # noqa: F401  (out: the tests set its width)
from profkit.errors import EXIT_BUG, EXIT_INTERRUPTED, OutputError, ProfkitError, UsageError


@app.command()
def analyze(
    paths: Annotated[list[Path], typer.Argument(readable=False, help="Trace files (*.trace.json.gz, *.pt.trace.json) or run folders; one file per rank.")],
    marker: Annotated[Optional[str], typer.Option("--marker", help="Regex for the CPU span that opens one iteration (default: scheduler.run_batch, step[...], execute_..., ProfilerStep#N).")] = None,
    min_bubble_us: Annotated[float, typer.Option("--min-bubble-us", min=0.0, help="Shortest GPU idle gap counted as a bubble.")] = 2.0,
    catalog: Annotated[Optional[str], typer.Option("--catalog", help="Kernel catalog: a name in kernels/ (generic, sglang-glm52, proxy) or a .toml path; default: picked from the kernel names.")] = None,
    json_out: Annotated[Optional[str], typer.Option("--json", help="Write summary.json (schema v2) to FILE, or '-' for stdout.")] = None,
    timeline: Annotated[Optional[Path], typer.Option("--timeline", help="Write the per-iteration kernel timeline (.parquet or .csv).")] = None,
    top: Annotated[int, typer.Option("--top", help="How many kernels to list.")] = 10,
    no_cache: Annotated[bool, typer.Option("--no-cache", help="Neither read nor write the parquet cache beside each trace (<trace>.profkit-cache/).")] = False,
    jobs: Annotated[Optional[int], typer.Option("--jobs", "-j", min=1, help="Worker processes: rank files in parallel, or one large file's chunks (default: min(cores, files)).")] = None,
    capture: Annotated[Optional[list[Path]], typer.Option("--capture", help="Graph-capture profile(s) (SGLang's or the proxy's graph_capture_profile/*.json.gz): replayed kernels categorized as in eager mode (default: the run folder's).")] = None,
    tables: Annotated[Optional[Path], typer.Option("--tables", help="Write every iteration, GPU op, bubble, sync and launch as parquet under DIR (DIR/<table>/run=<run>/rank=<rank>/, hive layout: DuckDB and Spark read it as it is).")] = None,
    list_markers: Annotated[bool, typer.Option("--list-markers", help="List the CPU spans that could mark iterations (user annotations, engine step spans), with counts and the --marker regex for each; analyze nothing.")] = False,
) -> None:
    """Analyze traces: per-iteration wall, GPU busy/idle, bubbles by cause, syncs, launches, time by category.

    Example:

        profkit analyze traces/sample/eager_sync.pt.trace.json.gz --json summary.json
    """
    import os
    import time

    from profkit.report import Report
    from profkit.report.terminal import TerminalRenderer
    from profkit.store import write_bytes_atomic

    _state["quick_exit"] = True  # see _quick_exit

    with user_errors():
        if list_markers:
            _list_markers(paths)
            return
        if timeline is not None and timeline.suffix not in (".parquet", ".csv"):
            raise UsageError(f"--timeline {timeline}: use a .parquet or .csv file name", hint="e.g. --timeline timeline.parquet")
        t_start = time.perf_counter()
        from profkit.ingest import expand_inputs
        from profkit.ingest.runs import plan_runs

        plan = plan_runs(expand_inputs(paths))  # several runs in one folder: each analyzed on its own
        if len(plan) > 1:
            _check_several_runs(plan, json_out, timeline)
        catalog_note = None
        if catalog is None:
            from profkit.cli_report import manifest_catalog_name

            catalog = manifest_catalog_name(paths)
            catalog_note = f"catalog {catalog}: from the run manifest's target (--catalog to choose another)" if catalog else None
        summary, skey, files = None, None, []
        from profkit.ingest.identity import cache_disabled_by_env

        cache_on = not no_cache and not cache_disabled_by_env()
        from profkit.analysis.graphs import find_capture_files

        captures = list(capture or []) or find_capture_files(paths)
        if cache_on and timeline is None and tables is None and not captures and len(plan) == 1:  # the stored summary knows no capture profiles
            # a repeated run on unchanged traces: the stored summary, without importing polars
            from profkit.summary_cache import read_summary, summary_key

            files = list(plan[0].files)
            skey = summary_key([i.file or i.path for i in plan[0].infos], marker=marker, min_bubble_us=min_bubble_us, catalog=catalog)
            summary = read_summary(files[0], skey) if skey else None
        if summary is not None:
            if os.environ.get("PROFKIT_TIMINGS"):
                _write_timings(os.environ["PROFKIT_TIMINGS"], [], t_start, time.perf_counter(), time.perf_counter())
        else:
            early = _decode_early(plan, cache_on, jobs)
            from profkit.analysis.parallel import analyze_runs
            from profkit.analysis.summary import build_summary
            from profkit.catalog import load_catalog

            try:
                cat = load_catalog(catalog) if catalog else None
                if early is None:
                    _numpy_without_blas_threads()
                runs = analyze_runs(paths, marker=marker, min_bubble_us=min_bubble_us, catalog=cat, cache=False if no_cache else None, jobs=jobs,
                                    captures=captures or None, runs=plan, early=early)
            finally:
                if early is not None:
                    early.stop()  # not taken (a cache answered, or an error came first): it stops
            if len(runs) > 1:
                _check_several_runs(runs, json_out, timeline)
                _analyze_several(runs, marker=marker, json_out=json_out, tables=tables, top=top, catalog_note=catalog_note)
                return
            analyses = runs[0].analyses
            t_analyzed = time.perf_counter()
            summary = build_summary(analyses, marker=marker)
            if os.environ.get("PROFKIT_TIMINGS"):  # for benchmarks/bench_ingest.py
                _write_timings(os.environ["PROFKIT_TIMINGS"], analyses, t_start, t_analyzed, time.perf_counter())
            if len(analyses) > 1:
                from profkit.analysis.ranks import cross_rank

                summary["cross_rank"] = cross_rank(analyses)
            if skey:
                from profkit.summary_cache import write_summary

                write_summary(files[0], skey, summary)
        to_stdout = json_out == "-"
        if json_out:
            from profkit.store import json_text
            from profkit.summary_cache import stored_text

            text = stored_text(summary) or json_text(summary)  # a cached summary: its stored text, not encoded again
            if to_stdout:
                sys.stdout.write(text)
            else:
                dest = Path(json_out)
                if _json_dir(json_out):  # --json DIR/: DIR/<run>.summary.json, as for several runs
                    from profkit.cli_report import _safe

                    dest = dest / f"{_safe(plan[0].label)}.summary.json"
                write_bytes_atomic(dest, text.encode())
                err.print(f"wrote {escape(str(dest))}")
        if tables is not None:
            from profkit.export.tables import write_tables

            try:
                written = write_tables(analyses, tables)
            except OSError as e:
                raise OutputError(f"--tables {tables}: cannot write ({e.strerror or e})", hint="pick a writable folder") from None
            err.print(f"wrote {escape(str(tables))} ({len(written)} parquet files)")
        if timeline is not None:
            from profkit.analysis.summary import timeline_frame

            frame = timeline_frame(analyses)
            import io

            buf = io.BytesIO()
            if timeline.suffix == ".parquet":
                frame.write_parquet(buf)
            else:
                frame.write_csv(buf)
            write_bytes_atomic(timeline, buf.getvalue())
            err.print(f"wrote {escape(str(timeline))} ({frame.height} GPU ops)")
        # printed last: every file is written before a reader that stops early (`| head`) can cut the output
        TerminalRenderer(err if to_stdout else out, top=top).show(Report(runs=[("", summary)]))
        picked = sorted({str(r.get("catalog")) for r in summary.get("ranks") or []})
        err.print(f"[dim]{escape(catalog_note or 'catalog ' + ', '.join(picked) + ': picked from the kernel names (--catalog NAME to choose)')}[/]",
                  soft_wrap=True)


def _check_several_runs(runs: list, json_out: Optional[str], timeline: Optional[Path]) -> None:
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


def _analyze_several(runs: list, *, marker: Optional[str], json_out: Optional[str], tables: Optional[Path], top: int,
                     catalog_note: Optional[str]) -> None:
    """Print (and write) each run on its own: its summary, cross-rank figures across its ranks only."""
    from profkit.analysis.summary import build_summary
    from profkit.ingest.runs import several_runs_message
    from profkit.report import Report
    from profkit.report.terminal import TerminalRenderer
    from profkit.store import json_text, write_bytes_atomic

    err.print(f"[yellow]warning:[/] {escape(several_runs_message(runs, 'these inputs', verb='hold'))}; each is analyzed on its own", soft_wrap=True)
    summaries = []
    for r in runs:
        s = build_summary(r.analyses, marker=marker)
        if len(r.analyses) > 1:
            from profkit.analysis.ranks import cross_rank

            s["cross_rank"] = cross_rank(r.analyses)
        summaries.append(s)
    if json_out:  # a folder (checked): one summary.json per run, named by the run
        from profkit.cli_report import _safe

        for r, s in zip(runs, summaries):
            p = Path(json_out) / f"{_safe(r.label)}.summary.json"
            write_bytes_atomic(p, json_text(s).encode())
            err.print(f"wrote {escape(str(p))}")
    if tables is not None:
        from profkit.export.tables import write_tables

        try:
            written = write_tables([a for r in runs for a in r.analyses], tables)
        except OSError as e:
            raise OutputError(f"--tables {tables}: cannot write ({e.strerror or e})", hint="pick a writable folder") from None
        err.print(f"wrote {escape(str(tables))} ({len(written)} parquet files)")
    for k, (r, s) in enumerate(zip(runs, summaries)):
        out.rule(f"run {k + 1} of {len(runs)}: {escape(r.label)}", align="left")
        TerminalRenderer(out, top=top).show(Report(runs=[(r.label, s)]))
    picked = sorted({str(x.get("catalog")) for s in summaries for x in s.get("ranks") or []})
    err.print(f"[dim]{escape(catalog_note or 'catalog ' + ', '.join(picked) + ': picked from the kernel names (--catalog NAME to choose)')}[/]",
              soft_wrap=True)


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


def _quick_exit(code: object) -> None:
    """Leave without tearing down the interpreter's objects: freeing the tables of a gigabyte trace
    one by one takes a third of a second. Everything a normal exit does for the outside world still
    happens first: output flushed, pending cache writes and other threads joined, atexit handlers run."""
    import atexit
    import os
    import threading

    if code is None:
        status = 0
    elif isinstance(code, int):
        status = code
    else:
        print(code, file=sys.stderr)
        status = 1
    cache = sys.modules.get("profkit.ingest.cache")
    if cache is not None:
        cache.wait_pending()
    me = threading.current_thread()
    for t in threading.enumerate():
        if t is not me and not t.daemon:
            t.join()
    atexit._run_exitfuncs()
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
    os._exit(status)


def _write_timings(path: str, analyses: list, t_start: float, t_analyzed: float, t_summary: float) -> None:
    """Where `analyze`'s time went (load = ingest, including the cache; analysis), as JSON."""
    load = sum(getattr(a, "_load_s", 0.0) for a in analyses)
    data = {"ingest_and_analysis_s": t_analyzed - t_start, "summary_s": t_summary - t_analyzed,
            "load_s": load or None, "analysis_s": (t_analyzed - t_start - load) if load else None}
    try:
        Path(path).write_text(json.dumps(data))
    except OSError:
        pass


def _decode_early(plan: list, cache_on: bool, jobs: int | None) -> Any:
    """One large trace to decode (not cached yet): start decoding it now, in threads, while polars
    and the analysis are imported (about half a second on two cores). The handle
    (ingest/early.py's EarlyDecode) goes to analyze_runs, whose loader takes it; None when nothing
    started."""
    from profkit.ingest import PARALLEL_MIN_BYTES, early
    from profkit.ingest.identity import CACHE_SUFFIX
    from profkit.ingest.reading import default_jobs

    infos = [i for r in plan for i in r.infos]
    if len(infos) != 1 or infos[0].file is None or infos[0].file.estimated_json_bytes < PARALLEL_MIN_BYTES:
        return None
    f = infos[0].file
    if cache_on and f.path.with_name(f.path.name + CACHE_SUFFIX).exists():
        return None  # likely read from the cache: nothing to decode
    return early.start(f, jobs=default_jobs(1) if jobs is None else max(1, jobs), prepare=_numpy_without_blas_threads)


def _numpy_without_blas_threads() -> None:
    """Import numpy with one OpenBLAS thread: profkit does no linear algebra, and OpenBLAS's idle
    threads otherwise spin on the cores the decoding needs. The environment is left as it was."""
    if "numpy" in sys.modules:
        return
    import os

    before = os.environ.get("OPENBLAS_NUM_THREADS")
    os.environ["OPENBLAS_NUM_THREADS"] = "1"
    try:
        import numpy  # noqa: F401
    finally:
        if before is None:
            del os.environ["OPENBLAS_NUM_THREADS"]
        else:
            os.environ["OPENBLAS_NUM_THREADS"] = before


def main() -> None:
    """Console-script entry point: run the app; unexpected errors are one line unless --debug."""
    try:
        app()
    except SystemExit as e:
        if _state.get("quick_exit"):
            _quick_exit(e.code)
        raise
    except KeyboardInterrupt:
        err.print("[yellow]interrupted[/]")
        sys.exit(EXIT_INTERRUPTED)
    except Exception as e:  # a bug: one line and the traceback in a file; --debug prints it
        if _state["debug"] or "--debug" in sys.argv:
            traceback.print_exc()
        else:
            where = _write_crash_report()
            err.print(f"[bold red]internal error (a bug in profkit):[/] {escape(type(e).__name__)}: {escape(str(e))}"
                      + (f"; traceback in {escape(str(where))}" if where else " (run with --debug for the traceback)"), soft_wrap=True)
        sys.exit(EXIT_BUG)


def _write_crash_report() -> Path | None:
    """The current exception's traceback, with profkit's version and the command line, in a new
    file under the temporary folder; its path, or None when it cannot be written."""
    import os
    import tempfile
    import time

    try:
        fd, name = tempfile.mkstemp(prefix=f"profkit-crash-{time.strftime('%Y%m%d-%H%M%S')}-", suffix=".txt")
        with os.fdopen(fd, "w") as f:
            f.write(f"profkit {__version__}\ncommand: {' '.join(sys.argv)}\n\n")
            traceback.print_exc(file=f)
        return Path(name)
    except OSError:
        return None


from profkit import cli_capture as _cli_capture  # noqa: E402,F401  (registers trace/sweep/opts)
from profkit import cli_report as _cli_report  # noqa: E402,F401  (registers diff/report/export-perfetto)
