"""`profkit trace --target sglang` end to end against a replica of SGLang 0.5.23's wire protocol and
process tree (tests/sglang_replica, built from the 0.5.23 source; its README says from where).

`--server-python` is a small wrapper that puts the replica first on PYTHONPATH, so the command
profkit composes (`<python> -m sglang.launch_server --model-path ... --tensor-parallel-size 4 ...`)
starts it. Covered: a normal run (exact study flags, 4 ranks, traces, attribution); a workload that
overflows the context refused before launch (from the preset) and after launch (from
/server_info), or trimmed with --fit-context; an error chunk inside the stream giving exit 4 with
the request in the manifest; trace files written non-atomically waited for until SGLang's
`Profiling done` line; a slow teardown waited out, and no orphan left (a helper in its own session).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import psutil

from processes import HANG_S, SPEC, assert_nothing_left, complete_trace, free_port, manifests, profkit, replica_procs, start_replica
SMALL = ["--isl", "64", "--turns", "3", "--turn-tokens", "16", "--output-tokens", "24", "--num-steps", "6",
         "--health-timeout", "600", "--profile-timeout", "600"]  # guards against a hang, not speed bounds


def test_trace_end_to_end_against_the_replica(tmp_path, replica_python):
    port = free_port()
    p = profkit(tmp_path, "trace", "--target", "sglang", "--preset", "glm52-nvfp4-tp4", "--server-python", str(replica_python),
                "--opt", "topk_v2", *SMALL, port=port)
    out, err = p.communicate(timeout=HANG_S)
    assert p.returncode == 0, err
    ms = manifests(tmp_path)
    assert [m["status"] for m in ms] == ["ok", "ok"]
    assert [m["base"] for m in ms] == ["on", "on"]  # leave-one-out is the default
    assert [m["env"]["SGLANG_OPT_USE_TOPK_V2"] for m in ms] == ["0", "1"]
    for m in ms:
        assert "--bf16-gemm-backend" in m["argv"] and "--disable-overlap-schedule" not in m["argv"]
        assert "--cuda-graph-backend-decode" not in m["argv"]  # CUDA graphs stay on (SGLang's default)
        by_window: dict[str, list[str]] = {}
        for f in m["trace_files"]:  # one folder per profile window when there are several
            by_window.setdefault(str(Path(f).parent), []).append(Path(f).name)
        assert by_window and all(sorted(v) == [f"{m['run_id']}-TP-{r}.trace.json.gz" for r in range(4)] for v in by_window.values())
        for f in m["trace_files"]:
            assert complete_trace(tmp_path / "traces" / m["run_id"] / f)["traceEvents"]
        assert m["failed_requests"] == [] and m["leftover_pids"] == []
        assert m["throughput"][0]["tokens_per_s"]["median"] > 0
        assert m["context"] == {"length": 90000, "source": "the command line's --context-length", "reserved_tokens": 6, "fit": []}
        assert m["versions"]["engine"] == "0.5.23" and m["versions"]["torch"]  # torch from the server's Python, not /server_info
        assert m["parser_check"].startswith("skipped") or m["parser_check"] == "passed"
        log = (tmp_path / "traces" / m["run_id"] / "server.log").read_text()
        assert "Profiling done. Traces are saved to:" in log and "Shutdown complete" in log
    assert any("accept length" in w for w in ms[0]["warnings"])  # random ids: say how to fix the accept length
    group = next(d for d in (tmp_path / "reports").iterdir() if (d / "diff.json").exists())
    diff = json.loads((group / "diff.json").read_text())
    assert diff["decomposition"]["residual_us"] == 0
    assert_nothing_left(port)


def test_overflowing_workload_is_refused_before_launch(tmp_path, replica_python):
    p = profkit(tmp_path, "trace", "--target", "sglang", "--preset", "glm52-nvfp4-tp4", "--server-python", str(replica_python),
                "--opt", "topk_v2", *SMALL[:2], "--isl", "89900", *SMALL[2:])
    out, err = p.communicate(timeout=HANG_S)
    assert p.returncode == 2, err
    assert "turn 2 (0-based)" in err and "90010 tokens" in err and "90000" in err and "--fit-context" in err
    (m,) = manifests(tmp_path)
    assert (m["status"], m["stage"]) == ("failed", "validate") and "server_pid" not in m
    assert not (tmp_path / "traces" / m["run_id"] / "server.log").exists()


def _small_model(tmp_path: Path, context: int) -> Path:
    d = tmp_path / "model"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"architectures": ["GlmMoeDsaForCausalLM"], "max_position_embeddings": context}))
    return d




def test_overflow_found_from_server_info_is_refused_and_fit_context_trims(tmp_path, replica_python):
    """No --context-length on the command line: the server's /server_info says 200 tokens; turn 2
    needs 100 + 2*(16+24) + 24 + 4 reserved = 208. Refused (exit 2, server stopped); --fit-context
    shortens the first prompt by 8 tokens instead and the run goes through."""
    model = _small_model(tmp_path, 200)
    port = free_port()
    args = ["trace", "--target", "sglang", "--model-path", str(model), "--extra-server-args", SPEC, "--server-python", str(replica_python),
            "--opt", "topk_v2", *SMALL[:2], "--isl", "100", *SMALL[2:], "--capture-only"]
    p = profkit(tmp_path, *args, port=port)
    out, err = p.communicate(timeout=HANG_S)
    assert p.returncode == 2, err
    assert "turn 2 (0-based)" in err and "208 tokens" in err and "/server_info" in err
    (m,) = manifests(tmp_path)
    assert (m["status"], m["stage"]) == ("failed", "context_check")
    assert_nothing_left(port)

    fit = tmp_path / "fit"
    fit.mkdir()
    p = profkit(fit, *args, "--fit-context", port=port)
    out, err = p.communicate(timeout=HANG_S)
    assert p.returncode == 0, err
    for m in manifests(fit):
        assert m["status"] == "ok" and m["failed_requests"] == []
        assert m["context"]["fit"] == ["--fit-context: first prompt trimmed from 100 to 92 tokens so that turn 2 fits the context of 200 tokens"]
        assert m["throughput"][0]["repeats"][0]["requests"] == 3
    assert_nothing_left(port)


def test_error_chunk_mid_run_fails_the_run_with_the_request_in_the_manifest(tmp_path, replica_python):
    """SGLang answers HTTP 200 and puts {"error": ...} inside the stream: that request failed, and
    the run exits 4 with the server's text; the request is listed, the throughput leaves it out."""
    port = free_port()
    # request 5: the warm-up pass is one conversation of 3 turns (requests 1-3), so the measured pass's turn 1
    env = {**os.environ, "SGLANG_REPLICA_FAIL_REQUEST": "5", "SGLANG_REPLICA_FAIL_MESSAGE": "Abort request: KV cache pool is full"}
    p = profkit(tmp_path, "trace", "--target", "sglang", "--preset", "glm52-nvfp4-tp4", "--server-python", str(replica_python),
                "--opt", "topk_v2", *SMALL, port=port, env=env)
    out, err = p.communicate(timeout=HANG_S)
    assert p.returncode == 4, err
    assert "Abort request: KV cache pool is full" in err and "1 of 2 requests of the measured pass failed" in err
    (m,) = manifests(tmp_path)  # the baseline failed: the candidate never started
    assert (m["status"], m["stage"]) == ("failed", "workload")
    (f,) = m["failed_requests"]
    assert (f["conversation"], f["turn"], f["error"]) == (0, 1, "Abort request: KV cache pool is full")
    rep = m["throughput"][0]["repeats"][0]
    assert (rep["requests"], rep["failed_requests"], rep["output_tokens"]) == (1, 1, 24)
    assert m["leftover_pids"] == []
    assert_nothing_left(port)


