"""What every renderer says, worded once: about a diff.json, the headline sentences, the
decomposition's rows, the unprofiled throughput rows, the noise verdict of a metric; about a
summary's rank, the findings (profkit.findings) as sentences: the host setting the pace, GPU work
outside every iteration, the CPU ops inside a bubble.

Plain data in, plain strings and tuples out (no rich, no HTML, no Markdown): the terminal,
Markdown and HTML renderers escape and lay them out. diff.json itself is computed in
`profkit.attribution`; nothing here changes a number, it only chooses and words them.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from typing import Any

from profkit.attribution.diff import IDLE_KEYS, judged_against, term_label
from profkit.findings import host_gap
from profkit.report.numbers import ratio_pct
from profkit.report.vocab import diff_timeline, rank_timeline, words


def within_noise(diff: Mapping[str, Any], metric: str) -> bool | None:
    """True/False when repeats give a noise estimate for `metric` (e.g. ``category_us.attention``), else None."""
    noise = diff.get("noise") or {}
    if not noise.get("available"):
        return None
    m = (noise.get("metrics") or {}).get(metric)
    return None if m is None else bool(m["within_noise"])


def noise_verdict(diff: Mapping[str, Any], metric: str) -> str:
    """``within noise``, ``beyond noise``, or "" when there is no noise estimate for `metric`."""
    w = within_noise(diff, metric)
    return "" if w is None else ("within noise" if w else "beyond noise")


def row_metric(group: str, term: str) -> str:
    """The noise metric of a `decomposition_rows` row (its key in diff.json's noise.metrics)."""
    return {"category": f"category_us.{term}", "overlap": "overlap_us", "idle": f"idle_us_by_cause.{term}"}[group]


THROUGHPUT_KEYS = (
    ("tokens_per_s_per_user_p50", "tokens/s per user (p50)", True), ("tokens_per_s_per_gpu", "tokens/s per GPU", True),
    ("tokens_per_s", "tokens/s", True), ("ttft_ms_p50", "TTFT ms (p50)", False), ("itl_ms_p50", "ITL ms (p50)", False),
    ("accept_length", "accept length", True), ("cache_hit_rate", "cache hit rate", True),
)


def _median_of(point: Mapping[str, Any] | None, key: str) -> tuple[float | None, float | None]:
    v = (point or {}).get(key)
    if isinstance(v, Mapping):
        return v.get("median"), v.get("spread")
    return (float(v), None) if isinstance(v, (int, float)) else (None, None)


def throughput_rows(diff: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Unprofiled throughput side by side: label, baseline, candidate, change (%), within_noise
    (None without a spread), higher_is_better. Empty when the manifests carry no throughput."""
    tp = diff.get("throughput") or {}
    b, c = tp.get("baseline"), tp.get("candidate")
    if not b and not c:
        return []
    rows = []
    cpu = diff_timeline(diff) == "cpu"
    for key, label, higher in THROUGHPUT_KEYS:
        if key == "tokens_per_s_per_gpu" and cpu:
            label = "tokens/s per rank"  # a CPU-only run has no GPU: the same figure, per process of the engine
        (bv, bs), (cv, cs) = _median_of(b, key), _median_of(c, key)
        if bv is None and cv is None:
            continue
        change = (cv / bv - 1) * 100 if bv and cv is not None else None
        spread = max(x for x in (bs, cs, -1.0) if x is not None)
        within = None if spread < 0 or bv is None or cv is None else (cv == bv or abs(cv - bv) < spread)
        rows.append({"key": key, "label": label, "baseline": bv, "candidate": cv, "change_pct": change, "within_noise": within,
                     "higher_is_better": higher, "baseline_spread": bs, "candidate_spread": cs})
    return rows


def headline(diff: Mapping[str, Any]) -> str:
    """One sentence: what the change did to the iteration (plain text; renderers escape it)."""
    w = diff["wall_us"]
    g = diff["gpu_window_us"]
    parts = [f"{diff['shape']['label']}: wall {w['baseline']:,.1f} → {w['candidate']:,.1f} µs per iteration ({ratio_pct(w.get('ratio'), missing='n/a')})"]
    window = words(diff_timeline(diff))["window"]  # a CPU-only diff's windows are of its CPU-op timeline
    parts.append(f"{window} {g['baseline']:,.1f} → {g['candidate']:,.1f} µs ({ratio_pct(g.get('ratio'), missing='n/a')})")
    return "; ".join(parts)


def headline_lines(diff: Mapping[str, Any]) -> list[str]:
    """The report headline (issue 19; plain text, renderers escape it): what bounds the iteration, what the
    optimization did to its own categories and phase, what else moved beyond noise, the unprofiled
    throughput change with its spread, and the regime warnings (exploration baseline, unstable windows)."""
    lines: list[str] = []
    W = words(diff_timeline(diff))
    dec = diff["decomposition"]
    c = dec["candidate"]
    idle = c.get("idle_us_by_cause") or {}
    win = c.get("gpu_window_us") or 0.0
    busy = c.get("gpu_busy_us") or 0.0
    cause, us = max(((k, idle.get(k) or 0.0) for k in ("launch", "sync", "iteration_boundary", "gpu_wait", "python")), key=lambda kv: kv[1])
    if win and busy >= 0.8 * win:
        bound = f"{W['device']}-bound (busy {busy:,.0f} of {win:,.0f} µs)"
    else:
        name = {"launch": "launch-bound", "sync": "sync-bound", "iteration_boundary": "scheduler-bound", "gpu_wait": "dependency-bound",
                "python": "Python-bound"}[cause]
        bound = f"{name} ({cause} idle {us:,.0f} µs of a {win:,.0f} µs {W['window']}; busy {busy:,.0f} µs)"
    lines.append(f"The candidate's iteration is {bound}; {headline(diff)}.")
    slow = {side: profiler_slowdown(diff, side) for side in ("baseline", "candidate")}
    if max((v for v in slow.values() if v is not None), default=0.0) >= SLOWDOWN_NOTE:
        got = [(side, v) for side, v in slow.items() if v is not None]
        said = f"the {got[0][0]} ran {got[0][1]:.1f}×" + "".join(f" and the {side} {v:.1f}×" for side, v in got[1:])
        terms = "python, iteration boundary" if diff_timeline(diff) == "cpu" else "launch, sync, gpu wait"
        lines.append(f"Profiled, {said} slower than unprofiled (tokens/s per user): the host-side idle "
                     f"terms ({terms}) carry the profiler's own cost; read them with the unprofiled throughput.")
    ee = diff.get("expected_effect") or {}
    if ee.get("known"):
        # an own term that is nothing on either side (no iteration-boundary idle to remove) says nothing
        terms = [t for t in ee.get("own") or [] if t.get("baseline_us") or t.get("candidate_us") or t.get("delta_us")]
        own = ", ".join(f"{term_label(t['term'])} {t['delta_us']:+,.1f} µs" + (f" (spread {t['spread_us']:,.1f})" if t.get("spread_us") is not None else "")
                        + (" within noise" if t.get("within_noise") else "") for t in terms) or "no category, phase or idle time of its own in the catalog"
        verdict = ""
        if terms and ee.get("judged"):
            wrong = [term_label(t["term"]) for t in terms if t.get("as_expected") is False]
            unseen = [term_label(t["term"]) for t in terms if t.get("as_expected") is None]
            bar = judged_against(ee.get("backlog_drift_us") or 0.0)
            verdict = (f"; against the expected decrease: {', '.join(wrong)}" if wrong else
                       "; a decrease, as expected" if not unseen else
                       f"; expected a decrease, none beyond {bar}" if len(unseen) == len(terms) else
                       f"; a decrease, as expected (not beyond {bar}: {', '.join(unseen)})")
        ph = dec.get("phase_us") or {}
        top = max(ph.items(), key=lambda kv: abs(kv[1]), default=None)
        phase = f"; largest phase change {top[0]} {top[1]:+,.1f} µs" if top and not ee.get("phases") else ""
        lines.append(f"{ee['optimization']}: {own}{verdict}{phase}.")
        if not ee.get("judged"):
            lines.append("Changes are not judged: one profile window per side (no noise estimate).")
        else:
            beyond = ee.get("beyond_noise") or []
            lines.append("Beyond noise elsewhere: " + (", ".join(f"{term_label(t['term'])} {t['delta_us']:+,.1f} µs"
                                                                   for t in beyond[:5]) or "nothing") + ".")
    tp = [r for r in throughput_rows(diff) if r["key"] == "tokens_per_s_per_user_p50"]
    if tp and tp[0]["change_pct"] is not None:
        r = tp[0]
        noise = "" if r["within_noise"] is None else (" within noise" if r["within_noise"] else " beyond noise")
        spread = ("; the repeats spread " + " and ".join(f"{x:,.0f}" for x in (r["baseline_spread"], r["candidate_spread"]) if x is not None)
                  if r["baseline_spread"] is not None or r["candidate_spread"] is not None else "")
        lines.append(f"Unprofiled tokens/s per user {r['baseline']:,.0f} → {r['candidate']:,.0f} ({r['change_pct']:+.1f}%{spread}){noise}.")
    if _exploration(diff):
        lines.append("Exploration mode (--base off): the baseline is everything off, eager and launch-bound, a regime the study never ran.")
    for side in ("baseline", "candidate"):
        u = (diff.get("stability") or {}).get(side)
        if u:
            lines.append(f"Unstable {side}: {u}.")
    return lines


SLOWDOWN_NOTE = 1.5  # a profiled window this much slower than the unprofiled passes gets a line in the headline


def profiler_slowdown(diff: Mapping[str, Any], side: str) -> float | None:
    """How much slower `side` ran inside its profile windows than in its unprofiled passes (tokens/s per user,
    the manifest's profiler_overhead; the median over the windows), or None without a manifest that says."""
    m = (diff.get("manifests") or {}).get(side)
    oh = m.get("profiler_overhead") if isinstance(m, Mapping) else None
    if not isinstance(oh, Mapping):
        return None
    raw = [w.get("slowdown") for w in oh.get("windows") or [oh] if isinstance(w, Mapping)]
    vals = [float(v) for v in raw if isinstance(v, (int, float))]
    return statistics.median(vals) if vals else None


def _exploration(diff: Mapping[str, Any]) -> bool:
    m = (diff.get("manifests") or {}).get("baseline")
    if not isinstance(m, Mapping):
        return False
    if m.get("base") == "off":
        return True
    states = m.get("optimizations")
    return isinstance(states, Mapping) and bool(states) and not any(states.values())


def phase_rows(diff: Mapping[str, Any]) -> list[tuple[str, float | None, float | None, float, str]]:
    """(phase, baseline_us, candidate_us, delta_us, noise metric) rows of the change by phase (mean µs per iteration)."""
    dec = diff["decomposition"]
    b, c = dec["baseline"].get("phase_us") or {}, dec["candidate"].get("phase_us") or {}
    return [(k, b.get(k), c.get(k), d, f"phase_us.{k}") for k, d in (dec.get("phase_us") or {}).items()]


def effect_flags(ee: Mapping[str, Any]) -> list[str]:
    """The expected-effect check's red flags, its own effect's first: against the expected direction, then
    changes outside its categories."""
    return [*(ee.get("against") or []), *(ee.get("flags") or [])]


def decomposition_rows(diff: Mapping[str, Any]) -> list[tuple[str, str, float, float | None, float | None]]:
    """(group, term, delta_us, baseline_us, candidate_us) rows whose deltas add up to the change in
    the GPU window; overlap enters with a minus sign (its row holds -delta overlap)."""
    d = diff["decomposition"]
    b, c = d["baseline"], d["candidate"]
    rows: list[tuple[str, str, float, float | None, float | None]] = []
    for k, v in d["category_us"].items():
        rows.append(("category", k, v, b["category_us"].get(k), c["category_us"].get(k)))
    rows.append(("overlap", "overlap (counted once)", -d["overlap_us"], b["overlap_us"], c["overlap_us"]))
    for k in IDLE_KEYS:
        if k in d["idle_us_by_cause"]:  # "python" only in a diff of CPU-only runs
            rows.append(("idle", k, d["idle_us_by_cause"][k], b["idle_us_by_cause"][k], c["idle_us_by_cause"][k]))
    return rows


# ---------------------------------------------------------------------------------------------
# a summary's findings, in words


def host_gap_text(rank: Mapping[str, Any]) -> str | None:
    """One sentence for the headline, or None."""
    h = host_gap(rank)
    if h is None:
        return None
    dev = "CPU-op" if rank.get("device_timeline") == "cpu" else "GPU"
    text = (f"the host sets the pace: CPU window {h['wall_us']:,.1f} µs vs {dev} window {h['gpu_window_us']:,.1f} µs "
            f"(median per iteration)")
    c = h["call"]
    if c:
        where = f", trigger {c['trigger']}" if c.get("trigger") else ""
        frame = f", at {str(c['stack']).split(' ← ')[0]}" if c.get("stack") else ""
        text += (f"; {c['blocked_us']:,.1f} µs of it blocked in {c['api']} ({c['kind']}, {c['direction']}{where}{frame}) "
                 f"in iteration {c['iteration']}")
    else:
        text += "; no single blocking call explains it (host work between the GPU's ops: see the bubbles)"
    return text


def cpu_ops_text(ops: list[tuple[str, float | None]], *, sep: str = ", ") -> str:
    return sep.join(name if us is None else f"{name} {us:,.1f} µs" for name, us in ops)


def outside_text(rank: Mapping[str, Any]) -> str | None:
    """One line on GPU work outside every iteration, when there is any."""
    o = rank.get("outside_iterations")
    if not o or not o.get("gpu_ops"):
        return None
    busy = o.get("device_busy_us") or 0.0
    cpu = rank_timeline(rank) == "cpu"  # a CPU-only run: its "ops" are aten ops, none of them launched
    share = f" ({100 * o['gpu_us'] / busy:.1f}% of the {'CPU-op' if cpu else 'device’s'} busy time)".replace("’", "'") if busy else ""
    parts = [f"{o[k]} {label}" for k, label in (("before_first", "before the first iteration" if cpu else "launched before the first iteration"),
                                                ("after_last", "after the last"), ("no_launch_in_trace", "with no launch call in the trace"))
             if o.get(k)]
    ops = "aten ops" if cpu else "GPU ops"  # a CPU-only run's device ops are its aten ops
    return f"outside every iteration: {o['gpu_ops']:,} {ops}, {o['gpu_us']:,.1f} µs{share}: {', '.join(parts)}"


def device_text(rank: Mapping[str, Any], manifest: Any = None) -> str:
    """What ran the rank: the trace's device name, else the run manifest's (its gpu, e.g. "cpu"), else
    "CPU" for a CPU-only trace; "unknown device" only when nothing says."""
    if rank.get("device"):
        return str(rank["device"])
    versions = manifest.get("versions") if isinstance(manifest, Mapping) else None
    gpu = (versions or {}).get("gpu") if isinstance(versions, Mapping) else None
    if gpu:
        return "CPU" if str(gpu).lower() == "cpu" else str(gpu)
    return "CPU" if rank.get("device_timeline") == "cpu" else "unknown device"


IDLE_VERDICT = 0.5  # a GPU idle for at least this share of its window gets a verdict line
_IDLE_WHY = {
    "launch": "launch-bound: the host issues kernels slower than the GPU runs them",
    "sync": "sync-bound: the host blocks on the GPU and the GPU then waits for the host",
    "iteration_boundary": "scheduler-bound: the GPU waits between iterations for the host's scheduling",
    "gpu_wait": "dependency-bound: the GPU waits on other streams or events",
    "short_gaps": "gaps shorter than --min-bubble-us between kernels (many small kernels)",
}


def idle_verdict(rank: Mapping[str, Any]) -> str | None:
    """One line when the GPU mostly idles (median idle >= IDLE_VERDICT of the median window): what bounds
    the iteration, by the largest idle cause, with the CPU op most of that idle time went to. None for a
    GPU that is mostly busy, or a CPU-only run (its "idle" is of the CPU-op timeline)."""
    from profkit.findings import idle_cpu_ops

    if rank.get("device_timeline") == "cpu":
        return None
    m = rank.get("median") or {}
    win, idle = m.get("gpu_window_us"), m.get("gpu_idle_us")
    if not win or idle is None or idle < IDLE_VERDICT * win:
        return None
    causes = {k: v or 0.0 for k, v in (m.get("bubble_us_by_cause") or {}).items()}
    causes["short_gaps"] = max(idle - (m.get("bubble_us") or 0.0), 0.0)
    cause, us = max(causes.items(), key=lambda kv: kv[1])
    where = ""
    ops = idle_cpu_ops(rank, cause, 1) if cause != "short_gaps" else []
    if ops and ops[0][1]:
        n = max(len(rank.get("iterations") or []), 1)
        where = f"; the CPU op with most of that idle time: {ops[0][0]} ({ops[0][1] / n:,.1f} µs per iteration)"
    launches = f", {m['kernel_launches']:,.0f} kernel launches per iteration" if cause == "launch" and m.get("kernel_launches") else ""
    return (f"verdict: the GPU idles {idle:,.1f} of its {win:,.1f} µs window per iteration ({100 * idle / win:.0f}%, medians); "
            f"{_IDLE_WHY.get(cause, cause)} ({cause.replace('_', ' ')} {us:,.1f} µs{launches}){where}")
