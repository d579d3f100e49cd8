"""Capture health (DESIGN.md "Capture health"): is a recording fit to be measured, before any number.

Each check looks for one artefact of the recording and names the figures it puts in doubt:

- `graph_replays_missing`: graph launches (cudaGraphLaunch) inside the iterations with no replayed
  kernel recorded (AMD-AGI/Hyperloom #1121: replays under-recorded, idle inflated);
- `start_records_missing`: launch calls of the first iteration with no device record, the profiler
  dropping the session's first kernels (pytorch/pytorch #192021);
- `rank_start_skew`: the ranks' first iterations start further apart than one iteration (a
  collective then looks like seconds of work: Hyperloom #1249);
- `deferred_work`: GPU ops that start after the next iteration's GPU window ended (their time lands,
  by the clock, two or more windows late);
- `stream_overlap`: two ops of different launches overlapping on one stream (impossible on the
  hardware: a clock artefact);
- `cut_markers`: marker spans cut by the profiler's stop (real SGLang 0.5.23 ends every window with a
  stub `scheduler.run_batch` with no step[...] inside): counted; figures are in doubt only while the
  iteration finder keeps the stub as an iteration;
- `profiler_overhead`: the profiled window ran >= 1.5x slower than the unprofiled passes (the
  manifest's profiler_overhead): host-side figures are the profiler's;
- `device_records`: launch calls but no GPU activity record at all (unusable for GPU figures);
- truncated files never get this far: ingest refuses them (exit 3) and says the capture is unusable.

The facts are found per rank from the analysis frames (`rank_facts`, stored in summary.json per rank
as `capture`), the verdict from the facts of every rank plus the manifest (`assess`, summary.json's
`health`): `ok`, `degraded: <metrics>` or `unusable`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, cast

if TYPE_CHECKING:
    import polars as pl

from profkit.apis import GRAPH_LAUNCH_APIS, LAUNCH_APIS

OVERHEAD_LIMIT = 1.5  # profiled / unprofiled time per token at which host-side figures are the profiler's
STREAM_OVERLAP_TOLERANCE_NS = 50  # CUPTI's device timestamps, converted to µs floats by Kineto, can touch by a few ns
MAX_LISTED = 5
EX_LAUNCH_APIS = frozenset({"cudaLaunchKernelExC", "cuLaunchKernelEx"})  # may launch with programmatic dependent launch

# the figures each check puts in doubt (summary.json field names)
DOUBTS: dict[str, tuple[str, ...]] = {
    "graph_replays_missing": ("gpu_busy_us", "gpu_idle_us", "bubble_us", "category_us", "phase_us", "gpu_kernels", "owned_gpu_us", "slack_us"),
    "start_records_missing": ("gpu_busy_us", "category_us", "gpu_kernels", "owned_gpu_us"),
    "rank_start_skew": ("cross_rank", "category_us.communication", "gpu_window_us"),
    "deferred_work": ("category_us", "phase_us", "gpu_busy_us"),
    "stream_overlap": ("gpu_busy_us", "overlap_us", "category_us"),
    "cut_markers": ("wall_us", "gpu_window_us", "iterations"),
    "profiler_overhead": ("wall_us", "gpu_idle_us", "bubble_us", "launch_us", "slack_us", "exposed_host_us"),
    "device_records": ("gpu_busy_us", "gpu_idle_us", "category_us", "phase_us", "gpu_kernels", "bubble_us", "slack_us"),
}


def rank_facts(trace: Any, ops: pl.DataFrame, calls: pl.DataFrame, win: pl.DataFrame, windows: pl.DataFrame,
               device_timeline: str, device_records: str, stubs_dropped: int = 0) -> dict[str, Any]:
    """The health facts of one rank (JSON-able). `ops`: every GPU op with its owning iteration (null:
    none); `calls`: the runtime calls with theirs; `win`: the iteration windows (with kinds);
    `windows`: the GPU windows."""
    import polars as pl

    facts: dict[str, Any] = {"device_timeline": device_timeline, "device_records": device_records}
    if device_timeline == "gpu" and device_records == "present" and ops.height:
        with_ops = ops["correlation"].drop_nulls().unique().implode()
        owned_calls = calls.filter(pl.col("iteration").is_not_null() & pl.col("correlation").is_not_null())
        capture_its = win.filter(pl.col("kind") == "graph_capture")["iteration"].implode()
        launches = owned_calls.filter(pl.col("api").is_in(LAUNCH_APIS) & ~pl.col("iteration").is_in(capture_its))
        empty = launches.filter(~pl.col("correlation").is_in(with_ops))
        graphs = launches.filter(pl.col("api").is_in(GRAPH_LAUNCH_APIS))
        g_empty = empty.filter(pl.col("api").is_in(GRAPH_LAUNCH_APIS))
        facts["graph_replays_missing"] = {"count": g_empty.height, "graph_launches": graphs.height,
                                          "iterations": sorted(set(g_empty["iteration"].to_list()))[:MAX_LISTED]}
        first = win["iteration"].min() if win.height else None
        eager = empty.filter(~pl.col("api").is_in(GRAPH_LAUNCH_APIS))
        first_missing = eager.filter(pl.col("iteration") == first).height if first is not None else 0
        facts["start_records_missing"] = {
            "count": first_missing, "launches_first_iteration": launches.filter(pl.col("iteration") == first).height,
            "missing_later": eager.height - first_missing}
        facts["deferred_work"] = _deferred(ops, windows)
        facts["stream_overlap"] = _stream_overlap(ops)
    facts["cut_markers"] = _cut_markers(trace, win, stubs_dropped)
    facts["first_iteration_start_ns"] = int(cast(int, win["cpu_start_ns"].min())) if win.height else None
    return facts


def _deferred(ops: pl.DataFrame, windows: pl.DataFrame) -> dict[str, Any]:
    """Owned ops that start at or after the end of the next iteration's GPU window."""
    import polars as pl

    nxt = windows.select((pl.col("iteration") - 1).alias("iteration"), pl.col("gpu_end_ns").alias("next_end_ns"))
    o = ops.filter(pl.col("iteration").is_not_null()).select("iteration", "ts_ns", "dur_ns").join(nxt, on="iteration", how="inner")
    late = o.filter(pl.col("next_end_ns").is_not_null() & (pl.col("ts_ns") >= pl.col("next_end_ns")))
    return {"count": late.height, "us": int(late["dur_ns"].sum() or 0) / 1000.0,
            "iterations": sorted(set(late["iteration"].to_list()))[:MAX_LISTED]}


