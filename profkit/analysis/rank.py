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

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import polars as pl

from profkit.documents import CaptureFacts, GraphCaptureStats, OverlapSlack, RankSpec
from profkit.apis import GRAPH_LAUNCH_APIS, KERNEL_LAUNCH_APIS, LAUNCH_APIS
from profkit.analysis.bubbles import find_bubbles, name_ids
from profkit.analysis.clock import busy_by_window, by_windows, device_union, length_ns, owned_and_spill, tiles
from profkit.analysis.iterations import WHOLE_TRACE, find_iterations
from profkit.analysis.owned import owned_by
from profkit.analysis.ownership import gpu_windows, outside_work, own_calls, own_ops
from profkit.analysis.phases import op_phases
from profkit.analysis.spans import innermost_enclosing
from profkit.analysis.syncs import find_syncs
from profkit.ingest import Trace
from profkit.terms import CAUSES

if TYPE_CHECKING:
    from profkit.analysis.catalog import Catalog

DIRECTIONS = ("h2d", "d2h", "d2d", "other")


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
    # by ownership (analysis/owned.py): each iteration's own ops, unclipped, per category / phase
    owned_categories: pl.DataFrame = field(default_factory=lambda: pl.DataFrame(schema={"iteration": pl.Int64, "category": pl.String, "dur_ns": pl.Int64}))
    owned_phases: pl.DataFrame = field(default_factory=lambda: pl.DataFrame(schema={"iteration": pl.Int64, "phase": pl.String, "dur_ns": pl.Int64}))
    warnings: list[str] = field(default_factory=list)
    device_timeline: str = "gpu"  # "cpu": a CPU-only trace, outermost aten ops stand in for device ops
    input_sha256: str | None = None  # of the trace file, when ingest knew it (cached); else summary hashes it
    # GPU ops outside every iteration: gpu_ops, gpu_ns (their busy union), before_first, after_last,
    # no_launch_in_trace; plus device_busy_ns, the device's busy union over the whole trace
    outside: dict[str, int] = field(default_factory=dict)
    device_records: str = "present"  # "missing": launch calls but no GPU activity records; "none": CPU-only, or nothing at all
    graph_capture: GraphCaptureStats | None = None  # analysis/graphs.py: replayed ops mapped to their capture (with a capture profile)
    source: dict[str, Any] | None = None  # what the input was read from when not a Kineto trace (an nsys export: ingest/nsys.py)
    stub_markers: int = 0  # marker spans cut by the profiler's stop, dropped (analysis/iterations.py)
    overlap_slack: OverlapSlack | None = None  # analysis/slack.py: every transition N -> N+1 and the rank's statistics
    capture: CaptureFacts | None = None  # analysis/health.py: the facts capture health is judged on
    speculative: RankSpec | None = None  # analysis/spec.py: the verify iterations' owned GPU time by phase, wall time
    # recorded with shapes: every GPU op of the device (owned or not) with its category, owner, times and work
    # (analysis/work.py), what analysis/floor.py turns into each iteration's floor and gap; None without shapes
    device_work: pl.DataFrame | None = None


def cpu_as_device(trace: Trace, iterations: pl.DataFrame) -> Trace:
    """A CPU-only trace seen as a device timeline: the outermost `cpu_op`s on the threads that carry
    the iteration markers become the ops (each its own launch), so busy/idle, bubbles and categories
    mean "time in aten ops" vs "time in Python between them" on a CPU engine."""
    from dataclasses import replace

    cpu = trace.cpu
    marker_names = set(iterations["marker"].to_list())
    tids = cpu.filter(pl.col("name").is_in(marker_names))["tid"].unique().to_list()
    every = cpu.filter(pl.col("cat") == "cpu_op")
    if tids:
        every = every.filter(pl.col("tid").is_in(tids))
    ops = _open_compiled(every, _outermost(every))
    ops = ops.sort("ts_ns").with_columns((-pl.int_range(1, pl.len() + 1, dtype=pl.Int64)).alias("correlation"))
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


