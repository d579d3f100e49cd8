"""A CI gate's decision (DESIGN.md "A gate for CI"), as data: diff.json in, gate.json out; the A/A
calibration; a run's comparability key. Pure: a documents.Diff in, a documents.Gate (gate.json) or
documents.Calibration (calibration.json) out, encoded where written; run manifests (or a summary's `run` section in
their place) read as documents.Manifest, a summary as the documents.KeyFacts its key needs, a run's key a
documents.RunKey; no files, no wording beyond the one-line reasons a row carries (report/gate.py renders).

The gate invents no statistic of its own. Every trace row is diff.json's judged statistic
(attribution/windows.py: the median over paired profile windows of the per-window change, and its
noise, the largest spread); the unprofiled rows are the run manifests' medians over repeats and their
spread (max - min). A row's noise is the larger of that spread and, with a calibration, the A/A spread
of the same metric (`calibration`). A row is a **regression** when the metric moved the wrong way by
more than its practical threshold, beyond its noise, and (time terms of the decomposition) by at least
the expected-effect check's materiality floor (1 µs and 1% of the baseline's window: diff.py's
MATERIAL_SHARE, the rule that keeps a 2 µs move of a 600 µs category from being flagged).

Decision: **inconclusive** when the sides are not comparable (their keys differ), a capture's health is
``unusable``, the trace figures are not judged (one profile window a side, or unstable windows), or no
row could be judged; else **regression** when a row regresses; else **pass**.
"""

from __future__ import annotations

import fnmatch
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import msgspec

from profkit.attribution.diff import ABS_THRESHOLD_NS, MATERIAL_SHARE
from profkit.documents import (Calibration, CalibrationMetric, Comparability, Diff, Gate, GateCalibration, GateRow, Health, History,
                               HostLoadCheck, KeyDiff, KeyFacts, Manifest, Measure, Pair, PolicyFile, PolicyMetric, RankDevice, RunKey, RunSection, Summary,
                               ThroughputPoint, diff_of, manifest_of, point_of, run_of, typed_or_none)

GATE_SCHEMA_VERSION = 1
CALIBRATION_SCHEMA_VERSION = 1

# The practical threshold of every gated metric unless a policy says otherwise: 2% of the baseline.
# Sources: DESIGN.md "A gate for CI" (default 2% of the baseline); nsys-ai's docs/ci-diff-gate.md
# uses a fixed 2% noise floor; sglang PR 28012 gates kernels at +-5% (a policy may set 5 for kernels).
DEFAULT_THRESHOLD_PCT = 2.0

# The comparability key's fields, in the order they are named (DESIGN.md: target, engine version,
# model, preset, workload, GPU, profkit's schema).
KeyField = Literal["target", "engine_version", "model", "preset", "workload", "gpu", "schema"]
KEY_FIELDS: tuple[KeyField, ...] = ("target", "engine_version", "model", "preset", "workload", "gpu", "schema")

THROUGHPUT = {  # unprofiled figures: the manifest's throughput point key -> better when
    "tokens_per_s_per_user_p50": "higher",
    "ttft_ms_p50": "lower",
    "itl_ms_p50": "lower",
}


# a regression's decision line leads with the first of these that regresses (else the row furthest past its threshold)
HEADLINE_FIRST = ("throughput.itl_ms_p50", "throughput.tokens_per_s_per_user_p50", "throughput.ttft_ms_p50", "gpu_window_us")


@dataclass(frozen=True)
class Rule:
    """One policy entry: a metric key or a glob over keys (``category_us.*``)."""

    pattern: str
    direction: str = "lower"  # lower: a rise is worse; higher: a fall is worse
    threshold_pct: float = DEFAULT_THRESHOLD_PCT
    gate: bool = True  # false: listed, never decides


@dataclass(frozen=True)
class Policy:
    rules: tuple[Rule, ...]
    source: str = "built in"

    def rule(self, key: str) -> Rule | None:
        """The first rule naming `key` exactly, else the first whose glob matches it."""
        for r in self.rules:
            if r.pattern == key:
                return r
        for r in self.rules:
            if any(ch in r.pattern for ch in "*?[") and fnmatch.fnmatchcase(key, r.pattern):
                return r
        return None


