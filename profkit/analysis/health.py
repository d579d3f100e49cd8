"""Capture health (DESIGN.md "Capture health"): is a recording fit to be measured, before any number.

Each check looks for one artefact of the recording and names the figures it puts in doubt:

- `graph_replays_missing`: graph launches (cudaGraphLaunch) inside the iterations with no replayed
  kernel recorded (AMD-AGI/Hyperloom #1121: replays under-recorded, idle inflated);
- `start_records_missing`: launch calls of the first iteration with no device record, the profiler
  dropping the session's first kernels (pytorch/pytorch #192021);
- `rank_start_skew`: the ranks' first iterations start further apart than one iteration (a
  collective then looks like seconds of work: Hyperloom #1249);
- `deferred_work`: GPU ops that start after the next iteration's GPU window ended (their time lands,
  by the clock, two or more windows late);
- `stream_overlap`: two ops of different launches overlapping on one stream (impossible on the
  hardware: a clock artefact);
- `cut_markers`: marker spans cut by the profiler's stop (real SGLang 0.5.23 ends every window with a
  stub `scheduler.run_batch` with no step[...] inside): counted; figures are in doubt only while the
  iteration finder keeps the stub as an iteration;
- `profiler_overhead`: the profiled window ran >= 1.5x slower than the unprofiled passes (the
  manifest's profiler_overhead): host-side figures are the profiler's;
- `graph_replays_under_recorded`: a graph replay with fewer ops than the other replays of the same
  graph (AMD-AGI/Hyperloom #1121: idle looks inflated); the graph by its launch site and op pattern;
- `impossible_durations`: GPU ops longer than the iteration window that holds them, far beyond every
  other op of their name, or whose `dur` overflowed the next op on their stream (AMD-AGI/TraceLens
  #669; Hyperloom #1116: 7 of 55,423 events were 62% of the GPU time);
- `capture_only`: only graph-capture warm-up iterations, no steady-state step;
- `device_records`: launch calls but no GPU activity record at all (unusable for GPU figures);
- truncated files never get this far: ingest refuses them (exit 3) and says the capture is unusable.

The facts are found per rank from the analysis frames (`rank_facts`, stored in summary.json per rank
as `capture`), the verdict from the facts of every rank plus the manifest (`assess`, summary.json's
`health`): `ok`, `degraded: <metrics>` or `unusable`.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, NamedTuple, cast

if TYPE_CHECKING:
    import polars as pl

from profkit.apis import GRAPH_LAUNCH_APIS, LAUNCH_APIS
from profkit.documents import (CaptureFacts, CaptureOnly, CutMarkers, DeferredWork, Finding, Health, ImpossibleDurations, ImpossibleWorst,
                               ReplaysMissing, StartRecordsMissing, StreamOverlap, UnderRecorded, UnderRecordedWorst, typed_or_none)

OVERHEAD_LIMIT = 1.5  # profiled / unprofiled time per token at which host-side figures are the profiler's
STREAM_OVERLAP_TOLERANCE_NS = 50  # CUPTI's device timestamps, converted to µs floats by Kineto, can touch by a few ns
MAX_LISTED = 5
EX_LAUNCH_APIS = frozenset({"cudaLaunchKernelExC", "cuLaunchKernelEx"})  # may launch with programmatic dependent launch
# impossible durations (docs/capture-health.md says why these numbers): an op is far beyond every other op
# of its name when it is longer than NAME_RATIO x the longest other (at least NAME_PEERS others) and at
# least NAME_FLOOR_NS long; on the 71 fixtures and public traces with GPU ops the largest ratio to the next
# longest of the name is 6.7x for compute kernels, 22x for an NCCL all-reduce waiting for its peer (communication
# is exempt)
# an under-recorded replay has at most this share of its graph's ops: records the profiler lost go in bulk (the
# issue's replay kept 10 of 130, Hyperloom #1121 idle 87%), while another graph launched from the same site
# differs by a few ops (vLLM's last piecewise CUDA graph: 12 of the 15 ops of the others, a public MI300X trace)
UNDER_RECORDED_SHARE = 0.5
NAME_RATIO = 100
NAME_PEERS = 2
NAME_FLOOR_NS = 1_000_000
COMM = r"(?i)nccl|rccl|all_?reduce|all_?gather|reduce_?scatter|all_?to_?all|sendrecv|broadcast"

# the figures each check puts in doubt (summary.json field names)
DOUBTS: dict[str, tuple[str, ...]] = {
    "graph_replays_missing": ("gpu_busy_us", "gpu_idle_us", "bubble_us", "category_us", "phase_us", "gpu_kernels", "owned_gpu_us", "slack_us"),
    "start_records_missing": ("gpu_busy_us", "category_us", "gpu_kernels", "owned_gpu_us"),
    "rank_start_skew": ("cross_rank", "category_us.communication", "gpu_window_us"),
    "deferred_work": ("category_us", "phase_us", "gpu_busy_us"),
    "stream_overlap": ("gpu_busy_us", "overlap_us", "category_us"),
    "cut_markers": ("wall_us", "gpu_window_us", "iterations"),
    "profiler_overhead": ("wall_us", "gpu_idle_us", "bubble_us", "launch_us", "slack_us", "exposed_host_us"),
    "graph_replays_under_recorded": ("gpu_busy_us", "gpu_idle_us", "bubble_us", "category_us", "phase_us", "gpu_kernels", "owned_gpu_us",
                                     "slack_us"),
    "impossible_durations": ("gpu_busy_us", "gpu_idle_us", "gpu_window_us", "overlap_us", "category_us", "phase_us", "owned_gpu_us",
                             "bubble_us", "slack_us"),
    "capture_only": ("wall_us", "gpu_window_us", "gpu_busy_us", "gpu_idle_us", "category_us", "phase_us", "gpu_kernels", "owned_gpu_us",
                     "launch_us", "bubble_us", "slack_us"),
    "device_records": ("gpu_busy_us", "gpu_idle_us", "category_us", "phase_us", "gpu_kernels", "bubble_us", "slack_us"),
}


def rank_facts(trace: Any, ops: pl.DataFrame, calls: pl.DataFrame, win: pl.DataFrame, windows: pl.DataFrame,
               device_timeline: str, device_records: str, stubs_dropped: int = 0) -> CaptureFacts:
    """The health facts of one rank. `ops`: every GPU op with its owning iteration (null:
    none); `calls`: the runtime calls with theirs; `win`: the iteration windows (with kinds);
    `windows`: the GPU windows."""
    import polars as pl

    facts = CaptureFacts(device_timeline=device_timeline, device_records=device_records)
    if device_timeline == "gpu" and device_records == "present" and ops.height:
        with_ops = ops["correlation"].drop_nulls().unique().implode()
        owned_calls = calls.select("api", "iteration", "correlation", "ts_ns", "end_ns", "tid").filter(
            pl.col("iteration").is_not_null() & pl.col("correlation").is_not_null())
        capture_its = win.filter(pl.col("kind") == "graph_capture")["iteration"].implode()
        launches = owned_calls.filter(pl.col("api").is_in(LAUNCH_APIS) & ~pl.col("iteration").is_in(capture_its))
        empty = launches.filter(~pl.col("correlation").is_in(with_ops))
        graphs = launches.filter(pl.col("api").is_in(GRAPH_LAUNCH_APIS))
        g_empty = empty.filter(pl.col("api").is_in(GRAPH_LAUNCH_APIS))
        facts.graph_replays_missing = ReplaysMissing(count=g_empty.height, graph_launches=graphs.height,
                                                     iterations=sorted(set(g_empty["iteration"].to_list()))[:MAX_LISTED])
        first = win["iteration"].min() if win.height else None
        eager = empty.filter(~pl.col("api").is_in(GRAPH_LAUNCH_APIS))
        first_missing = eager.filter(pl.col("iteration") == first).height if first is not None else 0
        facts.start_records_missing = StartRecordsMissing(
            count=first_missing, launches_first_iteration=launches.filter(pl.col("iteration") == first).height,
            missing_later=eager.height - first_missing)
        facts.deferred_work = _deferred(ops, windows)
        facts.stream_overlap = _stream_overlap(ops)
        # issue 36's checks: in the facts only where they find something (a clean capture's summary is as it was)
        under = _under_recorded(trace, ops, launches.filter(pl.col("api").is_in(GRAPH_LAUNCH_APIS)))
        if under.count:
            facts.graph_replays_under_recorded = under
        odd = _impossible(ops, win, windows, capture_its)
        if odd.count:
            facts.impossible_durations = odd
    only = _capture_only(trace, win)
    if only.flagged:
        facts.capture_only = only
    facts.cut_markers = _cut_markers(trace, win, stubs_dropped)
    facts.first_iteration_start_ns = int(cast(int, win["cpu_start_ns"].min())) if win.height else None
    return facts


def _deferred(ops: pl.DataFrame, windows: pl.DataFrame) -> DeferredWork:
    """Owned ops that start at or after the end of the next iteration's GPU window."""
    import polars as pl

    nxt = windows.select((pl.col("iteration") - 1).alias("iteration"), pl.col("gpu_end_ns").alias("next_end_ns"))
    o = ops.select("iteration", "ts_ns", "dur_ns").filter(pl.col("iteration").is_not_null()).join(nxt, on="iteration", how="inner")
    late = o.filter(pl.col("next_end_ns").is_not_null() & (pl.col("ts_ns") >= pl.col("next_end_ns")))
    return DeferredWork(count=late.height, us=int(late["dur_ns"].sum() or 0) / 1000.0,
                        iterations=sorted(set(late["iteration"].to_list()))[:MAX_LISTED])


