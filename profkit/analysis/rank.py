"""One rank's trace -> per-iteration metrics (DESIGN.md "Definitions"), all times integer ns.

Counts by ownership: a GPU op belongs to the iteration whose CPU window holds the start of its
launch call (same correlation id; kernels replayed from a CUDA graph share the cudaGraphLaunch's
id). GPU window of iteration i: from its first owned op's start to the next iteration's first
owned op start (the last: to its last owned op's end); starts are made monotone so the windows tile
the GPU timeline.
Time by the clock (analysis/clock.py): busy = the union of every GPU op of the device inside the
window, whoever owns it; category_us and phase_us = op time inside the window; idle = window - busy;
overlap = sum(category) - busy. So window = busy + idle and sum(category) - overlap = busy exactly,
and summed over iterations busy is the device's busy union over the analyzed span. owned_gpu_us
and spill_us say how much of an iteration's own work ran outside its window. GPU ops launched
outside every iteration (or whose launch is not in the trace) are counted in `outside`.
"""

from __future__ import annotations

import bisect
import re
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl

from profkit.apis import (
    ASYNC_COPY_APIS,
    BLOCKING_COPY_APIS,
    GRAPH_LAUNCH_APIS,
    KERNEL_LAUNCH_APIS,
    LAUNCH_APIS,
    SYNC_APIS,
)
from profkit.analysis.clock import busy_by_window, by_window, owned_and_spill, tiles, union_ns
from profkit.analysis.iterations import WHOLE_TRACE, find_iterations
from profkit.analysis.phases import op_phases
from profkit.analysis.spans import (
    MaxTree, enclosing_stacks, exclusive_sweeps, innermost_enclosing, innermost_enclosing_by, thread_rows,
)
from profkit.ingest import Trace

CAUSES = ("sync", "launch", "iteration_boundary", "gpu_wait")
DIRECTIONS = ("h2d", "d2h", "d2d", "other")
# A blocking call that returns within this long before the GPU went idle still counts as the
# gap's cause: CUPTI's host and device timestamps come from different clocks (~1 µs apart).
SYNC_SLACK_NS = 2_000


@dataclass
class RankAnalysis:
    """Everything `analyze` knows about one rank. Frames use integer ns; see `summary` for µs."""

    rank: int
    device: str | None
    path: Path
    marker: str
    catalog: str
    t0_ns: int
    iterations: pl.DataFrame  # one row per iteration: windows, scalar metrics
    categories: pl.DataFrame  # iteration, category, dur_ns
    launch_calls: pl.DataFrame  # iteration, api, n, dur_ns
    ops: pl.DataFrame  # owned GPU ops with iteration, category, owner, launch_api, launch_ts_ns
    bubbles: pl.DataFrame  # iteration, start_ns, dur_ns, cause, cpu_ops
    syncs: pl.DataFrame  # iteration, api, kind (sync|sync_copy), direction, ts_ns, blocked_ns, trigger, stack
    phases: pl.DataFrame = field(default_factory=lambda: pl.DataFrame(schema={"iteration": pl.Int64, "phase": pl.String, "dur_ns": pl.Int64}))
    warnings: list[str] = field(default_factory=list)
    device_timeline: str = "gpu"  # "cpu": a CPU-only trace, outermost aten ops stand in for device ops
    input_sha256: str | None = None  # of the trace file, when ingest knew it (cached); else summary hashes it
    # GPU ops outside every iteration: gpu_ops, gpu_ns (their busy union), before_first, after_last,
    # no_launch_in_trace; plus device_busy_ns, the device's busy union over the whole trace
    outside: dict[str, int] = field(default_factory=dict)
    device_records: str = "present"  # "missing": launch calls but no GPU activity records; "none": CPU-only


