"""A diff's terms per profile window, and the one statistic every report shows (DESIGN.md "Categories
and phases by ownership in a diff", "One statistic, everywhere").

Pure: lists of summary.json iterations (profkit.documents.Iteration) in, exact Fractions of integer ns out (`decomposition`: diff.json's typed section).

* **By ownership.** Each compared iteration contributes the GPU time of the ops it owns
  (``owned_category_us``, ``owned_phase_us``, ``owned_overlap_us``, summary.json v3), and the
  **backlog** is what the clock saw that this own work does not account for: ``backlog = busy -
  owned_gpu``. Per iteration ``window = busy + idle`` and ``sum(owned category) - owned overlap =
  owned_gpu``, so ``window = sum(owned category) - owned overlap + idle + backlog`` exactly, and a
  change in how far the GPU runs behind the host lands in the backlog, never in a category.
  Summaries without the owned fields (v1, v2) fall back to time by the clock with no backlog term
  (``basis: "clock"``): the identity still holds, but the categories carry the backlog's drift.
* **Per window, then the median.** Each side's profile windows give exact means over their compared
  iterations; window i of the baseline is paired with window i of the candidate (recorded next to
  each other when the windows alternate, A B A B); a term's change is the median over the pairs of
  the per-window change, and its noise is the largest spread (max - min): of either side's windows, or of the
  per-window changes themselves.
  Every pair's terms add up exactly; medians of terms need not add up, so the identity is checked
  per window.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, NamedTuple

from profkit.documents import Change, Decomposition, DecompositionSide, Iteration, Spreads, WindowChange
from profkit.terms import CAUSES

IDLE_KEYS = (*CAUSES, "short_gaps")
OWNED_FIELDS = ("owned_category_us", "owned_gpu_us")


class Terms(dict[str, Fraction]):
    """Exact terms by flat key (``gpu_window_us``, ``category_us.topk``, ...): a term absent from a
    window (a category it did not run) is 0."""

    def __missing__(self, key: str) -> Fraction:
        return Fraction(0)


@dataclass(frozen=True)
class Stat:
    """One term of `window_statistic` (exact ns): each side's median over its windows and its spread (max - min), the
    median over paired windows of the per-window change and that change's spread, the noise (the largest of the three
    spreads), and each pair's own change."""
    baseline: Fraction = Fraction(0)
    candidate: Fraction = Fraction(0)
    baseline_spread: Fraction = Fraction(0)
    candidate_spread: Fraction = Fraction(0)
    delta_spread: Fraction = Fraction(0)
    delta: Fraction = Fraction(0)
    noise: Fraction = Fraction(0)
    per_window: tuple[Fraction, ...] = ()


class Stats(dict[str, Stat]):
    """`window_statistic`'s figures by flat key: a term absent from every window is 0 on both sides."""

    def __missing__(self, key: str) -> Stat:
        return Stat()


class Parts(NamedTuple):
    """One iteration's terms in integer ns on a basis (`components`)."""
    window: int
    busy: int
    wall: int
    idle: int
    overlap: int
    backlog: int
    cats: dict[str, int]
    phases: dict[str, int]
    idle_by: dict[str, int]


def _ns(us: float | int | None) -> int:
    return 0 if us is None else int(round(float(us) * 1000))


def _us(ns: Fraction | int | None) -> float | None:
    return None if ns is None else float(Fraction(ns) / 1000)


def basis_of(windows: Sequence[Sequence[Iteration]]) -> str:
    """``ownership`` when every iteration of every window carries the owned fields (summary.json v3), else ``clock``."""
    its = [it for w in windows for it in w]
    return "ownership" if its and all(it.owned_category_us is not None and it.owned_gpu_us is not None for it in its) else "clock"


def components(it: Iteration, basis: str) -> Parts:
    """One iteration's terms in integer ns on `basis`."""
    idle = _ns(it.gpu_idle_us)
    busy = _ns(it.gpu_busy_us)
    by_cause = {c: _ns(it.bubble_us_by_cause.get(c)) for c in CAUSES}
    by_cause["short_gaps"] = idle - sum(by_cause.values())
    if basis == "ownership":
        cats = {k: _ns(v) for k, v in (it.owned_category_us or {}).items()}
        owned_gpu = _ns(it.owned_gpu_us)
        overlap = sum(cats.values()) - owned_gpu  # == owned_overlap_us, recomputed from the same ns
        phases = {k: _ns(v) for k, v in (it.owned_phase_us or {}).items()}
        backlog = busy - owned_gpu
    else:
        cats = {k: _ns(v) for k, v in it.category_us.items()}
        overlap = _ns(it.overlap_us)
        phases = {k: _ns(v) for k, v in it.phase_us.items()}
        backlog = 0
    return Parts(window=_ns(it.gpu_window_us), busy=busy, wall=_ns(it.wall_us), idle=idle,
                 overlap=overlap, backlog=backlog, cats=cats, phases=phases, idle_by=by_cause)


