"""Bubbles (DESIGN.md "Bubble"): gaps in the device's busy union, each in the iteration whose GPU
window holds it, with a cause (sync > iteration_boundary > launch > gpu_wait) and the CPU ops of
the launching thread with the most exclusive time inside it."""

from __future__ import annotations

import polars as pl

from profkit.apis import LAUNCH_APIS
from profkit.analysis.spans import thread_rows
from profkit.ingest import Trace

CAUSES = ("sync", "launch", "iteration_boundary", "gpu_wait")
# A blocking call that returns within this long before the GPU went idle still counts as the
# gap's cause: CUPTI's host and device timestamps come from different clocks (~1 µs apart).
SYNC_SLACK_NS = 2_000
GAP_TOP = 3  # CPU ops kept per gap


def find_bubbles(trace: Trace, ops: pl.DataFrame, calls: pl.DataFrame, windows: pl.DataFrame, syncs: pl.DataFrame,
             min_ns: int, rows_cache: dict | None = None) -> pl.DataFrame:
    schema = {"iteration": pl.Int64, "start_ns": pl.Int64, "dur_ns": pl.Int64, "cause": pl.String, "cpu_ops": pl.List(pl.String),
              "cpu_ops_ns": pl.List(pl.Int64)}
    w = windows.filter(pl.col("gpu_start_ns").is_not_null()).sort("gpu_start_ns")
    if w.height == 0 or ops.height == 0:
        return pl.DataFrame(schema=schema)
    lo, hi = w["gpu_start_ns"].min(), w["gpu_end_ns"].max()
    gaps = (
        ops.sort("ts_ns", "end_ns")
        .with_columns(pl.col("end_ns").cum_max().shift(1).alias("g0"))
        .filter(pl.col("g0").is_not_null() & (pl.col("ts_ns") - pl.col("g0") >= max(min_ns, 1)))
        .filter((pl.col("g0") >= lo) & (pl.col("ts_ns") <= hi))
        .select(
            pl.col("g0"), pl.col("ts_ns").alias("g1"), pl.col("iteration").alias("next_iteration"),
            "launch_ts_ns", "launch_tid",
        )
    )
    if gaps.height == 0:
        return pl.DataFrame(schema=schema)
    gaps = gaps.join_asof(w.select("iteration", "gpu_start_ns", "first_op_ns"), left_on="g0", right_on="gpu_start_ns", strategy="backward")

    main_tid = calls.filter(pl.col("api").is_in(LAUNCH_APIS))["tid"].mode().to_list() if calls.height else []
    default_tid = main_tid[0] if main_tid else None
    gaps = gaps.with_columns(pl.int_range(0, pl.len(), dtype=pl.Int64).alias("_g"))
    synced = _sync_gaps(gaps, syncs)
    firsts = windows.filter(pl.col("first_op_ns").is_not_null())["first_op_ns"].implode()
    cause = (
        pl.when(pl.col("_g").is_in(synced.implode())).then(pl.lit("sync"))
        .when(pl.col("next_iteration").is_not_null() & (pl.col("next_iteration") != w["iteration"].min()) & pl.col("g1").is_in(firsts))
        .then(pl.lit("iteration_boundary"))
        .when(pl.col("launch_ts_ns").is_not_null() & (pl.col("launch_ts_ns") > pl.col("g0"))).then(pl.lit("launch"))
        .otherwise(pl.lit("gpu_wait"))
    )
    tids = gaps["launch_tid"].fill_null(default_tid) if default_tid is not None else gaps["launch_tid"]
    ops_of = gap_cpu_ops(trace, gaps["g0"], gaps["g1"], tids, rows_cache)
    # a built-in's frame names its object's address ("<built-in method x of y object at 0x7f…>"):
    # dropped, so one function is one name across bubbles and runs
    ops_of = ops_of.with_columns(pl.col("name").str.replace(r" at 0x[0-9a-fA-F]+>", ">"))
    lists = ops_of.group_by("_g").agg(pl.col("name").alias("cpu_ops"), pl.col("ns").alias("cpu_ops_ns"))
    return (
        gaps.join(lists, on="_g", how="left", maintain_order="left")
        .select(
            "iteration", pl.col("g0").alias("start_ns"), (pl.col("g1") - pl.col("g0")).alias("dur_ns"), cause.alias("cause"),
            pl.col("cpu_ops").fill_null(pl.lit([], dtype=pl.List(pl.String))),
            pl.col("cpu_ops_ns").fill_null(pl.lit([], dtype=pl.List(pl.Int64))),
        )
    )


def _sync_gaps(gaps: pl.DataFrame, syncs: pl.DataFrame) -> pl.Series:
    """The gaps (`_g`) a host-blocking call explains: one on the launching thread (any thread when
    the launch is not in the trace) that started at or before the gap began and returned inside it
    (or up to SYNC_SLACK_NS before it began: host and device clocks differ by ~1 µs)."""
    found = [pl.Series("_g", [], dtype=pl.Int64)]
    if syncs.height == 0:
        return found[0]
    for tid, frame in gaps.select("_g", "g0", "g1", "launch_tid").group_by("launch_tid"):
        key = tid[0]
        b = (syncs if key is None else syncs.filter(pl.col("tid") == key)).select("ts_ns", "end_ns").sort("end_ns", "ts_ns")
        if b.height == 0:
            continue
        k0 = b["end_ns"].search_sorted(frame["g0"] - SYNC_SLACK_NS, side="left").cast(pl.Int64)
        k1 = b["end_ns"].search_sorted(frame["g1"], side="right").cast(pl.Int64)
        pairs = frame.select("_g", "g0", pl.int_ranges(k0, k1, dtype=pl.Int64).alias("k")).explode("k").drop_nulls("k")
        if pairs.height:
            found.append(pairs.filter(b["ts_ns"].gather(pairs["k"]) <= pairs["g0"])["_g"].unique())
    return pl.concat(found).unique()


