"""Why the GPU is idle, from one rank of summary.json: the facts every renderer leads with.

Plain data in, plain data out (no rich, no HTML, no polars: a cached `analyze` prints through it);
diff.json's bubble view (profkit.attribution) and the renderers' sentences (profkit.report.views)
are built on it, so the terminal, Markdown and HTML say the same thing. Reads schema v2 and falls
back to what v1 has.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from typing import Any

# The CPU window is "much longer" than the GPU window when the difference is over this share of
# it and over HOST_GAP_MIN_US: then the host, not the device, set the iteration's length.
HOST_GAP_SHARE = 0.2
HOST_GAP_MIN_US = 100.0


def _median(vals: list[float]) -> float | None:
    vals = [v for v in vals if v is not None]
    return statistics.median(vals) if vals else None


def host_gap(rank: Mapping[str, Any]) -> dict[str, Any] | None:
    """When the median CPU window (wall_us) is much longer than the median GPU window: the two
    medians and the host call that blocked longest inside the iterations (api, direction,
    trigger, stack, blocked_us, iteration), if one accounts for at least half the difference in
    its iteration. None when the windows agree."""
    its = rank.get("iterations") or []
    wall = _median([i.get("wall_us") for i in its])
    gpu = _median([i.get("gpu_window_us") for i in its])
    if wall is None or gpu is None:
        return None
    gap = wall - gpu
    if gap <= max(HOST_GAP_SHARE * wall, HOST_GAP_MIN_US):
        return None
    out: dict[str, Any] = {"wall_us": wall, "gpu_window_us": gpu, "gap_us": gap, "call": None}
    by_index = {i.get("index"): i for i in its}
    syncs = sorted(rank.get("syncs") or [], key=lambda s: -(s.get("blocked_us") or 0.0))
    if syncs:
        s = syncs[0]
        it = by_index.get(s.get("iteration")) or {}
        it_gap = (it.get("wall_us") or 0.0) - (it.get("gpu_window_us") or 0.0)
        if (s.get("blocked_us") or 0.0) >= 0.5 * it_gap > 0:
            out["call"] = {k: s.get(k) for k in ("api", "kind", "direction", "trigger", "stack", "blocked_us", "iteration")}
    return out


def largest_bubbles(rank: Mapping[str, Any], n: int = 5) -> list[dict[str, Any]]:
    """The n longest bubbles: iteration, start_us, dur_us, cause, cpu_ops [(name, µs or None)]."""
    bs = sorted(rank.get("bubbles") or [], key=lambda b: (-(b.get("dur_us") or 0.0), b.get("start_us") or 0.0))[:n]
    out = []
    for b in bs:
        names = list(b.get("cpu_ops") or [])
        us = list(b.get("cpu_ops_us") or [None] * len(names))
        out.append({"iteration": b.get("iteration"), "start_us": b.get("start_us"), "dur_us": b.get("dur_us"), "cause": b.get("cause"),
                    "cpu_ops": list(zip(names, us))})
    return out


def idle_cpu_ops(rank: Mapping[str, Any], cause: str | None = None, n: int = 3) -> list[tuple[str, float | None]]:
    """The CPU ops the idle time went to, most idle time first (schema v2's bubble_cpu_ops); for a
    v1 summary, which has no times, the ops of the listed bubbles weighted by bubble length."""
    agg = rank.get("bubble_cpu_ops")
    if agg is not None:
        got: dict[str, float] = {}
        for x in agg:
            if cause is None or x.get("cause") == cause:
                got[x["cpu_op"]] = got.get(x["cpu_op"], 0.0) + (x.get("idle_us") or 0.0)
        return [(k, v) for k, v in sorted(got.items(), key=lambda kv: (-kv[1], kv[0]))[:n]]
    w: dict[str, float] = {}
    for b in rank.get("bubbles") or []:
        if cause is None or b.get("cause") == cause:
            for op in (b.get("cpu_ops") or [])[:1]:
                w[op] = w.get(op, 0.0) + (b.get("dur_us") or 0.0)
    return [(k, None) for k, _ in sorted(w.items(), key=lambda kv: (-kv[1], kv[0]))[:n]]


def bubble_causes(rank: Mapping[str, Any]) -> dict[str, dict[str, float]]:
    """cause -> {count, us} over every bubble (v2 aggregate; v1: the listed bubbles, which were all)."""
    agg = rank.get("bubbles_by_cause")
    if agg is not None:
        return {c: {"count": v.get("count", 0), "us": v.get("us", 0.0)} for c, v in agg.items()}
    got: dict[str, dict[str, float]] = {}
    for b in rank.get("bubbles") or []:
        g = got.setdefault(b["cause"], {"count": 0, "us": 0.0})
        g["count"] += 1
        g["us"] += b.get("dur_us") or 0.0
    return got


def sync_groups(rank: Mapping[str, Any]) -> list[dict[str, Any]]:
    """(kind, api, direction, trigger) groups with count and blocked µs over every sync (v2), or
    grouped from the list (v1, which listed all); plus the innermost user frame of the group's
    longest listed sync."""
    frames: dict[tuple, tuple[float, str]] = {}
    for s in rank.get("syncs") or []:
        k = (s.get("kind"), s.get("api"), s.get("direction"), s.get("trigger"))
        if s.get("stack") and (k not in frames or (s.get("blocked_us") or 0.0) > frames[k][0]):
            frames[k] = (s.get("blocked_us") or 0.0, str(s["stack"]).split(" ← ")[0])
    if rank.get("sync_groups") is not None:
        groups = [dict(g) for g in rank["sync_groups"]]
    else:
        acc: dict[tuple, dict[str, Any]] = {}
        for s in rank.get("syncs") or []:
            k = (s.get("kind"), s.get("api"), s.get("direction"), s.get("trigger"))
            g = acc.setdefault(k, {"kind": k[0], "api": k[1], "direction": k[2], "trigger": k[3], "count": 0, "blocked_us": 0.0})
            g["count"] += 1
            g["blocked_us"] += s.get("blocked_us") or 0.0
        groups = sorted(acc.values(), key=lambda g: -g["blocked_us"])
    for g in groups:
        g["frame"] = frames.get((g.get("kind"), g.get("api"), g.get("direction"), g.get("trigger")), (0.0, None))[1]
    return groups
