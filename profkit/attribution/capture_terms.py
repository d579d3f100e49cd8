"""The diff's issue-31 sections, side by side: capture health, overlap slack (the change in exposed host
time is how an overlap optimization shows its effect) and speculative cost per accepted token.

One statistic, everywhere (DESIGN.md): with several profile windows a side, each figure is the median
over the windows with its spread (max - min); a change is judged against the larger spread (beyond
or within noise) and is `not judged` with one window a side.
"""

from __future__ import annotations

import statistics
from typing import Any, Sequence, TypedDict

import msgspec

from profkit.analysis import health, spec
from profkit.documents import Num, OverlapSlack, Pair, Rank, Summary

SLACK_FIGURES = ("exposed_us_mean", "exposed_share", "median_us", "p10_us")


def _rank(summary: Summary, rank: int) -> Rank:
    ranks = summary.ranks
    return next((r for r in ranks if r.rank == rank), ranks[0] if ranks else Rank())


def _windows(primary: Summary, repeats: Sequence[Summary]) -> list[Summary]:
    return list(repeats) if repeats else [primary]


def _spec_view(s: Summary) -> dict[str, Any]:
    """What analysis/spec.py reads of a summary (it reads summary.json as written)."""
    return {"ranks": [{"rank": r.rank, "speculative": r.speculative} for r in s.ranks], "run": s.run, "manifest": s.manifest}


class WindowStat(TypedDict):
    """A figure over a side's profile windows: the median, the spread (max - min; None with one window) and how many."""
    median: Num | None
    spread: Num | None
    windows: int


class BreakerShare(TypedDict):
    breaker: str
    us_per_transition: float


# one transition of the first window, for the reports' slack-per-step strip (`broken_by` as summary.json writes it)
SlackStep = TypedDict("SlackStep", {"from": "int | None", "to": "int | None", "slack_us": Num, "exposed_host_us": Num, "broken_by": "list[Any]"})


class SlackSide(TypedDict):
    """A side's overlap slack in a diff: each of SLACK_FIGURES over its windows, the breakers, the transitions."""
    exposed_us_mean: WindowStat
    exposed_share: WindowStat
    median_us: WindowStat
    p10_us: WindowStat
    exposed_us_by_breaker: list[BreakerShare]
    transitions: int
    series: list[SlackStep]


class SlackChange(TypedDict):
    delta: Num
    noise: str  # beyond noise, within noise, not judged


class _SlackDiff(TypedDict):
    baseline: SlackSide | None
    candidate: SlackSide | None


class SlackDiff(_SlackDiff, total=False):
    """diff.json's `overlap_slack`: each side's, and (both sides having one) each figure's change."""
    delta: dict[str, SlackChange]


def _stat(vals: list[Num]) -> WindowStat:
    return WindowStat(median=statistics.median(vals) if vals else None, spread=(max(vals) - min(vals)) if len(vals) > 1 else None,
                      windows=len(vals))


def _figure(sl: OverlapSlack, key: str) -> Num | None:
    return {"exposed_us_mean": sl.exposed_us_mean, "exposed_share": sl.exposed_share, "median_us": sl.median_us, "p10_us": sl.p10_us}[key]


def slack_side(windows: list[Summary], rank: int) -> SlackSide | None:
    per = [sl for s in windows if (sl := _rank(s, rank).overlap_slack) is not None and sl.count]
    if not per:
        return None
    figures = {k: _stat([v for p in per if (v := _figure(p, k)) is not None]) for k in SLACK_FIGURES}
    by: dict[str, list[float]] = {}
    for p in per:
        for b in p.exposed_us_by_breaker:
            by.setdefault(b.breaker, []).append(b.us / max(p.count, 1))
    return SlackSide(
        exposed_us_mean=figures["exposed_us_mean"], exposed_share=figures["exposed_share"], median_us=figures["median_us"],
        p10_us=figures["p10_us"],
        # µs per transition by breaker, the median over the windows (a window without that breaker counts 0)
        exposed_us_by_breaker=sorted(
            (BreakerShare(breaker=k, us_per_transition=statistics.median(v + [0.0] * (len(per) - len(v)))) for k, v in by.items()),
            key=lambda b: (-b["us_per_transition"], b["breaker"]))[:8],
        transitions=sum(p.count for p in per),
        # the first window's transitions, for the reports' slack-per-step strip
        series=[SlackStep({"from": t.from_, "to": t.to, "slack_us": t.slack_us, "exposed_host_us": t.exposed_host_us,
                           "broken_by": msgspec.to_builtins(t.broken_by)}) for t in per[0].transitions],
    )


def _judge(b: WindowStat, c: WindowStat) -> str:
    if b["spread"] is None or c["spread"] is None:
        return "not judged"
    d = abs((c["median"] or 0) - (b["median"] or 0))
    return "beyond noise" if d > max(b["spread"], c["spread"]) else "within noise"


def _figures(side: SlackSide) -> dict[str, WindowStat]:
    return {"exposed_us_mean": side["exposed_us_mean"], "exposed_share": side["exposed_share"], "median_us": side["median_us"],
            "p10_us": side["p10_us"]}


def slack_compare(b: SlackSide | None, c: SlackSide | None) -> SlackDiff | None:
    if b is None and c is None:
        return None
    out = SlackDiff(baseline=b, candidate=c)
    if b and c:
        fb, fc = _figures(b), _figures(c)
        delta: dict[str, SlackChange] = {}
        for k in SLACK_FIGURES:
            mb, mc = fb[k]["median"], fc[k]["median"]
            if mb is not None and mc is not None:
                delta[k] = SlackChange(delta=mc - mb, noise=_judge(fb[k], fc[k]))
        out["delta"] = delta
    return out


def sections(baseline: Summary, candidate: Summary, baseline_repeats: Sequence[Summary],
             candidate_repeats: Sequence[Summary], rank: int) -> tuple[Pair[Any], SlackDiff | None, dict[str, Any] | None]:
    """diff.json's `health` (each side's worst over its windows), `overlap_slack` and `speculative` (None: the optional key is left out)."""
    wb, wc = _windows(baseline, baseline_repeats), _windows(candidate, candidate_repeats)
    h = Pair[Any](baseline=health.worst([s.health for s in wb]), candidate=health.worst([s.health for s in wc]))
    sl = slack_compare(slack_side(wb, rank), slack_side(wc, rank))
    sp = spec.compare(spec.side_cost([_spec_view(s) for s in wb], rank=rank), spec.side_cost([_spec_view(s) for s in wc], rank=rank))
    return h, sl, sp
