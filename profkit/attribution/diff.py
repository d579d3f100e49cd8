"""Two summaries (summary.json v1) -> diff.json v1: what changed per iteration, and why (DESIGN.md "Attribution").

Pure: summaries in (profkit.documents.Summary; a summary.json dict is decoded on entry), diff.json
out as the profkit.documents.Diff it is read as (encoded once where it is written: documents.diff_doc);
no files, no printing.

Rules:

* Like with like: only iterations of one shape (kind, batch size) are compared, the shape present on
  both sides with the most iterations. Each rank's last iteration is left out when it has others:
  its GPU window ends at its last op's end instead of the next iteration's start, so it lacks the
  boundary idle time that every other window has.
* The change in the MEAN per-iteration ``gpu_window_us`` splits exactly into per-category changes,
  minus the change in overlap, plus the change in idle time split by bubble cause (and
  ``short_gaps``: idle time in gaps shorter than the bubble threshold). Every per-iteration figure is
  taken back to integer nanoseconds (summary.json writes ns / 1000) and the means are exact
  rationals, so ``residual_us`` is 0 whenever each iteration satisfies ``window = busy + idle`` and
  ``sum(category) - overlap = busy``, which the analysis guarantees.
* Counts (kernels, launches, syncs, copies, bubbles) are per-iteration medians: medians do not add
  up, but they are what a reader means by "per iteration".
* Kernels are matched by normalized name (template arguments, ``(anonymous namespace)`` and
  argument lists folded), so a re-instantiated template is not "added" and "removed".
"""

from __future__ import annotations

import re
import statistics
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, NamedTuple

from profkit import __version__
from profkit.analysis.shapes import shape_text
from profkit.attribution import capture_terms
from profkit.ingest.identity import short_label
from profkit.errors import NothingToAnalyze, UsageError
from profkit.attribution.findings import idle_cpu_ops, largest_bubbles
from profkit.documents import (UNSET, BubbleView, CategoryChange, Change, CpuOpTime, Diff, ExpectedEffect, IdleCpuOp, Iteration, IterationsUsed,
                               KernelEntry, LargeBubble, Mover, Noise, NoiseMetric, NoiseSide, NoiseTerm, NotJudged, OwnTerm, Pair, Rank,
                               SeriesPoint, Shape as ShapeInfo, SideBySide, SideInfo, Summary, SyncChange, UnsetType, manifest_of, summary_of)
from profkit.terms import CAUSES, COUNT_KEYS, SERIES_FIELDS, TIMING_KEYS, term_label
from profkit.attribution.windows import Stat, Stats, Terms, basis_of, decomposition as window_decomposition, flat_means, judged, unstable_windows, window_statistic, within

DIFF_SCHEMA_VERSION = 1
IDLE_KEYS = (*CAUSES, "short_gaps")
# a GPU diff's idle terms: "python" is a CPU-only timeline's cause (analysis/rank.py), never listed for a GPU
GPU_IDLE_KEYS = tuple(k for k in IDLE_KEYS if k != "python")


def idle_keys(*ranks: Rank) -> tuple[str, ...]:
    """The idle terms a diff lists: with "python" when a side is a CPU-only run."""
    return IDLE_KEYS if any(r.device_timeline == "cpu" for r in ranks) else GPU_IDLE_KEYS
MATERIAL_SHARE = 0.01  # a judged change smaller than this share of the baseline's GPU window is reported, never flagged
ABS_THRESHOLD_NS = 1_000
TOP_MOVERS = 20
MAX_KERNEL_LIST = 200

Shape = tuple[str, "int | None"]


# ---------------------------------------------------------------------------------------------
# kernel names


def _fold(s: str, open_: str, close: str, *, attached_only: bool = False) -> str:
    """Replace every outermost ``open_ ... close`` group by ``open_ + close``.

    ``attached_only``: only groups that follow an identifier character, ``>`` or ``]`` directly
    (an argument list), so ``Memcpy DtoH (Device -> Pageable)`` keeps its parentheses.
    Unbalanced input is returned unchanged.
    """
    out: list[str] = []
    depth = 0
    for i, ch in enumerate(s):
        if ch == open_ and (depth > 0 or not attached_only or (i > 0 and (s[i - 1].isalnum() or s[i - 1] in "_>]"))):
            if depth == 0:
                out.append(ch)
            depth += 1
        elif ch == close and depth > 0:
            depth -= 1
            if depth == 0:
                out.append(ch)
        elif depth == 0:
            out.append(ch)
    return s if depth else "".join(out)


_WS = re.compile(r"\s+")


def normalize_kernel_name(name: str) -> str:
    """Fold the parts of a kernel name that change with instantiation, not with what the kernel is.

    >>> normalize_kernel_name("void at::native::(anonymous namespace)::k<float, 4>(int, float*)")
    'void at::native::k<>()'
    """
    s = name.replace("(anonymous namespace)::", "").replace("(anonymous namespace)", "")
    # Template argument lists follow a name (`k<float, 4>`); a lone "<" or "->" is left alone, and an
    # unbalanced fold is a no-op.
    s = _fold(s, "<", ">", attached_only=True)
    s = _fold(s, "(", ")", attached_only=True)
    return _WS.sub(" ", s).strip()


# ---------------------------------------------------------------------------------------------
# helpers


def _ns(us: float | int | None) -> int:
    """summary.json µs (ns / 1000 as a float) -> the integer ns it came from."""
    return 0 if us is None else int(round(float(us) * 1000))


def _us(ns: Fraction | int | float | None) -> float | None:
    return None if ns is None else float(Fraction(ns) / 1000)


def shape_of(it: Iteration) -> Shape:
    return (str(it.kind or "unknown"), it.batch_size)


