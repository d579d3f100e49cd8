"""Real H200 fixtures (tests/data/gpu, recorded by record_fixtures.py): counts equal what each
recording's construction implies, identities hold exactly, and a clean trace warns about nothing."""

from __future__ import annotations

import json

import polars as pl
import pytest

from profkit.analysis import analyze_trace
from profkit.analysis.summary import build_summary
from profkit.ingest import load_trace

from support.helpers import raw_gpu_ops, sum_inside, union_inside

from support import DATA

GPU = DATA / "gpu"
EXPECTED = json.loads((GPU / "expected.json").read_text())
FIXTURES = ["eager_decode", "graph_decode", "eager_sync", "two_streams"]
FIELDS = {"gpu_kernels": "gpu_kernels", "kernel_launches": "kernel_launches", "graph_launches": "graph_launches",
          "memcpy_h2d": "memcpy_h2d", "memcpy_d2h": "memcpy_d2h", "memcpy_d2d": "memcpy_d2d", "memset": "memset", "syncs": "syncs"}


def analyze(name: str, **kw):
    return analyze_trace(load_trace(GPU / f"{name}.pt.trace.json.gz"), **kw)


@pytest.fixture(scope="module")
def analyses():
    return {n: analyze(n) for n in FIXTURES}


@pytest.mark.parametrize("name", FIXTURES)
def test_counts_match_construction(analyses, name):
    a = analyses[name]
    exp = EXPECTED[name]
    assert a.iterations.height == exp["iterations"]
    assert a.marker == r"^scheduler\.run_batch$"
    for ours, theirs in FIELDS.items():
        assert a.iterations[ours].to_list() == [exp["per_iteration"][theirs]] * exp["iterations"], ours
    assert a.iterations["kind"].to_list() == ["decode"] * exp["iterations"]
    assert a.iterations["batch_size"].to_list() == [4] * exp["iterations"]
    launch = exp["observed"]["launch_calls_per_iteration"]
    got = a.launch_calls.filter(pl.col("iteration") == 3).select("api", "n").rows()
    assert dict(got) == launch


@pytest.mark.parametrize("name", FIXTURES)
def test_identities_exact_and_no_warnings(analyses, name):
    a = analyses[name]
    it = a.iterations
    # busy and the categories' sum against a plain count over the raw events (tests/support/helpers.py):
    # busy = the union of every GPU op inside the GPU window, categories = those ops clipped to it
    ops = raw_gpu_ops(GPU / f"{name}.pt.trace.json.gz")
    cats = dict(a.categories.group_by("iteration").agg(pl.col("dur_ns").sum()).iter_rows())
    for r in it.iter_rows(named=True):
        g0, g1 = r["gpu_start_ns"], r["gpu_end_ns"]
        assert abs(r["gpu_busy_ns"] - union_inside(ops, g0, g1)) <= 2, r["iteration"]
        assert abs(cats.get(r["iteration"], 0) - sum_inside(ops, g0, g1)) <= 2, r["iteration"]
    assert (it["bubble_ns"] <= it["gpu_idle_ns"]).all()
    # GPU windows tile the GPU timeline: each ends where the next begins
    assert it["gpu_end_ns"].to_list()[:-1] == it["gpu_start_ns"].to_list()[1:]
    assert a.warnings == []
    s = build_summary([a])
    for rec in s["ranks"][0]["iterations"]:
        assert rec["gpu_window_us"] == pytest.approx(rec["gpu_busy_us"] + rec["gpu_idle_us"], abs=5e-4)


@pytest.mark.parametrize("name", FIXTURES)
def test_designed_bubbles_and_causes(name):
    """At 100 µs only the designed bubbles remain; their causes are the construction's."""
    a = analyze(name, min_bubble_us=100.0)
    exp = EXPECTED[name]["bubbles_by_iteration"]
    for i, e in enumerate(exp):
        got = a.bubbles.filter(pl.col("iteration") == i).group_by("cause").len()
        got = dict(got.rows())
        want = {k: v for k, v in e.items() if k != "incidental" and v}
        assert got == want, (i, got, want)


def test_graph_replay_owned_by_its_iteration(analyses):
    a = analyses["graph_decode"]
    ops = a.ops
    assert ops.filter(pl.col("cat") == "kernel")["launch_api"].unique().to_list() == ["cudaGraphLaunch"]
    per_it = ops.group_by("iteration").agg(pl.col("correlation").n_unique().alias("n"), pl.len().alias("ops"))
    assert per_it["n"].to_list() == [1] * 8  # one graph launch correlation per iteration
    assert per_it["ops"].to_list() == [31] * 8  # 25 kernels + 6 memsets


def test_eager_vs_graph_launch_bubbles_fall(analyses):
    eager = analyses["eager_decode"].iterations
    graph = analyses["graph_decode"].iterations
    assert graph["kernel_launches"].sum() == 0
    assert graph["bubble_launch_ns"].sum() < eager["bubble_launch_ns"].sum()


def test_sync_triggers_and_directions(analyses):
    a = analyses["eager_sync"]
    syncs = a.syncs.filter(pl.col("iteration") == 2)
    rows = sorted(syncs.select("api", "kind", "direction", "trigger").rows())
    assert rows == [
        ("cudaMemcpyAsync", "sync_copy", "h2d", "aten::copy_"),  # torch.tensor(..., device="cuda") from pageable memory
        ("cudaStreamSynchronize", "sync", "d2h", "aten::_local_scalar_dense"),  # .item()
        ("cudaStreamSynchronize", "sync", "h2d", "aten::copy_"),
    ]
    assert a.iterations["sync_copies"].to_list() == [1] * 8


def test_two_streams_overlap(analyses):
    it = analyses["two_streams"].iterations
    assert (it["overlap_ns"] > 100_000).all()
    assert (it["gpu_busy_ns"] < it["category_sum_ns"]).all()
