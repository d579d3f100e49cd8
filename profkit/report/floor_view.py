"""The floor and the gap as a report shows them (analysis/floor.py, attribution/floor_gap.py): the headline line, the
gap's rows, what a diff says the optimization closed. Words and rows only; each renderer lays them out.

Per-iteration figures are means over the rank's iterations of the kind most of them are (the split's terms add up
exactly in each iteration, so their means do too; medians would not)."""

from __future__ import annotations

from collections import Counter

from profkit.documents import Diff, FloorGap, FloorPeaks, GapChange, Iteration, ModeledOp, Rank, UnsetType, typed_or_none

GAP_TITLE = "gap to the floor (mean µs per iteration; the terms add up to the gap)"


def _steps(rank: Rank) -> tuple[str, list[Iteration]]:
    """The iterations of the most common (kind, batch size) that have a floor, and its label."""
    its = [it for it in rank.iterations if it.floor_us is not None and it.gap_us is not None]
    if not its:
        return "", []
    key = Counter((it.kind, it.batch_size) for it in its).most_common(1)[0][0]
    mine = [it for it in its if (it.kind, it.batch_size) == key]
    kind, bs = key
    return f"{kind or 'step'}{f' bs={bs}' if bs is not None else ''}", mine


def _mean(vals: list[float]) -> float:
    return sum(vals) / len(vals) if vals else 0.0


def floor_note(rank: Rank) -> str | None:
    """Why a rank has no floor (one line), None when it has one or says nothing (a summary written before issue 41)."""
    f = rank.floor
    if f is None or not f.note:
        return None
    return f"floor: {f.note}"


def floor_line(rank: Rank) -> str | None:
    """"decode bs=1 (5 steps, mean): GPU window 19,128.2 µs, busy 1,264.7 µs, floor 253.9 µs (memory): 5.0× busy, 75× window" """
    label, its = _steps(rank)
    if not its:
        return None
    win = _mean([float(it.gpu_window_us or 0) for it in its])
    busy = _mean([float(it.gpu_busy_us or 0) for it in its])
    fl = _mean([float(it.floor_us or 0) for it in its])
    bound = Counter(it.floor_bound for it in its).most_common(1)[0][0]
    peaks = rank.floor.peaks if rank.floor is not None else None
    src = f"; peaks: {peaks.device}, {peaks.source}" if isinstance(peaks, FloorPeaks) else ""
    ratio = f": {busy / fl:,.1f}× busy, {win / fl:,.0f}× window" if fl > 0 else ""
    # the floor covers the ops with a work model only: how much of the GPU time that is
    gs = [it.gap_us for it in its if it.gap_us is not None]
    op_time = _mean([sum(float(v or 0) for v in (it.category_us or {}).values()) for it in its])
    unmodeled = _mean([float(g.unmodeled_us) for g in gs])
    share = 100 * (op_time - unmodeled) / op_time if op_time > 0 else 0.0
    cover = f"; work modeled for {share:.1f}% of the GPU op time" if 0 < share < 10 else f"; work modeled for {share:.0f}% of the GPU op time" if op_time > 0 else ""
    steps = f"{len(its)} step{'s' if len(its) != 1 else ''}"
    return f"{label} ({steps}, mean): GPU window {win:,.1f} µs, busy {busy:,.1f} µs, floor {fl:,.1f} µs ({bound}){ratio}{cover}{src}"


def gap_rows(rank: Rank) -> list[tuple[str, float]]:
    """(term, mean µs) of the gap's split, largest first within each group, then the gap itself."""
    _, its = _steps(rank)
    if not its:
        return []
    gs = [it.gap_us for it in its if it.gap_us is not None]
    n = len(gs)

    def mean_map(attr: str) -> dict[str, float]:
        keys = {k for g in gs for k in getattr(g, attr)}
        return {k: sum(float(getattr(g, attr).get(k, 0)) for g in gs) / n for k in keys}

    rows: list[tuple[str, float]] = []
    for k, v in sorted(mean_map("idle_us_by_cause").items(), key=lambda kv: -kv[1]):
        if v:
            rows.append((f"idle: {k.replace('_', ' ')}", v))
    for k, v in sorted(mean_map("above_floor_us_by_category").items(), key=lambda kv: -kv[1]):
        rows.append((f"{k} above its floor", v))
    rows.append(("floor mix", _mean([float(g.floor_mix_us) for g in gs])))
    for k, v in sorted(mean_map("unmodeled_us_by_category").items(), key=lambda kv: -kv[1]):
        rows.append((f"{k} unmodeled", v))
    ov = _mean([float(g.overlap_us) for g in gs])
    if ov:
        rows.append(("− overlap", -ov))
    rows.append(("gap (GPU window − floor)", _mean([float(g.total_us) for g in gs])))
    return rows


