"""The SGLang target without a server (issue 16): the study's launch command as the ladder's last
step, leave-one-out as the default, switch dependencies, the context-length check, request
failures, the GPU-memory check, the catalog's gaps. Each test names the 0.5.23 source it follows."""

from __future__ import annotations

import json
import os
import shlex
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from typer.testing import CliRunner

from profkit.cli import app
from profkit.capture.sweep import check_sweep, sweep_plan
from profkit.errors import TargetError, UsageError
from profkit.targets import sglang
from profkit.targets.registry import check_comparison, inactive, opt_states, registry
from profkit.workloads.agentic import Workload

SGLANG = sglang.TARGET
SIX = ["overlap", "index_share", "topk_v2", "indexer_fusion", "bf16_gemm", "moe_deferred_finalize"]
SEED = Path(__file__).resolve().parents[2] / "shared" / "seeds" / "000_733062cccf0dc369.txt"

# The study's 8xB300 command (seeds/000, "Reproduction", TP 8), without --host/--port (profkit's).
STUDY_ENV = {"SGLANG_OPT_USE_TOPK_V2": "1", "SGLANG_ENABLE_MOE_DEFERRED_FINALIZE": "1"}
STUDY_ARGS = shlex.split("""--model-path nvidia/GLM-5.2-NVFP4 --tensor-parallel-size 8 --quantization modelopt_fp4
    --context-length 90000 --max-running-requests 16 --max-prefill-tokens 8192 --chunked-prefill-size 8192
    --cuda-graph-max-bs-decode 16 --mem-fraction-static 0.87 --trust-remote-code --kv-cache-dtype fp8_e4m3
    --bf16-gemm-backend cutedsl --reasoning-parser glm45 --tool-call-parser glm47 --speculative-algorithm EAGLE
    --speculative-num-steps 5 --speculative-eagle-topk 1 --speculative-num-draft-tokens 6 --enable-cache-report""")


def _seed_command() -> tuple[dict[str, str], list[str]] | None:
    """The first launch command of the seed text, if the steering repo is beside this one."""
    if not SEED.exists():
        return None
    text = SEED.read_text()
    block = text.split("# TP 4/TP 8", 1)[1].split("# TEP", 1)[0]
    env = dict(ln.split()[1].split("=", 1) for ln in block.splitlines() if ln.startswith("export "))
    cmd = " ".join(ln.split("#")[0].rstrip().rstrip("\\") for ln in block.splitlines() if ln.strip() and not ln.startswith(("export", "#")))
    argv = shlex.split(cmd)[3:]  # drop python3 -m sglang.launch_server
    argv[argv.index("--tensor-parallel-size") + 1] = "8"
    cut = argv.index("--host")
    return env, argv[:cut]


def _compose(states: dict[str, bool], preset: str = "glm52-nvfp4-tp8", caps: list[str] | None = None):
    return sglang.compose(states, preset=preset, model_path=None, extra_args=[], server_python="python", port=30000, caps=caps)


def test_ladder_of_the_six_ends_at_exactly_the_study_launch_command():
    plan = sweep_plan("sglang", SIX, "ladder")
    assert [label for label, *_ in plan][-1] == "+" + "+".join(SIX)
    last = _compose(plan[-1][1])
    assert last.argv[3:-4] == STUDY_ARGS and last.argv[-4:] == ["--host", "127.0.0.1", "--port", "30000"]
    assert last.env == STUDY_ENV
    seed = _seed_command()
    if seed is not None:
        assert (last.env, last.argv[3:-4]) == seed
    # the ladder's runs keep CUDA graphs and the draft-extend graph on throughout (issue 16, item 3)
    for _, st, _, _ in plan:
        assert st["cuda_graph"] and st["draft_extend_graph"]
        sp = _compose(st)
        assert "--cuda-graph-backend-decode" not in sp.argv and "SGLANG_DISABLE_DRAFT_EXTEND_CUDA_GRAPH" not in sp.env
    base = _compose(plan[0][1])
    assert "--disable-overlap-schedule" in base.argv and base.env["SGLANG_OPT_USE_TOPK_V2"] == "0"