def cpu_as_device(trace: Trace, iterations: pl.DataFrame) -> Trace:
    """A CPU-only trace seen as a device timeline: the outermost `cpu_op`s on the threads that carry
    the iteration markers become the ops (each its own launch), so busy/idle, bubbles and categories
    mean "time in aten ops" vs "time in Python between them" on a CPU engine."""
    from dataclasses import replace

    cpu = trace.cpu
    marker_names = set(iterations["marker"].to_list())
    tids = cpu.filter(pl.col("name").is_in(marker_names))["tid"].unique().to_list()
    ops = cpu.filter(pl.col("cat") == "cpu_op")
    if tids:
        ops = ops.filter(pl.col("tid").is_in(tids))
    ops = (
        ops.sort("tid", "ts_ns", pl.col("end_ns"), descending=[False, False, True])
        .with_columns(pl.col("end_ns").cum_max().shift(1).over("tid").alias("_prev"))
        .filter(pl.col("_prev").is_null() | (pl.col("ts_ns") >= pl.col("_prev")))
        .sort("ts_ns")
        .with_columns((-pl.int_range(1, pl.len() + 1, dtype=pl.Int64)).alias("correlation"))
    )
    gpu_ops = ops.select(
        "name", pl.lit("kernel").alias("cat"), "ts_ns", "dur_ns", "end_ns", pl.lit(None, pl.Int64).alias("device"),
        pl.lit(0, pl.Int64).alias("stream"), "correlation", pl.lit(None, pl.Int64).alias("bytes"),
        pl.lit(None, pl.String).alias("direction"), pl.lit(False).alias("pageable"),
    )
    launches = ops.select(
        "name", pl.lit("cpu_op").alias("api"), "ts_ns", pl.lit(0, pl.Int64).alias("dur_ns"), pl.col("ts_ns").alias("end_ns"),
        "pid", "tid", "correlation", pl.lit(None, pl.Int64).alias("external_id"),
    )
    calls = pl.concat([trace.calls, launches]).sort("ts_ns")
    return replace(trace, gpu_ops=gpu_ops, calls=calls)


def gpu_by_time(trace: Trace) -> Trace:
    """A trace without runtime calls: each GPU op stands as its own launch at its start time."""
    from dataclasses import replace

    ops = trace.gpu_ops.sort("ts_ns").with_columns((-pl.int_range(1, pl.len() + 1, dtype=pl.Int64)).alias("correlation"))
    calls = ops.select(
        "name", pl.lit("unknown").alias("api"), "ts_ns", pl.lit(0, pl.Int64).alias("dur_ns"), pl.col("ts_ns").alias("end_ns"),
        pl.lit("").alias("pid"), pl.lit("").alias("tid"), "correlation", pl.lit(None, pl.Int64).alias("external_id"),
    )
    return replace(trace, gpu_ops=ops, calls=calls)


def analyze_trace(trace: Trace, *, marker: str | None = None, min_bubble_us: float = 2.0, catalog: Any = None) -> RankAnalysis:
    """Analyze one rank. `catalog`: a profkit.catalog.Catalog, or None to auto-pick by kernel names."""
    from profkit.catalog import auto_catalog

    warnings = list(trace.warnings)
    its = find_iterations(trace, marker=marker)
    warnings.extend(its.warnings)
    win = its.frame
    if its.marker == WHOLE_TRACE:
        win = win.with_columns(pl.col("cpu_end_ns") + 1)

    device_timeline, device_records = "gpu", "present"
    n_launches = trace.calls.filter(pl.col("api").is_in(LAUNCH_APIS)).height if trace.gpu_ops.height == 0 else 0
    if trace.gpu_ops.height == 0 and n_launches:
        # launch calls but no activity records: the device ran, its records were lost (DESIGN.md
        # "Work outside every iteration"); not a CPU run, so no CPU timeline stands in for it
        device_records = "missing"
        kernels = trace.calls.filter(pl.col("api").is_in(KERNEL_LAUNCH_APIS | GRAPH_LAUNCH_APIS)).height
        warnings.append(
            f"the trace has {n_launches} launch calls ({kernels} kernel or graph launches) but no GPU activity records: the device "
            "records are missing (recorded with the CUPTI range profiler on, or the activity buffer overflowed); GPU time, "
            "kernel and bubble figures are 0, host-side launch and sync figures are real. Re-record with the profiler's "
            "default activities (ProfilerActivity.CUDA) and without CUPTI range profiling"
        )
    elif trace.gpu_ops.height == 0 and trace.cpu.filter(pl.col("cat") == "cpu_op").height:
        trace = cpu_as_device(trace, its.frame)
        device_timeline, device_records = "cpu", "none"
        warnings.append("CPU-only trace: the outermost aten ops on the iteration thread stand in for device ops (device_timeline: cpu)")
    elif trace.gpu_ops.height and trace.calls.height == 0:
        trace = gpu_by_time(trace)
        warnings.append("no runtime calls in the trace (GPU-only?): GPU ops are assigned to iterations by their start time, launch figures are 0")
    calls = _own_calls(trace.calls, win)
    ops = _own_ops(trace.gpu_ops, calls)  # every GPU op; iteration null when no iteration owns it
    owned_names = ops.filter(pl.col("iteration").is_not_null())["name"].unique().to_list() if ops.height else []
    if catalog is None:
        catalog = auto_catalog(owned_names)
    ops = _classify(ops, calls, trace, catalog)
    ops = ops.with_columns(op_phases(ops, trace.cpu))
    owned = ops.filter(pl.col("iteration").is_not_null())

    windows = _gpu_windows(win, owned)
    owned = owned.join(windows.select("iteration", "gpu_start_ns", "gpu_end_ns"), on="iteration", how="left")
    w = tiles(windows)
    busy = busy_by_window(ops, w)
    clocked = ops.select(pl.col("ts_ns").alias("a"), pl.col("end_ns").alias("b"), pl.col("category").fill_null("other"), "phase")
    categories = by_window(clocked, w, ("category",))
    phases = by_window(clocked, w, ("phase",))
    spill = owned_and_spill(owned)
    outside = _outside(ops, win)
    rows_cache: dict = {}  # spans.thread_rows of trace.cpu / trace.calls, shared by the two below
    syncs = _syncs(trace, calls, ops, rows_cache)
    bubbles = _bubbles(trace, ops, calls, windows, syncs, int(round(min_bubble_us * 1000)), rows_cache)

    per = _per_iteration(win, windows, busy, categories, spill, owned, calls, syncs, bubbles)
    launch_calls = (
        calls.filter(pl.col("iteration").is_not_null() & pl.col("api").is_in(LAUNCH_APIS))
        .group_by("iteration", "api")
        .agg(pl.len().cast(pl.Int64).alias("n"), pl.col("dur_ns").sum())
        .sort("iteration", "api")
    )
    if owned.height == 0 and device_records == "present":
        warnings.append("no GPU ops launched inside the iterations (a CPU-only trace?): GPU figures are 0")
    share = outside["gpu_ns"] / outside["device_busy_ns"] if outside["device_busy_ns"] else 0.0
    if device_timeline == "gpu" and share > 0.01:
        parts = [f"{outside[k]} {label}" for k, label in (("before_first", "launched before the first iteration"),
                                                          ("after_last", "launched after the last"),
                                                          ("no_launch_in_trace", "with no launch call in the trace")) if outside[k]]
        warnings.append(
            f"{outside['gpu_ops']} GPU ops ({outside['gpu_ns'] / 1000:,.1f} µs, {100 * share:.1f}% of the device's busy time) ran "
            f"outside every iteration: {', '.join(parts)}; their time inside a GPU window is counted there by the clock, "
            "their counts in no iteration (see outside_iterations)"
        )
    return RankAnalysis(
        rank=trace.rank, device=trace.device, path=trace.path, marker=its.marker, catalog=getattr(catalog, "name", str(catalog)),
        t0_ns=trace.t0_ns, iterations=per, categories=categories, launch_calls=launch_calls,
        ops=owned, bubbles=bubbles, syncs=syncs, phases=phases, warnings=warnings,
        device_timeline=device_timeline, input_sha256=getattr(trace, "sha256", None), outside=outside,
        device_records=device_records,
    )