# torch.compile's wrapper of a compiled graph: on a CPU-only trace it is the outermost op of the
# whole model forward (vLLM 0.32 compiled: 57% of the CPU op time in one "## Call CompiledFxGraph ... ##"),
# so it is opened (_open_compiled)
COMPILED_REGION = r"^(## Call CompiledFxGraph\b|Torch-Compiled Region\b)"
COMPILED_CODE = "compiled code (Inductor, inside a compiled graph)"


def _outermost(ops: pl.DataFrame) -> pl.DataFrame:
    """The ops no other op of their thread encloses."""
    return (
        ops.sort("tid", "ts_ns", pl.col("end_ns"), descending=[False, False, True])
        .with_columns(pl.col("end_ns").cum_max().shift(1).over("tid").alias("_prev"))
        .filter(pl.col("_prev").is_null() | (pl.col("ts_ns") >= pl.col("_prev")))
        .drop("_prev")
    )


def _open_compiled(every: pl.DataFrame, outer: pl.DataFrame) -> pl.DataFrame:
    """Outermost ops with each compiled-graph wrapper replaced by what ran inside it: its outermost
    ops (the engine's custom ops the graph calls: GEMMs, attention), and, for the time inside it that
    no op covers, ops named COMPILED_CODE (Inductor's generated C++: the fused norms, rope,
    activations and adds, which the profiler does not record as ops). They tile the wrapper, so the
    busy time is the wrapper's, exactly."""
    is_wrap = pl.col("name").str.contains(COMPILED_REGION)
    wraps = outer.filter(is_wrap).select("tid", pl.col("ts_ns").alias("w0"), pl.col("end_ns").alias("w1"), pl.col("name").alias("wname"))
    if wraps.height == 0:
        return outer
    inside = (
        every.filter(~is_wrap).sort("ts_ns")
        .join_asof(wraps.sort("w0"), left_on="ts_ns", right_on="w0", by="tid", strategy="backward", check_sortedness=False)
        .filter(pl.col("w1").is_not_null() & (pl.col("end_ns") <= pl.col("w1")))
    )
    children = _outermost(inside.drop("w0", "w1", "wname"))
    cols = outer.columns
    rows: list[dict[str, object]] = []
    kids = children.sort("tid", "ts_ns").select("tid", "ts_ns", "end_ns").rows()
    template = outer.filter(is_wrap).sort("tid", "ts_ns").to_dicts()
    k = 0
    for w in template:
        t, w0, w1 = w["tid"], w["ts_ns"], w["end_ns"]
        while k < len(kids) and (kids[k][0], kids[k][1]) < (t, w0):
            k += 1
        at = w0
        while k < len(kids) and kids[k][0] == t and kids[k][1] < w1:
            if kids[k][1] > at:
                rows.append({**w, "name": COMPILED_CODE,
                             "ts_ns": at, "dur_ns": kids[k][1] - at, "end_ns": kids[k][1]})
            at = max(at, kids[k][2])
            k += 1
        if w1 > at:
            rows.append({**w, "name": COMPILED_CODE,
                         "ts_ns": at, "dur_ns": w1 - at, "end_ns": w1})
    code = pl.DataFrame(rows, schema=outer.schema) if rows else outer.clear()
    return pl.concat([outer.filter(~is_wrap), children.select(cols), code.select(cols)])


def gpu_by_time(trace: Trace) -> Trace:
    """A trace without runtime calls: each GPU op stands as its own launch at its start time."""
    from dataclasses import replace

    ops = trace.gpu_ops.sort("ts_ns").with_columns((-pl.int_range(1, pl.len() + 1, dtype=pl.Int64)).alias("correlation"))
    calls = ops.select(
        "name", pl.lit("unknown").alias("api"), "ts_ns", pl.lit(0, pl.Int64).alias("dur_ns"), pl.col("ts_ns").alias("end_ns"),
        pl.lit("").alias("pid"), pl.lit("").alias("tid"), "correlation", pl.lit(None, pl.Int64).alias("external_id"),
    )
    return replace(trace, gpu_ops=ops, calls=calls)