def gap_headline(rank: Rank, n: int = 3) -> str | None:
    """"gap 18,874.3 µs: idle launch 16,102.0, gemm above its floor 1,650.2, memcpy unmodeled 85.0" """
    rows = gap_rows(rank)
    if not rows:
        return None
    total = rows[-1][1]
    parts = sorted(rows[:-1], key=lambda r: -abs(r[1]))[:n]
    return f"gap {total:,.1f} µs: " + ", ".join(f"{t} {v:,.1f}" for t, v in parts)


def diff_floor(diff: Diff) -> FloorGap | None:
    """The diff's `floor` section typed (None: the diff has none)."""
    return typed_or_none(diff.floor, FloorGap)


def closed_text(diff: Diff) -> str | None:
    """"topk_v2 closed 352.3 of the 2,628.8 µs gap between the step and its floor (topk: time −357.1 µs; …)", or a note."""
    f = diff_floor(diff)
    if f is None:
        return None
    if f.note:
        return f"floor: {f.note}"
    o = f.optimization
    g = f.gap_us or GapChange()
    gap = f"gap to the floor {g.baseline:,.1f} → {g.candidate:,.1f} µs ({g.delta:+,.1f}) per iteration"
    if o is None:
        return gap
    if o.closed_us is None:
        return f"{gap}; {o.name} has no category of its own in the catalog: no share of it to name"
    verb = "closed" if o.closed_us >= 0 else "widened it by"
    amount = f"{abs(o.closed_us):,.1f} of the {o.baseline_gap_us:,.1f} µs" if o.closed_us >= 0 else f"{abs(o.closed_us):,.1f} µs of the {o.baseline_gap_us:,.1f} µs"
    return (f"{o.name} {verb} {amount} gap between the step and its floor ({', '.join(o.categories)}: time "
            f"{o.own_time_change_us:+,.1f} µs); {gap}")


def diff_gap_rows(diff: Diff) -> list[tuple[str, float, float, float]]:
    """(term, baseline, candidate, Δ) of the gap's split on each side of a diff."""
    f = diff_floor(diff)
    if f is None or f.note or not f.terms or f.baseline is None or f.candidate is None or f.gap_us is None:
        return []
    rows = [("floor", f.baseline.floor_us, f.candidate.floor_us, f.candidate.floor_us - f.baseline.floor_us)]
    names = {"idle_us": "idle", "above_floor_us": "above the ops' floors", "floor_mix_us": "floor mix", "unmodeled_us": "unmodeled",
             "overlap_us": "− overlap"}
    for k, label in names.items():
        t = f.terms[k]
        sign = -1 if k == "overlap_us" else 1
        rows.append((label, sign * t.baseline, sign * t.candidate, sign * t.delta))
    g = f.gap_us
    rows.append(("gap", g.baseline, g.candidate, g.delta))
    return rows


OPS_COLUMNS = ("launching op and shapes", "GPU ops", "µs", "TFLOP/s", "TB/s", "% of peak", "bound")


def op_rows(rank: Rank, n: int = 8) -> list[tuple[str, ...]]:
    """The modeled launching ops, most time first (the rank's `floor.ops`): op and shapes, GPU ops, time, achieved
    TFLOP/s and TB/s, the larger share of the peaks, and which bound the op's own floor is."""
    from profkit.terms import shape_text
    from profkit.report.numbers import num

    ops: list[ModeledOp] = (rank.floor.ops or []) if rank.floor is not None else []
    out: list[tuple[str, ...]] = []
    for o in ops[:n]:
        share = max(o.memory_share or 0.0, o.compute_share or 0.0)
        shared = not (isinstance(o.memory_share, UnsetType) and isinstance(o.compute_share, UnsetType))
        out.append((shape_text(o.shape_op, o.shape, o.shape_dtypes), str(o.gpu_ops), num(o.total_us),
                    f"{o.tflop_s:,.2f}" if not isinstance(o.tflop_s, UnsetType) else "–", f"{o.tb_s:,.3f}" if not isinstance(o.tb_s, UnsetType) else "–",
                    f"{100 * share:.1f}%" if shared else "–", o.bound if isinstance(o.bound, str) else "–"))
    return out