def _outside(ops: pl.DataFrame, win: pl.DataFrame) -> dict[str, int]:
    """GPU ops no iteration owns, by why: launched before the first iteration's window, after the
    last one's, or with no launch call in the trace; their count and busy union."""
    out = ops.filter(pl.col("iteration").is_null())
    first = win["cpu_start_ns"].min() if win.height else None
    no_launch = out.filter(pl.col("launch_ts_ns").is_null()).height
    before = out.filter(pl.col("launch_ts_ns") < first).height if first is not None else 0
    return {
        "gpu_ops": out.height, "gpu_ns": union_ns(out), "before_first": before,
        "after_last": out.height - no_launch - before, "no_launch_in_trace": no_launch, "device_busy_ns": union_ns(ops),
    }


def _own_calls(calls: pl.DataFrame, win: pl.DataFrame) -> pl.DataFrame:
    w = win.select("iteration", "cpu_start_ns", "cpu_end_ns").sort("cpu_start_ns")
    out = calls.sort("ts_ns").join_asof(w, left_on="ts_ns", right_on="cpu_start_ns", strategy="backward")
    return out.with_columns(
        pl.when(pl.col("ts_ns") < pl.col("cpu_end_ns")).then(pl.col("iteration")).otherwise(None).alias("iteration")
    ).drop("cpu_start_ns", "cpu_end_ns")


def _own_ops(gpu_ops: pl.DataFrame, calls: pl.DataFrame) -> pl.DataFrame:
    launches = (
        calls.filter(pl.col("correlation").is_not_null())
        .unique(subset="correlation", keep="first", maintain_order=True)
        .select(
            "correlation", "iteration", pl.col("api").alias("launch_api"), pl.col("ts_ns").alias("launch_ts_ns"),
            pl.col("tid").alias("launch_tid"),
        )
    )
    return gpu_ops.join(launches, on="correlation", how="left").sort("ts_ns")


