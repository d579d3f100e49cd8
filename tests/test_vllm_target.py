"""The vLLM target without a server: the composed commands per switch (vLLM 0.32's flags), what a CPU
build would silently ignore refused up front, the profile protocol's file names, the verify/decode
reading of vLLM's step spans, and the decode->verify pairing of a speculative-decoding diff."""

from __future__ import annotations

from pathlib import Path

import pytest

from profkit.analysis.iterations import parse_kind
from profkit.attribution.diff import speculative_pair
from profkit.capture.vllm import worker_files
from profkit.errors import UsageError
from profkit.targets import vllm
from profkit.targets.registry import check_comparison, opt_states, registry

VLLM = vllm.TARGET


def _compose(states, caps, extra=()):
    return vllm.compose(states, model_path="m", extra_args=list(extra), server_python="py", port=8000, trace_dir=Path("/t"), caps=caps)


def test_leave_one_out_from_vllms_defaults_on_a_cpu():
    names = list(registry(VLLM))
    assert names == ["spec_decode", "chunked_prefill", "prefix_caching", "compile", "async_scheduling", "cuda_graph"]
    base = _compose(opt_states(VLLM, ["prefix_caching"], base="on", candidate=False), caps=[])
    cand = _compose(opt_states(VLLM, ["prefix_caching"], base="on", candidate=True), caps=[])
    assert [a for a in base.argv if a not in cand.argv] == ["--no-enable-prefix-caching"]
    assert cand.argv[:3] == ["py", "-m", "vllm.entrypoints.openai.api_server"] and "--speculative-config" in cand.argv
    for sp in (base, cand):  # GPU-only switches are not passed on a CPU, and the note says why
        assert "--async-scheduling" not in sp.argv and "--compilation-config" not in sp.argv and "--enforce-eager" not in sp.argv
        assert any("async_scheduling, cuda_graph left out" in n for n in sp.notes)
        assert sp.api == "openai" and sp.model == "m"
    cfg = cand.argv[cand.argv.index("--profiler-config") + 1]
    assert '"torch_profiler_dir": "/t"' in cfg and '"ignore_frontend": true' in cfg


def test_gpu_only_switches_are_refused_on_a_cpu_and_composed_on_a_gpu():
    for name in ("async_scheduling", "cuda_graph"):
        b = opt_states(VLLM, [name], base="on", candidate=False)
        c = opt_states(VLLM, [name], base="on", candidate=True)
        with pytest.raises(UsageError, match="cannot be measured on this machine"):
            check_comparison(VLLM, b, c, [name], caps=[])
        assert check_comparison(VLLM, b, c, [name], caps=["9.0"]) == []
    gpu = _compose(opt_states(VLLM, ["async_scheduling"], base="on", candidate=False), caps=["9.0"])
    assert "--no-async-scheduling" in gpu.argv
    eager = _compose(opt_states(VLLM, ["compile"], base="off", candidate=False), caps=["9.0"])
    assert "--enforce-eager" in eager.argv


def test_flags_profkit_owns_are_refused_in_extra_args():
    with pytest.raises(UsageError, match="--profiler-config"):
        _compose({}, caps=[], extra=["--profiler-config", "{}"])
    with pytest.raises(UsageError, match="needs --model-path"):
        vllm.compose({}, model_path=None, extra_args=[], server_python=None, port=1, trace_dir=Path("/t"))


def test_worker_files_by_name(tmp_path):
    for n in ("run-window-0_rank0.1796167015421054682.pt.trace.json.gz", "run-window-0_host_123.async_llm.17961.pt.trace.json.gz",
              "run-window-1_rank0.1.pt.trace.json.gz", "run-window-0_rank0.profiler_out.txt"):
        (tmp_path / n).write_text("x")
    assert [p.name for p in worker_files(tmp_path, "run-window-0")] == ["run-window-0_rank0.1796167015421054682.pt.trace.json.gz"]


@pytest.mark.parametrize("name, kind, bs", [
    ("execute_context_0(0)_generation_1(4)", "verify", 1),
    ("execute_context_0(0)_generation_2(5)", "verify", 2),
    ("execute_context_0(0)_generation_2(2)", "decode", 2),
    ("execute_context_1(48)_generation_0(0)", "extend", 1),
    ("execute_context_1(47)_generation_1(1)", "mixed", 2),
    ("execute_context_0(0)_generation_0(0)", "empty", 0),
    ("execute_60_context_1(sq48sk48sqsq1sqsk2)_generation_3(sq12sk5sqsq1sqsk1)", "mixed", 4),
])
def test_vllm_step_kinds(name, kind, bs):
    assert parse_kind(name) == (kind, bs)


def test_speculative_pair():
    from profkit.documents import Iteration

    its = lambda *kinds: [Iteration(kind=k, batch_size=1) for k in kinds]  # noqa: E731
    assert speculative_pair(its("decode", "decode"), its("verify", "verify", "decode")) == (("decode", 1), ("verify", 1))
    assert speculative_pair(its("decode"), its("decode", "decode", "verify")) is None  # verify is not the candidate's usual step
    assert speculative_pair(its("verify", "decode"), its("verify")) is None  # both sides speculate


def test_accept_length_from_vllms_counters():
    """vLLM's Prometheus text (/metrics): counters summed over label sets; accept length = 1 + accepted / drafts."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from profkit.capture.vllm import accept_length, spec_counters

    state = {"drafts": 10.0, "acc": 12.0}

    class H(BaseHTTPRequestHandler):
        def do_GET(self):
            body = ("# HELP vllm:spec_decode_num_drafts Number of spec decoding drafts.\n# TYPE vllm:spec_decode_num_drafts counter\n"
                    f'vllm:spec_decode_num_drafts_total{{engine="0",model_name="m"}} {state["drafts"]}\n'
                    f'vllm:spec_decode_num_accepted_tokens_total{{engine="0",model_name="m"}} {state["acc"] - 2}\n'
                    'vllm:spec_decode_num_accepted_tokens_total{engine="1",model_name="m"} 2.0\n'
                    'vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 30.0\n').encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{srv.server_address[1]}"
        before = spec_counters(url)
        assert before == {"drafts": 10.0, "accepted": 12.0, "draft_tokens": 30.0}
        state.update(drafts=30.0, acc=42.0)
        assert accept_length(before, spec_counters(url)) == 2.5  # 20 drafts, 30 accepted: 1 + 1.5
    finally:
        srv.shutdown()


def test_a_window_without_a_step_is_refused(tmp_path):
    """vLLM answers /stop_profile with a trace even when no engine step ran in the window (the turn
    ended before /start_profile took effect): that file is refused, not analyzed as one 'unknown' step."""
    import gzip
    import json as _json

    from profkit.capture.vllm import _holds_a_step

    empty, step = tmp_path / "p_rank0.1.pt.trace.json.gz", tmp_path / "q_rank0.1.pt.trace.json.gz"
    empty.write_bytes(gzip.compress(_json.dumps({"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "aten::to", "ts": 1, "dur": 1}]}).encode()))
    pad = [{"ph": "X", "cat": "cpu_op", "name": "x" * 100, "ts": i, "dur": 1} for i in range(20000)]  # the span after the first MiB
    step.write_bytes(gzip.compress(_json.dumps({"traceEvents": [*pad, {"ph": "X", "cat": "user_annotation",
                                                                        "name": "execute_context_0(0)_generation_1(1)", "ts": 1, "dur": 1}]}).encode()))
    assert not _holds_a_step(empty) and _holds_a_step(step)