def default_policy(threshold_pct: float = DEFAULT_THRESHOLD_PCT) -> Policy:
    """The gated metrics (DESIGN.md): unprofiled tokens/s per user, TTFT and ITL; per step the GPU
    window, owned category and phase time, idle by cause, launches and syncs per iteration."""
    t = threshold_pct
    return Policy((
        *(Rule(f"throughput.{k}", d, t) for k, d in THROUGHPUT.items()),
        Rule("gpu_window_us", "lower", t),
        Rule("category_us.*", "lower", t),
        Rule("phase_us.*", "lower", t),
        Rule("idle_us_by_cause.*", "lower", t),
        Rule("counts.kernel_launches", "lower", t),
        Rule("counts.graph_launches", "lower", t),
        Rule("counts.syncs", "lower", t),
    ), "built in" if t == DEFAULT_THRESHOLD_PCT else f"built in, --threshold {t:g}")


def policy_from(doc: Mapping[str, Any], source: str, threshold_pct: float | None = None) -> Policy:
    """A policy file's TOML (already parsed): ``[defaults] threshold_pct``; ``[metric."KEY or GLOB"]``
    with ``direction`` (lower/higher), ``threshold_pct`` and ``gate`` (false: listed only). Its
    metrics come first; the built-in rules follow for every metric it does not name. ValueError names
    the bad entry."""
    known = {"defaults", "metric"}
    extra = set(doc) - known
    if extra:
        raise ValueError(f"unknown table(s) {', '.join(sorted(extra))}: expected [defaults] and [metric.\"KEY\"]")
    try:
        pf = msgspec.convert(doc, PolicyFile)
    except msgspec.ValidationError as e:  # a metric that is no table, an unknown key, a value of another type
        raise ValueError(_policy_error(doc, e)) from None
    t_file = pf.defaults.threshold_pct
    base_t = float(threshold_pct if threshold_pct is not None else t_file if t_file is not None else DEFAULT_THRESHOLD_PCT)
    rules: list[Rule] = []
    for key, m in pf.metric.items():
        d = m.direction if m.direction is not None else "higher" if key.removeprefix("throughput.") == "tokens_per_s_per_user_p50" else "lower"
        if d not in ("lower", "higher"):
            raise ValueError(f"[metric.{key!r}] direction {d!r}: use lower (a rise is worse) or higher (a fall is worse)")
        t = float(m.threshold_pct if m.threshold_pct is not None else base_t)
        if t < 0:
            raise ValueError(f"[metric.{key!r}] threshold_pct {t}: at least 0")
        rules.append(Rule(key, d, t, m.gate))
    return Policy((*rules, *default_policy(base_t).rules), source)


def _policy_error(doc: Mapping[str, Any], e: msgspec.ValidationError) -> str:
    """Why a policy file did not convert, naming the metric's entry (msgspec's path does not name a table's key)."""
    metrics = doc["metric"] if "metric" in doc and isinstance(doc["metric"], Mapping) else {}
    for key, m in metrics.items():
        if not isinstance(m, Mapping):
            return f"[metric.{key!r}] must be a table"
        bad = set(m) - set(PolicyMetric.__struct_fields__)
        if bad:
            return f"[metric.{key!r}]: unknown key(s) {', '.join(sorted(bad))} (direction, threshold_pct, gate)"
        try:
            msgspec.convert(m, PolicyMetric)
        except msgspec.ValidationError as me:
            return f"[metric.{key!r}]: {me}"
    return str(e)


# ---------------------------------------------------------------------------------------------
# comparability


def _facts(summary: Summary | Mapping[str, Any] | None) -> KeyFacts | None:
    """What the key reads of a summary (a Summary, or summary.json as a plain value); None without one (or one of
    another shape)."""
    if isinstance(summary, Summary):
        return KeyFacts(schema_version=summary.schema_version, run=run_of(summary.run),
                        ranks=[RankDevice(device=r.device) for r in summary.ranks[:1]])
    return typed_or_none(summary, KeyFacts)


