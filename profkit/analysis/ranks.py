"""Cross-rank truth for one run with several rank files: the slowest rank sets the pace.

Iterations are aligned by index (and checked by kind and batch size). Rank files may come from
processes with different clocks: the k-th collective kernel ends at the same true time on every rank
(an all-reduce completes everywhere at once), so each rank's clock offset is the median difference
of its collective end times to rank 0's. The time a rank waits inside collectives is its
communication kernel time beyond the fastest rank's in the same iteration; the rank that makes the
others wait (least time in collectives, it arrives last) is the iteration's straggler.
"""

from __future__ import annotations

import statistics
from typing import Any

import polars as pl

from profkit.analysis.rank import RankAnalysis

COMM = "comm"


def _comm(a: RankAnalysis) -> pl.DataFrame:
    ops = a.ops
    if ops.height == 0 or "category" not in ops.columns:
        return ops.head(0)
    return ops.filter(pl.col("category") == COMM).sort("ts_ns")


def clock_offsets(analyses: list[RankAnalysis]) -> tuple[dict[int, int], list[str]]:
    """ns to subtract from each rank's timestamps to put it on rank 0's clock (0 where unknown)."""
    warnings: list[str] = []
    ref = _comm(analyses[0])["end_ns"].to_list()
    out = {analyses[0].rank: 0}
    for a in analyses[1:]:
        ends = _comm(a)["end_ns"].to_list()
        if not ref or not ends:
            out[a.rank] = 0
            continue
        if len(ends) != len(ref):
            warnings.append(f"rank {a.rank} has {len(ends)} collective kernels, rank {analyses[0].rank} {len(ref)}: clocks not aligned")
            out[a.rank] = 0
            continue
        out[a.rank] = int(statistics.median(e - r for e, r in zip(ends, ref)))
    return out, warnings


def cross_rank(analyses: list[RankAnalysis]) -> dict[str, Any]:
    """The cross-rank section of summary.json (only meaningful with two or more ranks)."""
    analyses = sorted(analyses, key=lambda a: a.rank)
    warnings: list[str] = []
    offsets, w = clock_offsets(analyses)
    warnings += w
    n = min(a.iterations.height for a in analyses)
    if len({a.iterations.height for a in analyses}) > 1:
        warnings.append(f"ranks captured {sorted({a.iterations.height for a in analyses})} iterations; aligning the first {n}")
    comm_time: dict[int, dict[int, int]] = {}
    comm_count: dict[int, dict[int, int]] = {}
    for a in analyses:
        c = _comm(a).group_by("iteration").agg(pl.col("dur_ns").sum().alias("t"), pl.len().alias("n"))
        comm_time[a.rank] = dict(zip(c["iteration"].to_list(), c["t"].to_list()))
        comm_count[a.rank] = dict(zip(c["iteration"].to_list(), c["n"].to_list()))
    its = []
    caused: dict[int, list[int]] = {a.rank: [] for a in analyses}
    waits: dict[int, list[int]] = {a.rank: [] for a in analyses}
    for i in range(n):
        rows = {a.rank: a.iterations.row(i, named=True) for a in analyses}
        shapes = {(r["kind"], r["batch_size"]) for r in rows.values()}
        if len(shapes) > 1:
            warnings.append(f"iteration {i}: ranks disagree on kind/batch size {sorted(map(str, shapes))}")
        window = {r: rows[r]["gpu_window_ns"] for r in rows}
        wall = {r: rows[r]["wall_ns"] for r in rows}
        ct = {r: comm_time[r].get(i, 0) for r in rows}
        counts = {r: comm_count[r].get(i, 0) for r in rows}
        if len(set(counts.values())) > 1:
            warnings.append(f"iteration {i}: collective counts differ across ranks {counts}")
        fastest = min(ct.values())
        wait = {r: ct[r] - fastest for r in rows}
        straggler = min(ct, key=lambda r: (ct[r], r)) if any(ct.values()) else max(window, key=lambda r: (window[r], -r))
        slowest = max(window, key=lambda r: (window[r], -r))
        for r in rows:
            waits[r].append(wait[r])
        caused[straggler].append(max(wait.values()))
        start = {r: (rows[r]["gpu_start_ns"] - offsets.get(r, 0)) if rows[r]["gpu_start_ns"] is not None else None for r in rows}
        its.append({
            "index": i, "kind": rows[analyses[0].rank]["kind"], "batch_size": rows[analyses[0].rank]["batch_size"],
            "slowest_rank": slowest, "straggler_rank": straggler,
            "spread_us": (max(window.values()) - min(window.values())) / 1000,
            "gpu_window_us": {str(r): v / 1000 for r, v in window.items()},
            "wall_us": {str(r): v / 1000 for r, v in wall.items()},
            "collectives": {str(r): v for r, v in counts.items()},
            "comm_us": {str(r): v / 1000 for r, v in ct.items()},
            "comm_wait_us": {str(r): v / 1000 for r, v in wait.items()},
            "gpu_start_skew_us": ((max(v for v in start.values() if v is not None) - min(v for v in start.values() if v is not None)) / 1000
                                  if all(v is not None for v in start.values()) else None),
        })
    stragglers = [
        {"rank": r, "times_straggler": len(caused[r]), "mean_wait_caused_us": (statistics.mean(caused[r]) / 1000) if caused[r] else 0.0,
         "mean_comm_wait_us": (statistics.mean(waits[r]) / 1000) if waits[r] else 0.0}
        for r in sorted(caused)
    ]
    return {
        "ranks": [a.rank for a in analyses],
        "aligned_iterations": n,
        "clock_offsets_us": {str(r): v / 1000 for r, v in offsets.items()},
        "iterations": its,
        "stragglers": stragglers,
        "warnings": warnings,
    }
