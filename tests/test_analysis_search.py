"""The analysis' searches (a gap's CPU ops, the span around a call, MaxTree) against the plain
definitions they implement, on random events with many ties and several threads."""

from __future__ import annotations

import random
from collections import defaultdict
from pathlib import Path

import polars as pl
import pytest

from profkit.analysis import rank
from profkit.analysis.spans import MaxTree, innermost_enclosing, innermost_enclosing_by
from profkit.ingest import Trace
from profkit.ingest.tables import CALLS_SCHEMA, CPU_SCHEMA, GPU_OPS_SCHEMA

from support.helpers import gap_cpu_ops

NAMES = ["a", "b", "c", "aa", "B", "é", "z"]
TIDS = ["1", "2", "3"]


def ref_gap_cpu_ops(trace, g0s, g1s, tids, top=3):
    """The definition: per thread the cpu events and runtime calls ordered by (ts, -end, name);
    each instant of a gap goes to the last event in that order that has started and not ended;
    per gap the `top` names with the most such time, by (-time, name)."""
    by_tid = defaultdict(list)
    for f in (trace.cpu, trace.calls):
        for ts, end, tid, name in zip(f["ts_ns"].to_list(), f["end_ns"].to_list(), f["tid"].to_list(), f["name"].to_list()):
            by_tid[tid].append((ts, -end, name or ""))
    out = []
    for g0, g1, t in zip(g0s, g1s, tids):
        evs = sorted(by_tid.get(t, [])) if t is not None else []
        cuts = sorted({g0, g1} | {x for ts, ne, _ in evs for x in (ts, -ne) if g0 < x < g1})
        excl = defaultdict(int)
        for a, b in zip(cuts, cuts[1:]):
            owner = None
            for ts, ne, name in evs:  # the last one in order covering a
                if ts <= a < -ne:
                    owner = name
            if owner is not None:
                excl[owner] += b - a
        out.append(sorted(((n, x) for n, x in excl.items() if x > 0), key=lambda kv: (-kv[1], kv[0]))[:top])
    return out


def _as_lists(frame, n):
    got = [[] for _ in range(n)]
    for g, name, ns in frame.iter_rows():
        got[g].append((name, ns))
    return got


def ref_innermost(points, spans):
    """The covering span on the point's thread latest in (ts, -end, row) order."""
    sp = list(enumerate(zip(spans["ts_ns"].to_list(), spans["end_ns"].to_list(), spans["tid"].to_list())))
    out = []
    for ts, end, tid in zip(points["ts_ns"].to_list(), points["end_ns"].to_list(), points["tid"].to_list()):
        cover = [(s, -e, i) for i, (s, e, t) in sp if t == tid and s <= ts and e >= end]
        out.append(max(cover)[2] if cover else None)
    return out