def analyze_trace(trace: Trace, *, marker: str | None = None, min_bubble_us: float = 2.0, catalog: Catalog | None = None,
                  captures: Any = None, digest: bool = True) -> RankAnalysis:
    """Analyze one rank. `catalog`: a profkit.analysis.catalog.Catalog, or None to auto-pick by kernel names.
    `digest`: hash the trace file meanwhile for summary.json's inputs (False when no summary follows)."""
    from profkit.analysis.catalog import auto_catalog

    warnings = list(trace.warnings)
    wait_digest = _digest_meanwhile(trace.path) if digest and getattr(trace, "sha256", None) is None else None
    rows_cache: dict = {}  # spans.thread_rows and bubbles.name_ids of trace.cpu / trace.calls, shared by the syncs, bubbles and slack
    # the bubbles' names, found while the iterations are (a core is idle there)
    names_found = _meanwhile(name_ids, trace, rows_cache) if trace.gpu_ops.height and trace.calls.height else None
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
    elif trace.gpu_ops.height == 0:
        # no GPU activity record, no launch call and no aten op: nothing ran on a device, and nothing
        # stands in for one (the records are not missing: there is no sign of any)
        device_records = "none"
        warnings.append("no GPU activity records, no launch calls and no CPU ops in the trace: nothing ran on a device, "
                        "every device figure is 0 (record with ProfilerActivity.CUDA, or ProfilerActivity.CPU for aten ops)")
    elif trace.gpu_ops.height and trace.calls.height == 0:
        trace = gpu_by_time(trace)
        device_timeline = "gpu_by_time"  # reset below: only slack needs to know (no launch calls, no slack)
        warnings.append("no runtime calls in the trace (GPU-only?): GPU ops are assigned to iterations by their start time, launch figures are 0")
    calls = own_calls(trace.calls, win)
    ops = own_ops(trace.gpu_ops, calls)  # every GPU op; iteration null when no iteration owns it
    pre_owned = ops.filter(pl.col("iteration").is_not_null())
    windows = gpu_windows(win, pre_owned)
    # the host side (syncs, then the bubbles that need them) reads the ops' times, ownership and
    # copies, not their categories: found in threads while the categories, phases and the clock's
    # figures are worked out here (polars releases the GIL; one core is often idle otherwise)
    min_ns = int(round(min_bubble_us * 1000))
    syncs_of = _meanwhile(find_syncs, trace, calls, ops, rows_cache)
    bubbles_of = _meanwhile(find_bubbles, trace, ops, calls, windows, syncs_of, min_ns, rows_cache)  # the syncs read last
    phase_of = _meanwhile(op_phases, ops, trace.cpu)  # from the launches' spans: the categories are not needed either
    names = name_codes(ops["name"]) if ops.height else None  # the names' codes, for the catalog's choice and its rules
    if catalog is None:
        catalog = auto_catalog(pre_owned["name"].gather(names.filter(ops["iteration"].is_not_null()).arg_unique()).to_list()
                               if names is not None else [])
    ops, gcap, replay_shapes = _classify(ops, trace, catalog, captures, names)
    if trace.meta.get("shapes") or replay_shapes:  # recorded with shapes: each op's launching CPU op and its shapes
        from profkit.analysis.shapes import attach_shapes

        ops = attach_shapes(ops, trace, replay_shapes)
    device_work = None
    if "shape" in ops.columns and ops["shape"].is_not_null().any():  # each op's FLOPs and bytes (analysis/work.py)
        from profkit.analysis.work import WORK_COLUMNS, attach_work

        device_work = attach_work(ops).select("ts_ns", "end_ns", "dur_ns", "category", "iteration", "shape_op", "shape", "shape_dtypes",
                                              *WORK_COLUMNS)
    if gcap is not None and gcap.replays_refused:
        warnings.append(
            f"graph capture: {gcap.replays_refused} of {gcap.replays} graph replays match no captured graph "
            f"({'; '.join(r.why for r in gcap.refused[:3])}); their {gcap.unmapped_us:,.1f} µs keep the name rules, "
            f"{gcap.unmapped_other_us:,.1f} µs of it in \"other\"")
    if gcap is not None and gcap.replays_shape_ambiguous:
        warnings.append(
            f"graph capture: {gcap.replays_shape_ambiguous} of {gcap.replays} graph replays match several captured graphs of "
            "their step with as many ops but other shapes (context-width buckets): the launch count cannot say which ran, so "
            "their ops take no shapes (no work, they count as unmodeled); give only the captures of the buckets the window ran "
            "(--capture FILE ...) to model them")
    ops = ops.with_columns(phase_of())  # _classify keeps the rows and their order
    owned = _with_window(ops.filter(pl.col("iteration").is_not_null()), windows)
    # the capture-health facts and the overlap slack, in threads from here (the slack once the syncs are found)
    capture_of = _meanwhile(_health, trace, ops, calls, win, windows, its, device_timeline, device_records)
    slack_of = _meanwhile(_slack, trace, owned, win, syncs_of, rows_cache) if device_timeline == "gpu" and owned.height else None
    w = tiles(windows)
    union = device_union(ops)  # once: busy per window, and the whole trace's busy time below
    busy = busy_by_window(union, w)
    clocked = ops.select(pl.col("ts_ns").alias("a"), pl.col("end_ns").alias("b"), pl.col("category").fill_null("other"), "phase")
    categories, phases = by_windows(clocked, w, ("category",), ("phase",))
    spill = owned_and_spill(owned)
    outside = outside_work(ops, win, length_ns(union))
    syncs, bubbles = syncs_of(), bubbles_of()
    # host calls outside every iteration: with the ops above, iterations plus outside are the whole trace
    outside["launch_calls"] = int(calls.select((pl.col("iteration").is_null() & pl.col("api").is_in(LAUNCH_APIS)).sum()).item())
    loose = syncs.filter(pl.col("iteration").is_null())
    outside["syncs"], outside["sync_copies"] = int((loose["kind"] == "sync").sum()), int((loose["kind"] == "sync_copy").sum())
    if device_timeline == "cpu":
        # each aten op is its own "launch" at its own start, so "the next op was launched late" is
        # true of every gap: it was Python (or the scheduler's code) between ops, not a launch
        bubbles = bubbles.with_columns(
            pl.when(pl.col("cause").is_in(["launch", "gpu_wait"])).then(pl.lit("python")).otherwise(pl.col("cause")).alias("cause"))
    if device_timeline == "gpu_by_time":
        device_timeline = "gpu"

    per = _per_iteration(win, windows, busy, categories, spill, owned, calls, syncs, bubbles)
    from profkit.analysis.spec import rank_spec

    speculative = rank_spec(owned, per) if device_timeline == "gpu" else None
    launch_calls = (
        calls.lazy().filter(pl.col("iteration").is_not_null() & pl.col("api").is_in(LAUNCH_APIS))
        .group_by("iteration", "api")
        .agg(pl.len().cast(pl.Int64).alias("n"), pl.col("dur_ns").sum())
        .sort("iteration", "api").collect()
    )
    owned_categories, owned_phases = owned_by(owned, "category"), owned_by(owned, "phase")
    overlap_slack, capture = slack_of() if slack_of else None, capture_of()
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
    if names_found is not None:
        names_found()  # done by now (the bubbles and slack waited for it), unless there was no gap: nothing left running
    return RankAnalysis(
        rank=trace.rank, device=trace.device, path=trace.path, marker=its.marker, catalog=getattr(catalog, "name", str(catalog)),
        t0_ns=trace.t0_ns, iterations=per, categories=categories, launch_calls=launch_calls,
        ops=owned, bubbles=bubbles, syncs=syncs, phases=phases, warnings=warnings,
        owned_categories=owned_categories, owned_phases=owned_phases,
        device_timeline=device_timeline, input_sha256=getattr(trace, "sha256", None) or (wait_digest() if wait_digest else None), outside=outside,
        device_records=device_records, graph_capture=gcap, source=trace.meta.get("source"), stub_markers=its.stub_markers,
        overlap_slack=overlap_slack, capture=capture, speculative=speculative, device_work=device_work,
    )