def _stream_overlap(ops: pl.DataFrame) -> dict[str, Any]:
    """Launches (one eager op, or a graph replay's ops) on one device stream whose spans overlap: each
    launch's [first start, last end) against the latest end of the launches before it on that stream.
    A kernel launched with cudaLaunchKernelExC / cuLaunchKernelEx may carry programmatic dependent launch
    (Hopper and later: it starts before its predecessor on the stream ends, by design; a public vLLM B200
    trace has 74 such), so those overlaps are counted apart (`ex_launch`) and doubt nothing."""
    import polars as pl

    spans = (ops.filter(pl.col("correlation").is_not_null())
             .group_by("device", "stream", "correlation").agg(pl.col("ts_ns").min().alias("a"), pl.col("end_ns").max().alias("b"),
                                                              pl.col("launch_api").first().alias("api"))
             .sort("device", "stream", "a", "b"))
    spans = spans.with_columns(pl.col("b").cum_max().shift(1).over("device", "stream").alias("prev_end"))
    over = spans.filter(pl.col("prev_end").is_not_null() & (pl.col("prev_end") - pl.col("a") > STREAM_OVERLAP_TOLERANCE_NS))
    ex = over["api"].is_in(list(EX_LAUNCH_APIS)).fill_null(False)
    bad = over.filter(~ex)
    worst = bad.select((pl.col("prev_end") - pl.col("a")).max()).item() if bad.height else 0
    return {"count": bad.height, "worst_us": int(worst or 0) / 1000.0, "ex_launch": int(ex.sum()),
            "streams": sorted({int(s) for s in bad["stream"].drop_nulls().to_list()})[:MAX_LISTED]}


def _cut_markers(trace: Any, win: pl.DataFrame, stubs_dropped: int) -> dict[str, Any]:
    """Marker spans cut by the profiler's stop: those the iteration finder dropped (when it does),
    plus a last iteration still standing that has no engine step span inside while the others do
    (SGLang 0.5.23's stub run_batch, which the finder keeps unless told otherwise)."""

    kept = 0
    if win.height >= 2:
        kinds = win.sort("iteration")["kind"].to_list()
        known = [k for k in kinds[:-1] if k not in ("unknown", None)]
        if kinds[-1] in ("unknown", None) and known and len(known) == len(kinds) - 1:
            kept = 1
    return {"count": int(stubs_dropped) + kept, "dropped": int(stubs_dropped), "kept_as_iteration": kept}


