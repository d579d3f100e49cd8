"""The replica itself: HTTP surface, a simulated scheduler step loop, rank processes that write traces.

Everything observable over the wire or in the process table follows the 0.5.23 source named in
../README.md; what happens inside a "forward" is a sleep.
"""

from __future__ import annotations

import argparse
import ctypes
import gzip
import json
import logging
import multiprocessing as mp
import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from sglang import __version__

log = logging.getLogger("sglang.replica")


def _env_f(name: str, default: float) -> float:
    try:
        return float(os.environ.get(name, default))
    except ValueError:
        return default


def _setup_logging(prefix: str = "") -> None:
    # SGLang's format: "[2026-01-01 12:00:00 TP0] message" (utils/common.py configure_logger)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, force=True,
                        format=f"[%(asctime)s{prefix}] %(message)s", datefmt="%Y-%m-%d %H:%M:%S")


def _prctl_child(title: str) -> None:
    """PR_SET_PDEATHSIG SIGKILL (utils/common.py) and the process name setproctitle would give."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        libc.prctl(15, title.encode()[:15], 0, 0, 0)  # PR_SET_NAME (setproctitle's effect on comm)
    except (OSError, AttributeError):
        pass


# ----------------------------------------------------------------------------- rank processes


def _compute_capability() -> str | None:
    """The GPU's compute capability as torch.cuda would report it: SGLANG_REPLICA_GPU_CAPABILITY
    (tests), else nvidia-smi's first GPU, else None (no GPU: SGLang's CPU platform)."""
    cap = os.environ.get("SGLANG_REPLICA_GPU_CAPABILITY")
    if cap is not None:
        return cap or None
    try:
        p = subprocess.run(["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = [x.strip() for x in p.stdout.splitlines() if x.strip()] if p.returncode == 0 else []
    return lines[0] if lines else None


def run_scheduler_process(rank: int, tp: int, ep: int, port: int, cmds: Any, results: Any, barrier: Any,
                          bf16_gemm_backend: str | None = None) -> None:
    title = f"sglang::scheduler_TP{rank}" + (f"_EP{rank}" if ep > 1 else "")
    _prctl_child(title)
    _setup_logging(f" TP{rank}" + (f" EP{rank}" if ep > 1 else ""))
    cap = _compute_capability()
    if bf16_gemm_backend == "cutedsl" and (cap is None or cap.split(".")[0] != "10"):
        # srt/layers/quantization/unquant.py:338, at model load in every scheduler (seen on a CPU machine)
        msg = "--bf16-gemm-backend cutedsl requires SM100/SM103 (Blackwell)"
        log.error("Scheduler hit an exception: Traceback (most recent call last):\n  File \"unquant.py\", line 338\nValueError: %s", msg)
        results.put(("failed", rank, f"ValueError: {msg}"))
        return
    helper = None
    if rank == 0:
        # a JIT-compile-like child in its own session: PDEATHSIG does not reach grandchildren
        # (sglang-0.5.23.md §6.2), and SGLang's teardown kills only the tree it can still see
        helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)", "sglang-replica-jit-helper", str(port)],
                                  start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    results.put(("ready", rank, os.getpid(), helper.pid if helper else None))
    while True:
        cmd = cmds.get()
        if cmd[0] == "export":
            _, out_dir, profile_id, steps, env = cmd
            log.info("Stop profiling...")
            name = f"{profile_id}-TP-{rank}" + (f"-EP-{rank}" if ep > 1 else "") + ".trace.json.gz"
            Path(out_dir).mkdir(parents=True, exist_ok=True)
            data = gzip.compress(json.dumps(_trace(rank, tp, steps, env)).encode())
            # torch's export_chrome_trace writes straight into the final name: half, a pause, the rest
            with open(os.path.join(out_dir, name), "wb") as f:
                f.write(data[: len(data) // 2])
                f.flush()
                time.sleep(_env_f("SGLANG_REPLICA_EXPORT_PAUSE_S", 1.0) * (1 + rank * 0.3))
                f.write(data[len(data) // 2 :])
            barrier.wait()  # torch.distributed.barrier(dp_tp_cpu_group)
            log.info("Profiling done. Traces are saved to: %s", out_dir)
            results.put(("exported", rank))
        elif cmd[0] == "shutdown":
            time.sleep(_env_f("SGLANG_REPLICA_RELEASE_S", 0.5))  # releasing GPU memory, leaving the loop
            log.info("Scheduler exits.")
            results.put(("exited", rank))
            return


def run_detokenizer_process(cmds: Any) -> None:
    _prctl_child("sglang::detokenizer")
    while True:
        if cmds.get()[0] == "shutdown":
            return


def _trace(rank: int, tp: int, steps: list[tuple[int, int, str, int]], env: dict[str, str]) -> dict[str, Any]:
    """A Kineto-shaped trace of the captured steps: SGLang's spans, launches and kernels whose names
    follow the switches (TopK-V2, indexer fusion), one CUDA graph launch per step when graphs are on."""
    pid, tid, dev, stream = os.getpid(), os.getpid(), rank, 7
    ev: list[dict[str, Any]] = []
    corr = 1000
    topk = "topk_transform_decode_kernel" if env.get("SGLANG_OPT_USE_TOPK_V2") == "0" else "topk_main_kernel"
    indexer = (["_act_quant_kernel", "fast_hadamard_transform_kernel", "vectorized_layer_norm_kernel", "fused_store_indexer_cache"]
               if env.get("SGLANG_DISABLE_DSA_INDEXER_FUSION") == "1" else ["fused_q_indexer_rope_hadamard_quant", "fused_k_indexer_norm_rope_store"])
    kernels = ["nvjet_sm100_tst_64x8", *indexer, "sm100_paged_mqa_logits", topk, "flash_fwd_splitkv_mla_fp8_sparse_kernel",
               "bmm_E2m1_E2m1E2m1_Fp32_t128", "_build_chain_tree_kernel"] + (["all_reduce_1shot_push_kernel"] if tp > 1 else [])
    graphs = env.get("_graphs") == "1"

    def x(cat: str, name: str, ts: int, dur: int, p: int, t: int, **args: Any) -> None:
        ev.append({"ph": "X", "cat": cat, "name": name, "pid": p, "tid": t, "ts": round(ts / 1000, 3), "dur": round(dur / 1000, 3), "args": args})

    if env.get("_device") == "cpu":
        return _cpu_trace(rank, tp, steps, pid, tid, x, ev)
    for ts, dur, kind, bs in steps:
        x("user_annotation", "scheduler.run_batch", ts, dur, pid, tid)
        label = f"step[EXTEND bs={bs} toks={bs}]" if kind == "extend" else f"step[{'VERIFY' if env.get('_spec') == '1' else 'DECODE'} bs={bs}]"
        x("user_annotation", label, ts + 1000, dur - 4000, pid, tid)
        gpu_t = ts + 20_000
        if graphs and kind != "extend":
            corr += 1
            x("cuda_runtime", "cudaGraphLaunch", ts + 2000, 8000, pid, tid, correlation=corr)
        for i, k in enumerate(kernels):
            if not (graphs and kind != "extend"):
                corr += 1
                x("cuda_runtime", "cudaLaunchKernel", ts + 2000 + i * 3000, 2500, pid, tid, correlation=corr)
            kd = max(2000, (dur - 60_000) // (len(kernels) + 1))
            x("kernel", k, gpu_t, kd, dev, stream, device=dev, stream=stream, correlation=corr)
            gpu_t += kd + 500
        corr += 1
        x("cuda_runtime", "cudaMemcpyAsync", ts + dur - 6000, 3000, pid, tid, correlation=corr)
        x("gpu_memcpy", "Memcpy DtoH (Device -> Pinned)", gpu_t, 1500, dev, stream, device=dev, stream=stream, correlation=corr, bytes=8)
        if env.get("_overlap") == "0":
            x("cuda_runtime", "cudaStreamSynchronize", ts + dur - 2500, 2000, pid, tid)
    _stub(steps, pid, tid, x)
    return {"schemaVersion": 1, "deviceProperties": [{"id": dev, "name": "SGLang replica GPU", "computeMajor": 10, "computeMinor": 0}],
            "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": tp}, "traceEvents": ev}


def _stub(steps: list[tuple[int, int, str, int]], pid: int, tid: int, x: Any) -> None:
    """The scheduler.run_batch that was running when the profiler stopped: real 0.5.23 on CPU records
    num_steps + 1 run_batch spans per window, the last a 6-16 ms stub with no step[...] inside."""
    if steps:
        ts, dur, _, _ = steps[-1]
        x("user_annotation", "scheduler.run_batch", ts + dur + 300_000, 6_000_000 + (ts % 10) * 1_000_000, pid, tid)


# CPU ops of one decode step on SGLang's CPU engine, outermost first with their share of the step.
# The real 0.5.23 server on a Sapphire Rapids CPU spent 97% of an iteration in aten::linear ->
# sgl_kernel::weight_packed_linear (issue 27); the other names are sgl-kernel's CPU ops
# (sgl-kernel/csrc/cpu/torch_extension_cpu.cpp).
_CPU_OPS = (
    ("aten::linear", "sgl_kernel::weight_packed_linear", 0.90),
    ("sgl_kernel::rmsnorm_cpu", None, 0.02),
    ("sgl_kernel::decode_attention_cpu", None, 0.03),
    ("sgl_kernel::silu_and_mul_cpu", None, 0.01),
)


def _cpu_trace(rank: int, tp: int, steps: list[tuple[int, int, str, int]], pid: int, tid: int, x: Any, ev: list[dict[str, Any]]) -> dict[str, Any]:
    """The CPU engine's trace (--device cpu): no GPU activity, cpu_ops on the scheduler thread,
    Python time between them (4%), and the stub run_batch at the stop."""
    for ts, dur, kind, bs in steps:
        x("user_annotation", "scheduler.run_batch", ts, dur, pid, tid)
        label = f"step[EXTEND bs={bs} toks={bs}]" if kind == "extend" else f"step[DECODE bs={bs}]"
        x("user_annotation", label, ts + 1000, dur - 4000, pid, tid)
        t = ts + 2000
        body = dur - 8000
        for outer, inner, share in _CPU_OPS:
            d = int(body * share)
            x("cpu_op", outer, t, d, pid, tid)
            if inner:
                x("cpu_op", inner, t + 500, d - 1000, pid, tid)
            t += d + int(body * 0.01)
    _stub(steps, pid, tid, x)
    return {"schemaVersion": 1, "deviceProperties": [], "distributedInfo": {"backend": "gloo", "rank": rank, "world_size": tp},
            "traceEvents": ev}


# ----------------------------------------------------------------------------- the engine (main process)


class Engine:
    def __init__(self, a: argparse.Namespace, context_len: int, ranks: list[tuple[Any, Any]], results: Any, detok: Any) -> None:
        self.a = a
        self.context_len = context_len
        self.ranks = ranks  # (process, command queue)
        self.results = results
        self.detok = detok
        self.lock = threading.Lock()  # one forward at a time (a batch of one)
        self.prof_lock = threading.Lock()
        self.forward_ct = 0
        self.prof: dict[str, Any] | None = None
        self.steps: list[tuple[int, int, str, int]] = []
        self.history: list[list[int]] = []
        self.requests = 0
        self.in_flight = 0
        self.status = "Starting"
        self.gracefully_exit = False
        self.startup_time = time.time()
        self.spec = (a.speculative_algorithm or "").upper() in ("EAGLE", "EAGLE3", "NEXTN")
        self.num_draft = a.speculative_num_draft_tokens or ((a.speculative_num_steps or 3) + 1)
        self.reserved = max((a.speculative_eagle_topk or 1) * (a.speculative_num_steps or 0), self.num_draft) if self.spec else 0
        self.accept_total = self.verify_total = 0
        self.step_s = _env_f("SGLANG_REPLICA_STEP_S", 0.002)
        self.sim_acc = _env_f("SGLANG_SIMULATE_ACC_LEN", -1)

    # -- tokenizer_manager._validate_one_request
    def validate(self, ids: list[int], max_new: int | None) -> None:
        n = len(ids) + self.reserved
        if n >= self.context_len:
            raise ValueError(f"The input ({n} tokens) is longer than the model's context length ({self.context_len} tokens).")
        if max_new is not None and max_new + n > self.context_len:
            raise ValueError(
                f"Requested token count exceeds the model's maximum context length of {self.context_len} tokens. "
                f"You requested a total of {max_new + n} tokens: {n} tokens from the input messages and {max_new} tokens "
                "for the completion. Please reduce the number of tokens in the input messages or the completion to fit within the limit.")

    def cached(self, ids: list[int]) -> int:
        best = 0
        for h in self.history:
            n = 0
            for a, b in zip(h, ids):
                if a != b:
                    break
                n += 1
            best = max(best, n)
        return min(best, len(ids) - 1)

    def step(self, kind: str, bs: int = 1, extra_s: float = 0.0) -> None:
        with self.lock:
            t0 = time.time_ns()
            time.sleep(self.step_s + extra_s)
            t1 = time.time_ns()
            self.forward_ct += 1
            stop = False
            with self.prof_lock:
                if self.prof is not None:
                    self.steps.append((t0, t1 - t0, kind, bs))
                    stop = self.prof.get("num_steps") is not None and len(self.steps) >= int(self.prof["num_steps"])
            if stop:  # the stop check runs inside run_batch: generation waits for the export
                try:
                    self.stop_profile()
                except RuntimeError:  # /stop_profile got there first
                    pass

    def generate(self, body: dict[str, Any]):
        """Yields SGLang's stream outputs (dicts); raises ValueError as the tokenizer manager does."""
        ids = list(body.get("input_ids") or [])
        sp = body.get("sampling_params") or {}
        max_new = sp.get("max_new_tokens")
        max_new = 128 if max_new is None else int(max_new)
        self.validate(ids, max_new)
        rid = body.get("rid") or uuid.uuid4().hex
        self.requests += 1
        fail_at = int(os.environ.get("SGLANG_REPLICA_FAIL_REQUEST", "0") or 0)
        fail = body.get("_internal") is None and fail_at == self.requests
        cached = self.cached(ids)
        t_start = time.perf_counter()
        self.step("extend", extra_s=(len(ids) - cached) * 2e-7)
        rng = random.Random(hash(tuple(ids[-16:])) ^ len(ids))
        out: list[int] = [rng.randrange(1, 1000)]  # the prefill's token
        verify = correct = 0
        hist = [0] * self.num_draft
        first = True
        while True:
            finished = len(out) >= max_new
            meta: dict[str, Any] = {
                "id": rid, "finish_reason": {"type": "length", "length": max_new} if finished else None,
                "prompt_tokens": len(ids), "weight_version": "default", "num_retractions": 0,
                "reasoning_tokens": 0, "completion_tokens": len(out), "cached_tokens": cached,
            }
            if cached:
                meta["cached_tokens_details"] = {"device": cached, "host": 0}
            if first:
                meta["response_sent_to_client_ts"] = time.time()
                first = False
            if finished:
                meta["e2e_latency"] = time.perf_counter() - t_start
                if self.spec and verify:
                    proposed = verify * (self.num_draft - 1)
                    meta.update({"spec_accept_rate": correct / proposed, "spec_accept_length": len(out) / verify,
                                 "spec_num_correct_drafts": correct, "spec_num_proposed_drafts": proposed, "spec_verify_ct": verify,
                                 "spec_correct_drafts_histogram": hist})
                self.history.append(ids + out)
            yield {"text": "".join(f" t{i}" for i in out), "output_ids": list(out), "meta_info": meta}
            if finished:
                return
            if fail and len(out) >= 2:
                raise ValueError(os.environ.get("SGLANG_REPLICA_FAIL_MESSAGE", "Abort request: KV cache pool is full (replica)"))
            self.step("decode")
            if self.spec:
                acc = int(self.sim_acc) if self.sim_acc > 0 else rng.randint(1, self.num_draft)
                acc = max(1, min(acc, self.num_draft, max_new - len(out)))
                verify += 1
                correct += acc - 1
                hist[acc - 1] += 1
                self.accept_total += acc
                self.verify_total += 1
            else:
                acc = 1
            out += [rng.randrange(1, 1000) for _ in range(acc)]

    # -- profiler_manager
    def start_profile(self, req: dict[str, Any]) -> None:
        with self.prof_lock:
            if self.prof is not None:
                raise RuntimeError("Profiling is already in progress. Call /stop_profile first.")
            req = dict(req)
            req["output_dir"] = os.path.expanduser(req.get("output_dir") or os.environ.get("SGLANG_TORCH_PROFILER_DIR", "/tmp"))
            req["profile_id"] = req.get("profile_id") or str(time.time())
            self.prof, self.steps = req, []
        log.info("Profiling starts. Traces will be saved to: %s (with profile id: %s)", req["output_dir"], req["profile_id"])

    def stop_profile(self) -> None:
        with self.prof_lock:
            if self.prof is None:
                raise RuntimeError("Profiling is not in progress. Call /start_profile first.")
            req, steps = self.prof, list(self.steps)
            env = {k: v for k, v in os.environ.items() if k.startswith("SGLANG_")}
            env["_graphs"] = "0" if self.a.cuda_graph_backend_decode == "disabled" else "1"
            env["_overlap"] = "0" if self.a.disable_overlap_schedule else "1"
            env["_spec"] = "1" if self.spec else "0"
            env["_device"] = self.a.device or ""
            for _, q in self.ranks:
                q.put(("export", req["output_dir"], req["profile_id"], steps, env))
            done = 0
            while done < len(self.ranks):  # /stop_profile answers once the ranks exported
                if self.results.get()[0] == "exported":
                    done += 1
            self.prof, self.steps = None, []

    def server_info(self) -> dict[str, Any]:
        a = self.a
        max_total = 4 * self.context_len
        return {
            "model_path": a.model_path, "tp_size": a.tp, "ep_size": a.ep, "context_length": a.context_length, "host": a.host, "port": a.port,
            "speculative_algorithm": a.speculative_algorithm, "speculative_num_steps": a.speculative_num_steps,
            "speculative_eagle_topk": a.speculative_eagle_topk, "speculative_num_draft_tokens": a.speculative_num_draft_tokens,
            "disable_overlap_schedule": a.disable_overlap_schedule, "launch_command": " ".join(sys.argv),
            "status": "ready", "max_total_num_tokens": max_total, "max_req_input_len": min(self.context_len - 1, max_total - 1),
            "startup_time": self.startup_time, "kv_events": None,
            "internal_states": [{"avg_spec_accept_length": (self.accept_total / self.verify_total) if self.verify_total else None,
                                 "last_gen_throughput": 0.0, "memory_usage": {"weight": 0.0, "kvcache": 0.0, "token_capacity": max_total}}],
            "version": __version__, "frontend": "python",
        }


