"""HTTP front end of the proxy engine: the subset of SGLang's surface that profkit uses.

    python -m profkit.proxy.server --port 30000 [--opts all|none|a,b] [--device cpu|cuda]

GET /health, /health_generate, /ready, /get_server_info, /server_info, /model_info;
POST /generate (`"stream": true`: SGLang's text/event-stream), /start_profile, /stop_profile (GET
works for the profile endpoints too). `--tp N`: ranks 1..N-1 are child processes (see tp.py).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import queue
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from . import config as C
from profkit.http import free_port

log = logging.getLogger("profkit.proxy")


def _bool_env(name: str, default: bool = True) -> bool:
    v = os.environ.get(name)
    if v is None:
        return default
    return v.strip().lower() not in ("0", "false", "no", "off", "")


class Engine:
    """Model + scheduler + the state the HTTP handlers read."""

    def __init__(self, cfg: C.ProxyConfig, args: dict):
        import torch

        from .scheduler import Scheduler

        self.torch = torch
        self.cfg = cfg
        self.args = args
        if cfg.device.startswith("cuda") and torch.device(cfg.device).index is not None:
            torch.cuda.set_device(torch.device(cfg.device))
        torch.manual_seed(cfg.seed)
        threads = args.get("cpu_threads")
        if threads and not cfg.device.startswith("cuda"):
            torch.set_num_threads(threads)
        self.workers = []
        tp = None
        if cfg.tp_size > 1:
            from . import tp as T

            init = f"tcp://127.0.0.1:{free_port()}"
            self.workers = T.spawn_workers(cfg, init, args)
            log.info("TP %d: started ranks 1..%d (pids %s), init %s", cfg.tp_size,
                     cfg.tp_size - 1, [p.pid for p in self.workers], init)
            joined = threading.Event()

            def watch_start():  # a rank that dies before joining would leave us in the rendezvous
                while not joined.wait(0.2):
                    for r, p in enumerate(self.workers, 1):
                        if p.poll() is not None:
                            log.error("TP rank %d exited with code %s during start-up", r,
                                      p.returncode)
                            T.stop_workers(self.workers, timeout=0)
                            os._exit(4)

            threading.Thread(target=watch_start, name="tp-start-watch", daemon=True).start()
            try:
                tp = T.init_distributed(cfg, 0, init)
            except BaseException:
                T.stop_workers(self.workers, timeout=0)
                raise
            finally:
                joined.set()
        self.tp = tp
        self.sched = Scheduler(cfg, tp=tp)
        self.ready = False
        self.shutting_down = False
        self.startup_time = time.time()

    def alive(self) -> bool:
        return self.sched.alive() and all(p.poll() is None for p in self.workers)

    def stop(self):
        """Stop the scheduler (it broadcasts the stop to the other ranks), then the ranks."""
        self.shutting_down = True
        self.sched.shutdown()
        if self.workers:
            from . import tp as T

            T.stop_workers(self.workers, timeout=3.0)

    def start(self, warmup: bool = True):
        self.sched.start()
        if warmup:
            from .scheduler import Req

            t = time.perf_counter()
            r = Req(list(range(1, 33)), 8, rid="warmup")
            self.sched.submit(r)
            if not r.finished.wait(600) or r.error:
                raise RuntimeError(f"warm-up request failed: {r.error}")
            log.info("warm-up request done in %.2fs", time.perf_counter() - t)
        self.ready = True

    def _kernels(self) -> dict:
        if getattr(self, "_kernels_info", None) is None:
            try:
                from profkit.proxy import kernels

                self._kernels_info = kernels.backends(self.cfg.device)
            except Exception as ex:  # never fail /server_info over it
                self._kernels_info = {"error": f"{type(ex).__name__}: {ex}"[:300]}
        return self._kernels_info

    def server_info(self) -> dict:
        torch = self.torch
        dev = self.cfg.device
        name = torch.cuda.get_device_name(torch.device(dev)) if dev.startswith("cuda") else "cpu"
        from profkit import __version__

        info = dict(self.args)
        info.update({
            "engine": "profkit-proxy",
            "version": __version__,
            "profkit_version": __version__,
            "torch_version": torch.__version__,
            "cuda_version": torch.version.cuda,
            "device": dev,
            "tp_size": self.cfg.tp_size,
            "rank_devices": [self.cfg.rank_device(r) if self.cfg.tp_size > 1 else dev
                             for r in range(self.cfg.tp_size)],
            "device_name": name,
            "dtype": self.cfg.dtype,
            "switches": self.cfg.switch_states(),
            "kernels": self._kernels(),  # which implementation topk_v2 / indexer_fusion run
            "model": self.cfg.size.__dict__,
            "speculative_algorithm": "EAGLE" if self.cfg.spec else None,
            "speculative_num_steps": self.cfg.speculative_num_steps,
            "speculative_num_draft_tokens": (self.cfg.speculative_num_steps + 1
                                             if self.cfg.spec else None),
            "speculative_eagle_topk": 1 if self.cfg.spec else None,
            "simulate_acc_len": self.cfg.simulate_acc_len,
            "startup_time": self.startup_time,
            "internal_states": [self.sched.internal_state()],
        })
        return info


class Handler(BaseHTTPRequestHandler):
    engine: Engine = None  # set by make_server
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *a):  # quiet access log (debug level)
        log.debug("%s - " + fmt, self.address_string(), *a)

    # -- helpers -------------------------------------------------------------------------------
    def _send(self, code: int, body, ctype="application/json"):
        data = (json.dumps(body) if ctype == "application/json" else body).encode()
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _text(self, code: int, text: str):
        self._send(code, text, "text/plain; charset=utf-8")

    def _body(self) -> dict:
        n = int(self.headers.get("Content-Length") or 0)
        if n <= 0:
            return {}
        raw = self.rfile.read(n)
        if not raw.strip():
            return {}
        obj = json.loads(raw)
        if not isinstance(obj, dict):
            raise ValueError("the JSON body must be an object")
        return obj

    # -- routing -------------------------------------------------------------------------------
    def do_GET(self):
        path = self.path.split("?")[0]
        e = self.engine
        if path in ("/health", "/health_generate", "/ready"):
            if e.ready and not e.shutting_down and e.alive():
                return self._text(200, "")
            return self._text(503, "not ready" if not e.ready else "unhealthy")
        if path in ("/get_server_info", "/server_info"):
            return self._send(200, e.server_info())
        if path in ("/model_info", "/get_model_info"):
            return self._send(200, {"model_path": "profkit-proxy", "is_generation": True,
                                    "model_type": "glm_moe_dsa_proxy",
                                    "architectures": ["ProfkitProxyGlmMoeDsa"]})
        if path in ("/start_profile", "/stop_profile"):
            return self._post(path, {})
        return self._text(404, f"unknown endpoint {path}")

    def do_POST(self):
        path = self.path.split("?")[0]
        try:
            body = self._body()
        except (ValueError, json.JSONDecodeError) as ex:
            return self._text(400, f"invalid JSON body: {ex}")
        return self._post(path, body)

    def _post(self, path: str, body: dict):
        if path == "/generate":
            return self._generate(body)
        if path == "/start_profile":
            return self._start_profile(body)
        if path == "/stop_profile":
            return self._stop_profile()
        if path == "/flush_cache":
            return self._text(400, "flush_cache is not supported by the proxy engine")
        return self._text(404, f"unknown endpoint {path}")

    def _generate(self, body: dict):
        from .scheduler import Req

        e = self.engine
        if not e.ready or e.shutting_down:
            return self._text(503, "server not ready")
        ids = body.get("input_ids")
        if ids is None:
            return self._text(400, "the proxy engine has no tokenizer: send input_ids")
        vocab = e.cfg.size.vocab_size
        if (not isinstance(ids, list) or not ids or
                not all(isinstance(t, int) and 0 <= t < vocab for t in ids)):
            return self._text(400, f"input_ids must be a non-empty list of ints in [0, {vocab})")
        sp = body.get("sampling_params") or {}
        try:
            n = int(sp.get("max_new_tokens", 128))
        except (TypeError, ValueError):
            return self._text(400, "max_new_tokens must be an int")
        if n < 1:
            return self._text(400, "max_new_tokens must be >= 1")
        req = Req(ids, n, rid=body.get("rid"))
        stream = bool(body.get("stream"))
        if stream:
            req.stream = queue.Queue()
        try:
            e.sched.submit(req)
        except (ValueError, RuntimeError) as ex:
            return self._text(400 if isinstance(ex, ValueError) else 503, str(ex))
        if stream:
            return self._stream(req)
        req.finished.wait()
        if req.error:
            return self._text(500, req.error)
        return self._send(200, {"output_ids": req.output_ids, "text": "",
                                "meta_info": req.meta_info(e.cfg.spec)})

    # -- streaming (SGLang's format: one `data: {json}` event per step, then `data: [DONE]`) -------
    def _chunk(self, data: bytes):
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def _event(self, obj) -> None:
        self._chunk(b"data: " + (obj if isinstance(obj, bytes) else json.dumps(obj).encode())
                    + b"\n\n")

    def _stream(self, req):
        """Every decode step: the NEW output ids and meta_info with completion_tokens so far; then a
        final chunk (no new ids) with the full meta_info incl. finish_reason; then [DONE]."""
        e = self.engine
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        n = 0
        try:
            while True:
                try:
                    new = req.stream.get(timeout=1.0)
                except queue.Empty:
                    if e.shutting_down or not e.alive():
                        req.error = req.error or "server shutting down"
                        break
                    continue
                if new is None:
                    break
                n += len(new)
                self._event({"text": "", "output_ids": new, "meta_info": {
                    "id": req.rid, "finish_reason": None, "prompt_tokens": len(req.input_ids),
                    "completion_tokens": n, "cached_tokens": req.cached_len}})
            if req.error:
                self._event({"error": {"message": req.error}})
            else:
                self._event({"text": "", "output_ids": [], "meta_info": req.meta_info(e.cfg.spec)})
            self._event(b"[DONE]")
            self._chunk(b"")
        except (BrokenPipeError, ConnectionResetError):
            log.debug("stream client went away (request %s)", req.rid)
            self.close_connection = True

    def _start_profile(self, body: dict):
        from .scheduler import ProfileError

        e = self.engine
        out = body.get("output_dir") or os.environ.get("SGLANG_TORCH_PROFILER_DIR") or "/tmp"
        num = body.get("num_steps")
        try:
            num = int(num) if num is not None else None
        except (TypeError, ValueError):
            return self._text(400, "num_steps must be an int")
        ws, rs = body.get("with_stack"), body.get("record_shapes")
        req = {
            "output_dir": out, "num_steps": num,
            "activities": body.get("activities") or ["CPU", "GPU"],
            "with_stack": (ws if ws is not None else True) and _bool_env("SGLANG_PROFILE_WITH_STACK"),
            "record_shapes": ((rs if rs is not None else True)
                              and _bool_env("SGLANG_PROFILE_RECORD_SHAPES")),
            "profile_id": str(body.get("profile_id") or time.time()),
        }
        try:
            e.sched.start_profile(req)
        except ProfileError as ex:
            return self._text(500, str(ex))
        return self._text(200, "Start profiling.\n")

    def _stop_profile(self):
        from .scheduler import ProfileError

        try:
            self.engine.sched.stop_profile()
        except ProfileError as ex:
            return self._text(500, str(ex))
        return self._text(200, "Stop profiling. This will take some time.\n")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m profkit.proxy.server",
        description="profkit's proxy engine: a GLM-5.2-shaped serving engine (DSA indexer, sparse "
        "MLA-like attention, routed MoE + shared expert, MTP speculative decoding) with random "
        "weights, serving SGLang's /generate, /start_profile, /stop_profile, /health and "
        "/server_info over HTTP. Every optimization of the GLM-5.2 study is a switch (--opts).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--skip-server-warmup", action="store_true",
                   help="mark ready without the 8-token warm-up request")
    p.add_argument("--log-level", default="info")
    C.add_cli_args(p)
    return p


def main(argv=None) -> int:
    p = build_parser()
    ns = p.parse_args(argv)
    logging.basicConfig(level=getattr(logging, ns.log_level.upper(), logging.INFO),
                        format="[%(asctime)s] %(message)s", stream=sys.stderr)
    try:
        import torch
    except ImportError:
        print("error: the proxy engine needs torch (pip install 'profkit[engine]')",
              file=sys.stderr)
        return 2
    try:
        cfg = C.config_from_args(ns, torch.cuda.is_available())
    except ValueError as ex:
        p.error(str(ex))
    if cfg.device.startswith("cuda") and not torch.cuda.is_available():
        p.error("--device cuda but torch sees no CUDA device")
    for name, state in cfg.switch_states().items():
        if state.startswith("n/a"):
            log.warning("switch %-22s %s: not applicable on this device (%s)", name, state,
                        C.SWITCH_HELP[name])
        else:
            log.info("switch %-22s %s", name, state.upper())
    log.info("device %s dtype %s; model %s; spec steps %d, simulated accept length %.2f",
             cfg.device, cfg.dtype, cfg.size, cfg.speculative_num_steps, cfg.simulate_acc_len)
    args = {k: v for k, v in vars(ns).items()}
    args.update(cfg.size.__dict__)
    args.update({"opts": sorted(cfg.switches), "device": cfg.device, "dtype": cfg.dtype,
                 "num_pages": cfg.num_pages, "chunked_prefill_size": cfg.chunked_prefill_size,
                 "simulate_acc_len": cfg.simulate_acc_len, "page_size": cfg.page_size})
    stopping: list[int] = []  # not a threading.Event: its set(), from a handler run inside the main thread's
    # wait(), waits for the lock that wait() holds, on the same thread: a hang (capture/process.Flag)

    def on_signal(signum, frame):
        stopping.append(signum)  # logged by the main loop: a handler that writes can cut into a write under way

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    engine = Engine(cfg, args)
    Handler.engine = engine
    try:
        httpd = ThreadingHTTPServer((ns.host, ns.port), Handler)
    except OSError as ex:
        log.error("cannot bind %s:%d: %s", ns.host, ns.port, ex)
        engine.stop()
        return 4
    httpd.daemon_threads = True
    th = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.2},
                          name="proxy-http", daemon=True)
    th.start()
    log.info("HTTP server listening on http://%s:%d", ns.host, ns.port)
    try:
        engine.start(warmup=not ns.skip_server_warmup)
    except Exception as ex:
        log.error("start-up failed: %s", ex)
        engine.stop()
        httpd.shutdown()
        httpd.server_close()
        return 4
    if not stopping:
        log.info("The server is fired up and ready to roll!")
    while not stopping:
        time.sleep(0.5)
        if not engine.alive():
            log.error("scheduler died: %r (rank exit codes %s)", engine.sched.crashed,
                      [p.poll() for p in engine.workers])
            break
    if stopping:
        log.info("received signal %d, shutting down", stopping[0])
    engine.stop()
    httpd.shutdown()
    httpd.server_close()
    log.info("shut down")
    return 0 if stopping else 1


if __name__ == "__main__":
    sys.exit(main())
