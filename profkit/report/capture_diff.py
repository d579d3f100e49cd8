"""A diff's capture-term lines in words (diff.json's `health` and `overlap_slack`, issue 31): attribution/capture_terms.py
compares the figures, this words them; report/capture_view.py puts them in every renderer."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from profkit.analysis import health


def slack_diff_line(d: Mapping[str, Any] | None) -> str | None:
    """The diff's one line on overlap slack: exposed host time per transition, baseline → candidate."""
    if not d or not d.get("delta") or "exposed_us_mean" not in d["delta"]:
        return None
    b, c, x = d["baseline"], d["candidate"], d["delta"]
    e = x["exposed_us_mean"]
    return (f"Exposed host time per transition {b['exposed_us_mean']['median']:,.1f} → {c['exposed_us_mean']['median']:,.1f} µs "
            f"({e['delta']:+,.1f}, {e['noise']}); transitions with exposed host time {b['exposed_share']['median'] * 100:.0f}% → "
            f"{c['exposed_share']['median'] * 100:.0f}%; median slack {b['median_us']['median']:,.1f} → {c['median_us']['median']:,.1f} µs")


def health_diff_line(baseline: Any, candidate: Any, slowdowns: Sequence[float] = ()) -> str:
    """The first line of a diff report: each side's health (diff.json's health.baseline and .candidate), in words;
    `slowdowns`: every profile window's profiler slowdown, both sides (one range, "these runs")."""
    def checks(h: Any) -> Any:
        return (h.get("verdict"), sorted({f["check"] for f in h.get("findings") or []})) if isinstance(h, Mapping) else None

    if checks(baseline) == checks(candidate):
        return health.health_text(baseline, slowdowns) + ("" if checks(baseline) and checks(baseline)[0] == "degraded" else " (both sides)")
    return f"baseline {health.health_text(baseline)}; candidate {health.health_text(candidate)}"