ENGINE_KINDS = ("decode", "extend", "verify", "mixed", "idle", "unknown")


def shape_label(shape: Shape) -> str:
    """``decode bs=4``, ``mixed bs=46``; a graph capture says its kernels did not run; iterations of
    a user's --marker are named after it (``decode_step iterations``)."""
    kind, bs = shape
    if kind == "graph_capture":
        return "graph capture (kernels did not run)"
    if kind not in ENGINE_KINDS:
        kind = f"{kind} iterations"
    return kind if bs is None else f"{kind} bs={bs}"


def pick_rank(summary: Summary, rank: int, side: str) -> Rank:
    ranks = summary.ranks
    if not ranks:
        raise UsageError(f"{side}: the summary has no ranks", hint="is it a summary.json written by `profkit analyze --json`?")
    for r in ranks:
        if r.rank == rank:
            return r
    have = ", ".join(str(r.rank) for r in ranks)
    raise UsageError(f"{side}: no rank {rank} in the summary (ranks: {have})", hint="pass --rank with one of those")


def _steady(rank: Rank) -> list[Iteration]:
    its = list(rank.iterations)
    return its[:-1] if len(its) > 1 else its


def select_shape(base_its: Sequence[Iteration], cand_its: Sequence[Iteration]) -> tuple[Shape | None, list[str]]:
    """The shape to compare: present on both sides, most iterations in total (ties: more on the
    smaller side, then name). None when the sides share no shape."""
    cb, cc = Counter(shape_of(i) for i in base_its), Counter(shape_of(i) for i in cand_its)
    warnings: list[str] = []
    common = set(cb) & set(cc)
    if not common:
        return None, warnings
    shape = max(common, key=lambda s: (cb[s] + cc[s], min(cb[s], cc[s]), shape_label(s)))
    if set(cb) != set(cc):
        warnings.append(
            f"the sides hold different iteration shapes (baseline: {_shapes_text(cb)}; candidate: {_shapes_text(cc)}); "
            f"comparing {shape_label(shape)} only"
        )
    elif len(cb) > 1:
        warnings.append(f"several iteration shapes ({_shapes_text(cb)}); comparing {shape_label(shape)} only")
    return shape, warnings


def speculative_pair(base_its: Sequence[Iteration], cand_its: Sequence[Iteration]) -> tuple[Shape, Shape] | None:
    """(baseline decode shape, candidate verify shape) when speculative decoding is on in the candidate
    only: the baseline has no verify step, the candidate's most common shape is verify bs=B and the
    baseline has decode bs=B steps (vLLM with an n-gram drafter: some steps find no draft and stay
    decode steps, so the sides may share decode bs=B too, but those are not what changed)."""
    cb, cc = Counter(shape_of(i) for i in base_its), Counter(shape_of(i) for i in cand_its)
    if not cc or any(k == "verify" for k, _ in cb):
        return None
    (kind, bs), _ = max(cc.items(), key=lambda kv: (kv[1], shape_label(kv[0])))
    if kind != "verify" or ("decode", bs) not in cb:
        return None
    return ("decode", bs), ("verify", bs)


def _shapes_text(c: Counter[Shape]) -> str:
    return ", ".join(f"{n}× {shape_label(s)}" for s, n in sorted(c.items(), key=lambda kv: (-kv[1], shape_label(kv[0]))))


def _select(rank: Rank, shape: Shape | None) -> list[Iteration]:
    its = _steady(rank)
    return its if shape is None else [i for i in its if shape_of(i) == shape]


def _median(vals: Sequence[float]) -> float | None:
    return statistics.median(vals) if vals else None


def _counts(its: Sequence[Iteration]) -> dict[str, float | None]:
    return {k: _median([i.count(k) for i in its]) for k in COUNT_KEYS}


def _timings(its: Sequence[Iteration]) -> dict[str, float | None]:
    return {k: _median([v for i in its if (v := getattr(i, k)) is not None]) for k in TIMING_KEYS}


def _side_by_side(b: float | None, c: float | None) -> SideBySide:
    delta = None if b is None or c is None else c - b
    return SideBySide(baseline=b, candidate=c, delta=delta)


def _stat_ratio(m: Stat) -> Change:
    """A metric of the statistic (windows.window_statistic) as diff.json's {baseline, candidate, delta, ratio}:
    each side's median over its windows, the median of the per-window change, 1 + delta / baseline."""
    b, c = m.baseline, m.candidate
    return Change(baseline=_us(b), candidate=_us(c), delta=_us(m.delta), ratio=float((b + m.delta) / b) if b else None)


def _with_ratio(b: Fraction, c: Fraction) -> Change:
    return Change(baseline=_us(b), candidate=_us(c), delta=_us(c - b), ratio=float(c / b) if b else None)


# ---------------------------------------------------------------------------------------------
# kernels


KernelKey = str | tuple[str, str]  # a normalized name, or (normalized name, shape)


@dataclass
class _KernelSum:
    """One kernel group of a rank, summed over its kernel entries."""
    name: str
    shape: str | UnsetType
    count: int = 0
    total_ns: int = 0
    cats: Counter[str] = field(default_factory=Counter)
    examples: list[str] = field(default_factory=list)


