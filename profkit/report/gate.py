"""gate.json and calibration.json in words: the decision line (a PR comment's first line, at most 80
columns), the rows as a terminal table and as GitHub Markdown, the calibration's table. A documents.Gate
or documents.Calibration in, read by field; plain text out; renderers only (attribution/gate.py decides)."""

from __future__ import annotations

from profkit.documents import Calibration, Gate, GateRow
from profkit.report.numbers import num

WIDTH = 80

_THROUGHPUT_LABELS = {"tokens_per_s_per_user_p50": "tok/s per user", "ttft_ms_p50": "TTFT", "itl_ms_p50": "decode ITL"}
_COUNT_LABELS = {"kernel_launches": "launches/step", "graph_launches": "graph launches/step", "syncs": "syncs/step"}
_ORDER = {"regression": 0, "too noisy": 1, "cannot be judged here": 2, "not judged": 3, "improvement": 4, "below threshold": 5, "within noise": 6}


def label(metric: str, timeline: str = "gpu") -> str:
    """A gated metric's key in words: throughput.itl_ms_p50 -> decode ITL, category_us.topk -> owned topk."""
    group, _, name = metric.partition(".")
    if group == "throughput":
        return _THROUGHPUT_LABELS.get(name, name)
    if group == "counts":
        return _COUNT_LABELS.get(name, name)
    if metric == "gpu_window_us":
        return "CPU-op window" if timeline == "cpu" else "GPU window"
    return {"category_us": f"owned {name}", "phase_us": f"{name} phase", "idle_us_by_cause": f"{name.replace('_', ' ')} idle"}.get(group, metric)


def _value(v: float | None, unit: str, *, sign: bool = False) -> str:
    if v is None:
        return "–"
    digits = 2 if unit in ("ms", "count") else 1
    return num(v, digits, sign=sign) + ("" if unit == "count" else f" {unit}")


def _pct(v: float | None, *, sign: bool = False) -> str:
    return "–" if v is None else (f"{v:+.1f}%" if sign else f"{v:.1f}%")


def figure(row: GateRow, timeline: str = "gpu", *, short: bool = False, bare: bool = False) -> str:
    """``decode ITL +6.1% (±1.2%, threshold 2%, MDE 1.5%)``; a change without a baseline in its unit; `bare`:
    the name and the change alone (the table below has the rest)."""
    name = label(row.metric, timeline)
    change = _pct(row.change_pct, sign=True) if row.change_pct is not None else _value(row.change, row.unit, sign=True)
    if bare:
        return f"{name} {change}"
    parts = []
    if row.noise_pct is not None:
        parts.append(f"±{row.noise_pct:.1f}%")
    parts.append(f"{'thr' if short else 'threshold'} {row.threshold_pct:g}%")
    if row.mde_pct is not None:
        parts.append(f"MDE {row.mde_pct:.1f}%")
    return f"{name} {change} ({', '.join(parts)})"


def _owned(row: GateRow, compact: bool = False) -> str:
    """``owned topk +354 µs per step`` (compact: without "per step")."""
    return f"{label(row.metric)} {num(row.change, 0, sign=True)} µs" + ("" if compact else " per step")


def _fit(line: str) -> str:
    return line if len(line) <= WIDTH else line[: WIDTH - 1] + "…"


def _short_reason(doc: Gate) -> str:
    differ = [d.field for d in doc.comparability.differ]
    if differ:
        return f"not comparable: {', '.join(differ)} {'differs' if len(differ) == 1 else 'differ'}"
    bad = [s for s, v in (("baseline", doc.health.baseline), ("candidate", doc.health.candidate)) if v == "unusable"]
    if bad:
        return f"capture health unusable ({', '.join(bad)})"
    load = doc.host_load
    if not load.comparable:
        b, c = load.baseline_other_cpus or 0.0, load.candidate_other_cpus or 0.0
        side = "candidate" if c > b else "baseline"
        return f"{side} ran on a busier machine ({max(b, c):.1f} vs {min(b, c):.1f} CPUs of other work)"
    reasons = doc.reasons
    noisy = [r for r in doc.rows if r.gated and r.verdict == "too noisy"]
    if noisy and reasons and "noisier in this run" in reasons[0]:
        from profkit.attribution.gate import HEADLINE_FIRST

        order = {m: i for i, m in enumerate(HEADLINE_FIRST)}
        r = min(noisy, key=lambda x: (order.get(x.metric, 9), x.metric))  # a felt figure: the one that made it inconclusive
        lead = f"{len(noisy)} metric{'s' if len(noisy) > 1 else ''} too noisy here"
        return f"{lead} ({label(r.metric, doc.timeline or 'gpu')} ±{r.noise_pct or 0:.0f}%, MDE {r.mde_pct or 0:.0f}%)"
    if reasons and reasons[0].startswith("not judged"):
        return "trace figures " + reasons[0]
    return reasons[0] if reasons else "no gated metric could be judged"