def _with_window(owned: pl.DataFrame, windows: pl.DataFrame) -> pl.DataFrame:
    """The owned ops with their iteration's gpu_start_ns and gpu_end_ns (a join on the iteration; a
    gather when the windows are iterations 0, 1, ... in order, as gpu_windows makes them)."""
    cols = windows.select("iteration", "gpu_start_ns", "gpu_end_ns")
    if cols["iteration"].equals(pl.int_range(0, cols.height, dtype=pl.Int64, eager=True).alias("iteration")):
        at = owned["iteration"]
        return owned.with_columns(cols["gpu_start_ns"].gather(at), cols["gpu_end_ns"].gather(at))
    return owned.join(cols, on="iteration", how="left")


def _slack(trace: Trace, owned: pl.DataFrame, win: pl.DataFrame, syncs_of: Any, rows_cache: dict) -> OverlapSlack:
    """Overlap slack (analysis/slack.py; GPU timelines with launch calls only). `syncs_of`: waits for the syncs and returns them."""
    from profkit.analysis import slack

    t = slack.transitions(owned)
    return slack.rank_slack(t, slack.broken_by(trace, t, syncs_of(), rows_cache), win)


def _health(trace: Trace, ops: pl.DataFrame, calls: pl.DataFrame, win: pl.DataFrame, windows: pl.DataFrame, its: Any,
            device_timeline: str, device_records: str) -> CaptureFacts:
    """The capture-health facts (analysis/health.py; the stubs the iteration finder dropped, when it says)."""
    from profkit.analysis import health

    return health.rank_facts(trace, ops, calls, win, windows, "gpu" if device_timeline == "gpu_by_time" else device_timeline,
                             device_records, int(getattr(its, "stub_markers", 0) or 0))