def _kernel_table(rank: Rank, shaped: bool = False) -> dict[KernelKey, KernelEntry]:
    """Normalized name -> per-iteration count and µs (over all the rank's iterations), category, examples;
    `shaped` (both sides recorded with shapes): (normalized name, shape) -> the same, with the launching op's
    shape as analysis/shapes.shape_text writes it."""
    n = max(len(rank.iterations), 1)
    sums: dict[KernelKey, _KernelSum] = {}
    for k in rank.kernels:
        raw = str(k.name or "")
        name = normalize_kernel_name(raw)
        key: KernelKey = name
        shape: str | UnsetType = UNSET
        if shaped:
            shape = shape_text(k.shape_op, k.shape, k.shape_dtypes)
            key = (name, shape)
        e = sums.setdefault(key, _KernelSum(name=name, shape=shape))
        e.count += int(k.count or 0)
        t = _ns(k.total_us)
        e.total_ns += t
        e.cats[k.category or "other"] += t
        if len(e.examples) < 3 and raw != key:
            e.examples.append(raw)
    return {key: KernelEntry(name=e.name, category=e.cats.most_common(1)[0][0], count_per_iteration=e.count / n,
                             us_per_iteration=e.total_ns / 1000 / n, examples=e.examples, shape=e.shape) for key, e in sums.items()}


# ---------------------------------------------------------------------------------------------
# syncs


SyncKey = tuple[str, str, str, str]


class _PerIteration(dict[SyncKey, Fraction]):
    """Sync groups per iteration: a group absent from a side is 0."""

    def __missing__(self, key: SyncKey) -> Fraction:
        return Fraction(0)


def _sync_groups(rank: Rank, its: Sequence[Iteration]) -> _PerIteration:
    """(kind, api, direction, trigger) -> syncs per iteration over the selected iterations (every sync is
    counted per group and iteration: schema v2, or a v1 summary's list on decoding)."""
    idx = {i.index for i in its}
    c: Counter[tuple[str, str, str, str]] = Counter()
    for g in rank.sync_groups:
        n = sum(v for k, v in g.by_iteration.items() if int(k) in idx)
        if n:
            c[(str(g.kind or "sync"), str(g.api or "?"), str(g.direction or "none"), str(g.trigger or "?"))] += n
    return _PerIteration({k: Fraction(v, max(len(its), 1)) for k, v in c.items()})


# ---------------------------------------------------------------------------------------------
# noise


def _window_flat(its: Sequence[Iteration], basis: str) -> Terms:
    """One profile window's figures for the statistic: exact means of every decomposition term on
    `basis` (attribution/windows.py) and the per-iteration medians of the counts (``counts.<key>``)."""
    out = flat_means(its, basis)
    for k, v in _counts(its).items():
        out[f"counts.{k}"] = Fraction(v or 0)
    for k, t in _timings(its).items():
        if t is not None:
            out[f"timings.{k}"] = Fraction(round(float(t) * 2000), 2)  # ns; a median of an even count can end in half a ns
    return out


def _noise(st: Stats, nb: int, nc: int, unstable: str | None = None, recorded: int = 1) -> Noise:
    """diff.json's ``noise``: per metric, each side's median and spread over its windows, the change
    (median over paired windows of the per-window change: the figure every renderer shows) and the
    noise it is judged against (the largest spread: either side's windows, or the per-window changes)."""
    if not judged(range(nb), range(nc)):
        return Noise(
            available=False,
            repeats={"baseline": nb, "candidate": nc},
            note=("not judged: one profile window per side, so no noise estimate; profile with --profile-windows N (N >= 2)" if recorded < 2 else
                     f"not judged: one profile window per side, so no noise estimate; the runs recorded {recorded} each: pass their run folders"),
        )
    if unstable:
        return Noise(available=False, unstable=True, repeats={"baseline": nb, "candidate": nc},
                     note=f"not judged: unstable ({unstable}); profile on a quieter machine, or with more iterations per window (--num-steps)")
    metrics: dict[str, NoiseMetric] = {}
    for k, m in st.items():
        metrics[k] = NoiseMetric(
            baseline=NoiseSide(median=_us_or_count(k, m.baseline), spread=_us_or_count(k, m.baseline_spread), n=nb),
            candidate=NoiseSide(median=_us_or_count(k, m.candidate), spread=_us_or_count(k, m.candidate_spread), n=nc),
            delta=_us_or_count(k, m.delta), spread=_us_or_count(k, m.noise),
            per_window=[_us_or_count(k, d) for d in m.per_window],
            within_noise=within(m.delta, m.noise),
        )
    return Noise(
        available=True,
        repeats={"baseline": nb, "candidate": nc},
        statistic="median over paired profile windows (window i of each side) of the per-window change",
        note="per metric: each side's median and spread (max - min) over its profile windows; the change is the median over "
                "paired windows of the per-window change, within noise when smaller than the largest spread (either side's, or "
                "that of the per-window changes) or none at all",
        metrics=metrics,
    )


def _us_or_count(key: str, v: Fraction) -> float:
    return float(v) if key.startswith("counts.") else float(v / 1000)


def _window_iterations(reps: Sequence[Summary], rank: int, shape: Shape | None) -> list[tuple[int, list[Iteration]]]:
    """Each profile window's (index, compared iterations); a window without the rank is left out."""
    out: list[tuple[int, list[Iteration]]] = []
    for i, s in enumerate(reps):
        try:
            out.append((i, _select(pick_rank(s, rank, "window"), shape)))
        except UsageError:
            continue
    return out


def _backlog_drift_ns(windows: Sequence[tuple[int, Sequence[Iteration]]]) -> Fraction:
    """How far the GPU's backlog moved across the compared iterations, per iteration: the largest
    |spill(last) - spill(first)| / n over a side's profile windows. When the host runs ahead of a
    GPU-bound device the queue can grow during a window: each iteration's own work then spills ever
    further into later windows, and time by the clock inside the compared windows misses (or gains)
    that much work per iteration, spread over its categories (schema v2 ``spill_us``; 0 for v1)."""
    worst = Fraction(0)
    for _, its in windows:
        if len(its) >= 2:
            worst = max(worst, Fraction(abs(_ns(its[-1].spill_us) - _ns(its[0].spill_us)), len(its)))
    return worst


# ---------------------------------------------------------------------------------------------
# expected effect


