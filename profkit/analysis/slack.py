"""Overlap slack between consecutive iterations (DESIGN.md "Overlap slack").

For each pair of consecutive iterations N -> N+1 of a rank that both own GPU work:
`slack` = end of N's last owned GPU op - start of the launch call of N+1's first owned GPU op.
Positive: the host had N+1's first work queued that long before the GPU ran out of N's (the
overlap hid the host's work); negative: the GPU waited that long for the host, and
`exposed_host = max(0, -slack)`. N's last op is the owned op that ends last; N+1's first op is
the owned op that starts first (ties: the one launched first). When host time is exposed,
`broken_by` says what the thread that launched N+1's first op did in the exposed interval
[N's last op end, that launch's start), largest exclusive time first (bubbles.gap_tops, the same
sweep the bubbles' CPU ops come from): a sync (API, direction, trigger), a blocking copy, or a CPU
op/span. What none of them covers (Python between ops that the trace did not record) is
`host code outside recorded ops`.

Only device timelines of a GPU with launch calls have slack: a CPU-only trace (device_timeline
cpu) or one without runtime calls has none (their "launch" is the op itself).
"""

from __future__ import annotations

import bisect
import itertools
import math
import statistics
from typing import TYPE_CHECKING, Any, NamedTuple

from profkit.apis import SYNC_APIS, canonical_api
from profkit.documents import UNSET, Breaker, BreakerTotal, OverlapSlack, Transition
from profkit.terms import UNCOVERED, breaker_key

if TYPE_CHECKING:
    import polars as pl


def transitions(owned: pl.DataFrame) -> pl.DataFrame:
    """One row per transition N -> N+1 (both own GPU ops with a launch call in the trace)."""
    import polars as pl

    SCHEMA = {"from_iteration": pl.Int64, "to_iteration": pl.Int64, "last_end_ns": pl.Int64, "next_launch_ns": pl.Int64,
              "slack_ns": pl.Int64, "exposed_ns": pl.Int64, "tid": pl.String}
    ops = owned.select("iteration", "ts_ns", "end_ns", "launch_ts_ns", "launch_tid").filter(
        pl.col("iteration").is_not_null() & pl.col("launch_ts_ns").is_not_null())
    if ops.height == 0:
        return pl.DataFrame(schema=SCHEMA)
    last = ops.group_by("iteration").agg(pl.col("end_ns").max().alias("last_end_ns"))
    first = (ops.sort("iteration", "ts_ns", "launch_ts_ns")
             .group_by("iteration", maintain_order=True)
             .agg(pl.col("launch_ts_ns").first().alias("next_launch_ns"), pl.col("launch_tid").first().cast(pl.String).alias("tid")))
    t = (last.with_columns((pl.col("iteration") + 1).alias("to_iteration"))
         .join(first, left_on="to_iteration", right_on="iteration", how="inner")
         .rename({"iteration": "from_iteration"})
         .with_columns((pl.col("last_end_ns") - pl.col("next_launch_ns")).alias("slack_ns"))
         .with_columns(pl.when(pl.col("slack_ns") < 0).then(-pl.col("slack_ns")).otherwise(0).alias("exposed_ns"))
         .sort("from_iteration"))
    return t.select(list(SCHEMA)).cast(pl.Schema(SCHEMA))


class Piece(NamedTuple):
    """A piece of an exposed interval, in ns: a sync or blocking copy (`sync`: with its direction and trigger), a CPU op, or host code."""
    kind: str
    name: str
    ns: int
    sync: bool = False
    direction: str | None = None
    trigger: str | None = None

    def breaker(self) -> Breaker:
        if self.sync:
            return Breaker(kind=self.kind, name=self.name, direction=self.direction, trigger=self.trigger, us=self.ns / 1000.0)
        return Breaker(kind=self.kind, name=self.name, direction=UNSET, trigger=UNSET, us=self.ns / 1000.0)


def broken_by(trace: Any, t: pl.DataFrame, syncs: pl.DataFrame, rows_cache: dict | None = None) -> list[list[Piece]]:
    """For each transition: what the launching thread did in its exposed interval (empty when none
    was exposed), largest exclusive time first (what no recorded op covers among them, as
    UNCOVERED); the times add up to the exposed time."""
    import polars as pl

    from profkit.analysis.bubbles import gap_tops

    out: list[list[Piece]] = [[] for _ in range(t.height)]
    exp = t.with_columns(pl.int_range(0, pl.len(), dtype=pl.Int64).alias("_i")).filter(pl.col("exposed_ns") > 0)
    if exp.height == 0:
        return out
    top_id, top_ns, name_col = gap_tops(trace, exp["last_end_ns"], exp["next_launch_ns"], exp["tid"], rows_cache)
    names = name_col.str.replace(r" at 0x[0-9a-fA-F]+>", ">").to_list()
    found = SyncFinder(syncs) if syncs.height else None
    for j, (i, g0, g1, tid, exposed) in enumerate(exp.select("_i", "last_end_ns", "next_launch_ns", "tid", "exposed_ns").iter_rows()):
        got: list[Piece] = []
        for k, ns in zip(top_id[j].tolist(), top_ns[j].tolist()):
            if k < 0 or ns <= 0:
                continue
            got.append(_breaker(names[k], int(ns), found, tid, g0, g1))
        rest = int(exposed) - sum(b.ns for b in got)
        if rest > 0:
            got.append(Piece("host", UNCOVERED, rest))
        got.sort(key=lambda b: (-b.ns, b.name))
        out[i] = got
    return out


