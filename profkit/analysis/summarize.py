"""Trace files -> summary.json: the one route from traces to a summary, with the summary cache.

`analyze`, `diff` and `report` (for inputs that are traces or run folders) and `trace` (after its
capture) all call `summarize`; `analyze`, whose inputs may hold several runs, calls
`summarize_runs`. The route: plan the runs from the files' metadata (ingest/runs.py), read the
stored summary of a single run when the cache holds one (summary_cache.py: no polars imported),
else analyze every rank file (analysis/parallel.py: ranks in worker processes, the per-rank and
tables caches), build each run's summary (analysis/summary.py) and cross-rank figures, and store it.
Nothing here prints or exits; errors are profkit.errors exceptions.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

from profkit.analysis.catalog import CatalogChoice
from profkit.errors import UsageError
from profkit.ingest.early import numpy_without_blas_threads

if TYPE_CHECKING:
    from profkit.ingest.runs import RunPlan


@dataclass(frozen=True)
class SummarizeOptions:
    """What changes a summary, and how it is computed."""

    marker: str | None = None  # the iteration regex (None: the default chain)
    min_bubble_us: float = 2.0
    catalog: CatalogChoice = field(default_factory=CatalogChoice)  # catalog.choose_catalog's answer
    captures: tuple[Path, ...] | None = None  # graph-capture profiles; None: graph_capture_profile/ beside the traces
    cache: bool = True  # False (--no-cache): no cache read or written; PROFKIT_NO_CACHE=1 does the same
    jobs: int | None = None  # worker processes (None: the cores, at most one per file)
    frames: bool = False  # the caller needs every rank's frames (--timeline, --tables): never the stored summary
    peaks: Path | None = None  # --peaks: measured peaks for the hardware floor (analysis/peaks.py); None: the datasheet's


@dataclass
class RunSummary:
    """One run's summary, and where it came from."""

    run: RunPlan  # the run (ingest/runs.py): its files, label, and what sets it apart from the others
    summary: dict[str, Any]
    analyses: list[Any] | None  # one RankAnalysis per rank; None when the summary was read from the cache
    text: str | None = None  # the JSON the cached summary was stored as (the bytes `--json` writes); None when built now

    @property
    def label(self) -> str:
        return self.run.label


Check = Callable[[list["RunPlan"]], None]


def summarize(paths: Sequence[Path], options: SummarizeOptions | None = None) -> RunSummary:
    """Trace files or run folders holding one run -> its summary. Inputs that hold several runs
    (unrelated traces in one folder) are refused with the runs named: compare one run a side."""
    from profkit.ingest.runs import several_runs_message

    what = " ".join(str(p) for p in paths)

    def one_run(runs: list[Any]) -> None:
        if len(runs) > 1:
            raise UsageError(several_runs_message(runs, what),
                             hint="compare one run a side: pass that run's trace files or folder (e.g. " + " ".join(str(f) for f in runs[0].files) + ")")

    return summarize_runs(paths, options, check=one_run)[0]


def summarize_runs(paths: Sequence[Path], options: SummarizeOptions | None = None, *, check: Check | None = None) -> list[RunSummary]:
    """Trace files or run folders -> one summary per run they hold (see the module doc). `check`
    sees the runs as planned (before anything is decoded) and again if the analysis split them
    (ingest/runs.py); it raises to refuse them."""
    from profkit.analysis.graphs import find_capture_files
    from profkit.ingest import expand_inputs
    from profkit.ingest.identity import cache_disabled_by_env
    from profkit.ingest.runs import plan_runs

    o = options or SummarizeOptions()
    paths = list(paths)
    files = expand_inputs(paths)
    plan = plan_runs(files)  # from the files' metadata, before anything is decoded
    if check is not None:
        check(plan)
    cache_on = o.cache and not cache_disabled_by_env()
    captures = list(o.captures) if o.captures is not None else find_capture_files(paths)
    key = None
    if cache_on and not o.frames and not captures and len(plan) == 1:  # the stored summary knows no capture profiles
        # a repeated run on unchanged traces: the stored summary, without importing polars
        from profkit.analysis.summary_cache import read_summary, summary_key

        key = summary_key([i.file or i.path for i in plan[0].infos], marker=o.marker, min_bubble_us=o.min_bubble_us, catalog=o.catalog.identity,
                          peaks=o.peaks)
        hit = read_summary(files[0], key) if key else None
        if hit is not None:
            return [RunSummary(plan[0], hit[0], None, hit[1])]

    early = _decode_early(plan, cache_on, o.jobs)
    from profkit.analysis.parallel import analyze_runs
    from profkit.analysis.summary import build_summary

    try:
        if early is None:
            numpy_without_blas_threads()
        runs = analyze_runs(paths, marker=o.marker, min_bubble_us=o.min_bubble_us, catalog=o.catalog.catalog, cache=None if o.cache else False,
                            jobs=o.jobs, captures=captures or None, runs=plan, early=early)
    finally:
        if early is not None:
            early.stop()  # not taken (a cache answered, or an error came first): it stops
    if len(runs) > 1 and check is not None:
        check(runs)
    out = []
    for r in runs:
        s = build_summary(r.analyses, marker=o.marker, peaks=o.peaks)
        if len(r.analyses) > 1:
            from profkit.analysis.ranks import cross_rank

            s["cross_rank"] = cross_rank(r.analyses)
        _health_and_spec(s, [i.path for i in r.infos])
        out.append(RunSummary(r, s, r.analyses))
    if key and len(out) == 1:
        from profkit.analysis.summary_cache import write_summary

        write_summary(files[0], key, out[0].summary)
    return out


def _health_and_spec(summary: dict[str, Any], files: list[Any]) -> None:
    """summary.json's `health` (analysis/health.py: the ranks' capture facts, and the profiler overhead
    of the run manifest beside the inputs, that profile window's in a window-<i>/ folder) and
    `speculative` (analysis/spec.py: rank 0's cost per accepted token, the window's accepted length
    from that manifest; absent without verify iterations)."""
    import msgspec

    from profkit.analysis import health, spec

    manifest, window = health.manifest_near(files)
    m = manifest if isinstance(manifest, dict) else None
    summary["health"] = msgspec.to_builtins(health.assess(summary, m.get("profiler_overhead") if m else None, window))
    cost = spec.spec_cost(summary, m, window)
    if cost is not None:
        summary["speculative"] = msgspec.to_builtins(cost)


def _decode_early(plan: list[Any], cache_on: bool, jobs: int | None) -> Any:
    """_begin_early's handle; where it begins nothing, a decode the CLI began ahead stops (ingest/early.py)."""
    from profkit.ingest import early

    got = _begin_early(plan, cache_on, jobs)
    if got is None:
        early.drop_ahead()
    return got


def _begin_early(plan: list[Any], cache_on: bool, jobs: int | None) -> Any:
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
    # the chunk threads analyze_runs gives one large file: the cores (or --jobs)
    return early.start(f, jobs=default_jobs(1) if jobs is None else max(1, jobs), prepare=numpy_without_blas_threads)