SLOWDOWN_AGREE = 2.0  # profile windows whose profiler slowdowns lie further apart than this (max/min) raise no flag (issue 40)


def profiler_slowdowns(*manifests: Any) -> list[float]:
    """Every profile window's profiler slowdown (profiled / unprofiled time per token: the manifests'
    profiler_overhead, per window where it lists them), over the given run manifests."""
    out: list[float] = []
    for m in map(manifest_of, manifests):
        if m is not None and m.profiler_overhead is not None:
            out += m.profiler_overhead.slowdowns()
    return out


def slowdown_disagreement(slowdowns: Sequence[float]) -> str | None:
    """Why no flag can be raised when the windows disagree on the profiler's slowdown by more than SLOWDOWN_AGREE
    (a window the profiler slowed 11× holds host-side work, and the GPU work that waits on it, unlike one slowed 1.7×),
    else None."""
    if len(slowdowns) < 2 or max(slowdowns) <= SLOWDOWN_AGREE * min(slowdowns):
        return None
    return f"the profiler's slowdown varied {min(slowdowns):.1f}–{max(slowdowns):.1f}× between windows"


def _catalog_table(catalog: Any, attr: str) -> Mapping[str, Sequence[str]]:
    """One of the catalog's tables by optimization (its categories, phases, idle causes, the categories it grows); {}
    where the catalog has none (anything with ``optimizations`` will do)."""
    table: Mapping[str, Sequence[str]] = getattr(catalog, attr, None) or {}
    return table


def _expected_effect(opt: str | None, catalog: Any, st: Stats, use_noise: bool,
                     drift_ns: Fraction = Fraction(0), *, clock: bool = False, unstable: str | None = None,
                     slowdown: str | None = None) -> ExpectedEffect | None:
    """The expected-effect check on the statistic `st` (attribution/windows.window_statistic: every
    figure the median over paired windows of the per-window change, judged against the larger
    spread): the optimization's own terms first, then what else moved beyond the noise. Nothing is
    judged (no flag, no verdict) without a noise estimate. `drift_ns`: the GPU backlog's drift, a
    floor for verdicts when the categories are by the clock (`clock`: older summaries), where it moves them."""
    if opt is None:
        return None
    optimizations = _catalog_table(catalog, "optimizations")
    cat_name = getattr(catalog, "name", None)
    if opt not in optimizations:
        return ExpectedEffect(
            optimization=opt, known=False, catalog=cat_name, categories=[], changes=[], flags=[], against=[], ok=None,
            judged=False,
            note=f"{opt!r} is not an optimization of catalog {cat_name!r}: no expected-effect check"
                 + (f" (known: {', '.join(sorted(optimizations))})" if optimizations else ""),
        )
    owned = list(optimizations[opt])
    # a verdict needs a change beyond the noise that also matters: at least 1 µs and MATERIAL_SHARE of the baseline's
    # GPU window (kernel time by ownership barely varies between a side's windows, so a 2 µs move of a 600 µs category
    # can exceed their spread without changing the iteration), and the backlog's drift where categories are by the clock
    material = Fraction(st["gpu_window_us"].baseline or 0) * Fraction(MATERIAL_SHARE)
    floor = max(Fraction(ABS_THRESHOLD_NS), drift_ns if clock else Fraction(0), material)
    get = st.__getitem__

    def beyond(key: str) -> bool:
        m = get(key)
        return use_noise and not within(m.delta, m.noise) and abs(m.delta) >= floor

    def term(key: str) -> NoiseTerm:
        m = get(key)
        return NoiseTerm(term=key, delta_us=float(m.delta / 1000), spread_us=_us(m.noise) if use_noise else None,
                         within_noise=within(m.delta, m.noise) if use_noise else None)

    grows = set(_catalog_table(catalog, "optimization_grows").get(opt, ()))
    why: Mapping[str, str] = getattr(catalog, "optimization_grows_why", None) or {}
    grows_why = why.get(opt) or None
    changes: list[CategoryChange] = []
    flags: list[str] = []
    unflagged: list[str] = []
    for cat in sorted(k.split(".", 1)[1] for k in st if k.startswith("category_us.")):
        m = get(f"category_us.{cat}")
        if m.delta == 0:
            continue
        inside = cat in owned
        exceeds = beyond(f"category_us.{cat}")  # not judged (one window a side): never flagged
        pct = float(m.delta / m.baseline * 100) if m.baseline else None
        # growth the catalog expects of the optimization's own design (a verify step's work per token) is no flag
        growth = m.delta > 0 and ("*" in grows or cat in grows)
        candidate_flag = (not inside) and exceeds and not growth
        flagged = candidate_flag and slowdown is None  # windows the profiler slowed 1.7× and 11× apart: not judged
        changes.append(CategoryChange(
            category=cat, baseline_us=_us(m.baseline), candidate_us=_us(m.candidate), delta_us=_us(m.delta), pct=pct,
            inside=inside, exceeds_threshold=exceeds, flagged=flagged,
            within_noise=term(f"category_us.{cat}").within_noise,
            expected_growth=True if growth and exceeds and not inside else UNSET,
        ))
        if candidate_flag:
            how = f"by {pct:+,.1f}%" if pct is not None else f"by {_us(m.delta):+,.1f} µs (absent in the baseline)"
            (flags if flagged else unflagged).append(
                f"{opt} changed {cat} time {how}, outside its categories ({_us(m.delta):+,.1f} µs per iteration)")
    changes.sort(key=lambda ch: -abs(ch.delta_us or 0))

    # its own effect first: the catalog's categories, phases and idle causes of the optimization, each expected
    # to shrink, with the verdict (as_expected: True/False beyond the noise, None within it or not judged);
    # then what else moved beyond the noise
    phases = list(_catalog_table(catalog, "optimization_phases").get(opt, ()))
    idle_own = list(_catalog_table(catalog, "optimization_idle").get(opt, ()))

    def own_term(key: str) -> OwnTerm:
        m, t = get(key), term(key)
        return OwnTerm(term=t.term, delta_us=t.delta_us, spread_us=t.spread_us, within_noise=t.within_noise,
                       baseline_us=_us(m.baseline), candidate_us=_us(m.candidate), expected="decrease",
                       as_expected=(m.delta < 0) if beyond(key) else None)

    own = ([own_term(f"category_us.{c}") for c in owned] + [own_term(f"phase_us.{p}") for p in phases]
           + [own_term(f"idle_us_by_cause.{k}") for k in idle_own])
    against = [f"{opt} moved its own {term_label(t.term)} the wrong way: {t.delta_us:+,.1f} µs per iteration, "
               f"expected a decrease (beyond {judged_against((_us(drift_ns) or 0.0) if clock else 0.0)})" for t in own if t.as_expected is False]
    elsewhere = [term(k) for k in sorted(st) if k.startswith("category_us.") and k.split(".", 1)[1] not in owned]
    elsewhere += [term(f"idle_us_by_cause.{k}") for k in IDLE_KEYS if k not in idle_own]
    elsewhere += [term("backlog_us")] if "backlog_us" in st else []
    beyond_noise = sorted((t for t in elsewhere if beyond(t.term)), key=lambda t: -abs(t.delta_us))
    return ExpectedEffect(
        optimization=opt, known=True, catalog=cat_name, categories=owned, phases=phases, idle=idle_own,
        judged=use_noise,
        threshold=(f"the noise (spread over profile windows) and {_us(floor):,.1f} µs (the larger of 1 µs and {MATERIAL_SHARE:.0%} of the baseline's window)" if not clock or drift_ns <= ABS_THRESHOLD_NS else
                      f"the noise (spread over profile windows) and the GPU backlog's drift ({_us(drift_ns):,.1f} µs per iteration)")
                  if use_noise else (f"not judged: unstable ({unstable})" if unstable else "not judged: one profile window per side (no noise estimate)"),
        backlog_drift_us=_us(drift_ns),
        own=own, against=against, beyond_noise=beyond_noise, floor_us=_us(floor),
        changes=changes, flags=flags,
        # (optional keys) changes outside its categories that would be flags, not judged because the windows disagree on the
        # profiler's slowdown (the sentence says by how much); growth the catalog expects (grows, grows_why)
        not_judged=NotJudged(reason=slowdown, changes=unflagged) if slowdown and unflagged else None,
        grows=sorted(grows), grows_why=grows_why if grows else None,
        # None when not judged: no pass, no fail
        # a pass only when judged, nothing against it, and its own effect seen beyond the noise; None: no pass, no fail
        ok=None if not use_noise else False if (flags or against) else None if unflagged else True if any(t.as_expected for t in own) else None,
    )