def _stream_overlap(ops: pl.DataFrame) -> StreamOverlap:
    """Launches (one eager op, or a graph replay's ops) on one device stream whose spans overlap: each
    launch's [first start, last end) against the latest end of the launches before it on that stream.
    A kernel launched with cudaLaunchKernelExC / cuLaunchKernelEx may carry programmatic dependent launch
    (Hopper and later: it starts before its predecessor on the stream ends, by design; a public vLLM B200
    trace has 74 such), so those overlaps are counted apart (`ex_launch`) and doubt nothing."""
    import polars as pl

    o = ops.select("device", "stream", "correlation", "ts_ns", "end_ns", "launch_api").filter(pl.col("correlation").is_not_null())
    # ingest leaves the ops by start time, so each stream's launches, in the order of their first op, are in (a, b)
    # order unless two start together: sorted only where they are not (ties as the sort leaves them)
    spans = _spans(o)
    streams = _by_stream(spans)
    if not all(_in_order(s, "a", "b") for s in streams):
        streams = _by_stream(spans.sort("device", "stream", "a", "b"))
    over = pl.concat([s.with_columns(pl.col("b").cum_max().shift(1).alias("prev_end")).filter(
        pl.col("prev_end").is_not_null() & (pl.col("prev_end") - pl.col("a") > STREAM_OVERLAP_TOLERANCE_NS)) for s in streams])
    ex = over["api"].is_in(list(EX_LAUNCH_APIS)).fill_null(False)
    bad = over.filter(~ex)
    worst = bad.select((pl.col("prev_end") - pl.col("a")).max()).item() if bad.height else 0
    return StreamOverlap(count=bad.height, worst_us=int(worst or 0) / 1000.0, ex_launch=int(ex.sum()),
                         streams=sorted({int(s) for s in bad["stream"].drop_nulls().to_list()})[:MAX_LISTED])