def run_key(manifest: Manifest | Mapping[str, Any] | None, summary: Summary | Mapping[str, Any] | None = None) -> RunKey:
    """A run's comparability key from its manifest (or a summary's `run` section): None where the run
    does not say (an unknown field is not compared)."""
    m = manifest_of(manifest) if manifest else None
    facts = _facts(summary)
    src: Manifest | RunSection | None = m or (facts.run if facts is not None else None)
    versions = src.versions if src is not None else None
    info = m.server_info if m is not None else None
    model = (m.model_path if m is not None else None) or (info.model_path or info.model if info is not None else None)
    wl = src.workload if src is not None and isinstance(src.workload, Mapping) else None
    workload = ({k: v for k, v in wl.items() if k not in ("repeat", "expected_cache_hit")} if wl else None)
    # the device's name: the server's (manifest), else the summary's rank 0 ("NVIDIA H200"; None on a CPU run), else the
    # capture's versions.gpu ("cpu"; "cuda:0" names no GPU, so it comes last)
    rank_device = facts.ranks[0].device if facts is not None and facts.ranks else None
    gpu = (info.device_name if info is not None else None) or rank_device or (versions.gpu if versions is not None else None)
    return RunKey(target=src.target if src is not None else None, engine_version=versions.engine if versions is not None else None,
                  model=_canon(model), preset=src.preset if src is not None else None, workload=_canon(workload), gpu=gpu,
                  schema=facts.schema_version if facts is not None else None)


def _canon(v: str | Mapping[str, Any] | None) -> str | None:
    """A key field as one comparable value: objects as compact JSON with sorted keys."""
    return json.dumps(v, sort_keys=True, separators=(",", ":")) if isinstance(v, Mapping) else v


def key_id(key: RunKey) -> str:
    """A short stable name for a key (a stored baseline's folder)."""
    import hashlib

    return hashlib.sha256(json.dumps({k: key.get(k) for k in KEY_FIELDS}, sort_keys=True).encode()).hexdigest()[:12]


def compare_keys(baseline: RunKey, candidate: RunKey) -> Comparability:
    """Which key fields differ (both known and unequal) and which are unknown on a side."""
    differ: list[KeyDiff] = []
    unknown: list[str] = []
    for k in KEY_FIELDS:
        b, c = baseline.get(k), candidate.get(k)  # a key read back may lack a field: unknown
        if b is None or c is None:
            if b != c:
                unknown.append(k)
        elif b != c:
            differ.append(KeyDiff(field=k, baseline=b, candidate=c))
    return Comparability(comparable=not differ, differ=differ, unknown=unknown, baseline=baseline.copy(), candidate=candidate.copy())


# ---------------------------------------------------------------------------------------------
# the machine's other work, and whether the sides were recorded together

# A gate compares a side recorded beside other work only with a side recorded beside about as much: the
# sides' medians of other processes' CPU use (capture/hostload.py, per repeat and profile window) may differ
# by at most this share of the machine's CPUs, and at least LOAD_LIMIT_MIN_CPUS. Source: the gate trials on
# the 2-core machine (benchmarks/results/gate_trials_2026-12-07.txt): two busy loops beside a recording read
# 1.9-2.0 CPUs and turned A/A gates against a quiet stored baseline into "regressions" of ITL (+43%) and
# boundary idle (+45-51%) in the previous pass (gate_trials_quiet_aa.txt); quiet recordings read 0.0-0.3.
LOAD_LIMIT_SHARE = 0.25
LOAD_LIMIT_MIN_CPUS = 0.5


def host_load(manifest: Manifest | Mapping[str, Any] | None) -> tuple[float | None, int | None]:
    """(median CPUs other processes kept busy while the run recorded, the machine's CPUs); None where the
    run did not measure it (recorded before profkit did)."""
    m = manifest_of(manifest)
    hl = m.host_load if m is not None else None
    if hl is None or hl.other_cpus_median is None:
        return None, None
    return float(hl.other_cpus_median), hl.cpus


def compare_load(baseline: Manifest | Mapping[str, Any] | None, candidate: Manifest | Mapping[str, Any] | None) -> HostLoadCheck:
    """Whether the two runs were recorded beside comparable other work (their manifests' host_load)."""
    (b, nb), (c, nc) = host_load(baseline), host_load(candidate)
    cpus = nb or nc
    limit = max(LOAD_LIMIT_MIN_CPUS, LOAD_LIMIT_SHARE * (cpus or 1))
    known = b is not None and c is not None
    return HostLoadCheck(baseline_other_cpus=b, candidate_other_cpus=c, cpus=cpus, limit_cpus=limit,
                         comparable=not known or abs((c or 0.0) - (b or 0.0)) <= limit, known=known)