def judged_against(drift_us: float) -> str:
    """What a change is judged against, in words: the noise, and the backlog drift where there is one."""
    return "the noise and the backlog drift" if drift_us > ABS_THRESHOLD_NS / 1000 else "the noise"


# ---------------------------------------------------------------------------------------------
# the diff


def _side_info(summary: Summary, rank: Rank, its: Sequence[Iteration], label: str | None, n_repeats: int) -> SideInfo:
    all_its = rank.iterations
    inputs = summary.inputs
    if label is None:
        label = short_label(str(None if inputs[0].path is UNSET else inputs[0].path)) if inputs else "?"
    return SideInfo(
        label=label,
        inputs=inputs,
        rank=rank.rank,
        device=rank.device,
        device_timeline=rank.device_timeline,  # "cpu": a CPU-only run (aten ops stand in for device ops)
        catalog=rank.catalog,
        marker=summary.marker if rank.marker is UNSET else rank.marker,
        iterations=IterationsUsed(total=len(all_its), used=[i.index for i in its]),
        shapes=dict(Counter(shape_label(shape_of(i)) for i in all_its).most_common()),
        repeats=n_repeats,
    )


def _first_shared(primary: Summary, repeats: Sequence[Summary], other: Sequence[Summary], rank: int) -> Summary:
    """`primary`, unless none of its rank's steady iterations has a shape the other side's windows hold and a profile
    window of the same run does: the first such."""
    def shapes(s: Summary) -> set[Shape]:
        r = next((x for x in s.ranks if x.rank == rank), None)
        return {shape_of(i) for i in _steady(r)} if r is not None else set()

    theirs = set().union(*(shapes(s) for s in other))
    if not theirs or shapes(primary) & theirs:
        return primary
    return next((s for s in repeats if shapes(s) & theirs), primary)


def _compared(baseline: Summary, candidate: Summary, rank: int = 0) -> tuple[
        Rank, Rank, Shape | None, Shape | None, list[Iteration], list[Iteration], list[str]]:
    """What a diff compares: each side's rank entry, the shape (None: no common one, all iterations)
    and the baseline's (the same but under speculative_pair: decode where the candidate verifies),
    each side's iterations of it (steady ones: each rank's last left out), and the warnings so far.
    Raises NothingToAnalyze when a side has no iteration to compare."""
    rb, rc = pick_rank(baseline, rank, "baseline"), pick_rank(candidate, rank, "candidate")
    warnings: list[str] = []
    spec = speculative_pair(_steady(rb), _steady(rc))
    shape: Shape | None
    base_shape: Shape | None
    if spec is not None:  # the step itself changed: decode steps against the verify steps that replaced them
        (base_shape, shape), w = spec, [f"speculative decoding on one side: the baseline's {shape_label(spec[0])} steps are compared with "
                                        f"the candidate's {shape_label(spec[1])} steps that replaced them (a verify step yields up to "
                                        "1 + draft tokens: per-token figures need the accept length)"]
    else:
        shape, w = select_shape(_steady(rb), _steady(rc))
        base_shape = shape
    warnings.extend(w)
    if shape is None:
        warnings.append("the sides share no iteration shape (kind, batch size): comparing all iterations, which mixes shapes")
    ib, ic = _select(rb, base_shape), _select(rc, shape)
    if not ib or not ic:
        raise NothingToAnalyze(
            f"nothing to compare: {len(ib)} baseline and {len(ic)} candidate iterations",
            hint="each side needs at least one iteration; check the marker (--marker) and that the traces cover decode steps",
        )
    if min(len(ib), len(ic)) < 3:
        warnings.append(f"only {min(len(ib), len(ic))} iteration(s) on one side: per-iteration means and medians are noisy")
    return rb, rc, shape, base_shape, ib, ic, warnings

