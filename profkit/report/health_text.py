"""Capture health in words: the first line of every report (`health: ok`, `capture health degraded: ...`,
`health: unusable (...)`) and the doubt a verdict casts on a figure. analysis/health.py finds the verdict
(summary.json's `health`, documents.Health); this module only says it."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

from profkit.documents import Health

# each check's finding in words, for the first line of a report (DESIGN.md: what the recording did to the run, never
# field names; the names stay in summary.json's health); † marks the figures it puts in doubt in every table
_WORDS = {
    "graph_replays_missing": "graph replays without their kernels recorded: idle time (†) looks inflated",
    "start_records_missing": "the profiler dropped the window's first kernels: kernel time (†) reads short",
    "rank_start_skew": "the ranks' profilers started more than one iteration apart: communication (†) looks long",
    "deferred_work": "GPU work ran past the next iteration's window: category time by the clock (†) lands late",
    "stream_overlap": "ops overlap on one stream (a clock artefact): busy and overlap time (†) are off",
    "cut_markers": "the profiler's stop cut the last step, kept as an iteration: its wall and window (†) read short",
    "graph_replays_under_recorded": "graph replays recorded with fewer ops than their graph's others: idle time (†) looks inflated",
    "impossible_durations": "GPU ops with durations the device cannot have: busy, idle and category time (†) are off",
    "capture_only": "only graph-capture warm-up steps were recorded: no steady-state step to measure (†)",
    "device_records": "launch calls without any GPU record",
}
_SLOW = re.compile(r"ran ([0-9.]+)x slower")


def health_of(h: Health | Mapping[str, Any] | None) -> Health | None:
    """A health section as documents.Health: a summary's is one already; a diff.json's side (a plain value) is
    converted; anything else (none, or written before capture health existed) is None."""
    if isinstance(h, Health) or h is None:
        return h
    if not isinstance(h, Mapping):
        return None
    return msgspec.convert(h, Health)


def slowdown_range(slowdowns: Sequence[float]) -> str:
    """``1.7–11.2×`` (``3.1×`` when they agree to a tenth)."""
    lo, hi = min(slowdowns), max(slowdowns)
    return f"{lo:.1f}×" if f"{lo:.1f}" == f"{hi:.1f}" else f"{lo:.1f}–{hi:.1f}×"


def health_text(h: Health | Mapping[str, Any] | None, slowdowns: Sequence[float] = ()) -> str:
    """The first line of every report, in words: `health: ok`, `capture health degraded: <what the recording did, with
    its figure>`, `health: unusable (...)`. `slowdowns`: every profile window's profiler slowdown (a diff's both sides,
    from the manifests); else the figures the findings name."""
    got = health_of(h)
    if got is None:
        return "health: unchecked (a summary written before capture health existed: analyze the traces again)"
    v = got.verdict
    if v == "degraded":
        findings = got.findings
        checks = list(dict.fromkeys(f.check for f in findings))
        said = []
        if "profiler_overhead" in checks:
            seen = [float(m.group(1)) for f in findings if f.check == "profiler_overhead" and (m := _SLOW.search(f.detail or ""))]
            slow = list(slowdowns) or seen
            figure = f" {slowdown_range(slow)}" if slow else ""
            said.append(f"the profiler slowed {'these runs' if len(slow) > 1 else 'this run'}{figure}; host-side idle terms (†) carry "
                        "its cost")
        said += [_WORDS.get(c, c.replace("_", " ")) for c in sorted(checks) if c != "profiler_overhead"]
        return "capture health degraded: " + "; ".join(said)
    if v == "unusable":
        return "health: unusable (" + "; ".join(f.detail for f in got.findings if f.status == "unusable") + ")"
    if v == "unchecked":
        return "health: unchecked (no per-rank capture facts in this summary)"
    dropped = got.cut_markers_dropped
    return "health: ok" + (f" ({dropped} marker span(s) cut by the profiler's stop dropped)" if dropped else "")


def health_diff_line(baseline: Health | Mapping[str, Any] | None, candidate: Health | Mapping[str, Any] | None,
                     slowdowns: Sequence[float] = ()) -> str:
    """The first line of a diff report: each side's health (diff.json's health.baseline and .candidate), in words;
    `slowdowns`: every profile window's profiler slowdown, both sides (one range, "these runs")."""
    def checks(h: Health | None) -> tuple[str | None, list[str]] | None:
        return (h.verdict, sorted({f.check for f in h.findings})) if h is not None else None

    b, c = health_of(baseline), health_of(candidate)
    cb = checks(b)
    if cb == checks(c):
        return health_text(b, slowdowns) + ("" if cb and cb[0] == "degraded" else " (both sides)")
    return f"baseline {health_text(b)}; candidate {health_text(c)}"


def doubted(h: Health | Mapping[str, Any] | None, metric: str) -> bool:
    """Whether `metric` (a summary field, or `category_us.<cat>`) is in doubt under health `h`."""
    got = health_of(h)
    return got is not None and got.doubts(metric)


def unhealthy(h: Health | Mapping[str, Any] | None) -> bool:
    """A verdict that puts figures in doubt: degraded or unusable."""
    got = health_of(h)
    return got is not None and got.verdict in ("degraded", "unusable")