def test_leave_one_out_removes_one_thing_from_the_study_command():
    plan = sweep_plan("sglang", SIX, "leave-one-out")
    full = _compose(plan[0][1])
    assert full.argv[3:-4] == STUDY_ARGS and full.env == STUDY_ENV
    for label, st, _, _opt in plan[1:]:
        sp = _compose(st)
        changed = [a for a in sp.argv if a not in full.argv] + [f"{k}={v}" for k, v in sp.env.items() if full.env.get(k) != v]
        assert len(changed) in (1, 2), (label, changed)  # one flag (+ its value), or one variable
    # --base off keeps the old exploration: unlisted ones off everywhere
    off = sweep_plan("sglang", ["topk_v2"], "leave-one-out", "off")
    assert off[0][1]["cuda_graph"] is False


def test_trace_defaults_to_leave_one_out():
    r = CliRunner().invoke(app, ["trace", "--target", "sglang", "--preset", "glm52-nvfp4-tp8", "--opt", "overlap", "--dry-run",
                                 "--server-python", "/nonexistent/python"])
    assert r.exit_code == 0, r.output
    base, cand = r.output.split("# candidate")
    assert "--disable-overlap-schedule" in base and "--disable-overlap-schedule" not in cand
    assert "--cuda-graph-backend-decode disabled" not in r.output  # graphs stay on: the study's "before"
    assert opt_states(SGLANG, ["overlap"], base="on", candidate=False) == {n: n != "overlap" for n in registry(SGLANG)}


def test_draft_extend_graph_without_cuda_graph_is_refused():
    """eagle_worker_v2.py _capture_cuda_graphs returns before capturing any draft graph when decode
    graphs are disabled: draft_extend_graph alone from everything off compares two identical runs."""
    b = opt_states(SGLANG, ["draft_extend_graph"], base="off", candidate=False)
    c = opt_states(SGLANG, ["draft_extend_graph"], base="off", candidate=True)
    with pytest.raises(UsageError, match="no-op.*cuda_graph"):
        check_comparison(SGLANG, b, c, ["draft_extend_graph"])
    assert check_comparison(SGLANG, *(opt_states(SGLANG, ["draft_extend_graph"], base="on", candidate=x) for x in (False, True)),
                            ["draft_extend_graph"]) == []
    assert "draft_extend_graph" in inactive(SGLANG, c)
    with pytest.raises(UsageError, match="no-op"):
        check_sweep("sglang", sweep_plan("sglang", ["draft_extend_graph", "cuda_graph"], "ladder", "off"), None)
    check_sweep("sglang", sweep_plan("sglang", ["cuda_graph", "draft_extend_graph"], "ladder", "off"), None)
    r = CliRunner().invoke(app, ["trace", "--target", "sglang", "--preset", "glm52-nvfp4-tp8", "--opt", "draft_extend_graph", "--base", "off",
                                 "--dry-run"])
    assert r.exit_code == 2 and "no-op" in r.output


def test_hardware_no_ops_are_warned_not_refused():
    b, c = (opt_states(SGLANG, ["bf16_gemm"], base="on", candidate=x) for x in (False, True))
    (w,) = check_comparison(SGLANG, b, c, ["bf16_gemm"], ["9.0"])
    assert "bf16_gemm does nothing on compute capability 9.0" in w and "same configuration" in w
    assert check_comparison(SGLANG, b, c, ["bf16_gemm"], ["10.3"]) == []
    assert _compose(c, caps=["9.0"]).argv.count("auto") == 1


def test_registry_meanings_follow_0523():
    reg = registry(SGLANG)
    assert "synchronous" in reg["overlap"].meaning and "no switch" in reg["overlap"].meaning
    assert reg["draft_extend_graph"].requires == ("cuda_graph",)
    r = CliRunner().invoke(app, ["opts", "--target", "sglang"])
    assert r.exit_code == 0
    assert "requires:" in r.output and "eagle_worker_v2.py" in r.output and "synchronously" in r.output