NO_COMMON_SHAPE = "all iterations (no common shape)"


class Means(NamedTuple):
    """A diff's headline numbers: the compared shape's label, and the wall and GPU window per iteration as diff.json has
    them (baseline, candidate, delta, ratio; µs per iteration)."""
    shape_label: str
    wall_us: Change
    gpu_window_us: Change


def compare_means(baseline: Summary | Mapping[str, Any], candidate: Summary | Mapping[str, Any], *, rank: int = 0) -> Means:
    """A diff's headline numbers only, from the same iterations and with the same exact means as
    `compare_summaries`."""
    _, _, shape, _, ib, ic, _ = _compared(summary_of(baseline), summary_of(candidate), rank)
    mb, mc = flat_means(ib, "clock"), flat_means(ic, "clock")  # the window and wall do not depend on the basis
    return Means(shape_label=shape_label(shape) if shape else NO_COMMON_SHAPE,
                 wall_us=_with_ratio(mb["wall_us"], mc["wall_us"]), gpu_window_us=_with_ratio(mb["gpu_window_us"], mc["gpu_window_us"]))


def compare_summaries(
    baseline: Summary | Mapping[str, Any],
    candidate: Summary | Mapping[str, Any],
    *,
    opt: str | None = None,
    catalog: Any = None,
    baseline_repeats: Sequence[Summary | Mapping[str, Any]] = (),
    candidate_repeats: Sequence[Summary | Mapping[str, Any]] = (),
    rank: int = 0,
    labels: tuple[str | None, str | None] = (None, None),
) -> Diff:
    """diff.json v1 for one rank of two summaries (see the module docstring for the rules), as the Diff it is read as.

    `catalog` (a profkit.analysis.catalog.Catalog, or anything with ``optimizations: {name: categories}``)
    and `opt` drive the expected-effect check. Repeats (summaries of the same configuration run
    again; the primary may be among them) give the noise estimate. Times are µs per iteration.
    Summaries given as dicts (summary.json of any schema version) are decoded here, once.
    """
    base, cand = summary_of(baseline), summary_of(candidate)
    reps_b = [base if s is baseline else summary_of(s) for s in baseline_repeats]
    reps_c = [cand if s is candidate else summary_of(s) for s in candidate_repeats]
    # the shape is chosen on each side's first profile window that shares a steady shape with the other side's windows: a
    # loaded CI run's window 0 once opened as its turn's decode ended (1 iteration of no known kind), and the run read as
    # "no shape" though its other windows held 6 verify steps each
    if reps_b and reps_c:
        base, cand = _first_shared(base, reps_b, reps_c, rank), _first_shared(cand, reps_c, reps_b, rank)
    rb, rc, shape, base_shape, ib, ic, warnings = _compared(base, cand, rank)

    # --- each profile window's exact terms, and the statistic every renderer shows -----------------
    win_b = _window_iterations(reps_b or [base], rank, base_shape)
    win_c = _window_iterations(reps_c or [cand], rank, shape)
    empty = sum(1 for _, its in (*win_b, *win_c) if not its)
    if empty:
        warnings.append(f"{empty} profile window(s) hold no iterations of the compared shape; left out of the statistic and the noise estimate")
    wb, wc = [its for _, its in win_b if its], [its for _, its in win_c if its]
    if len(wb) != len(wc) and min(len(wb), len(wc)) > 0:
        warnings.append(f"{len(wb)} baseline and {len(wc)} candidate profile windows: the change is taken over the first "
                        f"{min(len(wb), len(wc))} pairs, the noise over every window")
    basis = basis_of([*wb, *wc])
    if basis == "clock":
        warnings.append("the summaries have no time by ownership (owned_category_us: summary.json v3): categories and phases are by "
                        "the clock and the GPU's backlog cannot be split from them; re-run `profkit analyze` on the traces to split it")
    fb, fc = [_window_flat(its, basis) for its in wb], [_window_flat(its, basis) for its in wc]
    st = window_statistic(fb, fc)
    # not judged either when a side's profile windows disagree by more than the instability rule (DESIGN.md "Judged, or
    # not judged"); iterations swinging inside a window (stability) stay a warning: owned time per iteration does not
    # depend on how long its window was
    stab = Pair[str](baseline=_stability(win_b, rb), candidate=_stability(win_c, rc))
    unstable = unstable_windows(fb, fc, UNSTABLE_RATIO)
    use_noise = judged(fb, fc) and unstable is None
    decomposition = window_decomposition(fb, fc, basis, unstable=unstable, idle=idle_keys(rb, rc))
    if not decomposition.exact:
        warnings.append(f"the decomposition leaves up to {decomposition.residual_us:+.3f} µs unexplained in a profile window: an input "
                        "summary breaks window = busy + idle")

    # --- the gap to the hardware floor (issue 41): each side's, its change, what the optimization closed --------------
    from profkit.attribution.floor_gap import gap_change

    floor = gap_change(wb, wc, opt=opt, catalog=catalog, floor_notes=(rb.floor, rc.floor))

    # --- counts -------------------------------------------------------------------------------
    cb, cc = _counts(ib), _counts(ic)
    # one statistic, everywhere (DESIGN.md): each side's median over its windows of the per-iteration median, and the
    # median over paired windows of the per-window change, as the noise verdict beside it judges (window 0 alone before)
    counts = ({k: SideBySide(baseline=float(st[f"counts.{k}"].baseline), candidate=float(st[f"counts.{k}"].candidate),
                             delta=float(st[f"counts.{k}"].delta)) for k in COUNT_KEYS}
              if fb and fc else {k: _side_by_side(cb[k], cc[k]) for k in COUNT_KEYS})
    tb, tc = _timings(ib), _timings(ic)
    timings = ({k: SideBySide(baseline=_us(st[f"timings.{k}"].baseline), candidate=_us(st[f"timings.{k}"].candidate),
                              delta=_us(st[f"timings.{k}"].delta)) if f"timings.{k}" in st else _side_by_side(tb[k], tc[k]) for k in TIMING_KEYS}
               if fb and fc else {k: _side_by_side(tb[k], tc[k]) for k in TIMING_KEYS})
    sb, sc = _sync_groups(rb, ib), _sync_groups(rc, ic)
    syncs = [
        SyncChange(kind=k[0], api=k[1], direction=k[2], trigger=k[3],
                   baseline_per_iteration=float(sb[k]), candidate_per_iteration=float(sc[k]), delta=float(sc[k] - sb[k]))
        for k in sorted(set(sb) | set(sc), key=lambda k: (-abs(sc[k] - sb[k]), k))
    ]

    # --- kernels ------------------------------------------------------------------------------
    # by (kernel, shape) where both sides were recorded with shapes (analysis/shapes.py)
    sb_, sc_ = (any(k.shape_op for k in r.kernels) for r in (rb, rc))
    shaped = sb_ and sc_
    if sb_ != sc_:
        warnings.append(f"shapes were recorded for the {'baseline' if sb_ else 'candidate'} only: the kernels are compared by name alone; "
                        "record both with `profkit trace --record-shapes` to compare them by shape")
    kb, kc = _kernel_table(rb, shaped), _kernel_table(rc, shaped)
    order = lambda e: (-e.us_per_iteration, e.name, e.shape or "")  # noqa: E731
    added = sorted((kc[k] for k in set(kc) - set(kb)), key=order)
    removed = sorted((kb[k] for k in set(kb) - set(kc)), key=order)
    movers = []
    for k in set(kb) | set(kc):
        b, c = kb.get(k), kc.get(k)
        bu, cu = (b.us_per_iteration if b else 0.0), (c.us_per_iteration if c else 0.0)
        if bu == cu:
            continue
        either = c or b
        assert either is not None  # k is a key of one side at least
        movers.append(Mover(
            name=either.name, category=either.category,
            baseline_us=bu, candidate_us=cu, delta_us=cu - bu,
            baseline_count=b.count_per_iteration if b else 0.0, candidate_count=c.count_per_iteration if c else 0.0,
            status="added" if b is None else "removed" if c is None else "changed",
            examples=list(either.examples),
            shape=either.shape,
        ))
    movers.sort(key=lambda m: (-abs(m.delta_us), m.name, m.shape or ""))

    # --- noise and expected effect ------------------------------------------------------------
    recorded = min(len(profiler_slowdowns(run_manifest(base))) or 1, len(profiler_slowdowns(run_manifest(cand))) or 1)
    noise = _noise(st, len(fb), len(fc), unstable, recorded)
    drift_b, drift_c = _backlog_drift_ns(win_b), _backlog_drift_ns(win_c)
    drift = drift_b + drift_c
    gw = st["gpu_window_us"]
    if drift > ABS_THRESHOLD_NS and drift * 100 >= min(gw.baseline, gw.candidate):  # 1% of the GPU window
        if basis == "ownership":
            warnings.append(f"the GPU's backlog moved during the compared iterations (GPU-bound, the host ahead): {_us(drift_b):,.1f} µs "
                            f"per iteration on the baseline, {_us(drift_c):,.1f} on the candidate; categories and phases are by "
                            "ownership, so it shows in the backlog term, not in them")
        else:
            warnings.append(f"the GPU's backlog moved during the compared iterations (GPU-bound, the host ahead): {_us(drift_b):,.1f} µs "
                            f"per iteration on the baseline, {_us(drift_c):,.1f} on the candidate; time by the clock inside a window "
                            f"then misses or gains that much of each iteration's work, so category changes below {_us(drift):,.1f} µs are not flagged")
    slowdown = slowdown_disagreement(profiler_slowdowns(run_manifest(base), run_manifest(cand)))
    expected = _expected_effect(opt, catalog, st, use_noise, drift, clock=basis == "clock", unstable=unstable, slowdown=slowdown)
    if bool(cb["graph_launches"]) != bool(cc["graph_launches"]):  # eager on one side, graph replay on the other
        warnings.append("one side replays CUDA graphs and the other launches eagerly: a replayed kernel is recorded a little longer "
                        "than the same kernel launched from a stream, though it runs no longer (on an H200, +0.12 µs for a 1.3 µs "
                        "kernel, +0.06 µs for a 2.9 µs one; Nsight Compute times both alike: benchmarks/gpu_tiny_kernel_*), so a "
                        "category of sub-2 µs kernels can read ~10% higher under graphs with the same kernels")
    if rb.catalog and rc.catalog and rb.catalog != rc.catalog:
        warnings.append(f"the sides were classified with different catalogs ({rb.catalog} vs {rc.catalog}): categories may not line up")

    health, slack, speculative = capture_terms.sections(base, cand, reps_b, reps_c, rank)
    return Diff(
        schema_version=DIFF_SCHEMA_VERSION,
        profkit_version=__version__,
        baseline=_side_info(base, rb, ib, labels[0], len(baseline_repeats)),
        candidate=_side_info(cand, rc, ic, labels[1], len(candidate_repeats)),
        rank=rank,
        shape=ShapeInfo(
            kind=shape[0] if shape else None, batch_size=shape[1] if shape else None,
            label=shape_label(shape) if shape else NO_COMMON_SHAPE,
            # (optional key) the baseline's shape where the step itself changed: speculative_pair
            baseline_label=shape_label(base_shape) if base_shape and base_shape != shape else UNSET,
            iterations={"baseline": len(ib), "candidate": len(ic)},
        ),
        optimization=opt,
        wall_us=_stat_ratio(st["wall_us"]),
        gpu_window_us=decomposition.gpu_window_us,
        decomposition=decomposition,
        counts=counts,
        timings=timings,
        syncs=syncs,
        kernels_added=added[:MAX_KERNEL_LIST],
        kernels_removed=removed[:MAX_KERNEL_LIST],
        kernels_added_total=len(added),
        kernels_removed_total=len(removed),
        top_movers=movers[:TOP_MOVERS],
        expected_effect=expected,
        noise=noise,
        stability=stab,
        warnings=warnings,
        # for reports, so that `profkit report diff.json` needs nothing else
        timelines=Pair[Any](baseline=rb.timeline, candidate=rc.timeline),
        # why the GPU is idle on each side: the longest bubbles of the compared iterations with
        # their CPU ops, and the CPU ops ranked by the idle time inside the bubbles
        bubbles=Pair[BubbleView](baseline=_bubble_view(rb, ib), candidate=_bubble_view(rc, ic)),
        series=Pair[list[SeriesPoint]](baseline=_series(rb, ib), candidate=_series(rc, ic)),
        manifests=Pair[Any](baseline=run_manifest(base), candidate=run_manifest(cand)),
        # unprofiled throughput, the headline, when the run manifests carry it (first workload point)
        throughput=Pair[Any](baseline=_first_point(run_manifest(base)), candidate=_first_point(run_manifest(cand))),
        # issue 31: capture health, overlap slack and speculative cost per accepted token, side by side (optional keys but health)
        health=health,
        overlap_slack=UNSET if slack is None else slack,
        speculative=UNSET if speculative is None else speculative,
        # issue 41 (an optional key): the gap between each side's step and its hardware floor (attribution/floor_gap.py)
        floor=UNSET if floor is None else floor,
    )


