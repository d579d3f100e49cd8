"""The diff's issue-31 sections, side by side: capture health, overlap slack (the change in exposed host
time is how an overlap optimization shows its effect) and speculative cost per accepted token.

One statistic, everywhere (DESIGN.md): with several profile windows a side, each figure is the median
over the windows with its spread (max - min); a change is judged against the larger spread (beyond
or within noise) and is `not judged` with one window a side.
"""

from __future__ import annotations

import statistics
from typing import Any, Mapping, Sequence, cast

import msgspec

from profkit.analysis import health, spec
from profkit.documents import Pair, Rank, Summary

SLACK_FIGURES = ("exposed_us_mean", "exposed_share", "median_us", "p10_us")


def _rank(summary: Summary, rank: int) -> Rank:
    ranks = summary.ranks
    return next((r for r in ranks if r.rank == rank), ranks[0] if ranks else Rank())


def _windows(primary: Summary, repeats: Sequence[Summary]) -> list[Summary]:
    return list(repeats) if repeats else [primary]


def _spec_view(s: Summary) -> dict[str, Any]:
    """What analysis/spec.py reads of a summary (it reads summary.json as written)."""
    return {"ranks": [{"rank": r.rank, "speculative": r.speculative} for r in s.ranks], "run": s.run, "manifest": s.manifest}


def _stat(vals: list[float]) -> dict[str, Any]:
    return {"median": statistics.median(vals) if vals else None, "spread": (max(vals) - min(vals)) if len(vals) > 1 else None,
            "windows": len(vals)}


def slack_side(windows: list[Summary], rank: int) -> dict[str, Any] | None:
    per = [msgspec.to_builtins(sl) for s in windows if (sl := _rank(s, rank).overlap_slack) is not None]  # documents.OverlapSlack
    per = [p for p in per if p.get("count")]
    if not per:
        return None
    out: dict[str, Any] = {k: _stat([p[k] for p in per if p.get(k) is not None]) for k in SLACK_FIGURES}
    by: dict[str, list[float]] = {}
    for p in per:
        for b in p.get("exposed_us_by_breaker") or []:
            by.setdefault(b["breaker"], []).append(b["us"] / max(p["count"], 1))
    # µs per transition by breaker, the median over the windows (a window without that breaker counts 0)
    out["exposed_us_by_breaker"] = sorted(
        ({"breaker": k, "us_per_transition": statistics.median(v + [0.0] * (len(per) - len(v)))} for k, v in by.items()),
        key=lambda b: (-cast(float, b["us_per_transition"]), b["breaker"]))[:8]
    out["transitions"] = sum(p["count"] for p in per)
    # the first window's transitions, for the reports' slack-per-step strip
    out["series"] = [{k: t[k] for k in ("from", "to", "slack_us", "exposed_host_us", "broken_by")} for t in per[0].get("transitions") or []]
    return out


def _judge(b: Mapping[str, Any], c: Mapping[str, Any]) -> str:
    if b["spread"] is None or c["spread"] is None:
        return "not judged"
    d = abs((c["median"] or 0) - (b["median"] or 0))
    return "beyond noise" if d > max(b["spread"], c["spread"]) else "within noise"


def slack_compare(b: dict[str, Any] | None, c: dict[str, Any] | None) -> dict[str, Any] | None:
    if b is None and c is None:
        return None
    out: dict[str, Any] = {"baseline": b, "candidate": c}
    if b and c:
        out["delta"] = {k: {"delta": c[k]["median"] - b[k]["median"], "noise": _judge(b[k], c[k])}
                        for k in SLACK_FIGURES if b[k]["median"] is not None and c[k]["median"] is not None}
    return out


def sections(baseline: Summary, candidate: Summary, baseline_repeats: Sequence[Summary],
             candidate_repeats: Sequence[Summary], rank: int) -> tuple[Pair[Any], dict[str, Any] | None, dict[str, Any] | None]:
    """diff.json's `health` (each side's worst over its windows), `overlap_slack` and `speculative` (None: the optional key is left out)."""
    wb, wc = _windows(baseline, baseline_repeats), _windows(candidate, candidate_repeats)
    h = Pair[Any](baseline=health.worst([s.health for s in wb]), candidate=health.worst([s.health for s in wc]))
    sl = slack_compare(slack_side(wb, rank), slack_side(wc, rank))
    sp = spec.compare(spec.side_cost([_spec_view(s) for s in wb], rank=rank), spec.side_cost([_spec_view(s) for s in wc], rank=rank))
    return h, sl, sp