def flat_means(its: Sequence[Iteration], basis: str) -> Terms:
    """Exact means over `its` of every term, as flat keys (``gpu_window_us``, ``category_us.topk``,
    ``phase_us.draft``, ``overlap_us``, ``idle_us_by_cause.sync``, ``backlog_us``, ...); a
    category missing from an iteration counts 0."""
    n = len(its)
    if n == 0:
        return Terms()
    sums: dict[str, int] = defaultdict(int)

    def add(k: str, v: int) -> None:
        sums[k] += v

    for it in its:
        c = components(it, basis)
        for name, v in (("gpu_window_us", c.window), ("gpu_busy_us", c.busy), ("wall_us", c.wall), ("idle_us", c.idle),
                        ("overlap_us", c.overlap), ("backlog_us", c.backlog)):
            add(name, v)
        for k, v in c.cats.items():
            add(f"category_us.{k}", v)
        for k, v in c.phases.items():
            add(f"phase_us.{k}", v)
        for k, v in c.idle_by.items():
            add(f"idle_us_by_cause.{k}", v)
    return Terms({k: Fraction(v, n) for k, v in sums.items()})


def residual(delta: Terms) -> Fraction:
    """Δwindow − (ΣΔcategory − Δoverlap + ΣΔidle by cause + Δbacklog): 0 when the terms add up."""
    cats = sum((v for k, v in delta.items() if k.startswith("category_us.")), Fraction(0))
    idle = sum((delta[f"idle_us_by_cause.{k}"] for k in IDLE_KEYS), Fraction(0))
    return delta["gpu_window_us"] - (cats - delta["overlap_us"] + idle + delta["backlog_us"])


def _median(vals: Sequence[Fraction]) -> Fraction:
    return Fraction(statistics.median(vals))


def window_statistic(base: Sequence[Terms], cand: Sequence[Terms]) -> Stats:
    """Per key: each side's median over its windows (and spread), the median over paired windows of
    the per-window change, the noise (the largest spread), and the pairs' own changes. `base` and
    `cand` are per-window flat means (`flat_means`), in recording order."""
    keys = sorted({k for m in (*base, *cand) for k in m})
    pairs = list(zip(base, cand))
    out = Stats()
    for k in keys:
        bv = [m[k] for m in base]
        cv = [m[k] for m in cand]
        d = [c[k] - b[k] for b, c in pairs]
        sb, sc = max(bv) - min(bv), max(cv) - min(cv)
        sd = max(d) - min(d) if d else Fraction(0)
        # the noise: the larger of either side's spread over its windows and the spread of the per-window changes
        # themselves (a change that one pair of windows shows and another does not is not established)
        out[k] = Stat(baseline=_median(bv), candidate=_median(cv), baseline_spread=sb, candidate_spread=sc,
                      delta_spread=sd, delta=_median(d), noise=max(sb, sc, sd), per_window=tuple(d))
    return out


def unstable_windows(base: Sequence[Terms], cand: Sequence[Terms], ratio: float) -> str | None:
    """A sentence when one side's windows disagree by more than `ratio` (max/min of their mean GPU window), else None."""
    bad = []
    for side, ws in (("baseline", base), ("candidate", cand)):
        v = [w["gpu_window_us"] for w in ws]
        if len(v) > 1 and min(v) > 0 and max(v) / min(v) > Fraction(ratio):
            bad.append(f"the {side}'s profile windows disagree {float(max(v) / min(v)):.1f}× (mean GPU window "
                       f"{float(min(v)) / 1000:,.0f}–{float(max(v)) / 1000:,.0f} µs)")
    return "; ".join(bad) or None


def judged(base: Sequence[Any], cand: Sequence[Any]) -> bool:
    """Whether a noise estimate exists: a window on each side and at least two on one."""
    return bool(base) and bool(cand) and max(len(base), len(cand)) >= 2


def within(delta: Fraction, noise: Fraction) -> bool:
    """A change smaller than the noise (or none at all) is within noise."""
    return delta == 0 or abs(delta) < noise


