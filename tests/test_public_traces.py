"""Real traces recorded by others (../shared/public-traces, MIT, see tests/data/public/README.md): identities and known facts."""

from __future__ import annotations

import polars as pl
import pytest

from profkit.analysis import analyze_trace
from profkit.analysis.summary import build_summary
from profkit.ingest import load_trace

from support import TRACELENS_STEPS, needs_public, public_steps

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


# --- names as the trace has them (issue 36) -------------------------------------------------------

# DESIGN.md "ROCm traces": each HIP call counts as its CUDA twin (the syncs and blocking copies of these traces)
_HIP_TWIN = {"hipMemcpyWithStream": "cudaMemcpy", "hipMemcpy": "cudaMemcpy", "hipStreamSynchronize": "cudaStreamSynchronize",
             "hipDeviceSynchronize": "cudaDeviceSynchronize", "hipEventSynchronize": "cudaEventSynchronize"}
AMD_WITH_SYNCS = ("tracelens_sglang_qwen3-8b_mi300x_decode_step.json.gz", "tracelens_mi300_Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz",
                  "tracelens_vllm_gpt-oss-20b_mi300x_decode_fullgraph_step.json.gz")


def _raw(path):
    import gzip
    import json

    return json.loads(gzip.decompress(path.read_bytes()))


@pytest.mark.parametrize("name", AMD_WITH_SYNCS)
def test_hip_sync_names_as_the_trace_has_them(name):
    """The sync table prints the HIP call the trace recorded (hipMemcpyWithStream), not its CUDA twin;
    `api` stays the twin (what is counted), `name` is the trace's spelling; each group's count is the
    trace's number of those calls inside the iterations' windows (here: every one in the trace)."""
    from collections import Counter

    from typer.testing import CliRunner

    from support import public_trace
    from profkit.cli import app

    p = public_trace(name)
    raw = Counter(e["name"] for e in _raw(p)["traceEvents"] if e.get("cat") == "cuda_runtime" and e.get("name") in _HIP_TWIN)
    s = build_summary([analyze_trace(load_trace(p))])["ranks"][0]
    groups = Counter()
    for g in s["sync_groups"]:
        assert g["name"] in raw and g["api"] == _HIP_TWIN[g["name"]], g
        groups[g["name"]] += g["count"]
    assert groups and all(groups[n] <= raw[n] for n in groups)
    if s["outside_iterations"]["syncs"] + s["outside_iterations"]["sync_copies"] == 0:
        assert groups == raw
    assert all(x["name"] in raw and x["api"] == _HIP_TWIN[x["name"]] for x in s["syncs"])
    r = CliRunner().invoke(app, ["analyze", str(p), "--top", "30"])
    assert r.exit_code == 0, r.output
    table = r.output[r.output.index("host syncs and blocking copies"):].split("top kernels")[0]
    for n in groups:
        assert n in table
    assert "cuda" not in table.lower().replace("torch/cuda", "")  # no CUDA twin printed (torch/cuda/... is a Python frame)


def test_cuda_sync_names_carry_no_second_name():
    """On a CUDA trace the trace's name is the CUDA one: no `name` beside `api` (summaries unchanged)."""
    a = analyze_trace(load_trace(FILES[TRACELENS_STEPS.index("tracelens_vllm_gpt-oss-120b_b200_tp8_eager_prefill_step.json.gz")]))
    s = build_summary([a])["ranks"][0]
    assert all("name" not in x for x in s["syncs"]) and all("name" not in g for g in s["sync_groups"])


@pytest.mark.parametrize("name", ("tracelens_vllm_gpt-oss-20b_mi300x_decode_fullgraph_step.json.gz",
                                  "tracelens_vllm_gpt-oss-20b_mi300x_mixed_piecewise_step.json.gz"))
def test_device_named_from_device_properties(name):
    """vLLM's ROCm traces leave deviceProperties' `name` empty; its GFXIP version (computeMajor.minor
    9.4), 304 compute units (numSms) and 192 GiB (totalGlobalMem) are the MI300X's row of ROCm's GPU
    specifications table: the rank's device, in summary.json and the header, not "unknown device"."""
    from typer.testing import CliRunner

    from support import public_trace
    from profkit.cli import app

    p = public_trace(name)
    props = _raw(p)["deviceProperties"]
    assert {(d["name"], d["computeMajor"], d["computeMinor"], d["numSms"], d["warpSize"], round(d["totalGlobalMem"] / 2**30)) for d in props} == {
        ("", 9, 4, 304, 64, 192)}
    assert load_trace(p).device == "AMD Instinct MI300X"
    r = CliRunner().invoke(app, ["analyze", str(p)])
    assert r.exit_code == 0 and "rank 0 AMD Instinct MI300X" in r.output and "unknown device" not in r.output


def test_device_properties_names_win():
    """A named device keeps its name (the SGLang MI300X step says it itself)."""
    p = FILES[TRACELENS_STEPS.index("tracelens_sglang_qwen3-8b_mi300x_decode_step.json.gz")]
    assert _raw(p)["deviceProperties"][0]["name"] == "AMD Instinct MI300X" == load_trace(p).device