def recorded_together(baseline: Manifest | Mapping[str, Any] | None, candidate: Manifest | Mapping[str, Any] | None) -> bool:
    """True when the two runs were recorded side by side, their steps alternating (one `trace` or one
    calibrate session: the manifests' recorded_with), so that the host's drift landed on both; a stored
    baseline against a later recording is not."""
    b, c = manifest_of(baseline), manifest_of(candidate)
    if b is None or c is None:
        return False
    if b.recorded_with is not None or c.recorded_with is not None:
        return c.run_id in (b.recorded_with or []) or b.run_id in (c.recorded_with or [])
    # recorded before manifests said so: one command's alternating runs share its stamp (YYYYMMDD-HHMMSS-)
    rb, rc = b.run_id or "", c.run_id or ""
    return b.capture_order == c.capture_order == "alternating" and len(rb) > 16 and rb[:16] == rc[:16]


# ---------------------------------------------------------------------------------------------
# rows


def _throughput_figure(point: ThroughputPoint | None, key: str) -> tuple[float | None, float | None, int]:
    """(median, spread, repeats) of a manifest throughput point's figure."""
    v = getattr(point, key) if point is not None else None
    if isinstance(v, Measure):
        return v.median, v.spread, v.n or 0
    return (float(v), None, 1) if isinstance(v, (int, float)) else (None, None, 0)


@dataclass(frozen=True)
class Figures:
    """One metric a diff gives a figure for, before it is judged: its change, noise (None: none), unit, and
    the floor a time term must also pass (µs); `not_judged`: why it cannot be (None: it can)."""

    metric: str
    baseline: float | None
    candidate: float | None
    change: float | None
    noise: float | None
    unit: str
    floor: float = 0.0
    not_judged: str | None = None


def candidate_rows(diff: Diff) -> list[Figures]:
    """Every metric the diff gives a figure for."""
    rows: list[Figures] = []
    point_b, point_c = point_of(diff.throughput.baseline), point_of(diff.throughput.candidate)
    for k in THROUGHPUT:
        b, sb, nb = _throughput_figure(point_b, k)
        c, sc, nc = _throughput_figure(point_c, k)
        if b is None or c is None:
            continue
        noise = max(sb, sc) if sb is not None and sc is not None else None
        rows.append(Figures(f"throughput.{k}", b, c, c - b, noise, "tok/s" if k.startswith("tokens") else "ms", 0.0,
                            None if noise is not None else
                            f"one unprofiled repeat a side ({nb} and {nc}): no spread; record with --repeat N (N >= 2)"))
    nz = diff.noise
    metrics = nz.metrics if isinstance(nz.metrics, dict) else {}
    ee = diff.expected_effect  # diff.json writes floor_us for an optimization the catalog knows
    window = diff.gpu_window_us.baseline or 0.0
    floor: float = (float(ee.floor_us) if ee is not None and ee.known and isinstance(ee.floor_us, (int, float))
                    else max(ABS_THRESHOLD_NS / 1000, window * MATERIAL_SHARE))
    if nz.available and metrics:
        for k, m in metrics.items():
            time_term = k.startswith(("category_us.", "phase_us.", "idle_us_by_cause."))
            rows.append(Figures(k, m.baseline.median, m.candidate.median, m.delta, m.spread, "count" if k.startswith("counts.") else "µs",
                                float(floor) if time_term else 0.0))
    else:  # not judged: the decomposition's figures, no noise
        dec = diff.decomposition
        why = nz.note or "not judged: no noise estimate"
        gw = diff.gpu_window_us
        if gw.baseline is not None:
            rows.append(Figures("gpu_window_us", gw.baseline, gw.candidate, gw.delta, None, "µs", 0.0, why))
        for group in ("category_us", "phase_us", "idle_us_by_cause"):
            bs: dict[str, float | None] = getattr(dec.baseline, group)
            cs: dict[str, float | None] = getattr(dec.candidate, group)
            deltas: dict[str, float] = getattr(dec, group)
            for name, delta in deltas.items():
                if delta is None:
                    continue
                rows.append(Figures(f"{group}.{name}", bs.get(name), cs.get(name), delta, None, "µs", float(floor), why))
        for name in ("kernel_launches", "graph_launches", "syncs"):
            cn = diff.counts.get(name)
            if cn is not None and cn.baseline is not None and cn.candidate is not None:
                rows.append(Figures(f"counts.{name}", cn.baseline, cn.candidate, cn.candidate - cn.baseline, None, "count", 0.0, why))
    return rows