def _spans(o: pl.DataFrame) -> pl.DataFrame:
    """Each launch's span on each device stream of the ops `o`: (device, stream, correlation, a, b, api), in the
    order of their first ops."""
    import polars as pl

    if o["correlation"].n_unique() == o.height:  # eager: one op per launch
        return o.select("device", "stream", "correlation", pl.col("ts_ns").alias("a"), pl.col("end_ns").alias("b"), pl.col("launch_api").alias("api"))
    return (o.group_by("device", "stream", "correlation", maintain_order=True)
            .agg(pl.col("ts_ns").min().alias("a"), pl.col("end_ns").max().alias("b"), pl.col("launch_api").first().alias("api")))


def _by_stream(frame: pl.DataFrame) -> list[pl.DataFrame]:
    """The rows of each (device, stream) of frame, in their order (one stream: frame itself)."""
    if frame.height == 0 or all(frame[c].null_count() == 0 and frame[c].min() == frame[c].max() for c in ("device", "stream")):
        return [frame]
    return frame.partition_by("device", "stream", maintain_order=True)


def _in_order(frame: pl.DataFrame, a: str, b: str) -> bool:
    """Whether the rows of frame are strictly in (a, b) order as they come (then a sort by (a, b) leaves them
    in this order whatever it does with ties)."""
    import polars as pl

    if frame.height < 2:
        return True
    if frame[a].null_count() or frame[b].null_count():
        return False  # a sort puts them first, in an order of its own
    na, nb = pl.col(a).shift(-1), pl.col(b).shift(-1)
    return bool(frame.select((na.is_null() | (na > pl.col(a)) | ((na == pl.col(a)) & (nb > pl.col(b)))).all()).item())


