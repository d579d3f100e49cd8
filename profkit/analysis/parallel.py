"""Load and analyze several rank files at once: one worker process per file (ranks in parallel),
or one file with its chunks decoded in parallel. Results are identical to
`[analyze_trace(t) for t in load_traces(paths)]`, rank renumbering and warnings included."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from profkit.analysis.rank import RankAnalysis, analyze_trace


def _load_and_analyze(path: Path, default_rank: int, cache: bool | None, marker: str | None, min_bubble_us: float,
                      catalog: Any) -> tuple[RankAnalysis, int]:
    from profkit.ingest import load_trace

    t = load_trace(path, default_rank=default_rank, cache=cache)
    n_ingest_warnings = len(t.warnings)
    return analyze_trace(t, marker=marker, min_bubble_us=min_bubble_us, catalog=catalog), n_ingest_warnings


def analyze_paths(paths: list[Path], *, marker: str | None = None, min_bubble_us: float = 2.0, catalog: Any = None,
                  cache: bool | None = None, jobs: int | None = None, min_parallel_bytes: int | None = None) -> list[RankAnalysis]:
    """Files or run folders -> one RankAnalysis per rank file, sorted by rank (see module doc)."""
    from profkit.ingest import PARALLEL_MIN_BYTES, estimated_raw_bytes, expand_inputs, load_traces
    from profkit.ingest.columnar import default_jobs, make_executor

    files = expand_inputs(paths)
    jobs = default_jobs(len(files)) if jobs is None else max(1, jobs)
    threshold = PARALLEL_MIN_BYTES if min_parallel_bytes is None else min_parallel_bytes
    big = sum(estimated_raw_bytes(f) for f in files) >= threshold
    if not (jobs > 1 and len(files) > 1 and big):
        import time

        t0 = time.perf_counter()
        traces = load_traces(files, cache=cache, jobs=jobs, min_parallel_bytes=threshold)
        load_s = time.perf_counter() - t0
        out = [analyze_trace(t, marker=marker, min_bubble_us=min_bubble_us, catalog=catalog) for t in traces]
        if out:
            out[0]._load_s = load_s  # type: ignore[attr-defined]  (read by `analyze`'s PROFKIT_TIMINGS)
        return out
    ex = make_executor(min(jobs, len(files)))
    try:
        futs = [ex.submit(_load_and_analyze, f, i, cache, marker, min_bubble_us, catalog)  # type: ignore[union-attr]
                for i, f in enumerate(files)]
        done = [f.result() for f in futs]
    finally:
        ex.shutdown(cancel_futures=True)  # type: ignore[union-attr]
    analyses = [a for a, _ in done]
    ranks = [a.rank for a in analyses]
    if len(set(ranks)) != len(ranks):
        # as ingest.fix_duplicate_ranks does before analysis: the warning follows the ingest warnings
        for i, (a, n) in enumerate(done):
            a.warnings.insert(n, f"rank {a.rank} appears in several inputs; using file order ({i}) as its rank")
            a.rank = i
    return sorted(analyses, key=lambda a: a.rank)
