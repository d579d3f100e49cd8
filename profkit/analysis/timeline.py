"""A compact timeline of one representative iteration, stored in summary.json (key ``timeline``) so
that reports can draw it without the trace.

Representative: among the iterations of the rank's most common shape (kind, batch size), leaving
out the last iteration (its GPU window is cut at its last op), the one with the median GPU window
(the lower median for an even count). Times are µs relative to that iteration's GPU window start.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import polars as pl

from profkit.analysis.rank import RankAnalysis

MAX_OPS = 5000


def representative_iteration(a: RankAnalysis) -> int | None:
    it = a.iterations.filter(pl.col("gpu_start_ns").is_not_null())
    if it.height == 0:
        return None
    if it.height > 1:
        it = it.filter(pl.col("iteration") != it["iteration"].max())
    shapes = Counter(zip(it["kind"].to_list(), it["batch_size"].to_list()))
    kind, bs = max(shapes.items(), key=lambda kv: (kv[1], str(kv[0])))[0]
    it = it.filter((pl.col("kind") == kind) & (pl.col("batch_size").is_null() if bs is None else pl.col("batch_size") == bs))
    it = it.sort("gpu_window_ns", "iteration")
    return int(it["iteration"][(it.height - 1) // 2])


def representative_timeline(a: RankAnalysis, *, max_ops: int = MAX_OPS) -> dict[str, Any] | None:
    """The ``timeline`` entry of a rank in summary.json, or None when no iteration has GPU work.

    ops are columnar (stream, start_us, dur_us, category, name index into ``names``), sorted by start.
    """
    i = representative_iteration(a)
    if i is None:
        return None
    row = a.iterations.filter(pl.col("iteration") == i).row(0, named=True)
    g0 = row["gpu_start_ns"]
    ops = a.ops.filter(pl.col("iteration") == i).sort("ts_ns", "stream")
    total = ops.height
    ops = ops.head(max_ops)
    names: dict[str, int] = {}
    name_idx = [names.setdefault(n or "", len(names)) for n in ops["name"].to_list()]
    bubbles = a.bubbles.filter(pl.col("iteration") == i).sort("start_ns")
    syncs = a.syncs.filter(pl.col("iteration") == i).sort("ts_ns")
    return {
        "iteration": i,
        "kind": row["kind"],
        "batch_size": row["batch_size"],
        "gpu_start_us": (g0 - a.t0_ns) / 1000.0,
        "gpu_window_us": row["gpu_window_ns"] / 1000.0,
        "wall_us": row["wall_ns"] / 1000.0,
        "cpu_start_us": (row["cpu_start_ns"] - g0) / 1000.0,
        "ops": {
            "stream": ops["stream"].to_list(),
            "start_us": [(t - g0) / 1000.0 for t in ops["ts_ns"].to_list()],
            "dur_us": [d / 1000.0 for d in ops["dur_ns"].to_list()],
            "category": [c or "other" for c in ops["category"].to_list()],
            "name": name_idx,
        },
        "names": list(names),
        "ops_total": total,
        "bubbles": [
            {"start_us": (s - g0) / 1000.0, "dur_us": d / 1000.0, "cause": c, "cpu_ops": list(ops or []),
             "cpu_ops_us": [t / 1000.0 for t in (ts or [])]}
            # column by column: iter_rows converts each row's lists one by one, several times slower
            for s, d, c, ops, ts in zip(*(bubbles[k].to_list() for k in ("start_ns", "dur_ns", "cause", "cpu_ops", "cpu_ops_ns")))
        ],
        "syncs": [
            {"start_us": (t - g0) / 1000.0, "blocked_us": b / 1000.0, "api": api, "kind": k, "direction": d, "trigger": trig}
            for t, b, api, k, d, trig in syncs.select("ts_ns", "blocked_ns", "api", "kind", "direction", "trigger").iter_rows()
        ],
    }