def _pct(v: float | None, base: float | None) -> float | None:
    return None if v is None or not base else v / abs(base) * 100


def judge_row(row: Figures, rule: Rule, cal: CalibrationMetric | None, paired: bool = True) -> GateRow:
    """One gated row with its threshold, noise, MDE and verdict: regression, improvement, within noise,
    below threshold, not judged, cannot be judged here (the threshold below the calibrated MDE), or too
    noisy (within this run's noise, which is wider than the calibrated MDE: a regression could hide).
    `paired`: the sides were recorded together (the A/A pair's figures apply); else (a stored baseline,
    runs of two commands) the calibration's figures across sessions, where it has them."""
    b, delta = row.baseline, row.change
    sign = 1.0 if rule.direction == "lower" else -1.0
    threshold = abs(b or 0.0) * rule.threshold_pct / 100
    floor = row.floor or 0.0
    aa_spread = aa_mde = None
    pre = "" if paired or cal is None or cal.stored_mde_pct is None else "stored_"
    if cal is not None:
        aa_spread = getattr(cal, f"{pre}aa_spread_pct")
        aa_mde = getattr(cal, f"{pre}mde_pct")
    # the calibration's figures are shares of its own baseline: here, of this baseline
    spread_abs = None if aa_spread is None or not b else abs(b) * aa_spread / 100
    mde_abs = None if aa_mde is None or not b else abs(b) * aa_mde / 100
    if cal is not None and not b:
        spread_abs, mde_abs = getattr(cal, f"{pre}aa_spread_abs"), getattr(cal, f"{pre}mde_abs")
    noise = row.noise
    if noise is not None and spread_abs is not None:
        noise = max(noise, spread_abs)
    out = GateRow(
        metric=row.metric, unit=row.unit, direction=rule.direction, gated=rule.gate,
        baseline=b, candidate=row.candidate, change=delta, change_pct=_pct(delta, b),
        threshold_pct=rule.threshold_pct, threshold=max(threshold, floor), floor=floor,
        noise=noise, noise_pct=_pct(noise, b), window_noise=row.noise,
        aa_spread_pct=aa_spread, mde_pct=aa_mde, mde=mde_abs,
        mde_from=None if aa_mde is None else "sessions" if pre else "pair",
        verdict="", reason=None,
    )
    limit = max(threshold, floor)
    # the calibration's refusal first: it holds whatever this capture's own noise (the policy against the machine)
    if mde_abs is not None and limit < mde_abs:
        what = f"{aa_spread:.1f}%" if aa_spread is not None else f"{spread_abs or 0:g} {row.unit}"
        out.verdict = "cannot be judged here"
        out.reason = (f"cannot be judged here: the A/A spread is {what} (MDE {aa_mde:.1f}%), "
                      f"above the {rule.threshold_pct:g}% threshold" if aa_mde is not None else
                      f"cannot be judged here: the A/A spread is {what}, above the threshold")
    elif row.not_judged:
        out.verdict, out.reason = "not judged", row.not_judged
    elif delta is None:
        out.verdict, out.reason = "not judged", "no figure on one side"
    elif noise is not None and mde_abs is not None and noise > mde_abs and abs(delta) < noise:
        # the calibration promised this MDE; this run's own spread is wider, so a change of the MDE could hide in it
        out.verdict = "too noisy"
        out.reason = (f"too noisy here: this run's spread is {_pct(noise, b) or 0:.1f}%, above the calibrated MDE "
                      f"{aa_mde:.1f}%" if aa_mde is not None and b else f"too noisy here: this run's spread is {noise:g} {row.unit}, "
                      f"above the calibrated MDE {mde_abs:g}")
    elif noise is not None and (delta == 0 or abs(delta) < noise):
        out.verdict = "within noise"
    elif abs(delta) <= limit:
        out.verdict = "below threshold"
    else:
        out.verdict = "regression" if delta * sign > 0 else "improvement"
    return out


# ---------------------------------------------------------------------------------------------
# the decision


def _health(raw: Any) -> Health | None:
    """A diff side's capture health (a plain value in diff.json) typed; None without one (or one of another shape)."""
    return typed_or_none(raw, Health)


