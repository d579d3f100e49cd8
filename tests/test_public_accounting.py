"""profkit's accounting on real public traces against independent expected values.

tests/data/public/expected_public.py (stdlib only, no profkit code) computed
tests/data/public/expected_public.json from the raw events of every public trace, following
DESIGN.md "Definitions": counts by ownership, time inside a window by the clock, work outside
every iteration reported per rank. This file asserts profkit's summary against it.

The traces themselves are third-party data and never committed: they are read from
../shared/public-traces/ beside the checkout (or $PROFKIT_PUBLIC_TRACES); a trace not there is
skipped (see tests/data/public/README.md for where each one comes from).
"""

from __future__ import annotations

import json
import re

import pytest

from profkit.analysis import analyze_trace
from profkit.analysis.summary import build_summary
from profkit.ingest import load_trace

from support import PUBLIC_EXPECTED, TRACELENS_STEPS, public_trace

EXPECTED = json.loads((PUBLIC_EXPECTED / "expected_public.json").read_text())["traces"]
NAMES = sorted(EXPECTED)

# DESIGN.md "ROCm traces": each HIP call counts as its CUDA twin. Compared here by kind of call, so
# the test does not depend on which CUDA spelling a HIP module launch is given.
KERNEL = {
    "cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx", "cudaLaunchCooperativeKernel",
    "cuLaunchCooperativeKernel", "hipLaunchKernel", "hipExtLaunchKernel", "hipLaunchKernelExC", "hipModuleLaunchKernel",
    "hipExtModuleLaunchKernel", "hipHccModuleLaunchKernel", "hipLaunchCooperativeKernel",
}
GRAPH = {"cudaGraphLaunch", "cuGraphLaunch", "hipGraphLaunch"}
COPY = {"cudaMemcpyAsync": "memcpy_async", "hipMemcpyAsync": "memcpy_async",
        "cudaMemsetAsync": "memset_async", "hipMemsetAsync": "memset_async"}


def _kinds(calls: dict[str, int]) -> dict[str, int]:
    out: dict[str, int] = {}
    for api, n in calls.items():
        k = "kernel" if api in KERNEL else "graph" if api in GRAPH else COPY.get(api, api)
        out[k] = out.get(k, 0) + n
    return {k: v for k, v in out.items() if v}


def _close(got, want, rel=0.005, floor=1.0) -> bool:
    return got is not None and abs(got - want) <= max(floor, rel * abs(want))


_CACHE: dict[str, dict] = {}


def summary(name: str) -> dict:
    """The rank entry of profkit's summary for one public trace (analysed once per session)."""
    if name not in _CACHE:
        _CACHE[name] = build_summary([analyze_trace(load_trace(public_trace(name)))])["ranks"][0]
    return _CACHE[name]


def gpu_traces():
    return [n for n in NAMES if not EXPECTED[n]["cpu_only"]]


def test_every_public_trace_has_expected_values():
    assert set(TRACELENS_STEPS) <= set(EXPECTED), "run tests/data/public/expected_public.py"


def test_no_third_party_trace_is_committed():
    assert not list(PUBLIC_EXPECTED.glob("*.json*.gz")), "third-party traces belong in ../shared/public-traces only"


@pytest.mark.parametrize("name", NAMES)
def test_expected_values_are_for_this_file(name):
    import hashlib

    p = public_trace(name)
    assert hashlib.sha256(p.read_bytes()).hexdigest() == EXPECTED[name]["sha256"]


@pytest.mark.parametrize("name", gpu_traces())
def test_counts(name):
    """Counts by ownership: iterations, owned kernels / copies / memsets, launch calls by kind."""
    exp, r = EXPECTED[name], summary(name)
    its = r["iterations"]
    assert len(its) == exp["iterations_n"]
    assert [i["gpu_kernels"] for i in its] == [i["owned_kernels"] for i in exp["iterations"]]
    assert [sum(i["memcpy"].values()) for i in its] == [i["owned_memcpy"] for i in exp["iterations"]]
    assert [i["memset"] for i in its] == [i["owned_memset"] for i in exp["iterations"]]
    assert [i["kernel_launches"] for i in its] == [i["kernel_launches"] for i in exp["iterations"]]
    assert [i["graph_launches"] for i in its] == [i["graph_launches"] for i in exp["iterations"]]
    assert [_kinds(i["launch_calls"]) for i in its] == [_kinds(i["launch_calls"]) for i in exp["iterations"]]
    if not any(a.startswith("hip") for a in exp["launch_calls"]):  # CUDA names: the same API by API
        assert [i["launch_calls"] for i in its] == [i["launch_calls"] for i in exp["iterations"]]
    out = exp["outside_iterations"]
    owned_k = sum(i["owned_kernels"] for i in exp["iterations"])
    assert sum(i["gpu_kernels"] for i in its) == owned_k
    assert owned_k + out["gpu_ops"] >= exp["kernels"]  # nothing lost: owned + outside covers every kernel


