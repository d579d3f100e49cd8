"""Real traces recorded by others (../shared/public-traces, MIT, see tests/data/public/README.md): identities and known facts."""

from __future__ import annotations

import polars as pl
import pytest

from profkit.analysis import analyze_trace
from profkit.analysis.summary import build_summary
from profkit.ingest import load_trace

from conftest import TRACELENS_STEPS, needs_public, public_steps

FILES = public_steps()
pytestmark = needs_public


@pytest.fixture(scope="module")
def analyses():
    return {p.name: analyze_trace(load_trace(p)) for p in FILES}


def test_all_six_present():
    assert [p.name for p in FILES] == list(TRACELENS_STEPS)


@pytest.mark.parametrize("name", TRACELENS_STEPS)
def test_identities_and_no_warnings(analyses, name):
    a = analyses[name]
    it = a.iterations
    assert it.height >= 1
    assert (it["gpu_window_ns"] == it["gpu_busy_ns"] + it["gpu_idle_ns"]).all()
    assert (it["gpu_idle_ns"] >= 0).all()
    cats = a.categories.group_by("iteration").agg(pl.col("dur_ns").sum()).sort("iteration")
    joined = it.join(cats, on="iteration", how="left").with_columns(pl.col("dur_ns").fill_null(0))
    assert (joined["dur_ns"] - joined["overlap_ns"] == joined["gpu_busy_ns"]).all()
    assert (it["bubble_ns"] <= it["gpu_idle_ns"]).all()
    if "graph_capture" in name:  # the one warning a capture step must carry: its kernels did not run (issue 17)
        assert len(a.warnings) == 1 and "the kernels did not run" in a.warnings[0]
    else:
        assert a.warnings == []
    build_summary([a])  # serializable


def test_sglang_decode_step_blocking_copy(analyses):
    """The MI300X SGLang decode step holds a 463 ms blocking host copy (public README)."""
    a = analyses["tracelens_sglang_qwen3-8b_mi300x_decode_step.json.gz"]
    r = a.iterations.row(0, named=True)
    assert (r["kind"], r["batch_size"]) == ("decode", 32)
    assert r["graph_launches"] == 1
    s = a.syncs.row(0, named=True)
    assert (s["api"], s["kind"], s["direction"]) == ("cudaMemcpy", "sync_copy", "d2h")  # hipMemcpyWithStream
    assert s["blocked_ns"] == 463_063_750
    # graph-replayed kernels are owned through the hipGraphLaunch correlation
    graph = a.ops.filter(pl.col("launch_api") == "cudaGraphLaunch")
    assert graph.height > 500


def test_b200_tp8_eager_prefill_is_launch_bound(analyses):
    a = analyses["tracelens_vllm_gpt-oss-120b_b200_tp8_eager_prefill_step.json.gz"]
    r = a.iterations.row(0, named=True)
    assert r["kind"] == "extend"
    assert r["graph_launches"] == 0
    assert r["gpu_kernels"] == r["kernel_launches"]  # eager: one launch per kernel
    by = a.bubbles.group_by("cause").agg(pl.col("dur_ns").sum())
    launch = by.filter(pl.col("cause") == "launch")["dur_ns"].sum()
    assert launch > 0.9 * r["bubble_ns"]
    assert load_trace(FILES[0]).rank == 0


def test_vllm_decode_fullgraph(analyses):
    a = analyses["tracelens_vllm_gpt-oss-20b_mi300x_decode_fullgraph_step.json.gz"]
    r = a.iterations.row(0, named=True)
    assert (r["kind"], r["batch_size"]) == ("decode", 32)
    assert r["graph_launches"] >= 1
    assert r["gpu_kernels"] > r["kernel_launches"]