def _under_recorded(trace: Any, ops: pl.DataFrame, graphs: pl.DataFrame) -> UnderRecorded:
    """Graph replays (inside the iterations, captures left out) with fewer ops than the other replays of
    their graph. Kineto's JSON carries no graph id, so a graph is known by its launch site (the launching
    thread and the innermost user annotation around the cudaGraphLaunch/hipGraphLaunch: `draft`,
    `step[VERIFY bs=1]`) and its op pattern (the multiset of its ops' (cat, name)): the pattern of a site
    is the one most of its replays have, at least two; a replay whose ops are part of it (same kernels,
    fewer of them) and at most UNDER_RECORDED_SHARE of it is the same graph with records lost. Replays
    with no op at all are graph_replays_missing's."""
    import polars as pl

    from profkit.analysis.spans import innermost_enclosing

    out = UnderRecorded()
    mine = ops.filter(pl.col("correlation").is_in(graphs["correlation"].implode()))
    if graphs.height < 3 or mine.height == 0:
        return out
    ann = trace.cpu.filter(pl.col("cat") == "user_annotation").select("name", "ts_ns", "end_ns", "tid")
    g = graphs.select("correlation", "iteration", "ts_ns", "end_ns", pl.col("tid").cast(pl.String))
    inner = innermost_enclosing(g, ann.with_columns(pl.col("tid").cast(pl.String)))
    names = ann["name"].to_list()
    site = {c: (t, None if i is None else names[i]) for c, t, i in zip(g["correlation"].to_list(), g["tid"].to_list(), inner)}
    its = dict(zip(g["correlation"].to_list(), g["iteration"].to_list()))
    pats: dict[Any, Counter] = {}
    for c, cat, name in mine.select("correlation", "cat", "name").iter_rows():
        pats.setdefault(c, Counter())[(cat, name)] += 1
    by_site: dict[Any, list[Any]] = {}
    for c in pats:
        by_site.setdefault(site.get(c), []).append(c)
    short: list[tuple[int, int, Any]] = []  # (ops, pattern's ops, correlation)
    for cs in by_site.values():
        if len(cs) < 3:
            continue
        freq = Counter(frozenset(pats[c].items()) for c in cs)
        top, n = freq.most_common(1)[0]
        if n < 2:
            continue
        ref = Counter(dict(top))
        total = sum(ref.values())
        out.replays += len(cs)
        for c in cs:
            p = pats[c]
            k = sum(p.values())
            if k <= UNDER_RECORDED_SHARE * total and all(v <= ref.get(key, 0) for key, v in p.items()):
                short.append((k, total, c))
                out.ops_missing += total - k
    if short:
        short.sort(key=lambda x: (x[0] / x[1], x[2]))
        out.count = len(short)
        out.iterations = sorted({its[c] for _, _, c in short if its.get(c) is not None})[:MAX_LISTED]
        k, total, c = short[0]
        out.worst = UnderRecordedWorst(ops=k, pattern_ops=total, iteration=its.get(c), site=site.get(c, (None, None))[1])
    return out