def _meanwhile(fn: Any, *args: Any) -> Any:
    """fn(*args) in a thread: a function that waits for it and returns its result (or raises what it raised)."""
    import threading

    got: list[Any] = [None, None]

    def run() -> None:
        try:
            got[0] = fn(*args)
        except BaseException as e:  # re-raised by wait(), in the caller's thread
            got[1] = e

    t = threading.Thread(target=run, name="profkit-analysis", daemon=True)
    t.start()

    def wait() -> Any:
        t.join()
        if got[1] is not None:
            raise got[1]
        return got[0]

    return wait


def _digest_meanwhile(path: Path) -> Any:
    """The sha256 of the trace file (summary.json's inputs), computed in a thread while the analysis
    runs (hashlib releases the GIL): a function that waits for it and returns it, None when the file
    cannot be read (the summary tries again)."""
    from profkit.ingest.cache import file_sha256

    def digest() -> str | None:
        try:
            return file_sha256(path)
        except OSError:
            return None

    return _meanwhile(digest) if Path(path).is_file() else None


def _classify(owned: pl.DataFrame, trace: Trace, catalog: Catalog, captures: Any = None,
              names: pl.Series | None = None) -> tuple[pl.DataFrame, GraphCaptureStats | None, dict[int, Any]]:
    """The ops with category, owner and annotation (the innermost user annotation around the
    launch, or for graph-replayed ops their capture-time one), the graph-capture statistics
    (None without capture profiles), and the shapes of the graph-replayed ops from their capture
    ({row: (op, Input Dims, Input type)}; analysis/shapes.py). `names`: name_codes of the ops' names,
    when the caller has them."""
    if owned.height == 0:
        return owned.with_columns(pl.lit(None, pl.String).alias("category"), pl.lit(None, pl.String).alias("owner"),
                                  pl.lit(None, pl.String).alias("annotation")), None, {}
    ann: Any = [None] * owned.height
    if getattr(catalog, "uses_annotations", False):
        ann = _launch_annotations(owned, trace.cpu.filter(pl.col("cat") == "user_annotation"))
    mask = gstats = None
    if captures is not None:  # graph-replayed ops take their capture-time ranges (analysis/graphs.py)
        from profkit.analysis import graphs

        ann, mask, gstats = graphs.apply(owned, trace, captures, ann.to_list() if isinstance(ann, pl.Series) else ann)
    owned = owned.with_columns(ann if isinstance(ann, pl.Series) else pl.Series("annotation", ann, dtype=pl.String))
    out = _categorize(catalog, owned, names)
    replay_shapes = gstats.shapes if gstats is not None else {}
    return out, (graphs.finish_stats(gstats, out, mask, captures) if mask is not None and gstats is not None else None), replay_shapes


