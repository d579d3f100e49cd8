"""What every report shows of issue 31's figures, worded once for the three renderers: the capture-health
verdict (the first line of every report: report/health_text.py), the overlap-slack line, the speculative-cost
line, the mark on a figure that capture health puts in doubt, and the slack-per-step strip of the HTML report."""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from profkit.documents import Diff, Measure, OverlapSlack, SlackDiff, SpecDiff, Summary, Transition, typed_or_none
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


def _median(m: Measure | None) -> float:
    """A figure's median over the windows (each side of a change has it)."""
    if m is None or m.median is None:
        raise ValueError("a compared figure without its median")
    return float(m.median)


def slack_diff(diff: Diff) -> SlackDiff | None:
    """The diff's overlap slack typed (None: the diff has none)."""
    return typed_or_none(diff.overlap_slack, SlackDiff)


def slack_diff_line(d: SlackDiff | None) -> str | None:
    """The diff's one line on overlap slack: exposed host time per transition, baseline → candidate."""
    if d is None or "exposed_us_mean" not in d.delta or d.baseline is None or d.candidate is None:
        return None
    b, c = d.baseline, d.candidate
    e = d.delta["exposed_us_mean"]
    return (f"Exposed host time per transition {_median(b.exposed_us_mean):,.1f} → {_median(c.exposed_us_mean):,.1f} µs "
            f"({e.delta:+,.1f}, {e.noise}); transitions with exposed host time {_median(b.exposed_share) * 100:.0f}% → "
            f"{_median(c.exposed_share) * 100:.0f}%; median slack {_median(b.median_us):,.1f} → {_median(c.median_us):,.1f} µs")


def spec_line(diff_spec: SpecDiff | None) -> str | None:
    """The diff's one line: `draft GPU µs per accepted token 40.1 → 23.2 (−16.9); ...`."""
    if diff_spec is None or diff_spec.delta is None or diff_spec.baseline is None or diff_spec.candidate is None:
        return None
    b, c, d = diff_spec.baseline, diff_spec.candidate, diff_spec.delta

    def part(label: str, bv: float, cv: float, dv: float | None) -> str:
        return f"{label} {bv:,.1f} → {cv:,.1f} ({dv:+,.1f})"

    pb, pc = b.phase_us_per_accepted_token, c.phase_us_per_accepted_token
    draft = part("draft GPU µs per accepted token", _median(pb["draft"]), _median(pc["draft"]), d.phase_us_per_accepted_token["draft"])
    gpu = part("all phases", _median(b.gpu_us_per_accepted_token), _median(c.gpu_us_per_accepted_token), d.gpu_us_per_accepted_token)
    wall = part("wall µs per accepted token", _median(b.wall_us_per_accepted_token), _median(c.wall_us_per_accepted_token),
                d.wall_us_per_accepted_token)
    acc = f"accept length {_median(b.accept_length):.2f} → {_median(c.accept_length):.2f}"
    src = sorted({*b.accept_source, *c.accept_source})
    note = "" if src == ["window"] else f" [accept length from {' and '.join(src)}]"
    return f"Speculative cost: {draft}; {gpu}; {wall}; {acc}{note}"


def diff_lines(diff: Diff) -> list[str]:
    """A diff's lines after its health line: the change in exposed host time, speculative cost side by side."""
    note = [DOUBT_NOTE] if unhealthy(diff.health.baseline) or unhealthy(diff.health.candidate) else []
    return [x for x in (slack_diff_line(slack_diff(diff)), spec_line(typed_or_none(diff.speculative, SpecDiff))) if x] + note


def doubted_in_diff(diff: Diff, metric: str) -> bool:
    return doubted(diff.health.baseline, metric) or doubted(diff.health.candidate, metric)


def mark(label: str, doubted: bool) -> str:
    return label + DOUBT_MARK if doubted else label


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