def gap_cpu_ops(trace: Trace, g0s: pl.Series, g1s: pl.Series, tids: pl.Series,
                 rows_cache: dict | None = None) -> pl.DataFrame:
    """For each gap [g0, g1) on thread tid: the CPU events of that thread (cpu_op, annotations,
    Python frames, runtime calls) with the most exclusive time inside it, with that time (ns), as
    rows (_g: the gap's position, name, ns), most time first within a gap.

    The thread's events are ordered by (ts, -end, name); each instant of a gap goes to the event
    latest in that order that has started and not yet ended (for nested spans: the innermost), so
    an enclosing span that began long before the gap counts as well as the calls inside it. One
    pass over the thread's events for all its gaps: in the native library when it is built
    (ingest/scan.py), else the same sweep in Python (_sweep_gaps)."""
    from profkit.ingest import scan

    schema = {"_g": pl.Int64, "name": pl.String, "ns": pl.Int64}
    found = [pl.DataFrame(schema=schema)]
    gaps = pl.DataFrame({"_g": pl.int_range(0, len(g0s), dtype=pl.Int64, eager=True), "g0": g0s, "g1": g1s, "tid": tids})
    for (t,), mine in gaps.filter(pl.col("tid").is_not_null()).sort("g0").group_by("tid", maintain_order=True):
        parts = []
        g0, g1 = mine["g0"], mine["g1"]  # disjoint, in order
        for f in (trace.cpu, trace.calls):
            ts, end, rows = thread_rows(f, t, cache=rows_cache)
            if len(ts):
                # only events that overlap a gap can own any of its time (and dropping the others
                # changes no owner): the first gap ending after an event's start must begin before its end
                k = g1.search_sorted(ts, side="right").cast(pl.Int64)
                hit = k < len(g1)
                keep = hit & (g0.gather(k.clip(upper_bound=len(g1) - 1)) < end)
                pos = keep.arg_true()
                if len(pos):
                    src = pos if rows is None else rows.gather(pos)
                    parts.append(pl.DataFrame({"ts": ts.gather(pos), "end": end.gather(pos), "name": f["name"].gather(src)}))
        if not parts:
            continue
        ev = pl.concat(parts).with_columns(pl.col("name").fill_null(""))
        names = ev["name"].unique().sort()
        # name ids in the names' order: ties in time are broken by the name, as in (ts, -end, name)
        ev = ev.with_columns(pl.col("name").replace_strict(names, pl.int_range(0, len(names), dtype=pl.Int32, eager=True),
                                                           return_dtype=pl.Int32).alias("id"))
        ev = ev.sort("ts", "end", "id", descending=[False, True, False])
        got = scan.gap_exclusive(ev["ts"].to_numpy(), ev["end"].to_numpy(), ev["id"].to_numpy(), mine["g0"].to_numpy(),
                                 mine["g1"].to_numpy(), GAP_TOP)
        if got is None:
            tops = _sweep_gaps(ev["ts"].to_list(), ev["end"].to_list(), ev["id"].to_list(), mine["g0"].to_list(), mine["g1"].to_list(), GAP_TOP)
            flat = pl.DataFrame({"_k": [k for k, top in enumerate(tops) for _ in top], "id": [n for top in tops for n, _ in top],
                                 "ns": [x for top in tops for _, x in top]}, schema={"_k": pl.Int64, "id": pl.Int64, "ns": pl.Int64})
        else:
            m = mine.height
            flat = pl.DataFrame({"_k": pl.int_range(0, m, dtype=pl.Int64, eager=True).repeat_by(GAP_TOP).explode(),
                                 "id": got[0].reshape(-1).astype("int64"), "ns": got[1].reshape(-1)}).filter(pl.col("id") >= 0)
        found.append(flat.select(mine["_g"].gather(flat["_k"]).alias("_g"), names.gather(flat["id"]).alias("name"), "ns"))
    return pl.concat(found)


def _sweep_gaps(ts: list[int], end: list[int], name: list[int], g0: list[int], g1: list[int], top: int) -> list[list[tuple[int, int]]]:
    """profkit_gap_exclusive (ingest/_scan.c) in Python: the same sweep, for where no compiler is."""
    out: list[list[tuple[int, int]]] = []
    stack: list[tuple[int, int]] = []  # (end, name) of pushed events, latest last
    n, k = len(ts), 0
    for a, b in zip(g0, g1):
        while k < n and ts[k] <= a:
            while stack and stack[-1][0] <= ts[k]:
                stack.pop()
            stack.append((end[k], name[k]))
            k += 1
        acc: dict[int, int] = {}
        t = a
        while True:
            nxt = ts[k] if k < n and ts[k] < b else b
            while t < nxt:
                while stack and stack[-1][0] <= t:
                    stack.pop()
                if not stack:
                    t = nxt
                    break
                e = min(stack[-1][0], nxt)
                acc[stack[-1][1]] = acc.get(stack[-1][1], 0) + (e - t)
                t = e
            if nxt == b:
                break
            while stack and stack[-1][0] <= ts[k]:
                stack.pop()
            stack.append((end[k], name[k]))
            k += 1
        out.append(sorted(((nm, x) for nm, x in acc.items() if x > 0), key=lambda kv: (-kv[1], kv[0]))[:top])
    return out