ENGINE: Engine | None = None


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt: str, *args: Any) -> None:  # uvicorn's access log: quiet here
        pass

    def _send(self, code: int, body: bytes, ctype: str = "application/json") -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)
        self.close_connection = True

    def _json(self, code: int, obj: Any) -> None:
        self._send(code, json.dumps(obj).encode())

    def _body(self) -> dict[str, Any] | None:
        n = int(self.headers.get("Content-Length") or 0)
        if not n:
            return None
        return json.loads(self.rfile.read(n) or b"null")

    def do_GET(self) -> None:
        self._route()

    def do_POST(self) -> None:
        self._route()

    def _route(self) -> None:
        e = ENGINE
        assert e is not None
        path = self.path.split("?", 1)[0]
        if path in ("/health", "/health_generate"):
            if e.gracefully_exit:
                log.info("Health check request received during shutdown. Returning 503.")
                return self._send(503, b"", "text/plain")
            return self._send(503 if e.status == "Starting" else 200, b"", "text/plain")
        if path == "/ready":
            return self._send(200 if e.status == "Up" and not e.gracefully_exit else 503, b"", "text/plain")
        if path in ("/server_info", "/get_server_info"):
            if path == "/get_server_info":
                log.warning("Endpoint '/get_server_info' is deprecated and will be removed in a future version. Please use '/server_info' instead.")
            return self._json(200, e.server_info())
        if path == "/start_profile":
            try:
                e.start_profile(self._body() or {})
            except RuntimeError:  # the tokenizer raises; FastAPI answers 500
                return self._send(500, b"Internal Server Error", "text/plain")
            return self._send(200, b"Start profiling.\n", "text/plain")
        if path == "/stop_profile":
            try:
                e.stop_profile()
            except RuntimeError as err:  # a window that closed itself (num_steps): the real server's 500
                log.error("Exception in ASGI application\nRuntimeError: %s", err)
                return self._send(500, b"Internal Server Error", "text/plain")
            return self._send(200, b"Stop profiling. This will take some time.\n", "text/plain")
        if path == "/generate":
            return self._generate()
        self._json(404, {"detail": "Not Found"})

    def _generate(self) -> None:
        e = ENGINE
        assert e is not None
        body = self._body() or {}
        e.in_flight += 1
        try:
            if not body.get("stream"):
                try:
                    ret = None
                    for ret in e.generate(body):
                        pass
                    return self._json(200, ret)
                except ValueError as err:
                    log.error("[http_server] Error: %s", err)
                    return self._json(400, {"error": {"message": str(err)}})
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.send_header("Connection", "close")
            self.end_headers()
            self.close_connection = True
            try:
                for out in e.generate(body):
                    self._chunk(b"data: " + json.dumps(out).encode() + b"\n\n")
            except ValueError as err:  # http_server.py stream_results
                log.error("[http_server] Error: %s", err)
                self._chunk(b"data: " + json.dumps({"error": {"message": str(err), "type": "invalid_request_error", "code": 400,
                                                              "retryable": False}}).encode() + b"\n\n")
            self._chunk(b"data: [DONE]\n\n")
            self.wfile.write(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass
        finally:
            e.in_flight -= 1

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()


def _model_context(model_path: str) -> int:
    cfg = Path(model_path) / "config.json"
    try:
        return int(json.loads(cfg.read_text()).get("max_position_embeddings", 131072))
    except (OSError, ValueError, TypeError):
        return 131072


def main(argv: list[str]) -> int:
    global ENGINE
    _setup_logging()
    p = argparse.ArgumentParser(prog="sglang.launch_server")
    p.add_argument("--model-path", required=True)
    p.add_argument("--tensor-parallel-size", "--tp-size", "--tp", dest="tp", type=int, default=1)
    p.add_argument("--ep-size", "--expert-parallel-size", dest="ep", type=int, default=1)
    p.add_argument("--context-length", type=int)
    p.add_argument("--speculative-algorithm")
    p.add_argument("--speculative-num-steps", type=int)
    p.add_argument("--speculative-eagle-topk", type=int)
    p.add_argument("--speculative-num-draft-tokens", type=int)
    p.add_argument("--disable-overlap-schedule", action="store_true")
    p.add_argument("--cuda-graph-backend-decode")
    p.add_argument("--bf16-gemm-backend")
    p.add_argument("--device", default=None)  # "cpu": SGLang's CPU engine (sgl_kernel CPU ops, no GPU activity in the traces)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    a, _unknown = p.parse_known_args(argv)  # the real flags are checked by SGLang's own parser elsewhere
    context_len = a.context_length or _model_context(a.model_path)

    ctx = mp.get_context("spawn")  # engine.py: mp.set_start_method("spawn")
    results = ctx.Queue()
    barrier = ctx.Barrier(a.tp)
    ranks = []
    for r in range(a.tp):
        q = ctx.Queue()
        pr = ctx.Process(target=run_scheduler_process, args=(r, a.tp, a.ep, a.port, q, results, barrier, a.bf16_gemm_backend), daemon=False)
        pr.start()
        ranks.append((pr, q))
    dq = ctx.Queue()
    detok = ctx.Process(target=run_detokenizer_process, args=(dq,), daemon=False)
    detok.start()
    for _ in range(a.tp):  # wait for every scheduler to report ready before binding HTTP
        msg = results.get(timeout=120)
        if msg[0] == "failed":  # engine.py: "Rank N scheduler is dead", then the launcher exits
            log.error("Rank %d scheduler is dead. Please check if there are relevant logs. %s", msg[1], msg[2])
            for pr, _ in ranks:
                pr.kill()
            detok.kill()
            return 1
        log.info("scheduler TP%d ready (pid %d)", msg[1], msg[2])

    ENGINE = e = Engine(a, context_len, ranks, results, (detok, dq))
    httpd = ThreadingHTTPServer((a.host, a.port), Handler)
    httpd.daemon_threads = True
    done = threading.Event()

    def warmup() -> None:
        time.sleep(0.2)
        for _ in e.generate({"input_ids": [0, 1, 2], "sampling_params": {"max_new_tokens": 8}, "_internal": True}):
            pass
        e.requests = 0
        e.status = "Up"
        log.info("The server is fired up and ready to roll!")

    def sigterm_watchdog() -> None:
        # tokenizer_manager.sigterm_watchdog: poll, drain, ShutdownReq, wait, kill the children left
        poll = _env_f("SGLANG_REPLICA_WATCHDOG_S", 0.5)
        while not e.gracefully_exit:
            time.sleep(0.05)
        time.sleep(poll)
        while e.in_flight > 0:
            log.info("Gracefully exiting... Remaining number of requests %d.", e.in_flight)
            time.sleep(poll)
        for _, q in ranks:
            q.put(("shutdown",))
        dq.put(("shutdown",))
        deadline = time.monotonic() + 15  # _SCHEDULER_EXIT_TIMEOUT_SECS
        for pr, _ in ranks:
            pr.join(max(0.0, deadline - time.monotonic()))
        detok.join(max(0.0, deadline - time.monotonic()))
        for pr in [pr for pr, _ in ranks] + [detok]:
            if pr.is_alive():
                pr.kill()
        log.info("Shutdown complete: every scheduler left its loop and released its memory.")
        httpd.shutdown()
        done.set()

    def on_signal(signum: int, frame: Any) -> None:
        log.info("Received sigterm (signal %d); starting the graceful shutdown.", signum)
        e.gracefully_exit = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    threading.Thread(target=warmup, daemon=True).start()
    threading.Thread(target=sigterm_watchdog, daemon=True).start()
    log.info("Uvicorn running on http://%s:%d (replica of SGLang %s)", a.host, a.port, __version__)
    httpd.serve_forever(poll_interval=0.1)
    done.wait(30)
    return 0
