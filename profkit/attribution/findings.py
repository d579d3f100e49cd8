"""Why the GPU is idle, from one rank of summary.json: the facts every renderer leads with.

Plain data in, plain data out (no rich, no HTML, no polars: a cached `analyze` prints through it);
diff.json's bubble view (profkit.attribution) and the renderers' sentences (profkit.report.views)
are built on it, so the terminal, Markdown and HTML say the same thing. Reads a typed rank
(profkit.documents: a v1 summary's aggregates are counted on decoding; its CPU ops have no times).
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from typing import Any, TypedDict

from profkit.documents import Num, Rank

# The CPU window is "much longer" than the GPU window when the difference is over this share of
# it and over HOST_GAP_MIN_US: then the host, not the device, set the iteration's length.
HOST_GAP_SHARE = 0.2
HOST_GAP_MIN_US = 100.0


class BlockingCall(TypedDict):
    """The host call that blocked longest, as host_gap finds it (`name`: as the trace spells it)."""
    api: str | None
    kind: str | None
    direction: str | None
    trigger: str | None
    stack: str | None
    blocked_us: Num | None
    iteration: int | None
    name: str | None


class HostGap(TypedDict):
    """host_gap: the median CPU and GPU windows, their difference, and the call that accounts for it (None: none)."""
    wall_us: float
    gpu_window_us: float
    gap_us: float
    call: BlockingCall | None


class BubbleRow(TypedDict):
    """One of the longest bubbles: where, how long, why, and its CPU ops [(name, µs or None)]."""
    iteration: int | None
    start_us: Num | None
    dur_us: Num | None
    cause: str | None
    cpu_ops: list[tuple[str, Num | None]]


class CauseCount(TypedDict):
    count: int
    us: Num | None


class SyncRow(TypedDict):
    """A sync group with the innermost user frame of its longest listed sync (None: no stack)."""
    kind: str | None
    api: str | None
    name: str | None
    direction: str | None
    trigger: str | None
    count: int
    blocked_us: Num
    frame: str | None


def _median(vals: list[Any]) -> float | None:
    vals = [v for v in vals if v is not None]
    return statistics.median(vals) if vals else None


def host_gap(rank: Rank) -> HostGap | None:
    """When the median CPU window (wall_us) is much longer than the median GPU window: the two
    medians and the host call that blocked longest inside the iterations (api, direction,
    trigger, stack, blocked_us, iteration), if one accounts for at least half the difference in
    its iteration. None when the windows agree."""
    its = rank.iterations
    wall = _median([i.wall_us for i in its])
    gpu = _median([i.gpu_window_us for i in its])
    if wall is None or gpu is None:
        return None
    gap = wall - gpu
    if gap <= max(HOST_GAP_SHARE * wall, HOST_GAP_MIN_US):
        return None
    out = HostGap(wall_us=wall, gpu_window_us=gpu, gap_us=gap, call=None)
    by_index = {i.index: i for i in its}
    syncs = sorted(rank.syncs, key=lambda s: -(s.blocked_us or 0.0))
    if syncs:
        s = syncs[0]
        it = by_index.get(s.iteration) if s.iteration is not None else None
        it_gap = ((it.wall_us or 0.0) - (it.gpu_window_us or 0.0)) if it else 0.0
        if (s.blocked_us or 0.0) >= 0.5 * it_gap > 0:
            out["call"] = BlockingCall(api=s.api, kind=s.kind, direction=s.direction, trigger=s.trigger, stack=s.stack,
                                       blocked_us=s.blocked_us, iteration=s.iteration, name=s.name or s.api)  # as the trace spells it
    return out


def largest_bubbles(rank: Rank, n: int = 5, iterations: set[int] | None = None) -> list[BubbleRow]:
    """The n longest bubbles (of `iterations` only, when given): iteration, start_us, dur_us, cause,
    cpu_ops [(name, µs or None)]."""
    listed = [b for b in rank.bubbles if iterations is None or b.iteration in iterations]
    bs = sorted(listed, key=lambda b: (-(b.dur_us or 0.0), b.start_us or 0.0))[:n]
    out = []
    for b in bs:
        names = list(b.cpu_ops)
        us: list[Num | None] = list(b.cpu_ops_us or [None] * len(names))
        out.append(BubbleRow(iteration=b.iteration, start_us=b.start_us, dur_us=b.dur_us, cause=b.cause, cpu_ops=list(zip(names, us))))
    return out


def idle_cpu_ops(rank: Rank, cause: str | None = None, n: int = 3) -> list[tuple[str, float | None]]:
    """The CPU ops the idle time went to, most idle time first (schema v2's bubble_cpu_ops); for a
    v1 summary, which has no times, the ops of the listed bubbles weighted by bubble length."""
    if rank.bubble_cpu_ops is not None:
        got: dict[str, float] = defaultdict(float)
        for x in rank.bubble_cpu_ops:
            if cause is None or x.cause == cause:
                got[x.cpu_op] += x.idle_us or 0.0
        return [(k, v) for k, v in sorted(got.items(), key=lambda kv: (-kv[1], kv[0]))[:n]]
    w: dict[str, float] = defaultdict(float)
    for b in rank.bubbles:
        if cause is None or b.cause == cause:
            for op in b.cpu_ops[:1]:
                w[op] += b.dur_us or 0.0
    return [(k, None) for k, _ in sorted(w.items(), key=lambda kv: (-kv[1], kv[0]))[:n]]


def bubble_causes(rank: Rank) -> dict[str, CauseCount]:
    """cause -> {count, us} over every bubble (v1: counted from the listed bubbles, which were all)."""
    return {c: CauseCount(count=v.count, us=v.us) for c, v in rank.bubbles_by_cause.items()}


def sync_groups(rank: Rank) -> list[SyncRow]:
    """(kind, api, name, direction, trigger) groups with count and blocked µs over every sync (v1:
    grouped from the list, which listed all); plus the innermost user frame of the group's longest
    listed sync. `name` is the call as the trace spells it (`hipMemcpyWithStream`; `api` is its CUDA
    twin, what is counted)."""
    frames: dict[tuple[str | None, ...], tuple[float, str | None]] = {}
    for s in rank.syncs:
        k = (s.kind, s.api, s.name or s.api, s.direction, s.trigger)
        if s.stack and (k not in frames or (s.blocked_us or 0.0) > frames[k][0]):
            frames[k] = (s.blocked_us or 0.0, str(s.stack).split(" ← ")[0])
    return [SyncRow(kind=g.kind, api=g.api, name=g.name or g.api, direction=g.direction, trigger=g.trigger, count=g.count,
                    blocked_us=g.blocked_us, frame=frames.get((g.kind, g.api, g.name or g.api, g.direction, g.trigger), (0.0, None))[1])
            for g in rank.sync_groups]