def _impossible(ops: pl.DataFrame, win: pl.DataFrame, windows: pl.DataFrame, capture_its: Any) -> ImpossibleDurations:
    """GPU ops whose duration cannot be the device's: (window) an op owned by an iteration and longer than
    that iteration's window, the longer of its CPU window and its GPU window (the last iteration's GPU window
    ends with its own last op, so there only the other rules can fire); (name) longer than NAME_RATIO x every
    other op of its name (NAME_PEERS others at least) and NAME_FLOOR_NS long; (overflow) an op that ends after
    the next op on its stream ended (ops of one stream run in order: its `dur` overflowed, TraceLens #669).
    Communication kernels are exempt from the first two (a collective waits for its peers for as long as
    they take); an op launched with cudaLaunchKernelExC/cuLaunchKernelEx (programmatic dependent launch) is
    never counted as swallowed."""
    import polars as pl

    comm = pl.col("name").str.contains(COMM) | (pl.col("category").fill_null("") == "comm" if "category" in ops.columns else pl.lit(False))
    named = ops.select("name", *(["category"] if "category" in ops.columns else []))

    def not_comm(rows: pl.DataFrame) -> pl.DataFrame:
        """Those of rows (ops by `_i`) that are no communication: only their names are matched (the few that a
        rule picks, not every op's)."""
        return rows.filter(named[rows["_i"]].select(~comm).to_series())

    at = pl.int_range(0, pl.len(), dtype=pl.Int64).alias("_i")  # each op by its row
    o = ops.select(at, "iteration", "dur_ns", "device", "stream", "ts_ns", "end_ns", "launch_api")
    w = win.select("iteration", (pl.col("cpu_end_ns") - pl.col("cpu_start_ns")).alias("wall"))
    w = w.join(windows.select("iteration", (pl.col("gpu_end_ns") - pl.col("gpu_start_ns")).alias("gw")), on="iteration", how="left")
    w = w.select("iteration", pl.max_horizontal("wall", pl.col("gw").fill_null(0)).alias("window_ns"))
    owned = o.filter(pl.col("iteration").is_not_null() & ~pl.col("iteration").is_in(capture_its))
    longer = not_comm(owned.join(w, on="iteration", how="inner").filter(pl.col("dur_ns") > pl.col("window_ns")))
    # only an op at least NAME_FLOOR_NS long can be beyond its name: the names of those are ranked, no other
    big = not_comm(o.filter(pl.col("dur_ns") >= NAME_FLOOR_NS))
    beyond = big.clear()
    if big.height:
        tops = named[big["_i"]]["name"].unique()
        lens = tops.str.len_bytes().unique()  # lengths first: a cheap test that leaves most ops out before the names are hashed
        peers = ops.select(at, "dur_ns", *named.columns).filter(
            pl.col("name").str.len_bytes().is_in(lens.implode())).filter(pl.col("name").is_in(tops.implode()))
        ranked = peers.filter(~comm).with_columns(
            pl.col("dur_ns").rank("ordinal", descending=True).over("name").alias("_r"), pl.len().over("name").alias("_n"))
        second = ranked.filter(pl.col("_r") == 2).select("name", pl.col("dur_ns").alias("_second"))
        beyond = ranked.filter((pl.col("_r") == 1) & (pl.col("_n") > NAME_PEERS)).join(second, on="name").filter(
            (pl.col("dur_ns") > NAME_RATIO * pl.col("_second")) & (pl.col("dur_ns") >= NAME_FLOOR_NS))
    # the ops one after the other on each stream: ingest leaves them by start time, sorted only where that is not
    # (ts, end) order (ties as the sort leaves them)
    seq = o.filter(pl.col("stream").is_not_null())
    streams = _by_stream(seq)
    if not all(_in_order(s, "ts_ns", "end_ns") for s in streams):
        streams = _by_stream(seq.sort("device", "stream", "ts_ns", "end_ns"))
    over = pl.concat([s.with_columns(pl.col("end_ns").shift(-1).alias("_next_end"), pl.col("launch_api").shift(-1).alias("_next_api")).filter(
        pl.col("_next_end").is_not_null() & (pl.col("end_ns") > pl.col("_next_end"))
        & ~pl.col("_next_api").is_in(list(EX_LAUNCH_APIS)).fill_null(False)) for s in streams])
    rows = pl.concat([longer.select("_i", pl.lit("window").alias("rule")), beyond.select("_i", pl.lit("name").alias("rule")),
                      over.select("_i", pl.lit("overflow").alias("rule"))])
    hit = rows["_i"].unique().sort()
    bad = ops.select("name", "dur_ns", "iteration")[hit].with_columns(hit.alias("_i"))
    out = ImpossibleDurations(count=bad.height, us=int(bad["dur_ns"].sum() or 0) / 1000.0, longer_than_window=longer.height,
                              beyond_name=beyond.height, overflow=over.height,
                              iterations=sorted({int(i) for i in bad["iteration"].drop_nulls().to_list()})[:MAX_LISTED])
    if bad.height:
        top = bad.sort("dur_ns", descending=True).row(0, named=True)
        rules = sorted(set(rows.filter(pl.col("_i") == top["_i"])["rule"].to_list()))
        out.worst = ImpossibleWorst(name=str(top["name"])[:120], dur_us=int(top["dur_ns"]) / 1000.0, iteration=top["iteration"], rules=rules)
    return out