def test_inherited_switch_variables_are_removed():
    """An `export SGLANG_DISABLE_DSA_INDEXER_FUSION=1` left in the shell must not turn the "on" run off."""
    sp = _compose({n: True for n in registry(SGLANG)})
    assert "SGLANG_DISABLE_DSA_INDEXER_FUSION" in sp.unset and "SGLANG_DISABLE_DRAFT_EXTEND_CUDA_GRAPH" in sp.unset
    assert sp.shell().startswith("env -u SGLANG_DISABLE_DRAFT_EXTEND_CUDA_GRAPH -u SGLANG_DISABLE_DSA_INDEXER_FUSION ")


def test_context_check_names_the_overflowing_turn_and_fit_trims():
    """tokenizer_manager._validate_one_request: input + reserved >= context, or + max_new_tokens > context."""
    sp = _compose({n: True for n in registry(SGLANG)})
    assert (sp.context_length, sp.reserved_tokens) == (90000, 6)  # managers/utils.py compute_num_reserved_tokens
    old_default = Workload(isl=80_000)
    assert old_default.overflow(90000, 6) == (0, 10, 90426)  # the issue: turns 10-12 overflow
    assert Workload(isl=74_000).overflow(90000, 6) is None  # the new default: 80K mean input, all 13 fit
    fitted, note = old_default.fit(90000, 6)
    assert fitted.overflow(90000, 6) is None and fitted.isl == 77_534 and "trimmed from 80000 to 77534" in note
    replay = Workload(isl=3, turns=2, turn_tokens=0, output_tokens=4, replay=(((1, 2, 3, 4, 5), (6, 7)),))
    assert replay.prompt_lengths(0) == [5, 11] and replay.overflow(16, 2) == (0, 1, 17)
    fr, _ = replay.fit(16, 2)
    assert fr.replay[0][0] == (2, 3, 4, 5) and fr.overflow(16, 2) is None


class _Canned(BaseHTTPRequestHandler):
    """Answers /generate with a canned SGLang response; the wire format is the replica's, see tests/sglang_replica."""
    reply: tuple[int, str, bytes] = (200, "text/event-stream", b"")

    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        code, ctype, body = self.reply
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a):
        pass


def _chunk(ids, n, finish=None):
    return b"data: " + json.dumps({"text": "", "output_ids": ids, "meta_info": {"id": "x", "finish_reason": finish, "prompt_tokens": 5,
                                                                              "completion_tokens": n, "cached_tokens": 0}}).encode() + b"\n\n"


@pytest.mark.parametrize("reply,expect", [
    ((200, "text/event-stream", _chunk([1], 1) + b'data: {"error": {"message": "The input (90426 tokens) is longer", "type": "invalid_request_error", "code": 400, "retryable": false}}\n\n' + b"data: [DONE]\n\n"),
     "The input (90426 tokens) is longer"),
    ((400, "application/json", b'{"error": {"message": "Requested token count exceeds"}}'), "HTTP 400: Requested token count exceeds"),
    ((200, "text/event-stream", _chunk([1, 2], 2, {"type": "length", "length": 2}) + b"data: [DONE]\n\n"), "short reply: 2 of 4 tokens"),
    ((200, "text/event-stream", _chunk([1], 1, {"type": "abort", "message": "Abort before prefill", "status_code": 500}) + b"data: [DONE]\n\n"),
     "aborted by the server: Abort before prefill"),
    ((200, "text/event-stream", _chunk([1], 1)), "without data: [DONE]"),
    ((200, "text/event-stream", _chunk([1, 2, 3, 4], 4, {"type": "length", "length": 4}) + b"data: [DONE]\n\n"), None),
])
def test_failed_requests_are_counted_and_kept_out_of_the_throughput(reply, expect):
    from profkit.workloads.driver import drive

    handler = type("H", (_Canned,), {"reply": reply})
    srv = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        res = drive(f"http://127.0.0.1:{srv.server_address[1]}", Workload(isl=5, turns=2, turn_tokens=1, output_tokens=4), concurrency=1)
    finally:
        srv.shutdown()
    m = res.metrics()
    if expect is None:
        assert not res.failed and m["requests"] == 2 and m["output_tokens"] == 8
        return
    assert [r.turn for r in res.failed] == [0] and expect in res.failed[0].error  # the conversation stops at the failed turn
    assert m["requests"] == 0 and m["failed_requests"] == 1 and "tokens_per_s" not in m
    assert res.failed_json()[0]["error"] == res.failed[0].error