def _categorize(catalog: Catalog, ops: pl.DataFrame, names: pl.Series | None = None) -> pl.DataFrame:
    """catalog.classify_frame(ops), the rules run on one op of each distinct (name, cat, annotation):
    each op's key is made of the three's dictionary codes (`names`: name_codes(ops["name"]), when
    the caller has them), so each long name is hashed once and the rest is integer work."""
    key = (name_codes(ops["name"]) if names is None else names) * (1 << 32) + name_codes(ops["cat"])
    ann = ops["annotation"]
    if ann.null_count() < len(ann):
        codes = ann.cast(pl.String).cast(pl.Categorical).to_physical().cast(pl.UInt64)
        key = _distinct(key)[0].cast(pl.UInt64) * (1 << 33) + (codes + 1).fill_null(0)
    which, rows = _distinct(key)
    lookup = catalog.classify_frame(ops.select("name", "cat", "annotation")[rows])
    return ops.with_columns(lookup["category"].gather(which), lookup["owner"].gather(which))


def name_codes(names: pl.Series) -> pl.Series:
    """A UInt64 code per string of the column, equal for equal strings, so that strings are compared
    by one hash each: its code in the column's dictionary (a Categorical's, numbered from 0 in the
    column alone), a null 2**32 - 1 (more distinct strings than that do not fit a UInt32 code)."""
    codes = names.cast(pl.String).cast(pl.Categorical).to_physical().cast(pl.UInt64)
    return codes.fill_null((1 << 32) - 1) if codes.null_count() else codes


def _distinct(key: pl.Series) -> tuple[pl.Series, pl.Series]:
    """(which, rows): for each row, the position of its key among the distinct keys, and the first row of
    each distinct key."""
    rows = key.arg_unique()
    rows = rows.gather(key.gather(rows).arg_sort())  # in key order, so that a binary search finds each row's
    return key.gather(rows).search_sorted(key), rows


def _launch_annotations(ops: pl.DataFrame, spans: pl.DataFrame) -> pl.Series:
    """The innermost user annotation around each op's launch (spans.innermost_enclosing of the
    launch points; null where none): one sweep per thread in the native library, else in Python."""
    from profkit.ingest import scan

    if scan.lib() is None:
        has = ops["launch_ts_ns"].is_not_null() & ops["launch_tid"].is_not_null()
        pts = ops.filter(has).select(pl.col("launch_ts_ns").alias("ts_ns"), pl.col("launch_ts_ns").alias("end_ns"),
                                     pl.col("launch_tid").alias("tid"))
        names = spans["name"].to_list()
        ann: list[str | None] = [None] * ops.height
        for p, i in zip(has.arg_true().to_list(), innermost_enclosing(pts, spans)):
            if i is not None:
                ann[p] = names[i]
        return pl.Series("annotation", ann, dtype=pl.String)
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
    # a launch's latency: from the call to the first of its ops (a graph launch has many)
    launched = owned.select("iteration", "correlation", "ts_ns", "launch_ts_ns", "launch_api").filter(pl.col("launch_api").is_in(LAUNCH_APIS))
    if launched["correlation"].n_unique() == launched.height:  # one op per launch (eager): no grouping needed
        per_launch = launched.select("iteration", (pl.col("ts_ns") - pl.col("launch_ts_ns")).alias("lat"))
    else:
        per_launch = launched.group_by("iteration", "correlation").agg((pl.col("ts_ns").min() - pl.col("launch_ts_ns").first()).alias("lat"))
    lat = per_launch.group_by("iteration").agg(pl.col("lat").median().alias("launch_latency_ns_p50"))
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