def _breaker(name: str, ns: int, syncs: SyncFinder | None, tid: str | None, g0: int, g1: int) -> Piece:
    """A named piece of an exposed interval: a sync or blocking copy (found among the rank's syncs:
    same thread, overlapping the interval, same API) with its direction and trigger, else a CPU op."""
    api = canonical_api(name)
    if syncs is not None:
        r = syncs.latest(api, tid, g0, g1)
        if r is not None:
            kind, direction, trigger = r
            return Piece(kind, api, ns, True, direction, trigger)
    if api in SYNC_APIS:
        return Piece("sync", api, ns, True)
    return Piece("cpu", name, ns)


class SyncFinder:
    """The rank's syncs by API and thread, each by start time, for the syncs that overlap an interval:
    a bisection and a short walk back (while the latest end so far reaches into the interval) rather
    than a pass over every sync."""

    def __init__(self, syncs: pl.DataFrame):
        self.frame = syncs.select("api", "kind", "direction", "trigger", "ts_ns", "end_ns", "tid")
        api, ts, end, tid, *what = (self.frame[c].to_list() for c in ("api", "ts_ns", "end_ns", "tid", "kind", "direction", "trigger"))
        self.what = list(zip(*what))  # each sync's (kind, direction, trigger)
        by: dict[tuple[Any, Any], list[tuple[int, int, int]]] = {}
        for i, (a, t, e, th) in enumerate(zip(api, ts, end, tid)):
            if a is not None and t is not None and e is not None:
                by.setdefault((a, th), []).append((t, e, i))
                by.setdefault((a, _ANY), []).append((t, e, i))
        self.by: dict[tuple[Any, Any], tuple[list[int], list[int], list[int], list[int]]] = {}
        for key, got in by.items():
            got.sort(key=lambda x: x[0])
            reach = list(itertools.accumulate((e for _, e, _ in got), max))
            self.by[key] = ([t for t, _, _ in got], [e for _, e, _ in got], reach, [i for _, _, i in got])

    def latest(self, api: str, tid: str | None, g0: int, g1: int) -> tuple[str, str | None, str | None] | None:
        """The sync of `api` on thread `tid` (None: any) overlapping [g0, g1) that starts last: its kind,
        direction and trigger (None when none does)."""
        got = self.by.get((api, _ANY if tid is None else tid))
        if got is None or g0 is None or g1 is None:
            return None
        ts, end, reach, row = got
        j = bisect.bisect_left(ts, g1) - 1  # the syncs from j down start before g1
        while j >= 0 and reach[j] > g0 and end[j] <= g0:
            j -= 1
        if j < 0 or end[j] <= g0:
            return None
        last = j
        while j > 0 and ts[j - 1] == ts[last]:
            j -= 1
            if end[j] > g0:  # two overlapping syncs start last together: the one a sort puts first, as ever
                import polars as pl

                hit = self.frame.filter((pl.col("api") == api) & (pl.col("ts_ns") < g1) & (pl.col("end_ns") > g0)
                                        & ((pl.col("tid") == tid) if tid is not None else pl.lit(True)))
                r = hit.sort("ts_ns", descending=True).row(0, named=True)
                return r["kind"], r["direction"], r["trigger"]
        return self.what[row[last]]


_ANY = object()  # SyncFinder's key for the syncs of every thread


def lower_rank(values: list[float], q: float) -> float | None:
    """The q-th percentile by the nearest rank from below (q=1 of fewer than 100 values: the worst)."""
    if not values:
        return None
    v = sorted(values)
    return v[max(0, math.ceil(q / 100 * len(v)) - 1)]


def rank_slack(t: pl.DataFrame, broken: list[list[Piece]], iterations: pl.DataFrame | None = None) -> OverlapSlack:
    """summary.json's `overlap_slack` of one rank: every transition and the rank's statistics."""
    kinds: dict[int, str] = {}
    if iterations is not None and iterations.height:
        kinds = dict(zip(iterations["iteration"].to_list(), iterations["kind"].to_list()))
    rows = []
    by: dict[str, float] = {}
    for (a, b, _e, _l, s, x, _tid), br in zip(t.iter_rows(), broken):
        pieces = [p.breaker() for p in br]
        rows.append(Transition(from_=a, to=b, kind=kinds.get(b), slack_us=s / 1000.0, exposed_host_us=x / 1000.0, broken_by=pieces))
        for p in pieces:
            key = breaker_key(p)
            by[key] = by.get(key, 0.0) + p.us
    slacks = [r.slack_us for r in rows]
    exposed = [r for r in rows if r.exposed_host_us > 0]
    return OverlapSlack(
        transitions=rows,
        count=len(rows),
        median_us=statistics.median(slacks) if slacks else None,
        p10_us=lower_rank(slacks, 10),
        p1_us=lower_rank(slacks, 1),
        exposed_share=len(exposed) / len(rows) if rows else None,
        exposed_us=sum(r.exposed_host_us for r in rows),
        exposed_us_mean=(sum(r.exposed_host_us for r in rows) / len(rows)) if rows else None,
        exposed_us_by_breaker=[BreakerTotal(breaker=k, us=v) for k, v in sorted(by.items(), key=lambda kv: (-kv[1], kv[0]))],
    )
