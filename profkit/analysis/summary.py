"""RankAnalysis frames -> summary.json schema v3 (DESIGN.md), times in µs relative to the trace start.

Version 3: time by ownership per iteration (owned_category_us, owned_phase_us, owned_overlap_us), what a
diff splits the change by (attribution/diff.py), so the GPU's backlog never moves a category.

Version 2: time inside a window by the clock (owned_gpu_us, spill_us, phase_us per iteration),
work outside every iteration (outside_iterations), whether the device records exist
(device_records), and bounded lists: the `max_items` largest bubbles and syncs, with every bubble
and sync still counted in the aggregates (bubbles_by_cause, bubble_cpu_ops, sync_groups)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

import msgspec
import polars as pl

from profkit import __version__
from profkit.documents import BubbleCpuOp, CauseTotal, Outside
from profkit.terms import CAUSES
from profkit.analysis.rank import DIRECTIONS, RankAnalysis
from profkit.analysis.shapes import SHAPE_COLUMNS, has_shapes
from profkit.analysis.timeline import representative_timeline

SCHEMA_VERSION = 3
MAX_ITEMS = 100  # bubbles and syncs listed per rank (the largest); the aggregates count them all


def _us(ns: int | float | None) -> float | None:
    return None if ns is None else ns / 1000.0


def iteration_records(a: RankAnalysis) -> list[dict[str, Any]]:
    """One dict per iteration with every summary.json v2 field."""
    cats: dict[int, dict[str, float | None]] = {}
    for it, cat, dur in a.categories.select("iteration", "category", "dur_ns").iter_rows():
        cats.setdefault(it, {})[cat] = _us(dur)
    phases: dict[int, dict[str, float | None]] = {}
    for it, ph, dur in a.phases.select("iteration", "phase", "dur_ns").iter_rows():
        phases.setdefault(it, {})[ph] = _us(dur)
    owned_cats = _per_key_ns(a.owned_categories, "category")
    owned_phases = _per_key_ns(a.owned_phases, "phase")
    lcalls: dict[int, dict[str, int]] = {}
    for it, api, n in a.launch_calls.select("iteration", "api", "n").iter_rows():
        lcalls.setdefault(it, {})[api] = n
    out = []
    for r in a.iterations.iter_rows(named=True):
        i = r["iteration"]
        out.append(
            {
                "index": i,
                "kind": r["kind"],
                "batch_size": r["batch_size"],
                "start_us": _us(r["cpu_start_ns"] - a.t0_ns),
                "gpu_start_us": _us(r["gpu_start_ns"] - a.t0_ns) if r["gpu_start_ns"] is not None else None,
                "wall_us": _us(r["wall_ns"]),
                "gpu_window_us": _us(r["gpu_window_ns"]),
                "gpu_busy_us": _us(r["gpu_busy_ns"]),
                "gpu_idle_us": _us(r["gpu_idle_ns"]),
                "overlap_us": _us(r["overlap_ns"]),
                "gpu_kernels": r["gpu_kernels"],
                "memcpy": {d: r[f"memcpy_{d}"] for d in DIRECTIONS},
                "memset": r["memset"],
                "kernel_launches": r["kernel_launches"],
                "graph_launches": r["graph_launches"],
                "launch_calls": dict(sorted(lcalls.get(i, {}).items())),
                "launch_us": _us(r["launch_ns"]),
                "launch_latency_us_p50": _us(r["launch_latency_ns_p50"]),
                "syncs": r["syncs"],
                "sync_us": _us(r["sync_ns"]),
                "sync_copies": r["sync_copies"],
                "sync_copy_us": _us(r["sync_copy_ns"]),
                "bubble_count": r["bubble_count"],
                "bubble_us": _us(r["bubble_ns"]),
                "bubble_us_by_cause": {c: _us(r[f"bubble_{c}_ns"]) for c in causes(a.device_timeline)},
                "category_us": dict(sorted(cats.get(i, {}).items())),
                "phase_us": dict(sorted(phases.get(i, {}).items())),
                "owned_gpu_us": _us(r["owned_gpu_ns"]),
                "spill_us": _us(r["spill_ns"]),
                # schema v3: by ownership (each iteration's own ops, unclipped); sum(owned_category_us) -
                # owned_overlap_us == owned_gpu_us exactly (in ns)
                "owned_category_us": {k: _us(v) for k, v in sorted(owned_cats.get(i, {}).items())},
                "owned_phase_us": {k: _us(v) for k, v in sorted(owned_phases.get(i, {}).items())},
                "owned_overlap_us": _us(sum(owned_cats.get(i, {}).values()) - r["owned_gpu_ns"]),
            }
        )
        if r.get("step"):
            # the step span's fields but bs (toks, ext, dec, roofline c_*/g_*: analysis/steps.py), after batch_size;
            # absent where the span has none
            rec = out[-1]
            keys = list(rec)
            at = keys.index("batch_size") + 1
            out[-1] = {k: rec[k] for k in keys[:at]} | {"step": json.loads(r["step"])} | {k: rec[k] for k in keys[at:]}
    return out


def _per_key_ns(frame: pl.DataFrame, key: str) -> dict[int, dict[str, int]]:
    out: dict[int, dict[str, int]] = {}
    for it, k, dur in frame.select("iteration", key, "dur_ns").iter_rows():
        out.setdefault(it, {})[k] = int(dur)
    return out


_SKIP = {"index", "kind", "batch_size", "step", "start_us", "gpu_start_us"}


def medians(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Median over iterations of every numeric field; nested maps per key (a missing key counts as 0)."""
    if not records:
        return {}
    out: dict[str, Any] = {}
    for key, first in records[0].items():
        if key in _SKIP:
            continue
        if key in _FLOOR_KEYS:  # the floor's keys (analysis/floor.py): only iterations that have them, nested maps per key
            out[key] = _median_of([r[key] for r in records if key in r])
        elif isinstance(first, dict):
            keys = sorted({k for r in records for k in r[key]})
            out[key] = {k: statistics.median([r[key].get(k) or 0 for r in records]) for k in keys}
        else:
            vals = [r[key] for r in records if r[key] is not None]
            out[key] = statistics.median(vals) if vals else None
    return out


