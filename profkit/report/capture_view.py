"""What every report shows of issue 31's figures, worded once for the three renderers: the capture-health
verdict (the first line of every report: report/health_text.py), the overlap-slack line, the speculative-cost
line, the mark on a figure that capture health puts in doubt, and the slack-per-step strip of the HTML report."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping, Sequence

import msgspec

from profkit.documents import Diff, OverlapSlack, Summary, Transition
from profkit.report.health_text import doubted, health_diff_line, health_text, unhealthy
from profkit.terms import UNCOVERED, breaker_key

if TYPE_CHECKING:
    import plotly.graph_objects as go

DOUBT_MARK = " †"
DOUBT_NOTE = "† in doubt: capture health says this recording may distort it (see the first line)"
SPEC_PHASES = ("draft", "verify", "draft_extend", "other")  # the phases of speculative cost (analysis/spec.py's PHASES), in this order


def summary_health(summary: Summary) -> str:
    return health_text(summary.health)


def slack_line(s: OverlapSlack | None) -> str | None:
    """The one line the terminal and Markdown reports print for a rank's overlap slack."""
    if s is None or not s.count:
        return None
    # the profiler's own ProfilerStep#N span is host code outside recorded ops (issue 40): one breaker in words, its µs merged
    said: dict[str, float] = {}
    for b in s.exposed_us_by_breaker:
        k = UNCOVERED if b.breaker == "cpu ProfilerStep#N" else b.breaker
        said[k] = said.get(k, 0.0) + b.us
    top = sorted(said.items(), key=lambda kv: -kv[1])[:2]
    why = ("; exposed by " + ", ".join(f"{k} {us:,.1f} µs" for k, us in top)) if top else ""
    return (f"Overlap slack N→N+1: median {s.median_us:,.1f} µs, p10 {s.p10_us:,.1f}, worst {s.p1_us:,.1f}; "
            f"host exposed on {(s.exposed_share or 0) * 100:.0f}% of {s.count} transitions "
            f"({s.exposed_us_mean:,.1f} µs per transition){why}")


def summary_lines(summary: Summary) -> list[str]:
    """A run's lines after its health line: overlap slack per rank, speculative cost per accepted token."""
    ranks = summary.ranks
    out = []
    for r in ranks:
        line = slack_line(r.overlap_slack)
        if line:
            out.append(line if len(ranks) == 1 else f"rank {r.rank}: {line}")
    sp = summary.speculative
    if sp is not None and isinstance(sp.gpu_us_per_accepted_token, (int, float)):  # absent (UNSET) without an accepted length
        per = sp.phase_us_per_accepted_token if isinstance(sp.phase_us_per_accepted_token, dict) else {}
        src = "" if sp.accept_source == "window" else f" [accept length from the {sp.accept_source}, not this window]"
        out.append(f"Speculative cost per accepted token (accept length {sp.accept_length:.2f}{src}): GPU "
                   + ", ".join(f"{p} {per[p]:,.1f}" for p in SPEC_PHASES) + f" µs (all {sp.gpu_us_per_accepted_token:,.1f}); "
                   f"wall {sp.wall_us_per_accepted_token:,.1f} µs ({sp.verify_iterations} verify iterations)")
    if unhealthy(summary.health):
        out.append(DOUBT_NOTE)
    return out


def diff_health(diff: Diff) -> str:
    """The diff's first line, in words, with the profiler's slowdown over every profile window of both sides."""
    from profkit.attribution.diff import profiler_slowdowns

    slow = profiler_slowdowns(diff.manifests.baseline, diff.manifests.candidate)
    return health_diff_line(diff.health.baseline, diff.health.candidate, slow)


def slack_diff_line(d: Mapping[str, Any] | None) -> str | None:
    """The diff's one line on overlap slack: exposed host time per transition, baseline → candidate."""
    if not d or not d.get("delta") or "exposed_us_mean" not in d["delta"]:
        return None
    b, c, x = d["baseline"], d["candidate"], d["delta"]
    e = x["exposed_us_mean"]
    return (f"Exposed host time per transition {b['exposed_us_mean']['median']:,.1f} → {c['exposed_us_mean']['median']:,.1f} µs "
            f"({e['delta']:+,.1f}, {e['noise']}); transitions with exposed host time {b['exposed_share']['median'] * 100:.0f}% → "
            f"{c['exposed_share']['median'] * 100:.0f}%; median slack {b['median_us']['median']:,.1f} → {c['median_us']['median']:,.1f} µs")


