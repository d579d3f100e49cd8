"""What a real SGLang 0.5.23 server on a CPU machine showed (issue 27), each against the replica
(tests/sglang_replica), which was taught to behave as the real server did:

1. `--bf16-gemm-backend cutedsl` kills SGLang at start-up without a Blackwell GPU (unquant.py:338):
   `--base on` must compose `auto` there;
2. a profile window of num_steps holds num_steps + 1 `scheduler.run_batch` spans, the last a stub
   with no step[...] cut by the profiler's stop: dropped, counted and said (DESIGN.md "Iteration");
3. on CPU the GEMMs are `aten::linear` -> `sgl_kernel::weight_packed_linear` (97% of an iteration):
   they are gemm, not "other";
4. /stop_profile after the window closed itself answers HTTP 500: profkit says so and waits for the
   export the window started.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
import time
from pathlib import Path

import pytest

from processes import free_port, manifests, profkit
from processes import assert_nothing_left

NO_GPU = shutil.which("nvidia-smi") is None
SMALL = ["--isl", "64", "--turns", "3", "--turn-tokens", "16", "--output-tokens", "24", "--num-steps", "5",
         "--health-timeout", "120", "--profile-timeout", "120", "--profile-windows", "2"]


def _llama(tmp_path: Path) -> Path:
    d = tmp_path / "llama"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "max_position_embeddings": 4096}))
    return d


def test_replica_refuses_cutedsl_off_blackwell(tmp_path, replica_python):
    """The replica dies as SGLang did: the scheduler raises, the launcher exits non-zero."""
    port = free_port()
    env = {**os.environ, "SGLANG_REPLICA_GPU_CAPABILITY": "9.0"}
    p = subprocess.run([str(replica_python), "-m", "sglang.launch_server", "--model-path", "m", "--bf16-gemm-backend", "cutedsl",
                        "--port", str(port)], env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode != 0
    assert "--bf16-gemm-backend cutedsl requires SM100/SM103 (Blackwell)" in p.stderr
    env["SGLANG_REPLICA_GPU_CAPABILITY"] = "10.0"  # Blackwell: it starts (then profkit's Server stops it and its helper)
    from profkit.capture.server import Server
    from profkit.targets.spec import LaunchSpec

    spec = LaunchSpec(target="sglang", argv=[str(replica_python), "-m", "sglang.launch_server", "--model-path", "m",
                                             "--bf16-gemm-backend", "cutedsl", "--port", str(port)],
                      env={"SGLANG_REPLICA_GPU_CAPABILITY": "10.0"}, host="127.0.0.1", port=port, world_size=1, teardown_s=30)
    server = Server(spec, tmp_path / "server.log")
    try:
        server.start()
        server.wait_healthy(120)
    finally:
        server.stop()
    assert_nothing_left(port)


@pytest.mark.skipif(not NO_GPU, reason="needs a machine without nvidia-smi (SGLang's CPU case)")
def test_cpu_run_base_on_stubs_gemms(tmp_path, replica_python):
    """Findings 1-3 in one real run of `profkit trace --target sglang` (default --base on) against the
    replica on its CPU engine (--device cpu): the command holds `--bf16-gemm-backend auto` (the old
    cutedsl made the replica die: exit 4); every window's summary has num_steps iterations and one
    stub dropped (the old code counted 6, the stub an "unknown" iteration with busy 0); GEMMs are
    gemm and "other" holds at most 10% of the CPU op time (the old code: ~94% other)."""
    port = free_port()
    p = profkit(tmp_path, "trace", "--target", "sglang", "--model-path", str(_llama(tmp_path)), "--server-python", str(replica_python),
                "--extra-server-args", "--device cpu", "--opt", "topk_v2", *SMALL, port=port)
    out, err = p.communicate(timeout=600)
    assert p.returncode == 0, err
    for m in manifests(tmp_path):
        argv = m["argv"]
        assert argv[argv.index("--bf16-gemm-backend") + 1] == "auto"
        assert any("bf16_gemm on is --bf16-gemm-backend auto without a GPU" in w for w in m["warnings"])
        assert m["throughput"][0]["tokens_per_s_per_gpu"]["median"] is None  # no GPU: no per-GPU figure
        run = Path(m["summary"]).parent
        for s in [json.loads(f.read_text()) for f in sorted(run.glob("window-*/summary.json"))]:
            (rank,) = s["ranks"]
            assert rank["device_timeline"] == "cpu"
            assert len(rank["iterations"]) == 5 and rank["stub_markers"] == 1
            assert any("cut by the profiler's stop" in w for w in rank["warnings"])
            assert {i["kind"] for i in rank["iterations"]} <= {"decode", "extend"}
            cats: dict[str, float] = {}
            for it in rank["iterations"]:
                for k, v in it["category_us"].items():
                    cats[k] = cats.get(k, 0.0) + v
            total = sum(cats.values())
            assert cats["gemm"] / total > 0.85 and cats.get("other", 0.0) / total <= 0.10
            assert rank["bubbles_by_cause"]["launch"]["count"] == 0  # CPU: gaps are Python, not launches
    assert_nothing_left(port)


def test_a_late_stop_profile_answered_500_is_said_and_the_export_waited_for(tmp_path, replica_python):
    """The window closes itself after num_steps and exports (slowly); /stop_profile sent meanwhile
    waits for that export and answers 500 ("Profiling is not in progress"), as the real server did.
    wait_for_traces says so in its notes and still returns the complete files once SGLang logs
    `Profiling done` (no fixed sleep: the test waits for the replica's "Stop profiling..." line)."""
    from processes import complete_trace, start_replica

    from profkit.capture.profile import log_size, start_profile, wait_for_traces
    from profkit.workloads.agentic import Workload
    from profkit.workloads.driver import drive

    spec, server = start_replica(tmp_path, replica_python, {"SGLANG_REPLICA_EXPORT_PAUSE_S": "2"}, tp=1)
    try:
        out_dir = tmp_path / "prof"
        offset = log_size(server.log_path)
        start_profile(spec.base_url, output_dir=out_dir, profile_id="late", num_steps=3)
        th = threading.Thread(target=drive, args=(spec.base_url, Workload(isl=32, turns=1, turn_tokens=0, output_tokens=20)),
                              kwargs={"concurrency": 1}, daemon=True)
        th.start()
        deadline = time.monotonic() + 120
        while "Stop profiling..." not in server.log_path.read_bytes()[offset:].decode(errors="replace"):
            assert time.monotonic() < deadline and server.alive()
            time.sleep(0.05)
        notes: list[str] = []
        files = wait_for_traces(spec.base_url, out_dir, "late", 1, timeout_s=120, alive=server.alive, idle=lambda: True,
                                log_path=server.log_path, log_offset=offset, notes=notes)
        assert [f.name for f in files] == ["late-TP-0.trace.json.gz"] and complete_trace(files[0])["traceEvents"]
        assert len(notes) == 1 and "HTTP 500" in notes[0] and "closed itself" in notes[0]
        th.join(60)
    finally:
        server.stop()