_FLOOR_KEYS = {"flops", "bytes", "work_by_category", "floor_us", "floor_bound", "floor_memory_us", "floor_compute_us", "gap_us"}


def _median_of(vals: list[Any]) -> Any:
    """The median of numbers, the most common of strings, per key of maps (a missing key counts as 0)."""
    if not vals:
        return None
    if all(isinstance(v, dict) for v in vals):
        keys = sorted({k for v in vals for k in v})
        out = {}
        for k in keys:
            got = [v.get(k) for v in vals]
            blank: Any = {} if any(isinstance(g, dict) for g in got) else 0
            out[k] = _median_of([blank if g is None else g for g in got])
        return out
    if all(isinstance(v, str) for v in vals):
        return statistics.mode(sorted(vals))
    nums = [v for v in vals if isinstance(v, (int, float))]
    return statistics.median(nums) if nums else None


def _shape_keys(values: list[Any]) -> dict[str, Any]:
    """A kernel row's shape_op, shape and shape_dtypes (analysis/shapes.py), where it has them."""
    return {k: v for k, v in zip(SHAPE_COLUMNS, values) if v is not None}


def rank_summary(a: RankAnalysis, *, max_items: int = MAX_ITEMS, peaks: Path | None = None) -> dict[str, Any]:
    from profkit.analysis.floor import rank_floor

    records = iteration_records(a)
    # recorded with shapes: each iteration's work, floor and gap (new keys at the end of each record); the
    # rank's `floor` says which peaks, or what is missing (analysis/floor.py)
    floor = rank_floor(a, records, peaks, causes(a.device_timeline)) if a.device_timeline == "gpu" else None
    sy = a.syncs.filter(pl.col("iteration").is_not_null())
    syncs = [
        {
            "iteration": r["iteration"], "api": r["api"], **_trace_name(r.get("name"), r["api"]), "kind": r["kind"], "direction": r["direction"],
            "start_us": _us(r["ts_ns"] - a.t0_ns), "blocked_us": _us(r["blocked_ns"]), "trigger": r["trigger"], "stack": r["stack"],
        }
        for r in sy.sort("blocked_ns", "ts_ns", descending=[True, False]).head(max_items).sort("ts_ns").iter_rows(named=True)
    ]
    bubbles = [
        {"iteration": r["iteration"], "start_us": _us(r["start_ns"] - a.t0_ns), "dur_us": _us(r["dur_ns"]), "cause": r["cause"],
         "cpu_ops": r["cpu_ops"], "cpu_ops_us": [_us(t) for t in r["cpu_ops_ns"]]}
        for r in largest_bubbles(a.bubbles, max_items).iter_rows(named=True)
    ]
    # by (name, category), and by the launching op's shapes where they were recorded (analysis/shapes.py)
    keys = ["name", "category", *(SHAPE_COLUMNS if has_shapes(a.ops) else ())]
    kernels = (  # lazy: the streaming engine groups by strings several times faster
        a.ops.lazy().group_by(*keys).agg(pl.len().alias("count"), pl.col("dur_ns").sum().alias("total_ns"))
        .sort("total_ns", *keys, descending=[True] + [False] * len(keys)).collect()
        .select(*keys[:2], "count", "total_ns", *keys[2:])
    )
    return {
        "rank": a.rank,
        "device": a.device,
        "path": str(a.path),
        "marker": a.marker,
        "catalog": a.catalog,
        "device_timeline": a.device_timeline,
        "device_records": a.device_records,
        **({"graph_capture": msgspec.to_builtins(a.graph_capture)} if a.graph_capture is not None else {}),
        **({"source": a.source} if a.source is not None else {}),  # an nsys export: its format, schema version, device, pid
        "t0_us": _us(a.t0_ns),
        "iterations": records,
        "median": medians(records),
        "syncs": syncs,
        "syncs_total": sy.height,
        "sync_groups": sync_groups(sy),
        "bubbles": bubbles,
        "bubbles_total": a.bubbles.height,
        "bubbles_by_cause": msgspec.to_builtins(bubbles_by_cause(a.bubbles, a.device_timeline)),
        "bubble_cpu_ops": msgspec.to_builtins(bubble_cpu_ops(a.bubbles, max_items=max_items)),
        "kernels": [{"name": n, "category": c, "count": k, "total_us": _us(t), **_shape_keys(rest)} for n, c, k, t, *rest in kernels.iter_rows()],
        "outside_iterations": msgspec.to_builtins(outside_iterations(a.outside)),
        "warnings": list(a.warnings),
        # marker spans cut by the profiler's stop, dropped (a new optional key, only when there were any)
        **({"stub_markers": a.stub_markers} if a.stub_markers else {}),
        # issue 31 (new optional keys): every transition's slack and the rank's statistics (analysis/slack.py);
        # the facts capture health is judged on (analysis/health.py)
        "overlap_slack": msgspec.to_builtins(a.overlap_slack),
        "capture": msgspec.to_builtins(a.capture) if a.capture is not None else {},  # {}: not checked
        "speculative": msgspec.to_builtins(a.speculative),  # analysis/spec.py: per accepted token where the run manifest gives the accept length
        # Added after v1 shipped (a new key; readers must treat it as optional): see analysis/timeline.py.
        "timeline": representative_timeline(a),
        # issue 41 (a new optional key): the peaks the floor used and the modeled ops, or why there is no floor
        **({"floor": msgspec.to_builtins(floor)} if floor is not None else {}),
    }