def test_request_timeout_is_a_failed_request():
    from profkit.workloads.driver import drive

    release = threading.Event()

    class Slow(_Canned):
        def do_POST(self):  # answers only after the client gave up: the timeout fires however slow the host
            release.wait()

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Slow)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        res = drive(f"http://127.0.0.1:{srv.server_address[1]}", Workload(isl=5, turns=1, turn_tokens=1, output_tokens=4), concurrency=1,
                    timeout_s=0.3)
    finally:
        release.set()
        srv.shutdown()
    assert "timed out" in res.failed[0].error


def _fake_smi(tmp_path: Path, used: int, apps: str = "") -> dict[str, str]:
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\ncase \"$1\" in\n"
                   f"  --query-gpu=index*) echo '0, GPU-aaa, {used}, 143771'; echo '1, GPU-bbb, {used}, 143771' ;;\n"
                   f"  --query-compute-apps*) printf '{apps}' ;;\nesac\n")
    smi.chmod(0o755)
    return {"PATH": f"{tmp_path}:{os.environ['PATH']}"}


def test_gpu_memory_must_be_free_before_the_next_server(tmp_path, monkeypatch):
    from profkit.capture import gpu

    monkeypatch.setattr(gpu, "_nvml", lambda devices, world: None)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setenv("PATH", "/nonexistent")
    assert "not checked" in gpu.wait_gpus_free(2, timeout_s=0)  # CPU CI: neither NVML nor nvidia-smi
    for k, v in _fake_smi(tmp_path, 125000, "GPU-bbb, 4242\\n").items():
        monkeypatch.setenv(k, v)
    with pytest.raises(TargetError, match="GPU 1: 125000 of 143771 MiB in use by pid 4242"):
        gpu.wait_gpus_free(2, timeout_s=0, poll_s=0)
    for k, v in _fake_smi(tmp_path, 500).items():
        monkeypatch.setenv(k, v)
    assert gpu.wait_gpus_free(2, timeout_s=0) == "GPU memory free on 2 device(s) before start"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert [m.index for m in gpu.gpu_memory(1)] == ["1"]


def test_server_info_context_and_versions_come_from_the_fields_it_has():
    from profkit.capture.run import _versions

    # /server_info = resolved args + scheduler info + internal_states + version (http_server.py server_info)
    assert sglang.context_from_server_info({"context_length": None, "max_req_input_len": 199}) == 200
    assert sglang.context_from_server_info({"context_length": 4096}) == 4096
    assert _versions({"version": "0.5.23", "tp_size": 8}) == {"engine": "0.5.23"}


@pytest.mark.parametrize("name,category,owner", [
    ("_build_chain_tree_kernel", "spec", "spec"), ("_verify_commit_outputs_kernel", "spec", "spec"),
    ("_pack_verify_mask_kernel", "spec", "spec"), ("_argmax_partial_kernel", "spec", "spec"),
    ("_medium_argmax_final_kernel", "spec", "spec"), ("_draft_topk1_partial_argmax_kernel", "spec", "spec"),
    ("void sglang::tiny_n_gemm_kernel<128>(TinyGEMMParams)", "moe", None), ("act_and_mul_kernel", "moe", None),
    ("fused_qknorm_warp", "norm", None), ("fused_qknorm_cta", "norm", None), ("fused_qknorm_rope_warp", "rope", None),
    ("topk_small_batch_kernel", "topk", "topk_v2"), ("topk_small_batch_cluster_kernel", "topk", "topk_v2"),
    ("void sglang::topk_main_kernel<true, 0>(TopKPagedParams)", "topk", "topk_v2"), ("topk_plan_cluster", "topk", "topk_v2"),
    ("topk_transform_decode_kernel", "topk", None), ("topk_kernel", "topk", None), ("grouped_topk_kernel", "moe", None),
    ("at::native::reduce_kernel<512, 1, ArgMaxOps>", "sampling", None), ("nvjet_sm100_tst_64x8", "gemm", None),
])
def test_catalog_gaps_of_0523(name, category, owner):
    pytest.importorskip("polars")
    from profkit.analysis.catalog import load_catalog

    assert load_catalog("sglang-glm52").classify(name) == (category, owner)