def _capture_only(trace: Any, win: pl.DataFrame) -> CaptureOnly:
    """Every iteration a graph capture (its window holds cudaStreamBeginCapture/hipStreamBeginCapture):
    SGLang's graph-capture profile, not a served step. A trace with no iteration marker counts when it
    has capture calls and not one graph launch."""
    import polars as pl

    n = win.height
    cap = win.filter(pl.col("kind") == "graph_capture").height
    whole = bool(n == 1 and win["marker"].to_list()[0] == "<whole trace>")
    if whole and cap == 0 and trace.calls.height:
        begins = int(trace.calls["name"].str.contains(r"^(cuda|hip)StreamBeginCapture").sum())
        if begins and not int(trace.calls["api"].is_in(list(GRAPH_LAUNCH_APIS)).sum()):
            cap = 1
    return CaptureOnly(flagged=bool(n and cap == n), capture_iterations=cap, iterations=n)


def _cut_markers(trace: Any, win: pl.DataFrame, stubs_dropped: int) -> CutMarkers:
    """Marker spans cut by the profiler's stop: those the iteration finder dropped (when it does),
    plus a last iteration still standing that has no engine step span inside while the others do
    (SGLang 0.5.23's stub run_batch, which the finder keeps unless told otherwise)."""

    kept = 0
    if win.height >= 2:
        kinds = win.sort("iteration")["kind"].to_list()
        known = [k for k in kinds[:-1] if k not in ("unknown", None)]
        if kinds[-1] in ("unknown", None) and known and len(known) == len(kinds) - 1:
            kept = 1
    return CutMarkers(count=int(stubs_dropped) + kept, dropped=int(stubs_dropped), kept_as_iteration=kept)


# ------------------------------------------------------------------------------------------ verdict

def _finding(check: str, detail: str, *, unusable: bool = False, metrics: tuple[str, ...] | None = None) -> Finding:
    return Finding(check=check, status="unusable" if unusable else "degraded", metrics=list(metrics if metrics is not None else DOUBTS[check]),
                   detail=detail)


class RankFacts(NamedTuple):
    """What the verdict reads of one rank of a summary: its number, its capture facts (None: not checked), its median wall time."""
    rank: int | None
    facts: CaptureFacts | None
    wall_us: float | None