def _classify(owned: pl.DataFrame, calls: pl.DataFrame, trace: Trace, catalog: Any) -> pl.DataFrame:
    if owned.height == 0:
        return owned.with_columns(pl.lit(None, pl.String).alias("category"), pl.lit(None, pl.String).alias("owner"),
                                  pl.lit(None, pl.String).alias("annotation"))
    ann: list[str | None] = [None] * owned.height
    if getattr(catalog, "uses_annotations", False):
        spans = trace.cpu.filter(pl.col("cat") == "user_annotation")
        has = owned["launch_ts_ns"].is_not_null() & owned["launch_tid"].is_not_null()
        pos = has.arg_true()
        sub = owned.filter(has)
        pts = sub.select(pl.col("launch_ts_ns").alias("ts_ns"), pl.col("launch_ts_ns").alias("end_ns"), pl.col("launch_tid").alias("tid"))
        idx = innermost_enclosing(pts, spans)
        names = spans["name"].to_list()
        for p, i in zip(pos.to_list(), idx):
            if i is not None:
                ann[p] = names[i]
    owned = owned.with_columns(pl.Series("annotation", ann, dtype=pl.String))
    return catalog.classify_frame(owned)


def _gpu_windows(win: pl.DataFrame, owned: pl.DataFrame) -> pl.DataFrame:
    first = owned.group_by("iteration").agg(pl.col("ts_ns").min().alias("s"), pl.col("end_ns").max().alias("e"))
    rows = win.select("iteration").join(first, on="iteration", how="left").sort("iteration")
    its, ss, es = rows["iteration"].to_list(), rows["s"].to_list(), rows["e"].to_list()
    starts: list[int | None] = []
    running: int | None = None
    for s in ss:
        if s is None:
            starts.append(None)
            continue
        running = s if running is None else max(running, s)
        starts.append(running)
    ends: list[int | None] = [None] * len(its)
    nxt: int | None = None
    last_seen = True
    for i in range(len(its) - 1, -1, -1):
        if starts[i] is None:
            continue
        if last_seen:
            ends[i] = max(starts[i], es[i])
            last_seen = False
        else:
            ends[i] = nxt
        nxt = starts[i]
    return pl.DataFrame(
        {"iteration": its, "first_op_ns": ss, "gpu_start_ns": starts, "gpu_end_ns": ends},
        schema={"iteration": pl.Int64, "first_op_ns": pl.Int64, "gpu_start_ns": pl.Int64, "gpu_end_ns": pl.Int64},
    )


def _pick(col: pl.Series, idx: list[int | None]) -> list[Any]:
    """col[i] for each i in idx (None stays None), gathering only those rows."""
    got = col.gather(pl.Series([i for i in idx], dtype=pl.Int64)).to_list() if idx else []
    return [v if i is not None else None for v, i in zip(got, idx)]


_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+>")
# A Python frame in user code, as Kineto names it: "path/file.py(123): function"
_USER_FRAME = re.compile(r"\.py\(\d+\): ")
STACK_DEPTH = 6  # frames kept: the innermost one in a .py file, then its callers
STACK_SEP = " ← "


def _user_stacks(pts: pl.DataFrame, cpu: pl.DataFrame) -> list[str | None]:
    """For each point: its enclosing Python frames in .py files (never a built-in method or an
    address), innermost first, at most STACK_DEPTH, joined by STACK_SEP; None without any."""
    out: list[str | None] = [None] * pts.height
    if pts.height == 0 or cpu.height == 0:
        return out
    py = cpu["cat"] == "python_function"
    if not py.any():
        return out
    frames = cpu.select("name", "ts_ns", "end_ns", "tid").filter(py)
    stacks = enclosing_stacks(pts, frames)  # no rows cache: `frames` is a temporary (the cache keys by id)
    names = frames["name"]
    for k, rows in enumerate(stacks):
        if not rows:
            continue
        got = [n for n in names.gather(rows).to_list() if n and _USER_FRAME.search(n)]
        if got:
            out[k] = STACK_SEP.join(got[:STACK_DEPTH])
    return out