def _verdicts(health: Mapping[str, Health | None]) -> Pair[str]:
    """Each side's capture health verdict (None: no health)."""
    b, c = health["baseline"], health["candidate"]
    return Pair[str](baseline=b.verdict if b is not None else None, candidate=c.verdict if c is not None else None)


def decide(diff: Diff | Mapping[str, Any] | None, policy: Policy, *, calibration: Calibration | None = None,
           comparability: Comparability | None = None, inconclusive: str = "fail", paired: bool | None = None) -> Gate:
    """gate.json for a diff: every gated row judged, the decision, why, and the exit code. `paired`: the
    sides were recorded together (default: read from the diff's manifests). No diff (None): the sides were
    never compared (`not_comparable`), no row."""
    d = diff_of(diff) if diff is not None else None
    cal_metrics = calibration.metrics if calibration is not None else {}
    man_b, man_c = (manifest_of(d.manifests.baseline), manifest_of(d.manifests.candidate)) if d is not None else (None, None)
    if paired is None:
        paired = recorded_together(man_b, man_c)
    rows = []
    for r in candidate_rows(d) if d is not None else []:
        rule = policy.rule(r.metric)
        if rule is None:
            continue
        rows.append(judge_row(r, rule, cal_metrics.get(r.metric), paired))
    if comparability is None:
        comparability = compare_keys(run_key(man_b), run_key(man_c))
    load = compare_load(man_b, man_c)
    reasons: list[str] = []
    if not comparability.comparable:
        reasons.append("not comparable: " + "; ".join(f"{k.field} differs (baseline {k.baseline}, candidate {k.candidate})"
                                                       for k in comparability.differ))
    if not load.comparable:
        busier = "candidate" if (load.candidate_other_cpus or 0.0) > (load.baseline_other_cpus or 0.0) else "baseline"
        quieter = "baseline" if busier == "candidate" else "candidate"
        reasons.append(f"the machine was busier while the {busier} recorded: other processes kept {getattr(load, busier + '_other_cpus'):.1f} "
                       f"of {load.cpus or '?'} CPUs busy ({quieter}: {getattr(load, quieter + '_other_cpus'):.1f}; at most "
                       f"{load.limit_cpus:.1f} apart), and a trace cannot tell a busier machine from slower code")
    health = {s: _health(getattr(d.health, s)) if d is not None else None for s in ("baseline", "candidate")}
    for side, h in health.items():
        if h is not None and h.verdict == "unusable":
            details = "; ".join(f.detail for f in h.findings if f.status == "unusable")
            reasons.append(f"the {side}'s capture health is unusable" + (f" ({details})" if details else ""))
    if d is not None and not d.noise.available:
        reasons.append(d.noise.note or "the trace figures are not judged")
    gated = [r for r in rows if r.gated]
    judged = [r for r in gated if r.verdict not in ("not judged", "cannot be judged here", "too noisy")]
    if gated and not judged and not reasons:
        reasons.append("no gated metric could be judged")
    regressions = sorted((r for r in gated if r.verdict == "regression"), key=_severity, reverse=True)
    noisy = sorted((r for r in gated if r.verdict == "too noisy"), key=lambda r: (r.metric not in HEADLINE_FIRST, r.metric))
    felt = [r for r in noisy if r.metric in HEADLINE_FIRST]
    if felt and not regressions and not reasons:
        # a pass must be one the calibration could have failed: a figure users feel (ITL, tokens/s per user, TTFT, the step's
        # window) noisier than its MDE could hide a regression. Other rows too noisy are left out of the decision (named in
        # the notes): with 20-odd rows, one range of three windows above its calibrated one is the rule, not the exception
        reasons.append(f"{len(felt)} of the figures users feel noisier in this run than the calibration's MDE "
                       f"({', '.join(r.metric for r in felt)}): not a pass; record on a quieter machine, or with more "
                       "profile windows and repeats")
    decision = "inconclusive" if reasons else "regression" if regressions else "pass"
    exit_code = 5 if decision == "regression" or (decision == "inconclusive" and inconclusive == "fail") else 0
    # the figure behind a regression: what users feel first (ITL, tokens/s per user, TTFT, the step's window), then the rest
    felt = sorted((r for r in regressions if r.metric in HEADLINE_FIRST), key=lambda r: HEADLINE_FIRST.index(r.metric))
    headline = (felt or regressions)[0] if regressions else max(judged, key=_severity, default=None)
    owned = max((r for r in regressions if r.metric.startswith("category_us.")), key=lambda r: abs(r.change or 0.0), default=None)
    cal_note = None
    if calibration is not None and comparability.candidate:
        ck = compare_keys(calibration.key, comparability.candidate)
        cal_note = None if ck.comparable else "the calibration was recorded on another configuration (" + ", ".join(
            k.field for k in ck.differ) + " differ): its MDE may not hold here"
        if not calibration.judged:
            cal_note = "; ".join(filter(None, [cal_note, f"the calibration's A/A is not judged, so the trace figures have no MDE ({calibration.note})"]))
    if calibration is not None and not paired and (calibration.sessions or 1) < 2:
        cal_note = "; ".join(filter(None, [cal_note, "the sides were recorded apart, but the calibration has one session: its MDE is "
                                                     "an A/A pair's and can miss the spread between sessions (calibrate with --sessions 2 or more)"]))
    return Gate(
        schema_version=GATE_SCHEMA_VERSION,
        decision=decision,
        exit_code=exit_code,
        inconclusive_policy=inconclusive,
        reasons=reasons,
        headline=headline.metric if headline else None,
        owned_term=owned.metric if owned else None,
        regressions=[r.metric for r in regressions],
        policy=policy.source,
        calibration=GateCalibration(used=calibration is not None, source=calibration.source if calibration is not None else None, note=cal_note),
        comparability=comparability,
        pairing="paired" if paired else "apart",
        host_load=load,
        shape=d.shape.label if d is not None else None,
        sides=Pair[str](baseline=d.baseline.label, candidate=d.candidate.label) if d is not None else Pair[str](),
        health=_verdicts(health),
        timeline="cpu" if d is not None and all(getattr(d, s).device_timeline == "cpu" for s in ("baseline", "candidate")) else "gpu",
        rows=rows,
        history=None,
    )