def rank_facts_of(summary: Mapping[str, Any]) -> list[RankFacts]:
    """Each rank of summary.json (as written) with its `capture` facts typed."""
    out = []
    for r in summary.get("ranks") or []:
        raw = r.get("capture")
        out.append(RankFacts(r.get("rank"), typed_or_none(raw, CaptureFacts) if raw else None, (r.get("median") or {}).get("wall_us")))
    return out


def rank_findings(r: int | None, f: CaptureFacts) -> list[Finding]:
    """The findings of one rank's `capture` facts."""
    out: list[Finding] = []
    if f.device_records == "missing":
        out.append(_finding("device_records", f"rank {r}: launch calls but no GPU activity records", unusable=True))
    if g := f.graph_replays_missing:
        if g.count:
            out.append(_finding("graph_replays_missing", f"rank {r}: {g.count} of {g.graph_launches} graph launches have no replayed "
                                                        f"kernel recorded (iterations {_its(g.iterations)})"))
    if (s := f.start_records_missing) and s.count:
        out.append(_finding("start_records_missing", f"rank {r}: {s.count} of the first iteration's {s.launches_first_iteration} "
                                                     "launch calls have no device record (the profiler dropped them at its start)"))
    if (d := f.deferred_work) and d.count:
        out.append(_finding("deferred_work", f"rank {r}: {d.count} GPU ops ({d.us:,.1f} µs) started after the next iteration's "
                                             f"GPU window ended (owners: iterations {_its(d.iterations)})"))
    if (o := f.stream_overlap) and o.count:
        out.append(_finding("stream_overlap", f"rank {r}: {o.count} launches overlap an earlier one on their stream "
                                              f"(streams {', '.join(map(str, o.streams))}; up to {o.worst_us:,.3f} µs)"))
    if (u := f.graph_replays_under_recorded) and u.count:
        uw = u.worst
        out.append(_finding("graph_replays_under_recorded", f"rank {r}: {u.count} of {u.replays} graph replays have fewer ops than "
                                                            f"the other replays of their graph ({u.ops_missing} ops missing; the worst "
                                                            f"{uw and uw.ops} of {uw and uw.pattern_ops}, under {uw and uw.site!r}; "
                                                            f"iterations {_its(u.iterations)}): the device's idle time looks inflated"))
    if (m := f.impossible_durations) and m.count:
        mw = m.worst
        why = [f"{n} {label}" for n, label in ((m.longer_than_window, "longer than their iteration's window"),
                                               (m.beyond_name, f"over {NAME_RATIO}x every other op of their name"),
                                               (m.overflow, "ending after the next op on their stream")) if n]
        out.append(_finding("impossible_durations", f"rank {r}: {m.count} GPU ops ({m.us:,.1f} µs) have durations the device "
                                                    f"cannot have ({'; '.join(why)}; the longest {mw and mw.name!r}, "
                                                    f"{mw.dur_us if mw else 0:,.1f} µs)"))
    if (k := f.capture_only) and k.flagged:
        out.append(_finding("capture_only", f"rank {r}: all {k.iterations} iteration(s) capture a CUDA/HIP graph (warm-up, the "
                                            "kernels did not run): no steady-state step to measure; profile the served steps"))
    if f.cut_markers.kept_as_iteration:
        out.append(_finding("cut_markers", f"rank {r}: the last marker span has no engine step span inside (cut by the profiler's "
                                           "stop) and is counted as an iteration"))
    return out


def _its(iterations: list[int]) -> str:
    return ", ".join(map(str, iterations)) or "?"


def skew_finding(ranks: list[RankFacts]) -> Finding | None:
    """Profiler start skew between the ranks of one run beyond one iteration (the ranks' median wall)."""
    starts = {r.rank: r.facts.first_iteration_start_ns for r in ranks if r.facts is not None and r.facts.first_iteration_start_ns is not None}
    if len(starts) < 2:
        return None
    walls = [r.wall_us for r in ranks if r.facts is not None and r.facts.first_iteration_start_ns is not None and r.wall_us]
    if not walls:
        return None
    one = max(walls)
    skew = (max(starts.values()) - min(starts.values())) / 1000.0
    if skew <= one:
        return None
    late = max(starts, key=lambda k: starts[k])
    return _finding("rank_start_skew", f"the ranks' first iterations start {skew:,.1f} µs apart (rank {late} last), more than one "
                                       f"iteration ({one:,.1f} µs)")