def _syncs(trace: Trace, calls: pl.DataFrame, ops: pl.DataFrame, rows_cache: dict | None = None) -> pl.DataFrame:
    """Host-blocking calls: synchronize calls (kind sync) and blocking copies (kind sync_copy)."""
    op_info = (
        ops.filter(pl.col("cat") == "gpu_memcpy")
        .unique(subset="correlation", keep="first")
        .select("correlation", pl.col("direction").alias("op_direction"), "pageable")
    )
    c = calls.join(op_info, on="correlation", how="left")
    copies = c.filter(pl.col("api").is_in(ASYNC_COPY_APIS | BLOCKING_COPY_APIS))
    blocking = c.filter(
        pl.col("api").is_in(SYNC_APIS)
        | pl.col("api").is_in(BLOCKING_COPY_APIS)
        | (pl.col("api").is_in(ASYNC_COPY_APIS) & pl.col("pageable").fill_null(False))
    ).with_columns(pl.when(pl.col("api").is_in(SYNC_APIS)).then(pl.lit("sync")).otherwise(pl.lit("sync_copy")).alias("kind"))
    schema = {
        "iteration": pl.Int64, "api": pl.String, "kind": pl.String, "direction": pl.String, "ts_ns": pl.Int64,
        "end_ns": pl.Int64, "blocked_ns": pl.Int64, "tid": pl.String, "trigger": pl.String, "stack": pl.String,
    }
    if blocking.height == 0:
        return pl.DataFrame(schema=schema)
    pts = blocking.select("ts_ns", "end_ns", "tid")
    # the innermost cpu_op, annotation and Python frame around each call, as rows of trace.cpu
    # (one search for the three; a trace with stacks has millions of frames)
    found = innermost_enclosing_by(pts, trace.cpu, "cat", ("cpu_op", "user_annotation", "python_function"), cache=rows_cache)
    trig_idx, ann_idx = found["cpu_op"], found["user_annotation"]
    # only the rows found above, not whole columns
    op_names, op_ts = _pick(trace.cpu["name"], trig_idx), _pick(trace.cpu["ts_ns"], trig_idx)
    ann_names = _pick(trace.cpu["name"], ann_idx)
    py_names = _user_stacks(pts, trace.cpu)
    # For a sync call: the direction of the latest copy on its thread inside the same trigger op.
    copies_by_tid: dict[str, tuple[list[int], list[str | None]]] = {}
    for tid, ts, d in copies.sort("ts_ns", maintain_order=True).select("tid", "ts_ns", "op_direction").iter_rows():
        got = copies_by_tid.setdefault(tid, ([], []))
        got[0].append(ts)
        got[1].append(d)
    directions, triggers, stacks = [], [], []
    for k, (kind, tid, ts, opd) in enumerate(
        zip(blocking["kind"].to_list(), blocking["tid"].to_list(), blocking["ts_ns"].to_list(), blocking["op_direction"].to_list())
    ):
        ti = trig_idx[k]
        triggers.append(op_names[k] if ti is not None else (ann_names[k] if ann_idx[k] is not None else None))
        stacks.append(py_names[k])
        if kind == "sync_copy":
            directions.append(opd or "none")
            continue
        lo = op_ts[k] if ti is not None else None
        d = "none"
        if lo is not None and tid in copies_by_tid:
            # the latest copy on the thread starting at or before the sync, if inside the trigger op
            cts, cds = copies_by_tid[tid]
            j = bisect.bisect_right(cts, ts) - 1
            if j >= 0 and cts[j] >= lo:
                d = cds[j] or "none"
        directions.append(d)
    return blocking.select(
        "iteration", "api", "kind",
        pl.Series("direction", directions, dtype=pl.String), "ts_ns", "end_ns", pl.col("dur_ns").alias("blocked_ns"), "tid",
        pl.Series("trigger", triggers, dtype=pl.String), pl.Series("stack", stacks, dtype=pl.String),
    ).sort("ts_ns")