def _severity(r: GateRow) -> float:
    """How far past its threshold a row is: |change| / threshold (inf for a zero threshold)."""
    t = r.threshold or 0.0
    d = abs(r.change or 0.0)
    return d / t if t else (float("inf") if d else 0.0)


def not_comparable(comparability: Comparability, sides: tuple[str, str], policy: Policy, inconclusive: str = "fail") -> Gate:
    """gate.json when the sides were never compared: their keys differ (nothing was diffed)."""
    doc = decide(None, policy, comparability=comparability, inconclusive=inconclusive)
    doc.sides = Pair[str](baseline=sides[0], candidate=sides[1])
    return doc


def with_history(doc: Gate, previous: Sequence[Gate]) -> Gate:
    """Nightly mode: a regression only when the last two runs both regress on a same metric; today's
    alone is "suspect" (exit 0). `previous`: earlier gate.json documents, oldest first. Changes `doc`."""
    prev = previous[-1] if previous else None
    today = set(doc.regressions)
    if doc.decision != "regression":
        doc.history = History(runs=len(previous) + 1, status=doc.decision, confirmed=[])
        return doc
    both = sorted(today & set(prev.regressions)) if prev is not None and prev.decision in ("regression", "suspect") else []
    if both:
        doc.history = History(runs=len(previous) + 1, status="regression", confirmed=both)
        doc.headline = both[0] if doc.headline not in both else doc.headline
        return doc
    doc.history = History(runs=len(previous) + 1, status="suspect", confirmed=[],
                          note="one run regressed (the previous did not on the same metric): suspect until the next run confirms it")
    doc.decision = "suspect"
    doc.exit_code = 0
    return doc


# ---------------------------------------------------------------------------------------------
# A/A calibration

_AA = ("aa_change_abs", "aa_spread_abs", "aa_change_pct", "aa_spread_pct", "mde_abs", "mde_pct")


def _aa_figures(diffs: Sequence[Diff]) -> dict[str, CalibrationMetric]:
    """Per metric, the A/A figures of the comparison (of `diffs`, each two recordings of one
    configuration) whose change + spread is the largest share of its baseline: the worst seen."""
    out: dict[str, CalibrationMetric] = {}
    for d in diffs:
        for r in candidate_rows(d):
            b, ch, n = r.baseline, r.change, r.noise
            if ch is None:
                continue
            mde = None if n is None else abs(ch) + n
            fig = CalibrationMetric(unit=r.unit, baseline=b, aa_change_abs=abs(ch), aa_spread_abs=n, aa_change_pct=_pct(abs(ch), b),
                                    aa_spread_pct=_pct(n, b), mde_abs=mde, mde_pct=_pct(mde, b),
                                    note=None if n is not None else f"{r.not_judged or 'no spread'}: no MDE")
            have = out.get(r.metric)
            if have is None or (fig.mde_pct or 0.0) > (have.mde_pct or 0.0) or (have.mde_pct is None and fig.mde_pct is not None):
                out[r.metric] = fig
    return out


