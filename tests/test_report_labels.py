"""Iteration labels (issue 17, point 9) and marker discovery (point 10): a user's --marker names its
iterations, vLLM's mixed prefill+decode step is "mixed", a graph-capture trace says its kernels did
not run, `--list-markers` lists the spans with counts and `--marker nomatch` points at it."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from factories import TraceBuilder
from profkit.analysis.iterations import parse_kind
from profkit.attribution.diff import shape_label
from profkit.cli import app

from support import ROOT, public_trace

US = 1000
runner = CliRunner()


def _marked_trace(tmp_path: Path) -> Path:
    b = TraceBuilder()
    for i in range(4):
        s = i * 300 * US
        b.cpu("decode_step", s, 290 * US)
        b.kernel("gemm", s + 2 * US, s + 20 * US, 100 * US)
    return b.write(tmp_path / "marked.pt.trace.json.gz")


def test_a_user_marker_names_its_iterations(tmp_path):
    p = _marked_trace(tmp_path)
    r = runner.invoke(app, ["analyze", str(p), "--marker", "^decode_step$", "--no-cache"])
    assert r.exit_code == 0, r.output
    assert "4× decode_step iterations" in r.output
    assert "unknown" not in r.output
    r = runner.invoke(app, ["diff", str(p), str(p), "--marker", "^decode_step$"])
    assert r.exit_code == 0, r.output
    assert r.output.splitlines()[1].startswith("decode_step iterations: GPU window")  # after the capture-health line


def test_vllm_mixed_step_is_mixed():
    assert parse_kind("execute_8192_context_9(sq8155)_generation_37(sq37sk34489)") == ("mixed", 46)
    assert parse_kind("execute_8192_context_0(x)_generation_32(y)") == ("decode", 32)
    assert parse_kind("execute_8192_context_3(x)_generation_0(y)") == ("extend", 3)
    assert parse_kind("step[MIXED bs=8]") == ("mixed", 8)
    r = runner.invoke(app, ["analyze", str(public_trace("tracelens_vllm_gpt-oss-20b_mi300x_mixed_piecewise_step.json.gz")), "--no-cache"])
    assert r.exit_code == 0, r.output
    assert "1× mixed bs=46" in r.output and "extend" not in r.output.split("per iteration")[0]


def test_graph_capture_says_its_kernels_did_not_run():
    assert shape_label(("graph_capture", None)) == "graph capture (kernels did not run)"
    r = runner.invoke(app, ["analyze", str(public_trace("tracelens_sglang_qwen3-8b_mi300x_graph_capture_bs32.json.gz")), "--no-cache"])
    assert r.exit_code == 0, r.output
    assert "1× graph capture (kernels did not run)" in r.output
    assert "capture a CUDA graph" in r.output and "the kernels did not run" in r.output


def test_list_markers_and_the_nomatch_hint(tmp_path):
    p = _marked_trace(tmp_path)
    r = runner.invoke(app, ["analyze", str(p), "--list-markers"])
    assert r.exit_code == 0, r.output
    assert "decode_step" in r.output and "^decode_step$" in r.output and " 4 " in r.output
    sample = ROOT / "traces" / "sample" / "eager_sync.pt.trace.json.gz"
    r = runner.invoke(app, ["analyze", str(sample), "--list-markers"])
    assert "ProfilerStep#N" in r.output and r"^ProfilerStep#\d+$" in r.output
    assert "^scheduler\\.run_batch$" in r.output and "default" in r.output
    r = runner.invoke(app, ["analyze", str(p), "--marker", "nomatch", "--no-cache"])
    assert r.exit_code == 1
    assert "--list-markers" in r.output and "omitted" not in r.output