def outside_iterations(o: dict[str, int]) -> Outside:
    """GPU work outside every iteration (RankAnalysis.outside, ns) in µs: a missing count is 0."""
    def n(key: str) -> int:
        return int(o.get(key, 0))

    return Outside(
        gpu_ops=n("gpu_ops"), gpu_us=_us(n("gpu_ns")), before_first=n("before_first"), after_last=n("after_last"),
        no_launch_in_trace=n("no_launch_in_trace"), device_busy_us=_us(n("device_busy_ns")),
        # by kind, and the host calls outside every iteration: iterations plus these are the whole trace
        gpu_kernels=n("kernels"), memcpy={d: n(f"memcpy_{d}") for d in DIRECTIONS}, memset=n("memset"), launch_calls=n("launch_calls"),
        syncs=n("syncs"), sync_copies=n("sync_copies"))


def largest_bubbles(bubbles: pl.DataFrame, n: int) -> pl.DataFrame:
    """The n longest bubbles (ties: the earlier first), in start order. Bubbles start at distinct
    times, so which ones are the n longest is decided; only those rows (and their lists) are copied."""
    at = bubbles.select("dur_ns", "start_ns", pl.int_range(pl.len(), dtype=pl.Int64).alias("_i")).top_k(
        n, by=["dur_ns", "start_ns"], reverse=[False, True])["_i"]
    return bubbles[at].sort("start_ns")


def causes(device_timeline: str) -> tuple[str, ...]:
    """The bubble causes a rank's summary lists: "python" only on a CPU-only timeline (where it
    replaces launch and gpu_wait, analysis/rank.py), so a GPU summary keeps its four."""
    return CAUSES if device_timeline == "cpu" else tuple(c for c in CAUSES if c != "python")


def bubbles_by_cause(bubbles: pl.DataFrame, device_timeline: str = "gpu") -> dict[str, CauseTotal]:
    """cause -> {count, us}: every bubble of the rank (inside the iterations' GPU windows)."""
    got = {c: CauseTotal(count=0, us=0.0) for c in causes(device_timeline)}
    for c, n, t in bubbles.group_by("cause").agg(pl.len(), pl.col("dur_ns").sum()).iter_rows():
        got[c] = CauseTotal(count=int(n), us=_us(t))
    return got


