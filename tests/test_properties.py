"""Property-based: random traces never crash the analysis and the identities always hold exactly."""

from __future__ import annotations

import polars as pl
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from factories import TraceBuilder
from profkit.analysis import analyze_trace
from profkit.analysis.catalog import load_catalog
from profkit.ingest import load_trace

CAT = load_catalog("generic")

op = st.tuples(
    st.integers(0, 2000),  # launch time (µs)
    st.integers(0, 400),  # start delay after the launch
    st.integers(0, 60),  # duration
    st.sampled_from(["cudaLaunchKernel", "cuLaunchKernelEx", "cudaGraphLaunch", "cudaMemcpyAsync", "hipLaunchKernel"]),
    st.integers(0, 2),  # stream
    st.integers(1, 3),  # ops per launch (graph replays share one)
)
markers = st.lists(st.tuples(st.integers(0, 2000), st.integers(1, 400)), min_size=0, max_size=8)
syncs = st.lists(st.tuples(st.integers(0, 2000), st.integers(0, 100)), max_size=4)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(ops=st.lists(op, max_size=40), marks=markers, sy=syncs, min_bubble=st.sampled_from([0.0, 1.0, 2.0, 50.0]))
def test_identities_on_random_traces(tmp_path_factory, ops, marks, sy, min_bubble):
    assume(ops or marks or sy)  # an empty trace is an input error (tested elsewhere)
    b = TraceBuilder()
    for s, d in marks:
        b.cpu("scheduler.run_batch", s * 1000, d * 1000)
    raw = []  # (start, end) of every GPU op as built, integer ns: the independent side
    for launch, delay, dur, api, stream, n in ops:
        corr = b.call(api, launch * 1000, 2000)
        for j in range(n if api == "cudaGraphLaunch" else 1):
            if api == "cudaMemcpyAsync":
                b.op("Memcpy DtoH (Device -> Pageable)", (launch + delay) * 1000, dur * 1000, corr, cat="gpu_memcpy", stream=stream)
                raw.append(((launch + delay) * 1000, (launch + delay + dur) * 1000))
            else:
                b.op(f"k{j}", (launch + delay + j * dur) * 1000, dur * 1000, corr, stream=stream)
                raw.append(((launch + delay + j * dur) * 1000, (launch + delay + j * dur + dur) * 1000))
    for s, d in sy:
        b.call("cudaStreamSynchronize", s * 1000, d * 1000)
    path = b.write(tmp_path_factory.mktemp("h") / "t.json")
    a = analyze_trace(load_trace(path), min_bubble_us=min_bubble, catalog=CAT)
    it = a.iterations
    # idle = window - busy and overlap = sum(category) - busy hold by construction; what can fail is
    # what they are made of, checked below against a plain computation over the ops as built
    assert (it["gpu_idle_ns"] >= 0).all()
    cats = a.categories.group_by("iteration").agg(pl.col("dur_ns").sum())
    j = it.join(cats, on="iteration", how="left").with_columns(pl.col("dur_ns").fill_null(0))
    assert (j["dur_ns"] == j["category_sum_ns"]).all()
    assert (it["bubble_ns"] <= it["gpu_idle_ns"]).all()
    assert a.bubbles["cause"].is_in(["sync", "launch", "iteration_boundary", "gpu_wait"]).all()
    # windows tile: consecutive non-empty windows touch
    w = it.filter(pl.col("gpu_start_ns").is_not_null())
    assert w["gpu_end_ns"].to_list()[:-1] == w["gpu_start_ns"].to_list()[1:]

    # by the clock, against a plain computation over the ops as built: each window's busy is the
    # union of every op clipped to it, its category sum the clipped durations; summed, the busy
    # union of the device over the windows' span
    for r in w.iter_rows(named=True):
        g0, g1 = r["gpu_start_ns"], r["gpu_end_ns"]
        clipped = [(max(a, g0), min(e, g1)) for a, e in raw if min(e, g1) > max(a, g0)]
        assert r["gpu_busy_ns"] == _union(clipped)
        assert r["gpu_busy_ns"] + r["overlap_ns"] == sum(e - a for a, e in clipped)
        assert r["overlap_ns"] >= 0
    if w.height:
        lo, hi = w["gpu_start_ns"][0], w["gpu_end_ns"][-1]
        assert w["gpu_busy_ns"].sum() == _union([(max(a, lo), min(e, hi)) for a, e in raw if min(e, hi) > max(a, lo)])
    ph = a.phases.group_by("iteration").agg(pl.col("dur_ns").sum())
    jp = it.join(ph, on="iteration", how="left").with_columns(pl.col("dur_ns").fill_null(0))
    assert (jp["dur_ns"] - jp["overlap_ns"] == jp["gpu_busy_ns"]).all()  # phases split the same time as categories
    assert (it["spill_ns"] >= 0).all() and (it["spill_ns"] <= it["owned_gpu_ns"]).all()


def _union(iv):
    total, cur = 0, None
    for a, e in sorted(iv):
        if cur is None or a > cur[1]:
            if cur:
                total += cur[1] - cur[0]
            cur = [a, e]
        else:
            cur[1] = max(cur[1], e)
    return total + (cur[1] - cur[0] if cur else 0)