def random_events(rng: random.Random, n: int, *, horizon: int, cat: str | None = None) -> list[tuple]:
    rows = []
    for _ in range(n):
        ts = rng.randrange(horizon)
        dur = rng.choice([0, 0, 1, 2, 3, rng.randrange(horizon // 4 + 1), rng.randrange(horizon)])
        rows.append((rng.choice(NAMES), cat or rng.choice(["cpu_op", "user_annotation", "python_function"]), ts, dur, ts + dur,
                     "p", rng.choice(TIDS)))
    return rows


def make_trace(rng: random.Random, *, n_cpu: int, n_calls: int, horizon: int, sort: bool) -> Trace:
    cpu = pl.DataFrame(
        [r + (None,) for r in random_events(rng, n_cpu, horizon=horizon)], schema=CPU_SCHEMA, orient="row"
    )
    calls = pl.DataFrame(
        [(name, "cudaLaunchKernel", ts, dur, end, "p", tid, None, None)
         for name, _, ts, dur, end, _, tid in random_events(rng, n_calls, horizon=horizon)],
        schema=CALLS_SCHEMA, orient="row",
    )
    if sort:  # as ingest leaves them
        cpu, calls = cpu.sort("ts_ns"), calls.sort("ts_ns")
    return Trace(path=Path("t"), rank=0, device=None, gpu_ops=pl.DataFrame(schema=GPU_OPS_SCHEMA), calls=calls, cpu=cpu,
                 gpu_annotations=pl.DataFrame(schema=CPU_SCHEMA), t0_ns=0, n_events=n_cpu + n_calls)


def random_gaps(rng: random.Random, n: int, horizon: int) -> tuple[list[int], list[int], list[str | None]]:
    """Disjoint gaps (as the gaps of a device's busy union are), in random order, on random threads."""
    cuts = sorted(rng.sample(range(-2, horizon + 3), min(2 * n, horizon + 5) // 2 * 2))
    pairs = [(a, b) for a, b in zip(cuts[::2], cuts[1::2]) if b > a]
    rng.shuffle(pairs)
    return [a for a, _ in pairs], [b for _, b in pairs], [rng.choice(TIDS + ["9", None]) for _ in pairs]


@pytest.mark.parametrize("seed", range(40))
@pytest.mark.parametrize("native", [True, False], ids=["native", "python"])
def test_gap_cpu_ops_is_the_definition(seed, native, monkeypatch):
    from profkit.ingest import scan

    if native and scan.lib() is None:
        pytest.skip("no C compiler: the native sweep is not built")
    if not native:
        monkeypatch.setattr(scan, "gap_exclusive", lambda *a, **k: None)
    rng = random.Random(seed)
    horizon = rng.choice([8, 30, 200])
    trace = make_trace(rng, n_cpu=rng.randrange(0, 300), n_calls=rng.randrange(0, 40), horizon=horizon, sort=seed % 4 != 0)
    g0s, g1s, tids = random_gaps(rng, rng.randrange(1, 30), horizon)
    got = gap_cpu_ops(trace, pl.Series(g0s, dtype=pl.Int64), pl.Series(g1s, dtype=pl.Int64), pl.Series(tids, dtype=pl.String))
    assert _as_lists(got, len(g0s)) == ref_gap_cpu_ops(trace, g0s, g1s, tids)


def test_gap_ties_are_decided_by_name():
    # ten events with the same (ts, end) but different names: the last in name order owns the time
    cpu = pl.DataFrame(
        [(n, "python_function", 0, 50, 50, "p", "1", None) for n in "jihgfedcba"]
        + [("late", "cpu_op", 60, 5, 65, "p", "1", None)],
        schema=CPU_SCHEMA, orient="row",
    )
    trace = Trace(path=Path("t"), rank=0, device=None, gpu_ops=pl.DataFrame(schema=GPU_OPS_SCHEMA),
                  calls=pl.DataFrame(schema=CALLS_SCHEMA), cpu=cpu, gpu_annotations=pl.DataFrame(schema=CPU_SCHEMA),
                  t0_ns=0, n_events=11)
    got = gap_cpu_ops(trace, pl.Series([10, 55], dtype=pl.Int64), pl.Series([40, 70], dtype=pl.Int64), pl.Series(["1", "1"]))
    assert _as_lists(got, 2) == ref_gap_cpu_ops(trace, [10, 55], [40, 70], ["1", "1"]) == [[("j", 30)], [("late", 5)]]


def test_gap_ties_across_cpu_events_and_calls():
    # 40 events starting together, half CPU events, half runtime calls, of several lengths: the
    # merged order is (ts, -end, name) whichever stream an event comes from (a run longer than the
    # native sweep's insertion sort handles)
    rng = random.Random(7)
    names = [f"n{i:02d}" for i in range(40)]
    rng.shuffle(names)
    ends = [rng.choice([30, 50, 50, 80]) for _ in names]
    cpu = pl.DataFrame([(n, "cpu_op", 0, e, e, "p", "1", None) for n, e in zip(names[:20], ends[:20])], schema=CPU_SCHEMA, orient="row")
    calls = pl.DataFrame([(n, "cudaLaunchKernel", 0, e, e, "p", "1", None, None) for n, e in zip(names[20:], ends[20:])],
                         schema=CALLS_SCHEMA, orient="row")
    trace = Trace(path=Path("t"), rank=0, device=None, gpu_ops=pl.DataFrame(schema=GPU_OPS_SCHEMA), calls=calls, cpu=cpu,
                  gpu_annotations=pl.DataFrame(schema=CPU_SCHEMA), t0_ns=0, n_events=40)
    g0s, g1s = [5, 35, 60], [20, 55, 90]
    got = gap_cpu_ops(trace, pl.Series(g0s, dtype=pl.Int64), pl.Series(g1s, dtype=pl.Int64), pl.Series(["1"] * 3))
    assert _as_lists(got, 3) == ref_gap_cpu_ops(trace, g0s, g1s, ["1"] * 3)


def test_native_gap_sweep_refuses_a_stream_out_of_order():
    # the sweep merges the two streams itself: one not ordered by ts is refused (None), not swept wrong
    import numpy as np

    from profkit.ingest import scan

    if scan.lib() is None:
        pytest.skip("no C compiler: the native sweep is not built")
    a = (np.array([0, 10], np.int64), np.array([20, 15], np.int64), np.array([0, 1], np.int32))
    empty = (np.array([], np.int64), np.array([], np.int64), np.array([], np.int32))
    g0, g1 = np.array([12], np.int64), np.array([14], np.int64)
    got = scan.gap_exclusive(a, empty, g0, g1, 3)
    assert got is not None and got[0][0].tolist() == [1, -1, -1] and got[1][0].tolist() == [2, 0, 0]
    backwards = (a[0][::-1].copy(), a[1][::-1].copy(), a[2][::-1].copy())
    assert scan.gap_exclusive(empty, backwards, g0, g1, 3) is None


@pytest.mark.parametrize("seed", range(30))
def test_innermost_enclosing_is_the_definition(seed):
    rng = random.Random(seed)
    horizon = rng.choice([10, 100])
    spans = pl.DataFrame([r + (None,) for r in random_events(rng, rng.randrange(0, 200), horizon=horizon)],
                         schema=CPU_SCHEMA, orient="row")
    if seed % 3:
        spans = spans.sort("ts_ns")
    if seed % 5 == 0 and spans.height:  # null threads match null threads only
        spans = spans.with_columns(pl.when(pl.col("tid") == "3").then(None).otherwise(pl.col("tid")).alias("tid"))
    pts = []
    for _ in range(rng.randrange(0, 40)):
        ts = rng.randrange(-1, horizon + 1)
        pts.append((ts, ts + rng.choice([0, 0, 1, 5]), rng.choice(TIDS + [None])))
    points = pl.DataFrame(pts, schema={"ts_ns": pl.Int64, "end_ns": pl.Int64, "tid": pl.String}, orient="row")
    assert innermost_enclosing(points, spans) == ref_innermost(points, spans)
    by = innermost_enclosing_by(points, spans, "cat", ("cpu_op", "python_function", "nothing"))
    for cat, got in by.items():
        rows = [i for i, c in enumerate(spans["cat"].to_list()) if c == cat]
        want = ref_innermost(points, spans.filter(pl.col("cat") == cat))
        assert got == [rows[i] if i is not None else None for i in want], cat


@pytest.mark.parametrize("seed", range(20))
def test_max_tree_finds_every_row_above(seed):
    rng = random.Random(seed)
    n = rng.choice([1, 63, 64, 65, 5000, 70000])
    vals = [rng.randrange(1000) if rng.random() > 0.05 else None for _ in range(n)]
    s = pl.Series(vals, dtype=pl.Int64)
    qs = []
    for q in range(30):
        lo = rng.randrange(0, n + 1)
        qs.append((q, lo, rng.randrange(lo, n + 1) if rng.random() > 0.1 else max(lo - 3, 0), rng.choice([-1, 500, 990, 999])))
    queries = pl.DataFrame(qs, schema={"q": pl.Int64, "lo": pl.Int64, "hi": pl.Int64, "thr": pl.Int64}, orient="row")
    got = sorted(MaxTree(s).above(queries).rows())
    want = sorted((q, r) for q, lo, hi, thr in qs for r in range(lo, hi) if vals[r] is not None and vals[r] > thr)
    assert got == want


@pytest.mark.parametrize("seed", range(30))
def test_launch_annotations_native_is_innermost_enclosing(seed):
    from profkit.ingest import scan

    if scan.lib() is None:
        pytest.skip("no C compiler: the native sweep is not built")
    rng = random.Random(seed)
    horizon = rng.choice([8, 30, 200])
    spans = pl.DataFrame([r + (None,) for r in random_events(rng, rng.randrange(0, 200), horizon=horizon, cat="user_annotation")],
                         schema=CPU_SCHEMA, orient="row")
    n = rng.randrange(1, 60)
    ops = pl.DataFrame({"launch_ts_ns": [rng.choice([None, rng.randrange(-2, horizon + 2)]) for _ in range(n)],
                        "launch_tid": [rng.choice(TIDS + ["9", None]) for _ in range(n)]}, schema={"launch_ts_ns": pl.Int64, "launch_tid": pl.String})
    got = rank._launch_annotations(ops, spans).to_list()
    names = spans["name"].to_list()
    want = []
    for ts, tid in zip(ops["launch_ts_ns"].to_list(), ops["launch_tid"].to_list()):
        if ts is None or tid is None:
            want.append(None)
            continue
        i = ref_innermost(pl.DataFrame({"ts_ns": [ts], "end_ns": [ts], "tid": [tid]}), spans)[0]
        want.append(names[i] if i is not None else None)
    assert got == want