def decision_line(doc: Gate) -> str:
    """The first line of every output: the decision and the figure behind it, at most 80 columns."""
    tl = doc.timeline or "gpu"
    dec = doc.decision
    head = doc.row(doc.headline)
    if dec == "inconclusive":
        return _fit(f"inconclusive: {_short_reason(doc)}")
    if dec in ("regression", "suspect") and head is not None:
        owned = doc.row(doc.owned_term)
        tail = "" if dec == "regression" else " (last run only)"
        # the owned term is named whenever it fits: the figure short, the owned term without "per step", the figure bare
        for short, compact, bare in ((False, False, False), (True, False, False), (True, True, False), (True, True, True)):
            line = f"{dec}: {figure(head, tl, short=short, bare=bare)}"
            if owned is not None and owned is not head:
                full = f"{line}; {_owned(owned, compact)}{tail}"
                if len(full) <= WIDTH:
                    return full
        for short in (False, True):
            line = f"{dec}: {figure(head, tl, short=short)}"
            if len(line + tail) <= WIDTH:
                return line + tail
        return _fit(line + tail)
    judged = [r for r in _by_metric(doc) if r.gated and r.verdict not in ("not judged", "cannot be judged here", "too noisy")]
    if head is None:
        return _fit(f"{dec}: no gated metric judged")
    for short in (False, True):
        for lead in (f"{len(judged)} metrics judged, none worse; largest", f"{len(judged)} judged, none worse;"):
            line = f"{dec}: {lead} {figure(head, tl, short=short)}"
            if len(line) <= WIDTH:
                return line
    return _fit(f"{dec}: {len(judged)} metrics judged, none worse beyond threshold and noise")


def _by_metric(doc: Gate) -> list[GateRow]:
    """The rows, one per metric (a metric's last row where one is listed twice), in their first row's place."""
    return list({r.metric: r for r in doc.rows}.values())


def _sorted_rows(doc: Gate) -> list[GateRow]:
    return sorted(doc.rows, key=lambda r: (_ORDER.get(r.verdict, 9), -abs(r.change_pct or 0.0), r.metric))


def _cells(r: GateRow, tl: str) -> list[str]:
    u = r.unit
    noise = (_pct(r.noise_pct) if r.noise_pct is not None else _value(r.noise, u)) if r.noise is not None else "–"
    verdict = r.verdict + ("" if r.gated else " (not gated)")
    return [label(r.metric, tl), _value(r.baseline, u), _value(r.candidate, u),
            _pct(r.change_pct, sign=True) if r.change_pct is not None else _value(r.change, u, sign=True),
            f"{r.threshold_pct:g}%", noise, _pct(r.mde_pct), verdict]


HEADER = ["metric", "baseline", "candidate", "change", "threshold", "noise", "MDE", "verdict"]


def _notes(doc: Gate) -> list[str]:
    out = list(doc.reasons)
    if doc.calibration.note:
        out.append(doc.calibration.note)
    if doc.pairing == "apart" and any(r.mde_from == "sessions" for r in doc.rows):
        out.append("the sides were recorded apart (not alternating): each MDE is the calibration's across its sessions")
    if doc.comparability.unknown:
        out.append("not compared (unknown on a side): " + ", ".join(doc.comparability.unknown))
    noisy = [r for r in doc.rows if r.gated and r.verdict == "too noisy"]
    if noisy and doc.decision != "inconclusive":
        out.append(f"{len(noisy)} row{'s' if len(noisy) > 1 else ''} too noisy here, not judged (this run's spread above the calibrated MDE): "
                   + ", ".join(label(r.metric, doc.timeline) for r in noisy[:5]) + (", ..." if len(noisy) > 5 else ""))
    refused = [r for r in doc.rows if r.verdict == "cannot be judged here"]
    for r in refused[:5]:
        out.append(f"{label(r.metric, doc.timeline)}: {r.reason}")
    if len(refused) > 5:
        out.append(f"{len(refused) - 5} more rows cannot be judged here (their A/A spread is above the threshold)")
    if doc.history is not None and isinstance(doc.history.note, str) and doc.history.note:
        out.append(doc.history.note)
    return out