def overhead_finding(overhead: Any, window: int | None = None) -> Finding | None:
    """The manifest's profiler_overhead (that window's, where it lists windows) at or beyond OVERHEAD_LIMIT."""
    if not isinstance(overhead, Mapping):
        return None
    ws = overhead.get("windows")
    if isinstance(ws, list) and ws:
        o = ws[window] if window is not None and 0 <= window < len(ws) else None
        if o is None:
            vals = [v for w in ws if isinstance(w, Mapping) and isinstance(v := w.get("slowdown"), (int, float))]
            slow = max(vals) if vals else None
        else:
            slow = o.get("slowdown")
    else:
        slow = overhead.get("slowdown")
    if not isinstance(slow, (int, float)) or slow < OVERHEAD_LIMIT:
        return None
    return _finding("profiler_overhead", f"the profiled window ran {slow:.2f}x slower per token than the unprofiled passes "
                                         f"(>= {OVERHEAD_LIMIT}x): host-side figures are the profiler's")


def assess(summary: Mapping[str, Any], overhead: Any = None, window: int | None = None) -> Health:
    """summary.json's `health`: the verdict over every rank's facts, the ranks' start skew and the
    manifest's profiler overhead (`overhead`; else the summary's run section's)."""
    ranks = rank_facts_of(summary)
    findings = [f for r in ranks if r.facts is not None for f in rank_findings(r.rank, r.facts)]
    sk = skew_finding(ranks)
    if sk:
        findings.append(sk)
    run = got if isinstance(got := summary.get("run"), Mapping) else {}
    if overhead is None:
        overhead = run.get("profiler_overhead")
        window = run.get("window") if window is None else window
    oh = overhead_finding(overhead, window)
    if oh:
        findings.append(oh)
    cut = sum(r.facts.cut_markers.dropped for r in ranks if r.facts is not None)
    metrics = sorted({m for f in findings for m in f.metrics})
    if any(f.status == "unusable" for f in findings):
        verdict = "unusable"
    elif findings:
        verdict = "degraded"
    else:
        verdict = "ok"
    checked = any(r.facts is not None for r in ranks)
    return Health(verdict=verdict if checked else "unchecked", metrics=metrics, findings=findings, cut_markers_dropped=cut)


def worst(healths: list[Health | None]) -> Health | None:
    """One verdict over several windows: the worst, with every window's doubted metrics and findings."""
    hs = [h for h in healths if h is not None]
    if not hs:
        return None
    order = {"ok": 0, "unchecked": 1, "degraded": 2, "unusable": 3}
    v = max((h.verdict for h in hs), key=lambda x: order.get(x or "", 1))
    return Health(verdict=v, metrics=sorted({m for h in hs for m in h.metrics}), findings=[f for h in hs for f in h.findings],
                  cut_markers_dropped=sum(h.cut_markers_dropped or 0 for h in hs))


def manifest_near(files: list[Path]) -> tuple[Any, int | None]:
    """The run manifest next to the trace files (beside them, `<stem>.manifest.json` beside one, or one
    level up from a window-<i>/ folder) and which profile window they are: (manifest or None, window index
    or None). Only the folders are looked at: the traces themselves are not stat'ed again."""
    for f in files:
        f = Path(getattr(f, "path", f))
        d = f.parent
        window = int(d.name.split("-")[1]) if d.name.startswith("window-") and d.name.split("-")[-1].isdigit() else None
        for cand in (d / f"{f.name.split('.')[0]}.manifest.json", d / "manifest.json", d.parent / "manifest.json"):
            if cand.is_file():
                try:
                    return json.loads(cand.read_text()), window
                except (OSError, ValueError):
                    return None, window
    return None, None