def calibration_from(diff: Diff | Mapping[str, Any] | Sequence[Diff | Mapping[str, Any]], key: RunKey, source: str = "",
                     across: Sequence[Diff | Mapping[str, Any]] = ()) -> Calibration:
    """calibration.json from A/A diffs: `diff`, each session's two recordings of one configuration,
    alternating (A against A again); `across`, recordings of different sessions against each other.

    Per metric: the A/A change (|median over paired windows of the per-window change|, as a share of
    the baseline) and the A/A spread (the noise the gate's statistic saw: the largest spread). The MDE
    is their sum: a true change Δ is seen as Δ + e where e reached the A/A change with no change at all,
    and a row is beyond noise only when |Δ + e| exceeds the spread; so only |Δ| > change + spread is
    detected whatever e's sign. Over several sessions, each figure is the worst session's (the largest
    change + spread). The same across sessions (`stored_*`): what a gate of runs recorded apart (a stored
    baseline against a later recording) must allow for, as the host drifts between sessions while an
    alternating pair shares its drift. Sessions whose A/A is not judged (unstable windows) give none."""
    diffs = [diff_of(d) for d in ([diff] if isinstance(diff, (Diff, Mapping)) else diff)]
    judged = [d for d in diffs if d.noise.available]
    metrics = _aa_figures(judged or diffs[:1])
    # across sessions only when some session's own A/A is judged: with none, the calibration gives no MDE at all (a
    # pair of unstable sessions can still compare stably with each other; a CI run's recipe then gated with an MDE
    # its calibration called not judged)
    cross = _aa_figures([a for a in map(diff_of, across) if a.noise.available]) if judged else {}
    for k, m in metrics.items():
        c = cross.get(k)
        metrics[k] = msgspec.structs.replace(m, **{f"stored_{f}": getattr(c, f) if c else None for f in _AA})
    first = diffs[0]
    unjudged = [d.noise.note or "not judged" for d in diffs if not d.noise.available]
    health = {s: _health(getattr(first.health, s)) for s in ("baseline", "candidate")}
    return Calibration(
        schema_version=CALIBRATION_SCHEMA_VERSION,
        kind="calibration",
        source=source,
        # the trace figures' A/A is judged (a window-pair statistic with its noise) in some session: else they have no MDE
        judged=bool(judged),
        note=(None if not unjudged else f"{len(unjudged)} of {len(diffs)} session(s) not judged ({unjudged[0]})"
              + ("; the MDEs come from the others" if judged else "")),
        sessions=len(diffs),
        key=key.copy(),
        windows=dict(first.noise.repeats),
        mde=("MDE = A/A change + A/A spread, each as a share of the A side's median, the worst session's; stored_mde: the same "
             "across sessions (see docs/ci.md)"),
        sides=Pair[str](baseline=first.baseline.label, candidate=first.candidate.label),
        health=_verdicts(health),
        metrics=metrics,
    )


@dataclass
class BaselineEntry:
    """One stored baseline: its name, key, where it came from, when."""

    name: str
    key: RunKey
    source: str
    saved_at: str
    folder: str = ""
    windows: int | None = None  # the profile windows it holds (None: not said)


def pick_entry(entries: Sequence[BaselineEntry], name: str, key: RunKey) -> tuple[BaselineEntry | None, Comparability | None]:
    """The entry named `name` whose key matches `key` (no field differs), else None and the
    comparison with the closest entry of that name (fewest differing fields), or None when there is
    no entry of that name."""
    named = [e for e in entries if e.name == name]
    best: tuple[int, BaselineEntry, Comparability] | None = None
    for e in named:
        cmp = compare_keys(e.key, key)
        if cmp.comparable:
            return e, cmp
        if best is None or len(cmp.differ) < best[0]:
            best = (len(cmp.differ), e, cmp)
    return None, (best[2] if best else None)