def _bubbles(trace: Trace, ops: pl.DataFrame, calls: pl.DataFrame, windows: pl.DataFrame, syncs: pl.DataFrame,
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
    firsts = set(windows.filter(pl.col("first_op_ns").is_not_null())["first_op_ns"].to_list())
    first_iteration = w["iteration"].min()

    # host-blocking calls per thread (None: all threads), sorted by their end
    by_end = syncs.select("tid", "ts_ns", "end_ns").sort("end_ns", "ts_ns")
    blocking: dict[str | None, tuple[list[int], list[int]]] = {}
    if by_end.height:
        for (key,), frame in by_end.partition_by("tid", as_dict=True).items():
            if key is not None:
                blocking[key] = (frame["end_ns"].to_list(), frame["ts_ns"].to_list())
    blocking[None] = (by_end["end_ns"].to_list(), by_end["ts_ns"].to_list())
    main_tid = calls.filter(pl.col("api").is_in(LAUNCH_APIS))["tid"].mode().to_list() if calls.height else []
    default_tid = main_tid[0] if main_tid else None

    g0s, g1s = gaps["g0"].to_list(), gaps["g1"].to_list()
    ltids = gaps["launch_tid"].to_list()
    causes = []
    for g0, g1, nxt_it, lts, ltid in zip(g0s, g1s, gaps["next_iteration"].to_list(), gaps["launch_ts_ns"].to_list(), ltids):
        ends, tss = blocking.get(ltid, ((), ()))
        k0, k1 = bisect.bisect_left(ends, g0 - SYNC_SLACK_NS), bisect.bisect_right(ends, g1)
        if any(tss[k] <= g0 for k in range(k0, k1)):
            cause = "sync"
        elif nxt_it is not None and nxt_it != first_iteration and g1 in firsts:
            cause = "iteration_boundary"
        elif lts is not None and lts > g0:
            cause = "launch"
        else:
            cause = "gpu_wait"
        causes.append(cause)
    cpu_lists = _gap_cpu_ops(trace, g0s, g1s, [t if t is not None else default_tid for t in ltids], rows_cache)
    # a built-in's frame names its object's address ("<built-in method x of y object at 0x7f…>"):
    # dropped, so one function is one name across bubbles and runs
    cpu_lists = [[(_ADDRESS.sub(">", n) if "at 0x" in n else n, t) for n, t in got] for got in cpu_lists]
    return gaps.select(
        "iteration", pl.col("g0").alias("start_ns"), (pl.col("g1") - pl.col("g0")).alias("dur_ns"),
        pl.Series("cause", causes, dtype=pl.String), _string_lists("cpu_ops", [[n for n, _ in got] for got in cpu_lists]),
        _string_lists("cpu_ops_ns", [[t for _, t in got] for got in cpu_lists], pl.Int64),
    )


def _string_lists(name: str, lists: list[list[Any]], dtype: Any = pl.String) -> pl.Series:
    """pl.Series(name, lists, dtype=pl.List(dtype)), built from the flat values (polars builds a
    Series per inner list otherwise)."""
    flat = pl.DataFrame(
        {"_i": [i for i, got in enumerate(lists) for _ in got], name: [v for got in lists for v in got]},
        schema={"_i": pl.Int64, name: dtype},
    )
    grouped = flat.group_by("_i", maintain_order=True).agg(pl.col(name))
    full = pl.DataFrame({"_i": pl.int_range(0, len(lists), dtype=pl.Int64, eager=True)}).join(
        grouped, on="_i", how="left", maintain_order="left"
    )
    return full.select(pl.col(name).fill_null(pl.lit([], dtype=pl.List(dtype))))[name]


# A gap's CPU ops come from the events on its thread that start before the gap ends, looking back
# at most this many events (enclosing spans that still cover the gap's start; nesting is shallow).
GAP_LOOKBACK = 4000


def _gap_cpu_ops(trace: Trace, g0s: list[int], g1s: list[int], tids: list[str | None],
                 rows_cache: dict | None = None) -> list[list[tuple[str, int]]]:
    """For each gap [g0, g1) on thread tid: the CPU ops (cpu_op, annotations, Python frames, runtime
    calls) with the most exclusive time inside it, with that time (ns). Per thread the events are ordered by (ts, end,
    name); a gap looks at the GAP_LOOKBACK events before the first one starting at or after g1 and
    keeps those ending after g0.

    Each gap's kept events are found without sorting the thread's events or looking at each row of
    the window (_gap_rows); only they (a few per gap) go to Python, ordered as exclusive_top orders
    them: by (clipped start, -clipped end), then by (ts, end, name), the order of the window."""
    out: list[list[tuple[str, int]]] = [[] for _ in g0s]
    gaps_by_tid: dict[str, list[int]] = defaultdict(list)
    for i, t in enumerate(tids):
        if t is not None:
            gaps_by_tid[t].append(i)
    srcs = (trace.cpu, trace.calls)
    for t, idx in gaps_by_tid.items():
        parts = []
        for f in srcs:
            ts, end, rows = thread_rows(f, t, cache=rows_cache)
            if len(ts):
                parts.append(_Events(f, ts, end, rows))
        if not parts:
            continue
        g0 = pl.Series("g0", [g0s[i] for i in idx], dtype=pl.Int64)
        g1 = pl.Series("g1", [g1s[i] for i in idx], dtype=pl.Int64)
        kept = _gap_rows(parts, g0, g1)
        if kept.height == 0:
            continue
        keys = ["gap", "s", "neg_e", "ts_ns", "end_ns"]
        kept = (
            kept.with_columns(g0.gather(kept["gap"]), g1.gather(kept["gap"]))
            .with_columns(pl.max_horizontal("ts_ns", "g0").alias("s"), pl.min_horizontal("end_ns", "g1").alias("e"))
            .with_columns((-pl.col("e")).alias("neg_e"))
            .sort(keys)
        )
        if kept.select(pl.all_horizontal(pl.col(k) == pl.col(k).shift(1) for k in keys).any()).item():
            kept = kept.sort(*keys, "name")  # events equal but for the name: the name decides, as in the window
        tops = exclusive_sweeps(kept["gap"].to_list(), kept["s"].to_list(), kept["e"].to_list(), kept["name"].to_list(),
                                g0.to_list(), g1.to_list(), times=True)
        for g, names in tops.items():
            out[idx[g]] = names
    return out


@dataclass
class _Events:
    """One table's events on one thread, ordered by start: thread_rows' (ts, end, row)."""

    table: pl.DataFrame
    ts: pl.Series
    end: pl.Series
    rows: pl.Series | None  # row in `table` (None: the position itself)

    def pick(self, pos: pl.Series) -> pl.DataFrame:
        """ts_ns, end_ns and name of the events at these positions."""
        rows = pos if self.rows is None else self.rows.gather(pos)
        return pl.DataFrame({"ts_ns": self.ts.gather(pos), "end_ns": self.end.gather(pos), "name": self.table["name"].gather(rows)})


def _order_stat(parts: list[_Events], pos: pl.Series) -> pl.Series:
    """The start at each position of the parts' events merged by start (a valid position each)."""
    if len(parts) == 1:
        return parts[0].ts.gather(pos)
    assert len(parts) == 2
    big, small = sorted(parts, key=lambda p: -len(p.ts))
    # where the small part's events go in the merge (before the big part's at equal starts)
    at = big.ts.search_sorted(small.ts, side="left").cast(pl.Int64) + pl.int_range(0, len(small.ts), dtype=pl.Int64, eager=True)
    c = at.search_sorted(pos, side="left").cast(pl.Int64)  # small events before pos
    cc = c.clip(upper_bound=len(at) - 1)
    is_small = (c < len(at)) & (at.gather(cc) == pos)
    from_big = big.ts.gather((pos - c).clip(0, len(big.ts) - 1))
    return pl.select(pl.when(is_small).then(small.ts.gather(cc)).otherwise(from_big)).to_series()


def _gap_rows(parts: list[_Events], g0: pl.Series, g1: pl.Series) -> pl.DataFrame:
    """The events (gap, ts_ns, end_ns, name) in each gap's window that end after its g0, in no order.

    The window is positions [lo, j) of the thread's events in (ts, end, name) order: j counts the
    events starting before g1, lo = j - GAP_LOOKBACK. With x the start at position lo, those are
    the events starting in (x, g1), plus those starting at x, unless the group of events starting
    at x straddles lo: then only its last ones in (end, name) order, as the full order has them.
    Per part, that is an index range of its start-ordered events. Of it, the events starting at or
    after g0 are all looked at; of those starting before g0, the ones ending after g0 are found
    with a MaxTree of the ends (the open enclosing spans), not by looking at the whole lookback."""
    js = [p.ts.search_sorted(g1, side="left").cast(pl.Int64) for p in parts]
    total = sum(js[1:], js[0])
    lo = (total - GAP_LOOKBACK).clip(lower_bound=0)
    has = lo < total
    x = _order_stat(parts, pl.select(pl.when(has).then(lo).otherwise(0)).to_series())
    a_s = [p.ts.search_sorted(x, side="left").cast(pl.Int64) for p in parts]
    b_s = [p.ts.search_sorted(x, side="right").cast(pl.Int64) for p in parts]
    before = sum(a_s[1:], a_s[0])
    straddle = has & (before < lo)
    gap = pl.int_range(0, len(g0), dtype=pl.Int64, eager=True)
    found = []
    for p, j, a, b in zip(parts, js, a_s, b_s):
        start = pl.select(pl.when(~has).then(j).when(straddle).then(b).otherwise(a)).to_series()
        p0 = p.ts.search_sorted(g0, side="left").cast(pl.Int64).clip(upper_bound=j).rename("p0")
        p0 = pl.select(pl.max_horizontal(p0, start)).to_series()  # [start, p0): before g0; [p0, j): at or after
        inside = (
            pl.DataFrame({"q": gap, "r": pl.int_ranges(p0, j, dtype=pl.Int64, eager=True)})
            .explode("r").drop_nulls("r")
        )
        inside = inside.filter(p.end.gather(inside["r"]) > g0.gather(inside["q"]))
        opened = MaxTree(p.end).above(pl.DataFrame({"q": gap, "lo": start, "hi": p0, "thr": g0}))
        pos = pl.concat([inside.rename({"r": "row"}), opened])
        found.append(pl.concat([pos.select(pl.col("q").alias("gap")), p.pick(pos["row"])], how="horizontal"))
    for g in straddle.arg_true().to_list():
        # the group starting at x straddles lo: its first lo - before in (end, name) order are out
        grp = []
        for p, a, b in zip(parts, a_s, b_s):
            got = p.pick(pl.int_range(a[g], b[g], dtype=pl.Int64, eager=True))
            grp.extend(zip(got["end_ns"].to_list(), got["name"].to_list(), got["ts_ns"].to_list()))
        grp.sort(key=lambda e: (e[0], e[1]))
        keep = [e for e in grp[lo[g] - before[g]:] if e[0] > g0[g]]
        if keep:
            found.append(pl.DataFrame({"gap": [g] * len(keep), "ts_ns": [e[2] for e in keep], "end_ns": [e[0] for e in keep],
                                       "name": [e[1] for e in keep]},
                                      schema={"gap": pl.Int64, "ts_ns": pl.Int64, "end_ns": pl.Int64, "name": pl.String}))
    return pl.concat(found)


def _per_iteration(win, windows, busy, categories, spill, owned, calls, syncs, bubbles) -> pl.DataFrame:
    it = win.join(windows, on="iteration", how="left").join(busy, on="iteration", how="left").join(spill, on="iteration", how="left")
    it = it.with_columns(
        pl.when(pl.col("gpu_start_ns").is_not_null()).then(pl.col("gpu_end_ns") - pl.col("gpu_start_ns")).otherwise(0).alias("gpu_window_ns"),
        pl.col("gpu_busy_ns").fill_null(0),
        (pl.col("cpu_end_ns") - pl.col("cpu_start_ns")).alias("wall_ns"),
    ).with_columns((pl.col("gpu_window_ns") - pl.col("gpu_busy_ns")).alias("gpu_idle_ns"))
    it = it.join(categories.group_by("iteration").agg(pl.col("dur_ns").sum().alias("category_sum_ns")), on="iteration", how="left")

    o = owned.group_by("iteration").agg(
        (pl.col("cat") == "kernel").sum().cast(pl.Int64).alias("gpu_kernels"),
        *[((pl.col("cat") == "gpu_memcpy") & (pl.col("direction") == d)).sum().cast(pl.Int64).alias(f"memcpy_{d}") for d in DIRECTIONS],
        (pl.col("cat") == "gpu_memset").sum().cast(pl.Int64).alias("memset"),
    )
    lat = (
        owned.filter(pl.col("launch_api").is_in(LAUNCH_APIS))
        .group_by("iteration", "correlation")
        .agg((pl.col("ts_ns").min() - pl.col("launch_ts_ns").first()).alias("lat"))
        .group_by("iteration")
        .agg(pl.col("lat").median().alias("launch_latency_ns_p50"))
    )
    owned_calls = calls.filter(pl.col("iteration").is_not_null())
    cl = owned_calls.group_by("iteration").agg(
        pl.col("api").is_in(KERNEL_LAUNCH_APIS).sum().cast(pl.Int64).alias("kernel_launches"),
        pl.col("api").is_in(GRAPH_LAUNCH_APIS).sum().cast(pl.Int64).alias("graph_launches"),
        pl.col("dur_ns").filter(pl.col("api").is_in(LAUNCH_APIS)).sum().alias("launch_ns"),
    )
    sy = syncs.filter(pl.col("iteration").is_not_null()).group_by("iteration").agg(
        (pl.col("kind") == "sync").sum().cast(pl.Int64).alias("syncs"),
        pl.col("blocked_ns").filter(pl.col("kind") == "sync").sum().alias("sync_ns"),
        (pl.col("kind") == "sync_copy").sum().cast(pl.Int64).alias("sync_copies"),
        pl.col("blocked_ns").filter(pl.col("kind") == "sync_copy").sum().alias("sync_copy_ns"),
    )
    bb = bubbles.filter(pl.col("iteration").is_not_null()).group_by("iteration").agg(
        pl.len().cast(pl.Int64).alias("bubble_count"),
        pl.col("dur_ns").sum().alias("bubble_ns"),
        *[pl.col("dur_ns").filter(pl.col("cause") == c).sum().alias(f"bubble_{c}_ns") for c in CAUSES],
    )
    for f in (o, lat, cl, sy, bb):
        it = it.join(f, on="iteration", how="left")
    ints = [
        "category_sum_ns", "gpu_kernels", *[f"memcpy_{d}" for d in DIRECTIONS], "memset", "kernel_launches", "graph_launches",
        "launch_ns", "syncs", "sync_ns", "sync_copies", "sync_copy_ns", "bubble_count", "bubble_ns", *[f"bubble_{c}_ns" for c in CAUSES],
        "owned_gpu_ns", "spill_ns",
    ]
    it = it.with_columns([pl.col(c).fill_null(0).cast(pl.Int64) for c in ints])
    it = it.with_columns((pl.col("category_sum_ns") - pl.col("gpu_busy_ns")).alias("overlap_ns"))
    return it.sort("iteration")