def decomposition(base: Sequence[Terms], cand: Sequence[Terms], basis: str, *,
                  unstable: str | None = None, idle: Sequence[str] = IDLE_KEYS) -> Decomposition:
    """diff.json's ``decomposition``: every term as the statistic (median over paired windows of the
    per-window change), its noise beside it (None when not judged), each pair's exact terms and
    residual, and each side's medians over its windows. `idle`: the idle causes it lists (a GPU diff
    leaves out the CPU timeline's "python"); the residual counts every one."""
    st = window_statistic(base, cand)
    use_noise = judged(base, cand) and unstable is None  # unstable windows: not judged, whatever their spread
    cats = sorted(k.split(".", 1)[1] for k in st if k.startswith("category_us."))
    phases = sorted(k.split(".", 1)[1] for k in st if k.startswith("phase_us."))
    get = st.__getitem__

    def by_size(keys: Sequence[str], prefix: str) -> list[str]:
        return sorted(keys, key=lambda k: (-abs(get(f"{prefix}.{k}").delta), k))

    def delta(k: str) -> float:
        return float(Fraction(get(k).delta) / 1000)  # _us of a figure that is always there

    def noise(k: str) -> float | None:
        return _us(get(k).noise) if use_noise else None

    def side(base: bool) -> DecompositionSide:
        def at(k: str) -> float | None:
            s = get(k)
            return _us(s.baseline if base else s.candidate)

        return DecompositionSide(
            gpu_window_us=at("gpu_window_us"), gpu_busy_us=at("gpu_busy_us"),
            category_us={k: at(f"category_us.{k}") for k in cats},
            phase_us={k: at(f"phase_us.{k}") for k in phases},
            overlap_us=at("overlap_us"), idle_us=at("idle_us"),
            idle_us_by_cause={k: at(f"idle_us_by_cause.{k}") for k in idle},
            backlog_us=at("backlog_us"),
        )

    per_window: list[WindowChange] = []
    worst = Fraction(0)
    for i, (b, c) in enumerate(zip(base, cand)):
        d = Terms({k: c[k] - b[k] for k in st})
        r = residual(d)
        worst = max(worst, abs(r))
        per_window.append(WindowChange(
            window=i, gpu_window_us=_us(d["gpu_window_us"]),
            category_us={k: _us(d[f"category_us.{k}"]) for k in cats},
            overlap_us=_us(d["overlap_us"]),
            idle_us_by_cause={k: _us(d[f"idle_us_by_cause.{k}"]) for k in idle},
            backlog_us=_us(d["backlog_us"]),
            phase_us={k: _us(d[f"phase_us.{k}"]) for k in phases},
            residual_us=_us(r), exact=r == 0,
        ))
    n = len(per_window)
    g = get("gpu_window_us")
    return Decomposition(
        unstable=unstable,
        statistic=(f"median over {n} profile windows of the per-window change" if n > 1 else
                   "mean over the compared iterations (one profile window a side)"),
        basis=basis,
        windows=n,
        judged=use_noise,
        identity=("per window: delta gpu_window = sum(delta category) - delta overlap + sum(delta idle by cause) + delta backlog"
                  + ("; categories, phases and overlap by ownership, backlog = busy - owned GPU time" if basis == "ownership" else
                     "; categories by the clock (the summaries have no owned_category_us: re-run profkit analyze to split out the backlog)")),
        gpu_window_us=Change(baseline=_us(g.baseline), candidate=_us(g.candidate), delta=_us(g.delta),
                             # the change's own ratio (1 + delta / baseline), so that ratio and delta say the same
                             ratio=float((g.baseline + g.delta) / g.baseline) if g.baseline else None),
        category_us={k: delta(f"category_us.{k}") for k in by_size(cats, "category_us")},
        overlap_us=delta("overlap_us"),
        idle_us=delta("idle_us"),
        idle_us_by_cause={k: delta(f"idle_us_by_cause.{k}") for k in idle},
        backlog_us=delta("backlog_us"),
        phase_us={k: delta(f"phase_us.{k}") for k in by_size(phases, "phase_us")},
        # the noise each term is judged against (None: not judged), keyed like the terms
        spread_us=Spreads(
            gpu_window_us=noise("gpu_window_us"),
            category_us={k: noise(f"category_us.{k}") for k in cats},
            overlap_us=noise("overlap_us"), idle_us=noise("idle_us"),
            idle_us_by_cause={k: noise(f"idle_us_by_cause.{k}") for k in idle},
            backlog_us=noise("backlog_us"),
            phase_us={k: noise(f"phase_us.{k}") for k in phases},
        ),
        residual_us=_us(worst), exact=all(p.exact for p in per_window),
        per_window=per_window,
        baseline=side(True),
        candidate=side(False),
    )