def test_non_atomic_trace_writes_are_waited_for_until_profiling_done(tmp_path, replica_python):
    """Each rank writes half its gzip into the final name, pauses 1.5 s, writes the rest (torch's
    export), then SGLang logs `Profiling done` after a barrier. The files exist and stop growing
    long before they are complete; profkit returns only after the log line, with every file whole."""
    from profkit.capture.profile import log_size, rank_files, start_profile, wait_for_traces
    from profkit.workloads.agentic import Workload
    from profkit.workloads.driver import drive

    spec, server = start_replica(tmp_path, replica_python, {"SGLANG_REPLICA_EXPORT_PAUSE_S": "1.5"})
    try:
        out_dir = tmp_path / "prof"
        offset = log_size(server.log_path)
        start_profile(spec.base_url, output_dir=out_dir, profile_id="win", num_steps=4)
        res = drive(spec.base_url, Workload(isl=32, turns=1, turn_tokens=0, output_tokens=40), concurrency=1)
        assert not res.failed and not res.errors
        files = wait_for_traces(spec.base_url, out_dir, "win", spec.world_size, timeout_s=HANG_S, alive=server.alive,
                                log_path=server.log_path, log_offset=offset)
        assert [f.name for f in files] == ["win-TP-0.trace.json.gz", "win-TP-1.trace.json.gz"]
        for f in files:  # whole the moment profkit has them
            assert complete_trace(f)["distributedInfo"]["world_size"] == 2
        assert rank_files(out_dir, "win") == files
    finally:
        server.stop()


def test_slow_teardown_is_waited_out_and_nothing_is_left(tmp_path, replica_python):
    """SIGTERM starts SGLang's own shutdown (watchdog poll, drain, schedulers release memory): here
    ~5 s, longer than the 5 s profkit used to give a failed run. profkit waits for it to finish
    (the replica logs `Shutdown complete`), then kills what is left: the helper TP0 started in its
    own session, which neither SGLang's teardown nor killpg reaches."""
    from profkit.targets import sglang as sg

    assert sg.TEARDOWN_S >= 5 + 15 + 60  # SGLang's watchdog poll + scheduler exit + kill_process_tree budget
    spec, server = start_replica(tmp_path, replica_python, {"SGLANG_REPLICA_WATCHDOG_S": "2.5", "SGLANG_REPLICA_RELEASE_S": "2.5"})
    assert spec.teardown_s == sg.TEARDOWN_S
    tree = [server.pid] + [c.pid for c in psutil.Process(server.pid).children(recursive=True)]
    helper = [p.pid for p in replica_procs(spec.port) if "sglang-replica-jit-helper" in p.cmdline()]
    assert len(helper) == 1 and len(tree) >= 4  # main, 2 schedulers, detokenizer (+ spawn's resource tracker)
    server.stop()
    log = server.log_path.read_text()
    assert "Shutdown complete" in log, log[-2000:]
    assert server.leftovers() == []
    assert_nothing_left(spec.port, tree + helper)
