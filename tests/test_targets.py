"""The Target protocol (profkit/targets/target.py): every engine is its module, its catalog and a line in
targets/engines.py, and the run calls it by the protocol, not by its name."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from profkit.capture.run import RunConfig, compose
from profkit.errors import UsageError
from profkit.targets import proxy, sglang, vllm
from profkit.targets.engines import TARGETS, target
from profkit.targets.target import Launch
from support import ROOT


def test_every_target_is_named_by_its_line_and_has_a_registry_and_a_catalog():
    assert list(TARGETS) == ["proxy", "sglang", "vllm"]
    for name, t in TARGETS.items():
        assert t.name == name and t.optimizations  # its own optimization table (targets/<engine>.py)
        implied = t.catalog({"target": name, "preset": "glm52-nvfp4-tp8"})
        assert implied is not None and (ROOT / "kernels" / f"{implied}.toml").is_file()
    with pytest.raises(UsageError, match="unknown target 'tgi'"):
        target("tgi")


@pytest.mark.parametrize("doc, expect", [
    ({"target": "proxy"}, "proxy"),
    ({"target": "vllm", "model": "Qwen/Qwen3-0.6B"}, "vllm"),
    ({"target": "sglang", "preset": "glm52-nvfp4-tp4"}, "sglang-glm52"),
    ({"target": "sglang", "model_path": "/models/GLM-5.2-NVFP4"}, "sglang-glm52"),
    ({"target": "sglang", "model_path": "Qwen/Qwen3-8B"}, None),
    ({"target": "tgi"}, None),
])
def test_the_catalog_a_manifest_implies_is_the_targets(tmp_path: Path, doc: dict, expect: str | None):
    from profkit.analysis.catalog import manifest_catalog

    (tmp_path / "manifest.json").write_text(json.dumps(doc))
    t = TARGETS.get(doc["target"])
    assert manifest_catalog([tmp_path]) == expect == (t.catalog(doc) if t else None)


def test_the_run_composes_through_the_target():
    states = {o.name: True for o in sglang.TARGET.optimizations}
    cfg = RunConfig(target="sglang", preset="glm52-nvfp4-tp8", accept_length=5.0)
    spec = compose(cfg, states, 30001)
    assert spec == sglang.TARGET.compose(Launch(states=states, port=30001, preset="glm52-nvfp4-tp8", accept_length=5.0))
    assert spec.env["SGLANG_SIMULATE_ACC_LEN"] == "5" and "SGLANG_SIMULATE_ACC_LEN" not in spec.unset
    p = compose(RunConfig(), {"overlap": True}, 30002)
    assert p == proxy.compose({"overlap": True}, extra_args=[], port=30002)
    v = compose(RunConfig(target="vllm", model_path="Qwen/Qwen3-0.6B"), {"spec_decode": True}, 30003, trace_dir=Path("/tmp/run"))
    assert v.api == "openai" and '"torch_profiler_dir": "/tmp/run"' in v.argv[v.argv.index("--profiler-config") + 1]


def test_what_each_target_answers_for_the_run(tmp_path: Path):
    assert sglang.TARGET.profiler_env(tmp_path) == proxy.TARGET.profiler_env(tmp_path) == {
        "SGLANG_ENABLE_CUDA_GRAPH_CAPTURE_TRACE": "1", "SGLANG_TORCH_PROFILER_DIR": str(tmp_path.resolve())}
    assert vllm.TARGET.profiler_env(tmp_path) == {}
    assert [t.window for t in TARGETS.values()] == ["sglang", "sglang", "vllm"]
    assert [t.package for t in TARGETS.values()] == [None, "sglang", "vllm"]
    assert sglang.TARGET.context_length({"context_length": None, "max_req_input_len": 199}) == 200
    assert vllm.TARGET.context_length({"max_model_len": 4096}) == 4096
    assert proxy.TARGET.context_length({"context_length": 4096}) is None


def test_every_target_answers_its_optimizations_and_the_cli_offers_it():
    """Each target's table is its own (optimizations, gpu_only, hardware name its optimizations), and the
    --target choices are the registered names, the proxy the default (cli/options.py builds them from engines.py)."""
    from profkit.cli import options
    from profkit.targets.registry import check_opts, registry

    for t in TARGETS.values():
        names = list(registry(t))
        assert names and len(set(names)) == len(names) and names == [o.name for o in t.optimizations], t.name
        assert set(t.gpu_only) <= set(names) and set(t.hardware) <= set(names), t.name
        assert all(set(o.requires) <= set(names) for o in t.optimizations), t.name
        assert check_opts(t, names[:1] * 2) == names[:1]
    assert [c.value for c in options.TargetName] == list(TARGETS)
    assert options.DEFAULT_TARGET.value == "proxy" and str(options.DEFAULT_TARGET) == "proxy"
    assert options.TARGET.help == "proxy (the built-in engine), sglang or vllm."
    assert vllm.TARGET.gpu_only and sglang.TARGET.hardware and not proxy.TARGET.gpu_only and not proxy.TARGET.hardware


def test_the_capture_calls_the_target_never_its_name():
    """capture/ reaches an engine through targets/engines.py only: no import of an engine's module, no
    comparison of the target's name (a new engine adds nothing there unless its profiler speaks anew)."""
    import ast
    import re

    engines = {f"profkit.targets.{n}" for n in TARGETS}
    for path in sorted((ROOT / "profkit" / "capture").glob("*.py")):
        text = path.read_text()
        imported = {a.name if isinstance(n, ast.Import) else f"{n.module}.{a.name}" if n.module == "profkit.targets" else n.module
                    for n in ast.walk(ast.parse(text)) if isinstance(n, (ast.Import, ast.ImportFrom)) for a in n.names}
        assert not imported & engines, path.name
        assert not re.search(r"target\s*[!=]=|target\s+(?:not\s+)?in\s", text), path.name  # (target.window, its profiler's kind, may be)