def bubble_cpu_ops(bubbles: pl.DataFrame, *, max_items: int = MAX_ITEMS) -> list[BubbleCpuOp]:
    """The CPU ops the GPU's idle time went to: per (cause, CPU op), the exclusive time of that op
    inside the bubbles (`idle_us`) and how many bubbles it appears in, largest idle time first
    (DESIGN.md: ranked by the idle time they account for, not by how many gaps they appear in)."""
    if bubbles.height == 0:
        return []
    x = (
        bubbles.lazy().select("cause", "cpu_ops", "cpu_ops_ns").explode("cpu_ops", "cpu_ops_ns").drop_nulls("cpu_ops")
        .group_by("cause", "cpu_ops").agg(pl.col("cpu_ops_ns").sum().alias("ns"), pl.len().alias("n"))
        .sort("ns", "cause", "cpu_ops", descending=[True, False, False]).head(max_items).collect()
    )
    return [BubbleCpuOp(cause=c, cpu_op=op, idle_us=_us(ns), bubbles=int(n)) for c, op, ns, n in x.iter_rows()]


def _trace_name(name: str | None, api: str | None) -> dict[str, Any]:
    """{"name": the call as the trace spells it} where that is not its CUDA spelling `api` (a HIP
    call on a ROCm trace: hipMemcpyWithStream, counted as cudaMemcpy), else nothing."""
    return {"name": name} if name and name != api else {}


def sync_groups(syncs: pl.DataFrame) -> list[dict[str, Any]]:
    """Every sync and blocking copy of the iterations by (kind, api, name, direction, trigger): count,
    blocked µs, and the count per iteration (`by_iteration`, keyed by the iteration index). `name`
    (the trace's spelling) only where it is not `api`'s."""
    if syncs.height == 0:
        return []
    if "name" not in syncs.columns:
        syncs = syncs.with_columns(pl.col("api").alias("name"))
    keys = ("kind", "api", "name", "direction", "trigger")
    per = syncs.group_by(*keys, "iteration").agg(pl.len().alias("n"), pl.col("blocked_ns").sum().alias("b"))
    out: dict[tuple, dict[str, Any]] = {}
    for kind, api, name, d, trig, it, n, b in per.sort("iteration").iter_rows():
        g = out.setdefault((kind, api, name, d, trig), {"kind": kind, "api": api, **_trace_name(name, api), "direction": d, "trigger": trig,
                                                        "count": 0, "blocked_ns": 0, "by_iteration": {}})
        g["count"] += int(n)
        g["blocked_ns"] += int(b or 0)
        g["by_iteration"][str(it)] = int(n)
    groups = sorted(out.values(), key=lambda g: (-g["blocked_ns"], -g["count"], str(g["api"]), str(g["trigger"])))
    for g in groups:
        g["blocked_us"] = _us(g.pop("blocked_ns"))
    return groups


def sha256(path: Path) -> str:
    from profkit.ingest.cache import file_sha256

    return file_sha256(path)


def build_summary(analyses: list[RankAnalysis], *, marker: str | None = None, max_items: int = MAX_ITEMS,
                  peaks: Path | None = None) -> dict[str, Any]:
    """summary.json v3 for one run (one entry per rank)."""
    markers = sorted({a.marker for a in analyses})
    return {
        "schema_version": SCHEMA_VERSION,
        "profkit_version": __version__,
        "inputs": [{"path": str(a.path), "sha256": a.input_sha256 or sha256(a.path), "rank": a.rank} for a in analyses],
        "marker": marker if marker is not None else (markers[0] if len(markers) == 1 else markers),
        "ranks": [rank_summary(a, max_items=max_items, peaks=peaks) for a in analyses],
    }


def timeline_frame(analyses: list[RankAnalysis]) -> pl.DataFrame:
    """One row per owned GPU op: iteration, rank, stream, name, category, start and duration (µs)
    relative to the iteration's GPU window, launch API and launch latency."""
    frames = []
    for a in analyses:
        if a.ops.height == 0:
            continue
        frames.append(
            a.ops.select(
                pl.col("iteration"),
                pl.lit(a.rank, pl.Int64).alias("rank"),
                pl.col("stream"),
                pl.col("name"),
                pl.col("category"),
                pl.col("cat").alias("kind"),
                ((pl.col("ts_ns") - pl.col("gpu_start_ns")) / 1000.0).alias("start_us"),
                (pl.col("dur_ns") / 1000.0).alias("dur_us"),
                pl.col("launch_api"),
                ((pl.col("ts_ns") - pl.col("launch_ts_ns")) / 1000.0).alias("launch_latency_us"),
            ).sort("iteration", "start_us")
        )
    if not frames:
        return pl.DataFrame(schema={"iteration": pl.Int64, "rank": pl.Int64, "stream": pl.Int64, "name": pl.String, "category": pl.String,
                                    "kind": pl.String, "start_us": pl.Float64, "dur_us": pl.Float64, "launch_api": pl.String,
                                    "launch_latency_us": pl.Float64})
    return pl.concat(frames)