def run_manifest(summary: Summary) -> Any:
    """The run's manifest as written (diff.json carries it so): the summary's `manifest` (its manifest.json, added on
    loading), else the `run` section that `profkit trace` writes into every summary (run id, switches, throughput, ...),
    so that the summaries alone give the same diff as the run folders."""
    m, r = summary.manifest, summary.run
    return m if isinstance(m, Mapping) else r if isinstance(r, Mapping) else None


def _bubble_view(rank: Rank, its: Sequence[Iteration], n: int = 5) -> BubbleView:
    idx = {i.index for i in its}
    return BubbleView(
        largest=[LargeBubble(iteration=b["iteration"], start_us=b["start_us"], dur_us=b["dur_us"], cause=b["cause"],
                             cpu_ops=[CpuOpTime(name=nm, us=us) for nm, us in b["cpu_ops"]]) for b in largest_bubbles(rank, n, idx)],
        idle_cpu_ops=[IdleCpuOp(name=nm, idle_us=us) for nm, us in idle_cpu_ops(rank, None, n)],
    )


def _first_point(manifest: Any) -> dict[str, Any] | None:
    """The manifest's first unprofiled workload point as written ({isl, concurrency, repeats, <metric>: {median, min, max,
    n, spread}, warmup}: diff.json carries it whole, so it stays the manifest's JSON; documents.throughput_of reads it)."""
    pts = manifest.get("throughput") if isinstance(manifest, Mapping) else None
    got = [p for p in pts if isinstance(p, dict)] if isinstance(pts, list) else []
    return dict(got[0]) if got else None


