"""(e) CPU-only traces recorded by torch.profiler during the test run itself (no GPU anywhere)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from profkit.analysis import analyze_trace  # noqa: E402
from profkit.ingest import load_trace  # noqa: E402


def record(tmp_path, steps: int, *, marker: bool = True):
    from torch.profiler import ProfilerActivity, profile, record_function

    x = torch.randn(64, 64)
    w = torch.randn(64, 64)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            if marker:
                with record_function("scheduler.run_batch"), record_function("step[DECODE bs=2]"):
                    y = torch.relu(x @ w)
                    y.sum().item()
            else:
                y = torch.relu(x @ w)
    path = tmp_path / "cpu.pt.trace.json.gz"
    prof.export_chrome_trace(str(path))
    return path


def test_cpu_trace_iterations(tmp_path):
    a = analyze_trace(load_trace(record(tmp_path, 5)))
    assert a.iterations.height == 5
    assert a.iterations["kind"].to_list() == ["decode"] * 5
    assert a.iterations["batch_size"].to_list() == [2] * 5
    it = a.iterations
    assert a.device_timeline == "cpu"
    # per step: matmul, relu, sum, item at the top level of the step span
    assert it["gpu_kernels"].to_list() == [4] * 5
    assert (it["kernel_launches"] == 0).all() and (it["syncs"] == 0).all()
    assert (it["wall_ns"] > 0).all()
    assert any("CPU-only" in w for w in a.warnings)


def test_cpu_trace_without_marker(tmp_path):
    a = analyze_trace(load_trace(record(tmp_path, 3, marker=False)))
    assert a.iterations.height == 1
    assert any("whole trace" in w for w in a.warnings)
