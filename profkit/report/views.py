"""What every renderer says, worded once: about a diff.json, the headline sentences, the
decomposition's rows, the unprofiled throughput rows, the noise verdict of a metric; about a
summary's rank, the findings (profkit.attribution.findings) as sentences: the host setting the pace, GPU work
outside every iteration, the CPU ops inside a bubble.

Plain data in, plain strings and tuples out (no rich, no HTML, no Markdown): the terminal,
Markdown and HTML renderers escape and lay them out. diff.json itself is computed in
`profkit.attribution`; nothing here changes a number, it only chooses and words them.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Mapping, Sequence
from typing import Any, TypedDict, cast

from profkit.attribution.diff import IDLE_KEYS, profiler_slowdowns
from profkit.terms import UNCOVERED
from profkit.attribution.findings import host_gap
from profkit.documents import Diff, ExpectedEffect, OwnTerm, Rank, ThroughputPoint, UnsetType, manifest_of, point_of
from profkit.report.numbers import pct, ratio_pct
from profkit.report.vocab import diff_timeline, rank_timeline, words
from profkit.terms import term_label


def within_noise(diff: Diff, metric: str) -> bool | None:
    """True/False when repeats give a noise estimate for `metric` (e.g. ``category_us.attention``), else None."""
    if not diff.noise.available:
        return None
    m = diff.noise.metric(metric)
    return None if m is None else bool(m.within_noise)


def noise_verdict(diff: Diff, metric: str) -> str:
    """``±3.2 within noise``, ``±3.2 beyond noise`` (the noise the change is judged against beside the
    verdict), ``not judged`` when there is no noise estimate for `metric`, "" when the diff has none at all."""
    if not diff.noise.available:
        return ""  # nothing in the diff is judged: said once, in the headline and the note under the table
    w, m = within_noise(diff, metric), diff.noise.metric(metric)
    if w is None or m is None:
        return "not judged"
    spread = m.spread
    pm = "" if spread is None else f"±{spread:,.1f} " if not metric.startswith("counts.") else f"±{spread:,.2g} "
    floor = material_floor(diff)
    if not w and floor and not metric.startswith("counts.") and m.delta is not None and abs(m.delta) < floor:
        # beyond the spread but below what the expected-effect check calls a change: the headline says nothing of it, nor does this
        return pm + "below floor"
    return pm + ("within noise" if w else "beyond noise")


def material_floor(diff: Diff) -> float:
    """The smallest change the expected-effect check calls a change (µs per iteration; 0 without an optimization)."""
    ee = diff.expected_effect
    return float(ee.floor_us or 0.0) if ee is not None and ee.known and ee.judged else 0.0


def row_metric(group: str, term: str) -> str:
    """The noise metric of a `decomposition_rows` row (its key in diff.json's noise.metrics)."""
    return {"category": f"category_us.{term}", "overlap": "overlap_us", "idle": f"idle_us_by_cause.{term}",
            "backlog": "backlog_us"}[group]


def doubt_metric(group: str) -> str:
    """The capture-health metric that puts a `decomposition_rows` row in doubt (its mark in every renderer)."""
    return "category_us" if group == "category" else "gpu_idle_us" if group == "idle" else "overlap_us"


def statistic_note(diff: Diff) -> str:
    """What the decomposition's figures are, in one sentence (every renderer prints it under the table)."""
    dev = words(diff_timeline(diff))["device"]
    dec = diff.decomposition
    n = dec.windows or 1
    what = (f"Each term is the median over {n} paired profile windows of the per-window change, with the noise it is judged "
            "against (the largest spread: of a side's windows, or of the per-window changes); each window's terms add up exactly "
            "to its change (residual), "
            "their medians need not" if n > 1 else
            "Each term is the mean change over the compared iterations of one profile window a side: not judged (no noise estimate)")
    basis = (f"; categories, phases and overlap by ownership (each iteration's own {dev} work), the backlog is the {dev} time "
             "inside the windows that the compared iterations' own work does not account for" if dec.basis == "ownership" else
             "; categories by the clock (the summaries predate time by ownership: re-run profkit analyze to split out the backlog)"
             if dec.basis == "clock" else "")
    unstable = f"; not judged: unstable ({dec.unstable})" if dec.unstable else ""
    floor = material_floor(diff)
    below = (f"; \"below floor\": beyond the spread but under the {floor:,.1f} µs the expected-effect check calls a change"
             if floor and any(noise_verdict(diff, row_metric(g, t)).endswith("below floor") for g, t, *_ in decomposition_rows(diff)) else "")
    return what + basis + order_note(diff) + unstable + below + "."


def order_note(diff: Diff) -> str:
    """How the two sides were recorded (the manifests' capture_order), as a clause; "" when unknown."""
    ms = diff.manifests
    orders = {m.capture_order for m in map(manifest_of, (ms.baseline, ms.candidate)) if m is not None}
    if orders == {"alternating"}:
        return "; the sides were recorded side by side, their repeats and profile windows alternating (A B A B)"
    if orders == {"sequential"}:
        return "; one side was recorded after the other (sequential: load drift between them is not evened out)"
    return ""


THROUGHPUT_KEYS = (
    ("tokens_per_s_per_user_p50", "tokens/s per user (p50)", True), ("tokens_per_s_per_gpu", "tokens/s per GPU", True),
    ("tokens_per_s", "tokens/s", True), ("ttft_ms_p50", "TTFT ms (p50)", False), ("itl_ms_p50", "ITL ms (p50)", False),
    ("accept_length", "accept length", True), ("cache_hit_rate", "cache hit rate", True),
)


class ThroughputRow(TypedDict):
    """One unprofiled-throughput figure of a diff, side by side (throughput_rows)."""
    key: str
    label: str
    baseline: float | None
    candidate: float | None
    change_pct: float | None
    within_noise: bool | None  # None: no spread to judge by
    higher_is_better: bool
    baseline_spread: float | None
    candidate_spread: float | None


def throughput_rows(diff: Diff) -> list[ThroughputRow]:
    """Unprofiled throughput side by side: label, baseline, candidate, change (%), within_noise
    (None without a spread), higher_is_better. Empty when the manifests carry no throughput."""
    if not diff.throughput.baseline and not diff.throughput.candidate:
        return []
    b, c = point_of(diff.throughput.baseline) or ThroughputPoint(), point_of(diff.throughput.candidate) or ThroughputPoint()
    rows: list[ThroughputRow] = []
    cpu = diff_timeline(diff) == "cpu"
    for key, label, higher in THROUGHPUT_KEYS:
        if key == "tokens_per_s_per_gpu" and cpu:
            label = "tokens/s per rank"  # a CPU-only run has no GPU: the same figure, per process of the engine
        (bv, bs), (cv, cs) = b.value(key), c.value(key)
        if bv is None and cv is None:
            continue
        if key == "tokens_per_s_per_gpu" and (bv, cv) == (b.value("tokens_per_s")[0], c.value("tokens_per_s")[0]):
            continue  # one GPU (or one rank): the same figures as tokens/s, the row below
        change = (cv / bv - 1) * 100 if bv and cv is not None else None
        spread = max(x for x in (bs, cs, -1.0) if x is not None)
        within = None if spread < 0 or bv is None or cv is None else (cv == bv or abs(cv - bv) < spread)
        rows.append(ThroughputRow(key=key, label=label, baseline=bv, candidate=cv, change_pct=change, within_noise=within,
                                  higher_is_better=higher, baseline_spread=bs, candidate_spread=cs))
    return rows


def headline(diff: Diff) -> str:
    """One sentence: what the change did to the iteration (plain text; renderers escape it)."""
    w = diff.wall_us
    g = diff.gpu_window_us
    parts = [f"{diff.shape.label}: wall {w.baseline:,.1f} → {w.candidate:,.1f} µs per iteration ({ratio_pct(w.ratio, missing='n/a')})"]
    window = words(diff_timeline(diff))["window"]  # a CPU-only diff's windows are of its CPU-op timeline
    parts.append(f"{window} {g.baseline:,.1f} → {g.candidate:,.1f} µs ({ratio_pct(g.ratio, missing='n/a')})")
    return "; ".join(parts)


def _pct_of(part: float, whole: float, what: str = "kernel-time") -> str:
    return f", {100 * part / whole:.0f}% of the {what} change" if whole and (part < 0) == (whole < 0) and abs(whole) >= 1 else ""


def _own_text(t: OwnTerm) -> str:
    return f"{term_label(t.term)} {t.delta_us:+,.1f} µs" + (f" (±{t.spread_us:,.1f})" if t.spread_us is not None else "")


def _why_not_judged(diff: Diff) -> str:
    if diff.noise.unstable:
        return "the windows are unstable"
    return "one profile window a side, no noise estimate" if diff.noise.windows() < 2 else "the windows disagree"


def own_terms(diff: Diff) -> list[OwnTerm]:
    """The optimization's own terms that the runs have at all (the headline's): [] without a known optimization."""
    ee = diff.expected_effect
    if ee is None or not ee.known:
        return []
    return [t for t in ee.own if t.baseline_us or t.candidate_us or t.delta_us]


def own_verdict(diff: Diff, t: OwnTerm) -> str:
    """One own term's verdict in the headline's words: ``beyond noise, a decrease as expected``, ``beyond noise the
    WRONG way``, ``within noise``, ``not judged: under the 44.0 µs floor``, ``not judged (one profile window a side ...)``."""
    ee = diff.expected_effect
    if ee is None or not ee.judged:
        return f"not judged ({_why_not_judged(diff)})"
    if t.as_expected is True:
        return "beyond noise, a decrease as expected"
    if t.as_expected is False:
        return "beyond noise the WRONG way (a decrease expected)"
    if t.within_noise is False:  # beyond the spread, under the floor a change must reach to matter
        return f"not judged: under the {ee.floor_us or 0.0:,.1f} µs floor"
    return "within noise"


def recorded_windows(diff: Diff) -> int:
    """How many profile windows the sides' runs recorded (their manifests), the fewer of the two; 1 when unknown."""
    got = []
    for m in map(manifest_of, (diff.manifests.baseline, diff.manifests.candidate)):
        n = m.profile.windows if m is not None and m.profile is not None else None
        if n is None and m is not None and m.profiler_overhead is not None and m.profiler_overhead.windows is not None:
            n = len(m.profiler_overhead.windows)
        got.append(n if n is not None else 1)
    return min(got)


def what_to_run(diff: Diff) -> str:
    """What would make an unjudged change judged, for the headline."""
    if diff.noise.unstable:
        return "on a quieter machine, or with more iterations per window (--num-steps)"
    if diff.noise.windows() < 2:
        had = recorded_windows(diff)
        if had > 1:  # the run had them: one window's summary was passed (an attribution folder's before.json / after.json)
            return f"profkit diff on the two run folders, which hold the {had} profile windows each run recorded"
        return "with --profile-windows 3"
    return "on a quieter machine, or with --profile-windows 5"


def headline_lines(diff: Diff) -> list[str]:
    """The headline (issue 28 point 1, issue 30; plain text, renderers escape it): ONE line (what changed, by how much,
    judged or not, whose own effect), then at most three bullets (the largest other terms, the throughput, the one
    warning that matters). The same words in every renderer; nothing here that another part of the report contradicts."""
    W = words(diff_timeline(diff))
    dec = diff.decomposition
    g = dec.gpu_window_us
    n = dec.windows or 1
    stat = f"median of {n} windows" if n > 1 else "one window a side"
    judged_run = diff.noise.available
    ee = diff.expected_effect
    kernel = sum(v for v in dec.category_us.values() if v is not None)
    window = (f"{W['window']} {g.delta:+,.1f} µs per iteration ({ratio_pct(g.ratio, missing='n/a')} of the baseline's "
              f"{g.baseline:,.1f}, {diff.shape.label}, {stat})")
    shown: set[str] = set()
    if ee is not None and ee.known:
        # the window's own verdict beside it: a change within noise is never left to read as the optimization's gain
        nv = noise_verdict(diff, "gpu_window_us")
        window = window.replace(" per iteration (", f" per iteration, {nv} (", 1) if nv else window
        terms = [t for t in ee.own if t.baseline_us or t.candidate_us or t.delta_us]
        shown = {t.term for t in terms}
        if not terms:
            first = f"{ee.optimization}: no category, phase or idle time of its own in the catalog; {window}."
        elif not ee.judged:
            first = (f"{ee.optimization}'s own effect {', '.join(_own_text(t) for t in terms)}: not judged ("
                     f"{_why_not_judged(diff)}; run {what_to_run(diff)}); {window}.")
        else:
            wrong = [t for t in terms if t.as_expected is False]
            good = [t for t in terms if t.as_expected is True]
            unseen = [t for t in terms if t.as_expected is None]
            parts = []
            if wrong:
                parts.append(f"{', '.join(_own_text(t) for t in wrong)} beyond noise the WRONG way (a decrease expected)")
            if good:
                cat = [t for t in good if t.term.startswith(("category_us.", "phase_us."))]
                share = _pct_of(cat[0].delta_us, kernel, W["kernel_time"]) if len(cat) == 1 and cat[0].term.startswith("category_us.") else ""
                parts.append(f"{', '.join(_own_text(t) for t in good)} beyond noise, a decrease as expected{share}")
            if unseen:  # within the noise (or below the floor): the run cannot tell, so no verdict on it
                parts.append(f"{', '.join(_own_text(t) for t in unseen)} not judged, within the noise"
                             + (f" (run {what_to_run(diff)})" if not good and not wrong else ""))
            first = f"{ee.optimization}'s own effect: {'; '.join(parts)}; {window}."
    else:
        v = within_noise(diff, "gpu_window_us")
        verdict = "not judged" if v is None else "within noise" if v else "beyond noise"
        who = (f"{ee.optimization!r} is not in the catalog (no own terms)" if ee else "no optimization named (pass --opt for its own effect)")
        first = f"{diff.shape.label}: {window.replace(', ' + diff.shape.label, '')}, {verdict}" + (f" (run {what_to_run(diff)})" if v is None else "") + f"; {who}."
    bullets: list[str] = []
    # the largest other terms (judged: those beyond noise; not judged: the largest, said so)
    others: list[tuple[str, float]] = [(f"category_us.{k}", v) for k, v in dec.category_us.items()]
    others += [(f"idle_us_by_cause.{k}", v) for k, v in dec.idle_us_by_cause.items()]
    others += [("backlog_us", (dec.backlog_us if isinstance(dec.backlog_us, (int, float)) else None) or 0.0)]
    others = sorted(((k, v) for k, v in others if k not in shown and v), key=lambda kv: -abs(kv[1]))
    if judged_run:
        # beyond noise (and, with an optimization, beyond its floor: the same terms its check would flag)
        floor = ee.floor_us or 0.0 if ee is not None and ee.known else 0.0
        beyond = [(k, v) for k, v in others if within_noise(diff, k) is False and abs(v) >= floor]
        rest = (", ".join(f"{term_label(k)} {v:+,.1f} µs" for k, v in beyond[:3]) if beyond else "nothing beyond noise")
        bullets.append(f"Elsewhere: {rest}" + (f" (largest within noise: {term_label(others[0][0])} {others[0][1]:+,.1f} µs)"
                                               if not beyond and others else "") + ".")
    elif others:
        bullets.append("Largest other terms (not judged): " + ", ".join(f"{term_label(k)} {v:+,.1f} µs" for k, v in others[:3]) + ".")
    tp = [r for r in throughput_rows(diff) if r["key"] == "tokens_per_s_per_user_p50"]
    if tp and tp[0]["change_pct"] is not None:
        r = tp[0]
        if r["within_noise"] is None:
            judged_tp = "not judged (one unprofiled measurement a side: run --repeat 3)"
        else:
            spread = " and ".join(f"{x:,.0f}" for x in (r["baseline_spread"], r["candidate_spread"]) if x is not None)
            judged_tp = ("within noise" if r["within_noise"] else "beyond noise") + f" (the repeats spread {spread})"
        bullets.append(f"Unprofiled tokens/s per user {r['baseline']:,.0f} → {r['candidate']:,.0f} ({pct(r['change_pct'])}), {judged_tp}.")
    warning = _the_warning(diff)
    if warning:
        bullets.append(warning)
    return [first, *bullets[:3]]


def _the_warning(diff: Diff) -> str | None:
    """The one warning that matters most for reading the headline, or None: a red flag, an unstable side, the
    exploration baseline, the profiler's slowdown."""
    ee = diff.expected_effect
    flags = effect_flags(ee) if ee is not None and ee.known else []
    if flags:
        return f"Flag: {flags[0]}" + (f" (and {len(flags) - 1} more)" if len(flags) > 1 else "") + "."
    nj = ee.not_judged if ee is not None and ee.known else None
    if nj and nj.changes:
        ch = nj.changes
        return (f"Not judged: {nj.reason}, so no flag on {ch[0].removeprefix(ee.optimization + ' ') if ee else ch[0]}"
                + (f" (and {len(ch) - 1} more)" if len(ch) > 1 else "") + "; profile on a quieter machine.")
    stab = {"baseline": diff.stability.baseline, "candidate": diff.stability.candidate}
    unstable = [side for side, v in stab.items() if v]
    if unstable:
        return f"Unstable {' and '.join(unstable)}: {stab[unstable[0]]}."
    if _exploration(diff):
        return "Exploration mode (--base off): the baseline is everything off, eager, a regime the study never ran."
    slow = {side: profiler_slowdown(diff, side) for side in ("baseline", "candidate")}
    if max((v for v in slow.values() if v is not None), default=0.0) >= SLOWDOWN_NOTE:
        got = [(side, v) for side, v in slow.items() if v is not None]
        said = f"the {got[0][0]} ran {got[0][1]:.1f}×" + "".join(f" and the {side} {v:.1f}×" for side, v in got[1:])
        return (f"Profiled, {said} slower than unprofiled: the host-side idle terms carry the profiler's own cost; "
                "read them with the unprofiled throughput.")
    return None


SLOWDOWN_NOTE = 1.5  # a profiled window this much slower than the unprofiled passes gets a line in the headline


def profiler_slowdown(diff: Diff, side: str) -> float | None:
    """How much slower `side` ran inside its profile windows than in its unprofiled passes (tokens/s per user,
    the manifest's profiler_overhead; the median over the windows), or None without a manifest that says."""
    m = diff.manifests.baseline if side == "baseline" else diff.manifests.candidate
    vals = profiler_slowdowns(m)
    return statistics.median(vals) if vals else None


def _exploration(diff: Diff) -> bool:
    m = manifest_of(diff.manifests.baseline)
    if m is None:
        return False
    if m.base == "off":
        return True
    states = m.optimizations
    return isinstance(states, Mapping) and bool(states) and not any(states.values())


def counts_title(diff: Diff) -> str:
    """The counts table's title: the statistic its figures are (the one the noise verdict beside them judges)."""
    n = diff.decomposition.windows or 1
    return f"per iteration (medians; Δ the median of {n} windows' changes)" if n > 1 else "per iteration (medians, one window a side)"


def phase_rows(diff: Diff) -> list[tuple[str, float | None, float | None, float, str]]:
    """(phase, baseline_us, candidate_us, delta_us, noise metric) rows of the change by phase (µs per iteration, the statistic)."""
    dec = diff.decomposition
    b, c = dec.baseline.phase_us, dec.candidate.phase_us
    return [(k, b.get(k), c.get(k), d, f"phase_us.{k}") for k, d in dec.phase_us.items()]


def withheld_text(ee: ExpectedEffect) -> str | None:
    """The expected-effect check's withheld flags in one sentence (the windows disagree on the profiler's slowdown), or None."""
    nj = ee.not_judged
    if not nj or not nj.changes:
        return None
    return (f"Expected-effect check outside {ee.optimization}'s categories not judged: {nj.reason}; not flagged: "
            + "; ".join(nj.changes) + ".")


def effect_flags(ee: ExpectedEffect) -> list[str]:
    """The expected-effect check's red flags, its own effect's first: against the expected direction, then
    changes outside its categories."""
    return [*ee.against, *ee.flags]


def decomposition_rows(diff: Diff) -> list[tuple[str, str, float, float | None, float | None]]:
    """(group, term, delta_us, baseline_us, candidate_us) rows whose deltas (in each profile window) add up to
    the change in the GPU window; overlap enters with a minus sign (its row holds -delta overlap); the backlog
    row where the categories are by ownership."""
    d = diff.decomposition
    b, c = d.baseline, d.candidate
    rows: list[tuple[str, str, float, float | None, float | None]] = []
    for k, v in d.category_us.items():
        rows.append(("category", k, v, b.category_us.get(k), c.category_us.get(k)))
    rows.append(("overlap", "overlap (counted once)", -d.overlap_us, b.overlap_us, c.overlap_us))
    for k in IDLE_KEYS:
        if k in d.idle_us_by_cause:  # "python" only in a diff of CPU-only runs
            rows.append(("idle", k, d.idle_us_by_cause[k], b.idle_us_by_cause[k], c.idle_us_by_cause[k]))
    if not isinstance(d.backlog_us, UnsetType) and d.basis != "clock":  # by ownership: the clock's GPU time that the own work does not explain
        rows.append(("backlog", "backlog", cast(float, d.backlog_us), b.backlog_us, c.backlog_us))
    return rows


# ---------------------------------------------------------------------------------------------
# a summary's findings, in words


def host_gap_text(rank: Rank) -> str | None:
    """One sentence for the headline, or None."""
    h = host_gap(rank)
    if h is None:
        return None
    dev = "CPU-op" if rank.device_timeline == "cpu" else "GPU"
    text = (f"the host sets the pace: CPU window {h['wall_us']:,.1f} µs vs {dev} window {h['gpu_window_us']:,.1f} µs "
            f"(median per iteration)")
    c = h["call"]
    if c:
        where = f", trigger {c['trigger']}" if c["trigger"] else ""
        frame = f", at {str(c['stack']).split(' ← ')[0]}" if c["stack"] else ""
        text += (f"; {c['blocked_us']:,.1f} µs of it blocked in {c['name']} ({c['kind']}, {c['direction']}{where}{frame}) "
                 f"in iteration {c['iteration']}")
    else:
        text += "; no single blocking call explains it (host work between the GPU's ops: see the bubbles)"
    return text


_PROFILER_STEP = re.compile(r"ProfilerStep#\d+")


def op_label(name: str) -> str:
    """A CPU op as a reader should read it: the profiler's own ``ProfilerStep#N`` span holds whatever host code ran
    outside every recorded op (issue 40), so it is named for that, not as an op of the engine."""
    return UNCOVERED if _PROFILER_STEP.fullmatch(name) else name


def merged_ops(ops: Sequence[tuple[str, float | None]]) -> list[tuple[str, float | None]]:
    """`ops` under op_label, those that read the same merged (their µs summed), in order of first appearance."""
    out: dict[str, float | None] = {}
    for name, us in ops:
        k = op_label(name)
        if k in out and out[k] is not None and us is not None:
            out[k] = cast(float, out[k]) + us
        else:
            out.setdefault(k, us)
    return list(out.items())


def cpu_ops_text(ops: list[tuple[str, float | None]], *, sep: str = ", ", unit: str = " µs") -> str:
    """``plan 101.7 µs, draft 36.6 µs``; `unit` "" where the column's header names the unit (a terminal
    folds at spaces, and a figure must not land on one line and its unit on the next)."""
    return sep.join(name if us is None else f"{name} {us:,.1f}{unit}" for name, us in merged_ops(ops))


def outside_text(rank: Rank) -> str | None:
    """One line on GPU work outside every iteration, when there is any."""
    o = rank.outside_iterations
    if o is None or not o.gpu_ops:
        return None
    busy = o.device_busy_us or 0.0
    cpu = rank_timeline(rank) == "cpu"  # a CPU-only run: its "ops" are aten ops, none of them launched
    share = f" ({100 * (o.gpu_us or 0.0) / busy:.1f}% of the {'CPU-op' if cpu else 'device’s'} busy time)".replace("’", "'") if busy else ""
    parts = [f"{n} {label}" for n, label in ((o.before_first, "before the first iteration" if cpu else "launched before the first iteration"),
                                             (o.after_last, "after the last"), (o.no_launch_in_trace, "with no launch call in the trace"))
             if n]
    ops = "aten ops" if cpu else "GPU ops"  # a CPU-only run's device ops are its aten ops
    return f"outside every iteration: {o.gpu_ops:,} {ops}, {o.gpu_us:,.1f} µs{share}: {', '.join(parts)}"


def device_text(rank: Rank, manifest: Any = None) -> str:
    """What ran the rank: the trace's device name, else the run manifest's (its gpu, e.g. "cpu"), else
    "CPU" for a CPU-only trace; "unknown device" only when nothing says."""
    if rank.device:
        return str(rank.device)
    m = manifest_of(manifest)
    gpu = m.versions.gpu if m is not None and m.versions is not None else None
    if gpu:
        return "CPU" if str(gpu).lower() == "cpu" else str(gpu)
    return "CPU" if rank.device_timeline == "cpu" else "unknown device"


IDLE_VERDICT = 0.5  # a GPU idle for at least this share of its window gets a verdict line
_IDLE_WHY = {
    "launch": "launch-bound: the host issues kernels slower than the GPU runs them",
    "sync": "sync-bound: the host blocks on the GPU and the GPU then waits for the host",
    "iteration_boundary": "scheduler-bound: the GPU waits between iterations for the host's scheduling",
    "gpu_wait": "dependency-bound: the GPU waits on other streams or events",
    "short_gaps": "gaps shorter than --min-bubble-us between kernels (many small kernels)",
}


GPU_BOUND_BUSY = 0.9  # a GPU busy at least this share of its window gets the GPU-bound verdict line (issue 40)


def gpu_bound_verdict(win: float, idle: float, wall: float | None) -> str:
    """The verdict line of a GPU-bound step: busy most of its window, and (where the CPU window is much shorter) the
    host running ahead of a queue that sets the pace."""
    busy = 100 * (win - idle) / win
    ahead = (f"; its window is {win / wall:,.1f}× the CPU window ({wall:,.1f} µs): the host runs ahead and the GPU's queue sets "
             "the pace" if wall and win >= 1.5 * wall else "")
    return (f"verdict: GPU-bound: the GPU is busy {busy:.0f}% of its {win:,.1f} µs window per iteration (medians){ahead}; "
            "a faster step needs less GPU work (the kernels below), not less host time")


def idle_verdict(rank: Rank) -> str | None:
    """One line when the GPU mostly idles (median idle >= IDLE_VERDICT of the median window): what bounds
    the iteration, by the largest idle cause, with the CPU op most of that idle time went to. None for a
    GPU that is mostly busy, or a CPU-only run (its "idle" is of the CPU-op timeline)."""
    from profkit.attribution.findings import idle_cpu_ops

    if rank.device_timeline == "cpu":
        return None
    m = rank.median
    win, idle = m.gpu_window_us, m.gpu_idle_us
    if win and idle is not None and idle <= (1 - GPU_BOUND_BUSY) * win:
        # a graph capture's kernels did not run (capture health says so): nothing bounds a step there
        capture = bool(rank.iterations) and all(i.kind == "graph_capture" for i in rank.iterations)
        return None if capture else gpu_bound_verdict(win, idle, m.wall_us)
    if not win or idle is None or idle < IDLE_VERDICT * win:
        return None
    causes = {k: v or 0.0 for k, v in m.bubble_us_by_cause.items()}
    causes["short_gaps"] = max(idle - (m.bubble_us or 0.0), 0.0)
    cause, us = max(causes.items(), key=lambda kv: kv[1])
    where = ""
    # ProfilerStep#N spans are one thing, host code outside recorded ops: merged before the largest is named
    ops = merged_ops(idle_cpu_ops(rank, cause, 50))[:1] if cause != "short_gaps" else []
    if ops and ops[0][1]:
        n = max(len(rank.iterations), 1)
        where = f"; the CPU op with most of that idle time: {op_label(ops[0][0])} ({ops[0][1] / n:,.1f} µs per iteration)"
    launches = f", {m.kernel_launches:,.0f} kernel launches per iteration" if cause == "launch" and m.kernel_launches else ""
    return (f"verdict: the GPU idles {idle:,.1f} of its {win:,.1f} µs window per iteration ({100 * idle / win:.0f}%, medians); "
            f"{_IDLE_WHY.get(cause, cause)} ({cause.replace('_', ' ')} {us:,.1f} µs{launches}){where}")


def unstable_runs(steps: Sequence[tuple[str, str, str, Diff]], config: Mapping[str, str]) -> list[str]:
    """A sweep's unstable runs, each once with the steps it takes part in (a ladder's middle run is one step's
    candidate and the next one's baseline): "+topk_v2: profile window 0: …; steps +topk_v2, +topk_v2+overlap: their
    changes are the swing as much as the step". `steps`: (step label, baseline run id, candidate run id, diff);
    `config`: run id -> configuration name. The same words in the terminal and the HTML."""
    runs: dict[str, tuple[str, list[str]]] = {}
    for label, b, c, d in steps:
        for side, run in (("baseline", b), ("candidate", c)):
            u = getattr(d.stability, side)
            if u:
                runs.setdefault(str(config.get(run) or run), (u, []))[1].append(label)
    return [f"{run}: {u}; step{'s' if len(st) > 1 else ''} {', '.join(st)}: "
            f"{'their changes are' if len(st) > 1 else 'its change is'} the swing as much as the step" for run, (u, st) in runs.items()]