def markdown(doc: Gate) -> str:
    """gate --md: a PR comment; its first line is `decision_line`."""
    tl = doc.timeline or "gpu"
    lines = [decision_line(doc), ""]
    lines.append(f"Baseline `{doc.sides.baseline}`, candidate `{doc.sides.candidate}`"
                 + (f", {doc.shape} steps" if doc.shape else "") + f"; policy: {doc.policy}.")
    notes = _notes(doc)
    if notes:
        lines.append("")
        lines += [f"- {n}" for n in notes]
    rows = _sorted_rows(doc)
    if rows:
        lines += ["", "| " + " | ".join(HEADER) + " |", "|" + "|".join(["---"] + ["---:"] * 6 + ["---"]) + "|"]
        for r in rows:
            lines.append("| " + " | ".join(c.replace("|", "\\|") for c in _cells(r, tl)) + " |")
    lines += ["", "Change: the median over paired profile windows of the per-window change (unprofiled figures: the median over "
              "repeats); noise: the largest spread, and the A/A spread with a calibration; MDE: the calibrated minimum detectable effect."]
    return "\n".join(lines) + "\n"


def terminal(doc: Gate, *, all_rows: bool = False) -> list[str]:
    """The decision line, the notes, then the rows (every row with `all_rows`, else the gated rows
    that are not within noise, and the headline's) as aligned text."""
    tl = doc.timeline or "gpu"
    out = [decision_line(doc)]
    out += [f"  note: {n}" for n in _notes(doc)]
    rows = [r for r in _sorted_rows(doc) if all_rows or r.verdict not in ("within noise",) or r.metric == doc.headline]
    if rows:
        table = [HEADER] + [_cells(r, tl) for r in rows]
        w = [max(len(row[i]) for row in table) for i in range(len(HEADER))]
        for row in table:
            out.append("  ".join(c.ljust(w[i]) if i in (0, 7) else c.rjust(w[i]) for i, c in enumerate(row)).rstrip())
    hidden = len(doc.rows) - len(rows)
    if hidden:
        out.append(f"({hidden} more rows within noise: --json FILE has every row)")
    return out


def calibration_lines(cal: Calibration, timeline: str = "gpu") -> list[str]:
    """calibrate's table: each metric's A/A change, spread and MDE (shares of the A side's median)."""
    rows = [["metric", "baseline", "A/A change", "A/A spread", "MDE", "MDE apart"]]
    for k, m in sorted(cal.metrics.items(), key=lambda kv: (-(kv[1].mde_pct or 0.0), kv[0])):
        rows.append([label(k, timeline), _value(m.baseline, m.unit), _pct(m.aa_change_pct),
                     _pct(m.aa_spread_pct), _pct(m.mde_pct), _pct(m.stored_mde_pct)])
    w = [max(len(r[i]) for r in rows) for i in range(6)]
    return ["  ".join(c.ljust(w[i]) if i == 0 else c.rjust(w[i]) for i, c in enumerate(r)).rstrip() for r in rows]


def policy_toml(cal: Calibration, floor_pct: float = 2.0) -> str:
    """A policy whose thresholds sit at each metric's calibrated MDE (the larger of the pair's and the one
    across sessions, rounded up to a whole percent, at least `floor_pct`): the policy `profkit calibrate`
    suggests (policy.toml beside calibration.json), under which no row is refused as below its MDE, paired
    or against a stored baseline. Metrics without an MDE keep the built-in rules."""
    import json
    import math

    from profkit.attribution.gate import default_policy

    gated = default_policy()
    lines = [f"# written by `profkit calibrate` from {cal.source or 'an A/A calibration'}: each threshold is the metric's",
             "# A/A minimum detectable effect (MDE), rounded up, at least the built-in 2% (docs/ci.md)",
             "[defaults]", f"threshold_pct = {floor_pct:g}", ""]
    for k, m in sorted(cal.metrics.items()):
        mdes = [v for v in (m.mde_pct, m.stored_mde_pct) if v is not None]
        if not mdes or gated.rule(k) is None:  # only what the built-in policy gates
            continue
        mde = max(mdes)
        t = max(floor_pct, float(math.ceil(mde)))
        lines += [f"[metric.{json.dumps(k)}]", f"threshold_pct = {t:g}", ""]
    return "\n".join(lines)
