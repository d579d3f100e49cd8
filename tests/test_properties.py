"""Property-based: random traces never crash the analysis and the identities always hold exactly."""

from __future__ import annotations

import polars as pl
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from factories import TraceBuilder
from profkit.analysis import analyze_trace
from profkit.catalog import load_catalog
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
    for launch, delay, dur, api, stream, n in ops:
        corr = b.call(api, launch * 1000, 2000)
        for j in range(n if api == "cudaGraphLaunch" else 1):
            if api == "cudaMemcpyAsync":
                b.op("Memcpy DtoH (Device -> Pageable)", (launch + delay) * 1000, dur * 1000, corr, cat="gpu_memcpy", stream=stream)
            else:
                b.op(f"k{j}", (launch + delay + j * dur) * 1000, dur * 1000, corr, stream=stream)
    for s, d in sy:
        b.call("cudaStreamSynchronize", s * 1000, d * 1000)
    path = b.write(tmp_path_factory.mktemp("h") / "t.json")
    a = analyze_trace(load_trace(path), min_bubble_us=min_bubble, catalog=CAT)
    it = a.iterations
    assert (it["gpu_window_ns"] == it["gpu_busy_ns"] + it["gpu_idle_ns"]).all()
    assert (it["gpu_idle_ns"] >= 0).all()
    assert (it["gpu_busy_ns"] <= it["gpu_window_ns"]).all()
    cats = a.categories.group_by("iteration").agg(pl.col("dur_ns").sum())
    j = it.join(cats, on="iteration", how="left").with_columns(pl.col("dur_ns").fill_null(0))
    assert (j["dur_ns"] - j["overlap_ns"] == j["gpu_busy_ns"]).all()
    assert (it["bubble_ns"] <= it["gpu_idle_ns"]).all()
    assert a.bubbles["cause"].is_in(["sync", "launch", "iteration_boundary", "gpu_wait"]).all()
    # windows tile: consecutive non-empty windows touch
    w = it.filter(pl.col("gpu_start_ns").is_not_null())
    assert w["gpu_end_ns"].to_list()[:-1] == w["gpu_start_ns"].to_list()[1:]
