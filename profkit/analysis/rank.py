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
from profkit.analysis.spans import enclosing_stacks, innermost_enclosing, innermost_enclosing_by, thread_rows
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
    graph_capture: dict[str, Any] | None = None  # analysis/graphs.py: replayed ops mapped to their capture (with a capture profile)


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


def analyze_trace(trace: Trace, *, marker: str | None = None, min_bubble_us: float = 2.0, catalog: Any = None,
                  captures: Any = None) -> RankAnalysis:
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
    ops = _classify(ops, calls, trace, catalog, captures)
    gcap = trace.meta.pop("_graph_capture", None)
    if gcap is not None and gcap["replays_refused"]:
        warnings.append(
            f"graph capture: {gcap['replays_refused']} of {gcap['replays']} graph replays match no captured graph "
            f"({'; '.join(r['why'] for r in gcap['refused'][:3])}); their {gcap['unmapped_us']:,.1f} µs keep the name rules, "
            f"{gcap['unmapped_other_us']:,.1f} µs of it in \"other\"")
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
        device_records=device_records, graph_capture=gcap,
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


def _classify(owned: pl.DataFrame, calls: pl.DataFrame, trace: Trace, catalog: Any, captures: Any = None) -> pl.DataFrame:
    if owned.height == 0:
        return owned.with_columns(pl.lit(None, pl.String).alias("category"), pl.lit(None, pl.String).alias("owner"),
                                  pl.lit(None, pl.String).alias("annotation"))
    ann: list[str | None] = [None] * owned.height
    if getattr(catalog, "uses_annotations", False):
        spans = trace.cpu.filter(pl.col("cat") == "user_annotation")
        got = _launch_annotations(owned, spans)
        if got is not None:
            ann = got
        else:
            has = owned["launch_ts_ns"].is_not_null() & owned["launch_tid"].is_not_null()
            pos = has.arg_true()
            sub = owned.filter(has)
            pts = sub.select(pl.col("launch_ts_ns").alias("ts_ns"), pl.col("launch_ts_ns").alias("end_ns"), pl.col("launch_tid").alias("tid"))
            idx = innermost_enclosing(pts, spans)
            names = spans["name"].to_list()
            for p, i in zip(pos.to_list(), idx):
                if i is not None:
                    ann[p] = names[i]
    mask = None
    if captures is not None:  # graph-replayed ops take their capture-time ranges (analysis/graphs.py)
        from profkit.analysis import graphs

        ann, mask, gstats = graphs.apply(owned, trace, captures, ann.to_list() if isinstance(ann, pl.Series) else ann)
    owned = owned.with_columns(ann if isinstance(ann, pl.Series) else pl.Series("annotation", ann, dtype=pl.String))
    out = catalog.classify_frame(owned)
    if mask is not None:
        trace.meta["_graph_capture"] = graphs.finish_stats(gstats, out, mask, captures)
    return out


def _launch_annotations(ops: pl.DataFrame, spans: pl.DataFrame) -> pl.Series | None:
    """The innermost user annotation around each op's launch (spans.innermost_enclosing of the
    launch points), one sweep per thread in the native library; None without it."""
    from profkit.ingest import scan

    if scan.lib() is None:
        return None
    pts = ops.select(pl.int_range(0, pl.len(), dtype=pl.Int64).alias("_i"), pl.col("launch_ts_ns").alias("t"), pl.col("launch_tid").alias("tid"))
    pts = pts.filter(pl.col("t").is_not_null() & pl.col("tid").is_not_null())
    out = [pl.DataFrame(schema={"_i": pl.Int64, "annotation": pl.String})]
    sp = spans.select("name", "ts_ns", "end_ns", "tid").filter(pl.col("ts_ns").is_not_null() & pl.col("end_ns").is_not_null())
    for (tid,), mine in pts.group_by("tid"):
        s = sp.filter(pl.col("tid") == tid).with_columns(pl.int_range(0, pl.len(), dtype=pl.Int64).alias("_r")).sort(
            "ts_ns", "end_ns", "_r", descending=[False, True, False])
        if s.height == 0:
            continue
        mine = mine.sort("t")
        at = scan.point_owner(s["ts_ns"].to_numpy(), s["end_ns"].to_numpy(), mine["t"].to_numpy())
        hit = pl.Series(at)
        keep = hit >= 0
        out.append(pl.DataFrame({"_i": mine["_i"].filter(keep), "annotation": s["name"].gather(hit.filter(keep))}))
    got = pl.concat(out)
    full = pl.DataFrame({"_i": pl.int_range(0, ops.height, dtype=pl.Int64, eager=True)}).join(got, on="_i", how="left", maintain_order="left")
    return full["annotation"]


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
    ops_of = _gap_cpu_ops(trace, gaps["g0"], gaps["g1"], tids, rows_cache)
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


GAP_TOP = 3  # CPU ops kept per gap


def _gap_cpu_ops(trace: Trace, g0s: pl.Series, g1s: pl.Series, tids: pl.Series,
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
        for f in (trace.cpu, trace.calls):
            ts, end, rows = thread_rows(f, t, cache=rows_cache)
            if len(ts):
                parts.append(pl.DataFrame({"ts": ts, "end": end, "name": f["name"] if rows is None else f["name"].gather(rows)}))
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
