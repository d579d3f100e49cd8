"""Bubbles (DESIGN.md "Bubble"): gaps in the device's busy union, each in the iteration whose GPU
window holds it, with a cause (sync > iteration_boundary > launch > gpu_wait) and the CPU ops of
the launching thread with the most exclusive time inside it."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import polars as pl

from profkit.apis import LAUNCH_APIS
from profkit.analysis.spans import thread_rows
from profkit.ingest import Trace

if TYPE_CHECKING:
    import numpy as np

# A blocking call that returns within this long before the GPU went idle still counts as the
# gap's cause: CUPTI's host and device timestamps come from different clocks (~1 µs apart).
SYNC_SLACK_NS = 2_000
GAP_TOP = 3  # CPU ops kept per gap


def find_bubbles(trace: Trace, ops: pl.DataFrame, calls: pl.DataFrame, windows: pl.DataFrame,
                 syncs: pl.DataFrame | Callable[[], pl.DataFrame], min_ns: int, rows_cache: dict | None = None) -> pl.DataFrame:
    """The bubbles of one rank (the module's docstring). `syncs`: find_syncs' frame, or a function
    that waits for it and returns it (the gaps and their CPU ops need no syncs: they are read last,
    for the causes); `rows_cache`: as spans.thread_rows'."""
    schema: dict[str, Any] = {"iteration": pl.Int64, "start_ns": pl.Int64, "dur_ns": pl.Int64, "cause": pl.String, "cpu_ops": pl.List(pl.String),
              "cpu_ops_ns": pl.List(pl.Int64)}
    w = windows.filter(pl.col("gpu_start_ns").is_not_null()).sort("gpu_start_ns")
    if w.height == 0 or ops.height == 0:
        return pl.DataFrame(schema=schema)
    lo, hi = w["gpu_start_ns"].min(), w["gpu_end_ns"].max()
    ops = ops.select("ts_ns", "end_ns", "iteration", "launch_ts_ns", "launch_tid")
    if not (ops["ts_ns"].is_sorted() and ops["ts_ns"].n_unique() == ops.height):  # else in (ts, end) order already
        ops = ops.sort("ts_ns", "end_ns")
    gaps = (
        ops
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

    main_tid = _main_thread(calls)
    default_tid = main_tid[0] if main_tid else None
    gaps = gaps.with_columns(pl.int_range(0, pl.len(), dtype=pl.Int64).alias("_g"))
    tids = gaps["launch_tid"].fill_null(default_tid) if default_tid is not None else gaps["launch_tid"]
    top_id, top_ns, names = gap_tops(trace, gaps["g0"], gaps["g1"], tids, rows_cache)
    # a built-in's frame names its object's address ("<built-in method x of y object at 0x7f…>"):
    # dropped, so one function is one name across bubbles and runs
    names = names.str.replace(r" at 0x[0-9a-fA-F]+>", ">")
    cpu_ops, cpu_ops_ns = _as_lists(top_id, top_ns, names)
    synced = _sync_gaps(gaps, syncs if isinstance(syncs, pl.DataFrame) else syncs())
    firsts = windows.filter(pl.col("first_op_ns").is_not_null())["first_op_ns"].implode()
    cause = (
        pl.when(pl.col("_g").is_in(synced.implode())).then(pl.lit("sync"))
        .when(pl.col("next_iteration").is_not_null() & (pl.col("next_iteration") != w["iteration"].min()) & pl.col("g1").is_in(firsts))
        .then(pl.lit("iteration_boundary"))
        .when(pl.col("launch_ts_ns").is_not_null() & (pl.col("launch_ts_ns") > pl.col("g0"))).then(pl.lit("launch"))
        .otherwise(pl.lit("gpu_wait"))
    )
    return gaps.with_columns(cpu_ops, cpu_ops_ns).select(
        "iteration", pl.col("g0").alias("start_ns"), (pl.col("g1") - pl.col("g0")).alias("dur_ns"), cause.alias("cause"),
        "cpu_ops", "cpu_ops_ns",
    )


def _main_thread(calls: pl.DataFrame) -> list[Any]:
    """The thread(s) that made the most launch calls (the modes)."""
    if calls.height == 0:
        return []
    tid = calls["tid"]
    if not tid.null_count() and tid.min() == tid.max():  # one thread made every call
        return [tid[0]] if calls["api"].is_in(LAUNCH_APIS).any() else []
    return calls.select("api", "tid").filter(pl.col("api").is_in(LAUNCH_APIS))["tid"].mode().to_list()


def _as_lists(top_id: np.ndarray, top_ns: np.ndarray, names: pl.Series) -> tuple[pl.Series, pl.Series]:
    """gap_tops' arrays -> per gap the list of its CPU ops' names and the list of their times."""
    import numpy as np

    n, top = top_id.shape
    count = np.zeros(n, dtype=np.int64)  # a gap's names come first, then -1
    for r in range(top):
        count += top_id[:, r] >= 0
    if n and count.min() > 0:
        # every gap has one at least: the names found, grouped by gap (in order, so the groups are runs)
        found = top_id.reshape(-1) >= 0
        flat = pl.DataFrame({"_g": pl.Series(np.repeat(np.arange(n), top)[found]).set_sorted(),
                             "cpu_ops": names.gather(top_id.reshape(-1)[found]), "cpu_ops_ns": top_ns.reshape(-1)[found]})
        got = flat.group_by("_g", maintain_order=True).agg("cpu_ops", "cpu_ops_ns")
        return got["cpu_ops"], got["cpu_ops_ns"]
    flat = pl.DataFrame({"k": top_id.reshape(-1), "ns": top_ns.reshape(-1)})
    k = pl.col("k")
    flat = flat.select(
        (pl.lit(names, dtype=pl.String).gather(k.clip(lower_bound=0)) if len(names) else pl.lit("")).alias("cpu_ops"), "ns")
    lists = [pl.select(pl.lit(flat[c].reshape((n, top)).arr.to_list()).list.head(pl.lit(pl.Series(count)))).to_series().alias(c)
             for c in ("cpu_ops", "ns")]
    return lists[0], lists[1].alias("cpu_ops_ns")


def by_thread(frame: pl.DataFrame, tid: str, *, maintain_order: bool = False) -> Any:
    """frame.group_by(tid) (keys as tuples), without hashing every row's thread when they are all one
    (the common case: one thread launches everything)."""
    t = frame[tid]
    if len(t) and not t.null_count() and t.min() == t.max():
        return [((t[0],), frame)]
    return frame.group_by(tid, maintain_order=maintain_order)


def _sync_gaps(gaps: pl.DataFrame, syncs: pl.DataFrame) -> pl.Series:
    """The gaps (`_g`) a host-blocking call explains: one on the launching thread (any thread when
    the launch is not in the trace) that started at or before the gap began and returned inside it
    (or up to SYNC_SLACK_NS before it began: host and device clocks differ by ~1 µs)."""
    found = [pl.Series("_g", [], dtype=pl.Int64)]
    if syncs.height == 0:
        return found[0]
    for tid, frame in by_thread(gaps.select("_g", "g0", "g1", "launch_tid"), "launch_tid"):
        key = tid[0]
        b = (syncs if key is None else syncs.filter(pl.col("tid") == key)).select("ts_ns", "end_ns").sort("end_ns", "ts_ns")
        if b.height == 0:
            continue
        k0 = b["end_ns"].search_sorted(frame["g0"] - SYNC_SLACK_NS, side="left").cast(pl.Int64)
        k1 = b["end_ns"].search_sorted(frame["g1"], side="right").cast(pl.Int64)
        some = k1 > k0  # the gaps with a call ending in their window (few): one row per (gap, call)
        pairs = frame.filter(some).select("_g", "g0", pl.int_ranges(k0.filter(some), k1.filter(some), dtype=pl.Int64).alias("k")).explode("k")
        if pairs.height:
            found.append(pairs.filter(b["ts_ns"].gather(pairs["k"]) <= pairs["g0"])["_g"].unique())
    return pl.concat(found).unique()


def gap_tops(trace: Trace, g0s: pl.Series, g1s: pl.Series, tids: pl.Series,
             rows_cache: dict | None = None) -> tuple[np.ndarray, np.ndarray, pl.Series]:
    """For each gap [g0, g1) on thread tid: the GAP_TOP CPU events of that thread (cpu_op,
    annotations, Python frames, runtime calls) with the most exclusive time inside it, most time
    first, as two arrays of shape (gaps, GAP_TOP): the name (a position in the names returned, -1
    where a gap has fewer) and that time (ns).

    The thread's events are ordered by (ts, -end, name); each instant of a gap goes to the event
    latest in that order that has started and not yet ended (for nested spans: the innermost), so
    an enclosing span that began long before the gap counts as well as the calls inside it. One
    pass over the thread's events for all its gaps: in the native library when it is built
    (ingest/scan.py, which merges the thread's CPU events and calls itself), else the same sweep in
    Python (_sweep_gaps) over the events that overlap a gap."""
    import numpy as np

    from profkit.ingest import scan

    n = len(g0s)
    top_id = np.full((n, GAP_TOP), -1, dtype=np.int64)
    top_ns = np.zeros((n, GAP_TOP), dtype=np.int64)
    names = pl.Series("name", [], dtype=pl.String)
    gaps = pl.DataFrame({"_g": pl.int_range(0, n, dtype=pl.Int64, eager=True), "g0": g0s, "g1": g1s, "tid": tids})
    for (t,), mine in by_thread(gaps.filter(pl.col("tid").is_not_null()).sort("g0"), "tid", maintain_order=True):
        # name ids in the names' order: ties in time are broken by the name, as in (ts, -end, name)
        names, ids = name_ids(trace, rows_cache)
        streams = []
        for f, fid in zip((trace.cpu, trace.calls), ids):
            ts, end, rows = thread_rows(f, t, cache=rows_cache)
            streams.append((ts, end, fid if rows is None else fid.gather(rows)))
        if len(streams[0][0]) + len(streams[1][0]) == 0:
            continue
        g0, g1 = mine["g0"], mine["g1"]  # disjoint, in order
        a, b = [(ts.to_numpy(), end.to_numpy(), i.to_numpy()) for ts, end, i in streams]  # the CPU events, the calls
        got = scan.gap_exclusive(a, b, g0.to_numpy(),
                                 g1.to_numpy(), GAP_TOP)
        if got is None:
            got = _sweep_overlapping(streams, g0, g1)
        at = mine["_g"]
        if len(at) == n and at.is_sorted():  # every gap, in order (one thread): no scattering
            top_id[:], top_ns[:] = got
        else:
            top_id[at.to_numpy()], top_ns[at.to_numpy()] = got
    return top_id, top_ns, names


def name_ids(trace: Trace, cache: dict | None = None) -> tuple[pl.Series, tuple[pl.Series, pl.Series]]:
    """Every name of trace.cpu and trace.calls (a null read as ""), sorted, and the name of each
    event of the two as an Int32 position in it: ids that compare as the names do. Each name is
    hashed once (a dictionary code), the rest is integer work. `cache`: as thread_rows' (kept
    while trace lives), so that the bubbles and the slack work them out once."""
    import threading

    if cache is None:
        return _name_ids(trace)
    key = ("name_ids", id(trace.cpu), id(trace.calls))
    with cache.setdefault("name_ids_lock", threading.Lock()):  # a second thread waits for the first's
        if key not in cache:
            cache[key] = _name_ids(trace)
        return cache[key]


def _name_ids(trace: Trace) -> tuple[pl.Series, tuple[pl.Series, pl.Series]]:
    import numpy as np

    columns = (trace.cpu["name"].fill_null(""), trace.calls["name"].fill_null(""))
    codes = [f.cast(pl.Categorical).to_physical() for f in columns]  # one code per distinct name of each column
    firsts = [c.arg_unique() for c in codes]
    names = pl.concat([f.gather(first) for f, first in zip(columns, firsts)]).unique().sort()
    ids = []
    for f, c, first in zip(columns, codes, firsts):
        # a column's codes -> the positions of their names in `names`
        table = np.zeros(int(c.max() or 0) + 1, dtype=np.int32)
        table[c.gather(first).to_numpy()] = names.search_sorted(f.gather(first)).to_numpy()
        ids.append(pl.Series(table[c.to_numpy()]))
    return names, (ids[0], ids[1])


def _sweep_overlapping(streams: list[tuple[pl.Series, pl.Series, pl.Series]], g0: pl.Series,
                       g1: pl.Series) -> tuple[np.ndarray, np.ndarray]:
    """The native sweep's result computed in Python (_sweep_gaps), over the events of the streams
    that overlap a gap, in (ts, -end, name id) order."""
    import numpy as np

    parts = []
    for ts, end, ids in streams:
        if len(ts):
            # only events that overlap a gap can own any of its time (and dropping the others
            # changes no owner): the first gap ending after an event's start must begin before its end
            k = g1.search_sorted(ts, side="right").cast(pl.Int64)
            keep = (k < len(g1)) & (g0.gather(k.clip(upper_bound=len(g1) - 1)) < end)
            pos = keep.arg_true()
            parts.append(pl.DataFrame({"ts": ts.gather(pos), "end": end.gather(pos), "id": ids.gather(pos)}))
    ev = pl.concat(parts).sort("ts", "end", "id", descending=[False, True, False])
    tops = _sweep_gaps(ev["ts"].to_list(), ev["end"].to_list(), ev["id"].to_list(), g0.to_list(), g1.to_list(), GAP_TOP)
    top_id = np.full((len(g0), GAP_TOP), -1, dtype=np.int64)
    top_ns = np.zeros((len(g0), GAP_TOP), dtype=np.int64)
    for j, top in enumerate(tops):
        for r, (i, x) in enumerate(top):
            top_id[j, r], top_ns[j, r] = i, x
    return top_id, top_ns


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
