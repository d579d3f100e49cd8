"""What every report shows of issue 31's figures, worded once for the three renderers: the capture-health
verdict (the first line of every report), the overlap-slack line, the speculative-cost line, the mark on a
figure that capture health puts in doubt, and the slack-per-step strip of the HTML report."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping, Sequence

from profkit.analysis import health, slack, spec
from profkit.report import capture_diff
from profkit.documents import Diff, Summary

if TYPE_CHECKING:
    import plotly.graph_objects as go

DOUBT_MARK = " †"
DOUBT_NOTE = "† in doubt: capture health says this recording may distort it (see the first line)"


def summary_health(summary: Summary) -> str:
    return health.health_text(summary.health)


def _unhealthy(h: Any) -> bool:
    return isinstance(h, Mapping) and h.get("verdict") in ("degraded", "unusable")


def summary_lines(summary: Summary) -> list[str]:
    """A run's lines after its health line: overlap slack per rank, speculative cost per accepted token."""
    ranks = summary.ranks
    out = []
    for r in ranks:
        line = slack.slack_line(r.overlap_slack)
        if line:
            out.append(line if len(ranks) == 1 else f"rank {r.rank}: {line}")
    sp = summary.speculative
    if isinstance(sp, Mapping) and sp.get("gpu_us_per_accepted_token") is not None:
        per = sp["phase_us_per_accepted_token"]
        src = "" if sp.get("accept_source") == "window" else f" [accept length from the {sp.get('accept_source')}, not this window]"
        out.append(f"Speculative cost per accepted token (accept length {sp['accept_length']:.2f}{src}): GPU "
                   + ", ".join(f"{p} {per[p]:,.1f}" for p in spec.PHASES) + f" µs (all {sp['gpu_us_per_accepted_token']:,.1f}); "
                   f"wall {sp['wall_us_per_accepted_token']:,.1f} µs ({sp['verify_iterations']} verify iterations)")
    if _unhealthy(summary.health):
        out.append(DOUBT_NOTE)
    return out


def diff_health(diff: Diff) -> str:
    """The diff's first line, in words, with the profiler's slowdown over every profile window of both sides."""
    from profkit.attribution.diff import profiler_slowdowns

    slow = profiler_slowdowns(diff.manifests.baseline, diff.manifests.candidate)
    return capture_diff.health_diff_line(diff.health.baseline, diff.health.candidate, slow)


def diff_lines(diff: Diff) -> list[str]:
    """A diff's lines after its health line: the change in exposed host time, speculative cost side by side."""
    note = [DOUBT_NOTE] if _unhealthy(diff.health.baseline) or _unhealthy(diff.health.candidate) else []
    return [x for x in (capture_diff.slack_diff_line(diff.overlap_slack), spec.spec_line(diff.speculative)) if x] + note


def doubted_in_diff(diff: Diff, metric: str) -> bool:
    return health.doubted(diff.health.baseline, metric) or health.doubted(diff.health.candidate, metric)


def mark(label: str, doubted: bool) -> str:
    return label + DOUBT_MARK if doubted else label


def slack_strip_figure(sides: Sequence[tuple[str, Sequence[Mapping[str, Any]]]]) -> go.Figure:
    """Slack per step (one bar per transition N → N+1), one row per side: above zero the host was ahead,
    below it the GPU waited for the host (exposed host time)."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=max(len(sides), 1), cols=1, shared_xaxes=True, subplot_titles=[label for label, _ in sides] or None)
    for k, (label, ts) in enumerate(sides, start=1):
        fig.add_trace(go.Bar(
            x=[f"{t['from']}→{t['to']}" for t in ts], y=[t["slack_us"] for t in ts], name=label, showlegend=False,
            marker_color=["#c0392b" if t["slack_us"] < 0 else "#2e86c1" for t in ts],
            hovertext=[("exposed " + f"{t['exposed_host_us']:,.1f} µs: " + "; ".join(
                f"{capture_breaker(b)} {b['us']:,.1f}" for b in (t.get("broken_by") or [])[:3])) if t["exposed_host_us"] > 0 else "host ahead"
                for t in ts],
        ), row=k, col=1)
        fig.update_yaxes(title_text="slack µs", row=k, col=1, zeroline=True)
    fig.update_layout(title="Overlap slack per step (below 0: the GPU waited for the host)", height=220 + 160 * len(sides),
                      margin={"l": 60, "r": 20, "t": 60, "b": 40})
    return fig


def capture_breaker(b: Mapping[str, Any]) -> str:
    return slack.breaker_key({**b, "ns": 0})
