"""Real H200 traces of profkit's proxy engine (tests/data/gpu_proxy; recorded by
benchmarks/gpu_proxy_sweep.sh, trimmed to 3 iterations by trim.py): each switch's mechanism is visible
in profkit's analysis — the indexer prologue falls from 45 GPU ops per layer to 4 (two GEMMs and the
two fused Triton kernels), the top-k becomes the Triton TopK-V2, CUDA graphs replace launches."""

from __future__ import annotations

import json

import polars as pl
import pytest

from profkit.analysis import analyze_trace
from profkit.analysis.summary import build_summary
from profkit.attribution.diff import compare_summaries
from profkit.documents import diff_doc
from profkit.analysis.catalog import load_catalog
from profkit.ingest import load_trace

import support

DATA = support.DATA / "gpu_proxy"
CAT = load_catalog("proxy")
NAMES = ["baseline", "topk_v2", "indexer_fusion", "cuda_graph", "all"]


@pytest.fixture(scope="module")
def runs():
    return {n: analyze_trace(load_trace(DATA / f"{n}.trace.json.gz"), catalog=CAT) for n in NAMES}


@pytest.mark.parametrize("name", NAMES)
def test_real_h200_proxy_traces_are_clean(runs, name):
    a = runs[name]
    assert a.device == "NVIDIA H200"
    assert a.iterations.height == 3
    assert a.iterations["kind"].to_list() == ["verify"] * 3
    it = a.iterations
    assert (it["gpu_window_ns"] == it["gpu_busy_ns"] + it["gpu_idle_ns"]).all()
    assert a.warnings == []
    m = json.loads((DATA / f"{name}.manifest.json").read_text())
    on = {k for k, v in m["optimizations"].items() if v}
    assert on == ({"cuda_graph", "overlap", "topk_v2", "indexer_fusion", "index_share", "moe_deferred_finalize"} if name == "all"
                  else set() if name == "baseline" else {name})


def _per_range(a, rng: str) -> set[float]:
    """GPU ops launched inside each `rng` range, per range instance (ops / ranges, per iteration)."""
    ops = a.ops.filter(pl.col("annotation") == rng).group_by("iteration").len()
    tr = load_trace(a.path)
    spans = tr.cpu.filter(pl.col("name") == rng)
    win = a.iterations.select("iteration", "cpu_start_ns", "cpu_end_ns")
    n = {r["iteration"]: spans.filter((pl.col("ts_ns") >= r["cpu_start_ns"]) & (pl.col("ts_ns") < r["cpu_end_ns"])).height
         for r in win.iter_rows(named=True)}
    return {cnt / n[i] for i, cnt in ops.rows()}


def test_indexer_prologue_falls_to_four_kernels(runs):
    assert _per_range(runs["baseline"], "proxy.indexer.prologue") == {45.0}
    assert _per_range(runs["indexer_fusion"], "proxy.indexer.prologue") == {4.0}
    fused = runs["indexer_fusion"].ops.filter(pl.col("annotation") == "proxy.indexer.prologue")["name"].unique().to_list()
    assert {"indexer_k_fused_kernel", "indexer_q_fused_kernel"} <= set(fused)


def test_topk_v2_is_the_triton_kernel(runs):
    k = runs["topk_v2"].ops.filter(pl.col("name").str.starts_with("topk_v2_"))
    assert set(k["name"].unique().to_list()) == {"topk_v2_sample_kernel", "topk_v2_filter_kernel", "topk_v2_select_kernel"}
    assert set(k["category"].unique().to_list()) == {"topk"} and set(k["owner"].unique().to_list()) == {"topk_v2"}
    assert _per_range(runs["topk_v2"], "proxy.indexer.topk") == {5.0}
    assert runs["baseline"].ops.filter(pl.col("name").str.contains("RadixSort")).height > 0


def test_attribution_on_the_category_each_switch_owns(runs):
    base = build_summary([runs["baseline"]])
    for opt, cat in (("topk_v2", "topk"), ("indexer_fusion", "indexer")):
        d = diff_doc(compare_summaries(base, build_summary([runs[opt]]), opt=opt, catalog=CAT))
        assert d["decomposition"]["residual_us"] == 0
        assert d["decomposition"]["category_us"][cat] < -100  # the switch's own category falls by > 100 µs per iteration
    g = runs["cuda_graph"].iterations
    assert (g["graph_launches"] > 0).all()
    assert g["kernel_launches"].max() < runs["baseline"].iterations["kernel_launches"].min() / 10
    assert runs["all"].iterations["gpu_window_ns"].median() < runs["baseline"].iterations["gpu_window_ns"].median() / 5


def test_topk_v2_leave_one_out_with_graphs():
    """All switches on (CUDA graphs too) with and without topk_v2 (benchmarks/gpu_leave_one_out.sh):
    without the eager launch overhead, the Triton TopK-V2 shortens the decode iteration."""
    b = analyze_trace(load_trace(DATA / "loo_topk_v2_before.trace.json.gz"), catalog=CAT)
    c = analyze_trace(load_trace(DATA / "loo_topk_v2_after.trace.json.gz"), catalog=CAT)
    assert (b.iterations["graph_launches"] > 0).all() and (c.iterations["graph_launches"] > 0).all()
    d = diff_doc(compare_summaries(build_summary([b]), build_summary([c]), opt="topk_v2", catalog=CAT))
    assert d["decomposition"]["residual_us"] == 0
    assert d["gpu_window_us"]["candidate"] < 0.9 * d["gpu_window_us"]["baseline"]
    assert d["decomposition"]["category_us"]["topk"] < 0
    assert c.ops.filter(pl.col("name").str.starts_with("topk_v2_")).height > 0
    assert b.ops.filter(pl.col("name").str.starts_with("topk_v2_")).height == 0
