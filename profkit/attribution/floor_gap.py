"""A diff's change of the gap to the hardware floor (DESIGN.md "Work and the hardware floor", "Attribution").

Each side's gap (`gpu_window_us − floor_us`, analysis/floor.py) and its split, as means over the compared
iterations of each profile window, then — one statistic, everywhere — each side's median over its windows and
the median over paired windows of the per-window change. What the optimization closed: the change of its own
categories' part of the gap, by ownership as the diff's categories are (each iteration's own GPU time in the
category minus the own floors of its work there, `work_by_category[c].floor_us`), negated:

    closed_us = −Σ over its categories of Δ(owned_category_us[c] − work_by_category[c].floor_us)

so that "topk_v2 closed 354 of the 2,065 µs gap" reads against the baseline's gap; beside it, the change of
those categories' time alone (the two differ by the change of their floors: the work the optimization added or
removed). Nothing here when a side has no floor (no shapes, or no peaks): `note` says which and what to run.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypedDict

from profkit.documents import FloorSection, Iteration

TERMS = ("idle_us", "above_floor_us", "floor_mix_us", "unmodeled_us", "overlap_us")


def _mean(vals: Sequence[float]) -> float:
    return sum(vals) / len(vals) if vals else 0.0


def _window_means(its: Sequence[Iteration], owned: Sequence[str]) -> dict[str, float]:
    out: dict[str, float] = {}
    g = [it.gap_us for it in its]
    out["gpu_window_us"] = _mean([float(it.gpu_window_us or 0) for it in its])
    out["floor_us"] = _mean([float(it.floor_us or 0) for it in its])
    out["gap_us"] = _mean([float(x.total_us) for x in g if x is not None])
    for t in TERMS:
        out[t] = _mean([float(getattr(x, t)) for x in g if x is not None])
    cats = sorted({c for it in its for c in (it.owned_category_us or it.category_us or {})} | {c for it in its for c in (it.work_by_category or {})})
    for c in cats:
        time = _mean([float((it.owned_category_us if it.owned_category_us is not None else it.category_us).get(c) or 0) for it in its])
        fl = _mean([float(it.work_by_category[c].floor_us) if it.work_by_category and c in it.work_by_category else 0.0 for it in its])
        out[f"category_time_us.{c}"] = time
        out[f"category_gap_us.{c}"] = time - fl
    out["own_time_us"] = sum(out.get(f"category_time_us.{c}", 0.0) for c in owned)
    out["own_gap_us"] = sum(out.get(f"category_gap_us.{c}", 0.0) for c in owned)
    return out


@dataclass(frozen=True)
class _Stat:
    """A figure's statistic: each side's median over its windows, the median of the per-window change, the largest spread."""
    baseline: float
    candidate: float
    delta: float
    spread: float


class FloorSide(TypedDict):
    """A side's gap to the floor and its split (µs per iteration)."""
    gpu_window_us: float
    floor_us: float
    gap_us: float
    idle_us: float
    above_floor_us: float
    floor_mix_us: float
    unmodeled_us: float
    overlap_us: float


class FloorChange(TypedDict):
    baseline: float
    candidate: float
    delta: float
    spread: float


class FloorOptimization(TypedDict):
    """What the optimization closed of the gap (None: it owns no category)."""
    name: str
    categories: list[str]
    closed_us: float | None
    own_time_change_us: float | None
    baseline_gap_us: float
    spread_us: float | None


class _FloorGap(TypedDict):
    statistic: str
    baseline: FloorSide
    candidate: FloorSide
    gap_us: FloorChange
    terms: dict[str, FloorChange]
    category_gap_us: dict[str, FloorChange]


class FloorGap(_FloorGap, total=False):
    """diff.json's `floor` with a floor on both sides (`optimization`: with --opt)."""
    optimization: FloorOptimization


class FloorNote(TypedDict):
    """diff.json's `floor` without a floor on a side: which, and what to run."""
    note: str


def _has_floor(windows: Sequence[Sequence[Iteration]]) -> bool:
    its = [it for w in windows for it in w]
    return bool(its) and all(it.floor_us is not None and it.gap_us is not None for it in its)


def gap_change(wb: Sequence[Sequence[Iteration]], wc: Sequence[Sequence[Iteration]], *, opt: str | None, catalog: Any,
               floor_notes: tuple[FloorSection | None, FloorSection | None] = (None, None)) -> FloorGap | FloorNote | None:
    """diff.json's `floor` section from each side's profile windows (their compared iterations); None when neither side
    has a floor or a note (a summary written before issue 41)."""
    hb, hc = _has_floor(wb), _has_floor(wc)
    if not (hb and hc):
        if not (hb or hc) and all(n is None for n in floor_notes):
            return None
        missing = [side for side, has in (("baseline", hb), ("candidate", hc)) if not has]
        why = next((n.note for n in floor_notes if n is not None and isinstance(n.note, str) and n.note), None)
        return FloorNote(note=f"no floor for the {' and '.join(missing)}: " + (why or "its summary has no floor figures (re-run `profkit analyze` "
                                                                                 "on traces recorded with `profkit trace --record-shapes`)"))
    optimizations: Mapping[str, Sequence[str]] = getattr(catalog, "optimizations", None) or {}
    owned = list(optimizations.get(opt, ())) if opt else []
    fb = [_window_means(w, owned) for w in wb]
    fc = [_window_means(w, owned) for w in wc]
    keys = sorted({k for m in (*fb, *fc) for k in m})
    pairs = list(zip(fb, fc))
    stat: dict[str, _Stat] = {}
    for k in keys:
        bv, cv = [m.get(k, 0.0) for m in fb], [m.get(k, 0.0) for m in fc]
        d = [c.get(k, 0.0) - b.get(k, 0.0) for b, c in pairs]
        stat[k] = _Stat(baseline=statistics.median(bv), candidate=statistics.median(cv), delta=statistics.median(d) if d else 0.0,
                        spread=max(max(bv) - min(bv), max(cv) - min(cv), (max(d) - min(d)) if d else 0.0))

    def side(base: bool) -> FloorSide:
        def at(k: str) -> float:
            return round(stat[k].baseline if base else stat[k].candidate, 3)

        return FloorSide(gpu_window_us=at("gpu_window_us"), floor_us=at("floor_us"), gap_us=at("gap_us"), idle_us=at("idle_us"),
                         above_floor_us=at("above_floor_us"), floor_mix_us=at("floor_mix_us"), unmodeled_us=at("unmodeled_us"),
                         overlap_us=at("overlap_us"))

    def ch(k: str) -> FloorChange:
        v = stat[k]
        return FloorChange(baseline=round(v.baseline, 3), candidate=round(v.candidate, 3), delta=round(v.delta, 3), spread=round(v.spread, 3))

    out = FloorGap(
        statistic="median over paired profile windows of the per-window change of the means over the compared iterations",
        baseline=side(True),
        candidate=side(False),
        gap_us=ch("gap_us"),
        terms={t: ch(t) for t in TERMS},
        category_gap_us={k.split(".", 1)[1]: ch(k) for k in keys if k.startswith("category_gap_us.")},
    )
    if opt:
        closed = -stat["own_gap_us"].delta if owned else None
        out["optimization"] = FloorOptimization(
            name=opt, categories=owned,
            closed_us=round(closed, 3) if closed is not None else None,
            own_time_change_us=round(stat["own_time_us"].delta, 3) if owned else None,
            baseline_gap_us=round(stat["gap_us"].baseline, 3),
            spread_us=round(stat["own_gap_us"].spread, 3) if owned else None,
        )
    return out