def _series(rank: Rank, used: Sequence[Iteration]) -> list[SeriesPoint]:
    """Per-iteration counts for plots (every iteration of the rank; `used` marks the compared ones)."""
    idx = {i.index for i in used}
    return [
        SeriesPoint(index=it.index, shape=shape_label(shape_of(it)), used=it.index in idx, **{k: getattr(it, k) for k in SERIES_FIELDS})
        for it in rank.iterations
    ]


UNSTABLE_RATIO = 2.0  # a run whose GPU window per iteration varies by more than this (max/min) is unstable (issue 19)


def swings(values: Sequence[float]) -> bool:
    """Whether iterations' GPU windows vary by more than UNSTABLE_RATIO (the one rule: diff.json's stability,
    every report's "unstable" warning)."""
    return len(values) > 1 and min(values) > 0 and max(values) / min(values) > UNSTABLE_RATIO


def _stability(windows: Sequence[tuple[int, Sequence[Iteration]]], rank: Rank | None = None) -> str | None:
    bad = []
    what = "CPU-op window" if rank is not None and rank.device_timeline == "cpu" else "GPU window"  # report/vocab.py's words
    for i, its in windows:
        ws = [it.gpu_window_us or 0 for it in its]
        if swings(ws):
            bad.append(f"profile window {i}: {what} {min(ws):,.0f}–{max(ws):,.0f} µs")
    return "; ".join(bad) if bad else None