# ------------------------------------------------------------------------------------------ verdict

def _finding(check: str, detail: str, *, unusable: bool = False, metrics: tuple[str, ...] | None = None) -> dict[str, Any]:
    return {"check": check, "status": "unusable" if unusable else "degraded", "metrics": list(metrics if metrics is not None else DOUBTS[check]),
            "detail": detail}


def rank_findings(rank: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The findings of one rank's `capture` facts."""
    f = rank.get("capture") or {}
    r = rank.get("rank")
    out: list[dict[str, Any]] = []
    if f.get("device_records") == "missing":
        out.append(_finding("device_records", f"rank {r}: launch calls but no GPU activity records", unusable=True))
    g = f.get("graph_replays_missing") or {}
    if g.get("count"):
        out.append(_finding("graph_replays_missing", f"rank {r}: {g['count']} of {g['graph_launches']} graph launches have no replayed "
                                                    f"kernel recorded (iterations {_its(g)})"))
    s = f.get("start_records_missing") or {}
    if s.get("count"):
        out.append(_finding("start_records_missing", f"rank {r}: {s['count']} of the first iteration's {s['launches_first_iteration']} "
                                                     "launch calls have no device record (the profiler dropped them at its start)"))
    d = f.get("deferred_work") or {}
    if d.get("count"):
        out.append(_finding("deferred_work", f"rank {r}: {d['count']} GPU ops ({d['us']:,.1f} µs) started after the next iteration's "
                                             f"GPU window ended (owners: iterations {_its(d)})"))
    o = f.get("stream_overlap") or {}
    if o.get("count"):
        out.append(_finding("stream_overlap", f"rank {r}: {o['count']} launches overlap an earlier one on their stream "
                                              f"(streams {', '.join(map(str, o['streams']))}; up to {o['worst_us']:,.3f} µs)"))
    c = f.get("cut_markers") or {}
    if c.get("kept_as_iteration"):
        out.append(_finding("cut_markers", f"rank {r}: the last marker span has no engine step span inside (cut by the profiler's "
                                           "stop) and is counted as an iteration"))
    return out


def _its(d: Mapping[str, Any]) -> str:
    return ", ".join(map(str, d.get("iterations") or [])) or "?"


def skew_finding(summary: Mapping[str, Any]) -> dict[str, Any] | None:
    """Profiler start skew between the ranks of one run beyond one iteration (the ranks' median wall)."""
    ranks = [r for r in summary.get("ranks") or [] if (r.get("capture") or {}).get("first_iteration_start_ns") is not None]
    if len(ranks) < 2:
        return None
    starts = {r["rank"]: r["capture"]["first_iteration_start_ns"] for r in ranks}
    walls = [w for w in ((r.get("median") or {}).get("wall_us") for r in ranks) if w]
    if not walls:
        return None
    one = max(walls)
    skew = (max(starts.values()) - min(starts.values())) / 1000.0
    if skew <= one:
        return None
    late = max(starts, key=lambda k: starts[k])
    return _finding("rank_start_skew", f"the ranks' first iterations start {skew:,.1f} µs apart (rank {late} last), more than one "
                                       f"iteration ({one:,.1f} µs)")


def overhead_finding(overhead: Any, window: int | None = None) -> dict[str, Any] | None:
    """The manifest's profiler_overhead (that window's, where it lists windows) at or beyond OVERHEAD_LIMIT."""
    if not isinstance(overhead, Mapping):
        return None
    ws = overhead.get("windows")
    if isinstance(ws, list) and ws:
        o = ws[window] if window is not None and 0 <= window < len(ws) else None
        if o is None:
            vals = [v for w in ws if isinstance(w, Mapping) and isinstance(v := w.get("slowdown"), (int, float))]
            slow = max(vals) if vals else None
        else:
            slow = o.get("slowdown")
    else:
        slow = overhead.get("slowdown")
    if not isinstance(slow, (int, float)) or slow < OVERHEAD_LIMIT:
        return None
    return _finding("profiler_overhead", f"the profiled window ran {slow:.2f}x slower per token than the unprofiled passes "
                                         f"(>= {OVERHEAD_LIMIT}x): host-side figures are the profiler's")


def assess(summary: Mapping[str, Any], overhead: Any = None, window: int | None = None) -> dict[str, Any]:
    """summary.json's `health`: the verdict over every rank's facts, the ranks' start skew and the
    manifest's profiler overhead (`overhead`; else the summary's run section's)."""
    findings = [f for r in summary.get("ranks") or [] for f in rank_findings(r)]
    sk = skew_finding(summary)
    if sk:
        findings.append(sk)
    run = got if isinstance(got := summary.get("run"), Mapping) else {}
    if overhead is None:
        overhead = run.get("profiler_overhead")
        window = run.get("window") if window is None else window
    oh = overhead_finding(overhead, window)
    if oh:
        findings.append(oh)
    cut = sum(int(((r.get("capture") or {}).get("cut_markers") or {}).get("dropped") or 0) for r in summary.get("ranks") or [])
    metrics = sorted({m for f in findings for m in f["metrics"]})
    if any(f["status"] == "unusable" for f in findings):
        verdict = "unusable"
    elif findings:
        verdict = "degraded"
    else:
        verdict = "ok"
    checked = any(r.get("capture") for r in summary.get("ranks") or [])
    return {"verdict": verdict if checked else "unchecked", "metrics": metrics, "findings": findings,
            "cut_markers_dropped": cut}


def health_text(h: Mapping[str, Any] | None) -> str:
    """The first line of every report: `health: ok`, `health: degraded: <metrics>`, `health: unusable`."""
    if not isinstance(h, Mapping):
        return "health: unchecked (a summary written before capture health existed: analyze the traces again)"
    v = h.get("verdict")
    if v == "degraded":
        checks = sorted({f["check"] for f in h.get("findings") or []})
        return f"health: degraded: {', '.join(h.get('metrics') or [])} ({', '.join(checks)})"
    if v == "unusable":
        return "health: unusable (" + "; ".join(f["detail"] for f in h.get("findings") or [] if f["status"] == "unusable") + ")"
    if v == "unchecked":
        return "health: unchecked (no per-rank capture facts in this summary)"
    dropped = h.get("cut_markers_dropped")
    return "health: ok" + (f" ({dropped} marker span(s) cut by the profiler's stop dropped)" if dropped else "")


def doubted(h: Mapping[str, Any] | None, metric: str) -> bool:
    """Whether `metric` (a summary field, or `category_us.<cat>`) is in doubt under health `h`."""
    if not isinstance(h, Mapping) or h.get("verdict") not in ("degraded", "unusable"):
        return False
    ms = set(h.get("metrics") or [])
    return metric in ms or metric.split(".")[0] in ms


def worst(healths: list[Any]) -> dict[str, Any] | None:
    """One verdict over several windows: the worst, with every window's doubted metrics and findings."""
    hs = [h for h in healths if isinstance(h, Mapping)]
    if not hs:
        return None
    order = {"ok": 0, "unchecked": 1, "degraded": 2, "unusable": 3}
    v = max((h.get("verdict", "unchecked") for h in hs), key=lambda x: order.get(x, 1))
    return {"verdict": v, "metrics": sorted({m for h in hs for m in h.get("metrics") or []}),
            "findings": [f for h in hs for f in h.get("findings") or []],
            "cut_markers_dropped": sum(int(h.get("cut_markers_dropped") or 0) for h in hs)}


def manifest_near(files: list[Path]) -> tuple[Any, int | None]:
    """The run manifest next to the trace files (beside them, `<stem>.manifest.json` beside one, or one
    level up from a window-<i>/ folder) and which profile window they are: (manifest or None, window index
    or None). Only the folders are looked at: the traces themselves are not stat'ed again."""
    for f in files:
        f = Path(getattr(f, "path", f))
        d = f.parent
        window = int(d.name.split("-")[1]) if d.name.startswith("window-") and d.name.split("-")[-1].isdigit() else None
        for cand in (d / f"{f.name.split('.')[0]}.manifest.json", d / "manifest.json", d.parent / "manifest.json"):
            if cand.is_file():
                try:
                    return json.loads(cand.read_text()), window
                except (OSError, ValueError):
                    return None, window
    return None, None