def spec_line(diff_spec: Mapping[str, Any] | None) -> str | None:
    """The diff's one line: `draft GPU µs per accepted token 40.1 → 23.2 (−16.9); ...`."""
    if not diff_spec or not diff_spec.get("delta"):
        return None
    b, c, d = diff_spec["baseline"], diff_spec["candidate"], diff_spec["delta"]

    def part(label: str, bv: float, cv: float, dv: float) -> str:
        return f"{label} {bv:,.1f} → {cv:,.1f} ({dv:+,.1f})"

    pb, pc = b["phase_us_per_accepted_token"], c["phase_us_per_accepted_token"]
    draft = part("draft GPU µs per accepted token", pb["draft"]["median"], pc["draft"]["median"], d["phase_us_per_accepted_token"]["draft"])
    gpu = part("all phases", b["gpu_us_per_accepted_token"]["median"], c["gpu_us_per_accepted_token"]["median"], d["gpu_us_per_accepted_token"])
    wall = part("wall µs per accepted token", b["wall_us_per_accepted_token"]["median"], c["wall_us_per_accepted_token"]["median"],
                d["wall_us_per_accepted_token"])
    acc = f"accept length {b['accept_length']['median']:.2f} → {c['accept_length']['median']:.2f}"
    src = sorted({*b.get("accept_source", []), *c.get("accept_source", [])})
    note = "" if src == ["window"] else f" [accept length from {' and '.join(src)}]"
    return f"Speculative cost: {draft}; {gpu}; {wall}; {acc}{note}"


def diff_lines(diff: Diff) -> list[str]:
    """A diff's lines after its health line: the change in exposed host time, speculative cost side by side."""
    note = [DOUBT_NOTE] if unhealthy(diff.health.baseline) or unhealthy(diff.health.candidate) else []
    return [x for x in (slack_diff_line(diff.overlap_slack), spec_line(diff.speculative)) if x] + note


def doubted_in_diff(diff: Diff, metric: str) -> bool:
    return doubted(diff.health.baseline, metric) or doubted(diff.health.candidate, metric)


def mark(label: str, doubted: bool) -> str:
    return label + DOUBT_MARK if doubted else label


def transitions_of(series: Sequence[Mapping[str, Any]] | Sequence[Transition]) -> list[Transition]:
    """A slack strip's transitions typed: a summary's are; a diff.json's `series` (plain values) is converted."""
    return [t if isinstance(t, Transition) else msgspec.convert(t, Transition) for t in series]


def slack_strip_figure(sides: Sequence[tuple[str, Sequence[Transition]]]) -> go.Figure:
    """Slack per step (one bar per transition N → N+1), one row per side: above zero the host was ahead,
    below it the GPU waited for the host (exposed host time)."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=max(len(sides), 1), cols=1, shared_xaxes=True, subplot_titles=[label for label, _ in sides] or None)
    for k, (label, ts) in enumerate(sides, start=1):
        fig.add_trace(go.Bar(
            x=[f"{t.from_}→{t.to}" for t in ts], y=[t.slack_us for t in ts], name=label, showlegend=False,
            marker_color=["#c0392b" if t.slack_us < 0 else "#2e86c1" for t in ts],
            hovertext=[("exposed " + f"{t.exposed_host_us:,.1f} µs: " + "; ".join(
                f"{breaker_key(b)} {b.us:,.1f}" for b in t.broken_by[:3])) if t.exposed_host_us > 0 else "host ahead"
                for t in ts],
        ), row=k, col=1)
        fig.update_yaxes(title_text="slack µs", row=k, col=1, zeroline=True)
    fig.update_layout(title="Overlap slack per step (below 0: the GPU waited for the host)", height=220 + 160 * len(sides),
                      margin={"l": 60, "r": 20, "t": 60, "b": 40})
    return fig