@pytest.mark.parametrize("name", gpu_traces())
def test_busy_sum_is_the_device_union(name):
    """Summed over iterations, gpu_busy_us is the device's busy union over the GPU windows."""
    exp, r = EXPECTED[name], summary(name)
    got = sum(i["gpu_busy_us"] or 0.0 for i in r["iterations"])
    want = exp["busy_sum_us"]
    assert _close(got, want), f"busy sum {got:.3f} us, expected {want:.3f} us ({100 * (got - want) / want if want else 0:+.1f}%)"


@pytest.mark.parametrize("name", NAMES)
def test_iteration_identities(name):
    r = summary(name)
    for i in r["iterations"]:
        if i["gpu_window_us"] is None:
            continue
        assert abs(i["gpu_window_us"] - (i["gpu_busy_us"] + i["gpu_idle_us"])) <= 1e-3, i["index"]
        assert abs(sum(i["category_us"].values()) - i["overlap_us"] - i["gpu_busy_us"]) <= 1e-3, i["index"]
        assert i["overlap_us"] >= -1e-3, i["index"]
        assert i["gpu_idle_us"] >= -1e-3, i["index"]


@pytest.mark.parametrize("name", gpu_traces())
def test_gpu_windows(name):
    """gpu_start_us (relative to the rank's t0_us) and gpu_window_us of every iteration."""
    exp, r = EXPECTED[name], summary(name)
    assert "t0_us" in r, "rank entry has no t0_us (schema v2)"
    # compare absolute starts without adding two ~1e15 floats: shift by the difference of the t0s
    shift = r["t0_us"] - exp["t0_us"]
    tol = 2e-3 + abs(exp["t0_us"]) * 2.0**-51
    for got, want in zip(r["iterations"], exp["iterations"], strict=True):
        if want["gpu_start_us"] is None:
            assert got["gpu_start_us"] is None, got["index"]
            continue
        assert got["gpu_start_us"] is not None, got["index"]
        assert abs(got["gpu_start_us"] + shift - want["gpu_start_us"]) <= tol, (got["index"], got["gpu_start_us"] + shift, want["gpu_start_us"])
        assert abs(got["gpu_window_us"] - want["gpu_window_us"]) <= 1e-3, (got["index"], got["gpu_window_us"], want["gpu_window_us"])


@pytest.mark.parametrize("name", gpu_traces())
def test_owned_and_spill(name):
    exp, r = EXPECTED[name], summary(name)
    for got, want in zip(r["iterations"], exp["iterations"], strict=True):
        if want["owned_us"] is None:
            continue
        assert "owned_gpu_us" in got and "spill_us" in got, "iteration has no owned_gpu_us / spill_us (schema v2)"
        assert _close(got["owned_gpu_us"], want["owned_us"]), (got["index"], got["owned_gpu_us"], want["owned_us"])
        assert _close(got["spill_us"], want["spill_us"]), (got["index"], got["spill_us"], want["spill_us"])


@pytest.mark.parametrize("name", gpu_traces())
def test_outside_iterations(name):
    exp, r = EXPECTED[name], summary(name)
    want = exp["outside_iterations"]
    assert "outside_iterations" in r, "rank entry has no outside_iterations (schema v2)"
    got = r["outside_iterations"]
    for k in ("gpu_ops", "before_first", "after_last", "no_launch_in_trace"):
        assert got[k] == want[k], (k, got[k], want[k])
    assert _close(got["gpu_us"], want["gpu_us"]), (got["gpu_us"], want["gpu_us"])


@pytest.mark.parametrize("name", NAMES)
def test_warnings(name):
    exp, r = EXPECTED[name], summary(name)
    ws = r["warnings"]
    outside_warned = any("outside every iteration" in w for w in ws)
    if exp["cpu_only"]:
        assert any("CPU-only" in w for w in ws), ws
        assert not any("device records are missing" in w for w in ws), ws
        return
    assert outside_warned == (exp["outside_iterations"]["share_of_busy"] > 0.01), ws
    if exp["launches_without_gpu_ops"]:
        assert any("device records are missing" in w for w in ws), ws
        assert not any(re.search("CPU-only", w) for w in ws), ws
    else:
        assert not any("device records are missing" in w for w in ws), ws


def test_cupti_range_profiler_trace_is_a_gpu_trace_without_device_records():
    name = "hta_cupti_profiler_benchmark_result_924719_1679055439_trace.json.gz"
    exp = EXPECTED[name]
    assert exp["launches_without_gpu_ops"] and exp["launch_calls"]["cudaLaunchKernel"] == 77
    r = summary(name)
    assert any("device records are missing" in w for w in r["warnings"]), r["warnings"]
    assert not any("CPU-only" in w for w in r["warnings"]), r["warnings"]
    assert sum(i["kernel_launches"] for i in r["iterations"]) == 77
    assert sum(i["gpu_kernels"] for i in r["iterations"]) == 0
