"""Tiny synthetic Kineto traces for edge cases no real trace shows on demand.

Times are given in integer nanoseconds and written as Kineto does: microsecond floats with three
decimals. Every GPU op is linked to its launch call by a fresh correlation id.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any


class TraceBuilder:
    def __init__(self, *, pid: int = 100, tid: int = 100, device: int = 0, stream: int = 7) -> None:
        self.events: list[dict[str, Any]] = []
        self.pid, self.tid, self.device, self.stream = pid, tid, device, stream
        self._corr = 1000
        self.extra: dict[str, Any] = {}

    @staticmethod
    def _us(ns: int) -> float:
        return round(ns / 1000.0, 3)

    def cpu(self, name: str, ts: int, dur: int, *, cat: str = "user_annotation", tid: int | None = None) -> dict[str, Any]:
        ev = {"ph": "X", "cat": cat, "name": name, "pid": self.pid, "tid": self.tid if tid is None else tid,
              "ts": self._us(ts), "dur": self._us(dur), "args": {}}
        self.events.append(ev)
        return ev

    def call(self, api: str, ts: int, dur: int, *, corr: int | None = None, tid: int | None = None, cat: str = "cuda_runtime") -> int:
        if corr is None:
            self._corr += 1
            corr = self._corr
        self.events.append({"ph": "X", "cat": cat, "name": api, "pid": self.pid, "tid": self.tid if tid is None else tid,
                            "ts": self._us(ts), "dur": self._us(dur), "args": {"correlation": corr}})
        return corr

    def op(self, name: str, ts: int, dur: int, corr: int, *, cat: str = "kernel", stream: int | None = None, **args: Any) -> None:
        s = self.stream if stream is None else stream
        self.events.append({"ph": "X", "cat": cat, "name": name, "pid": self.device, "tid": s, "ts": self._us(ts), "dur": self._us(dur),
                            "args": {"device": self.device, "stream": s, "correlation": corr, **args}})

    def kernel(self, name: str, launch_ts: int, start: int, dur: int, *, api: str = "cudaLaunchKernel", launch_dur: int = 3000,
               stream: int | None = None) -> int:
        corr = self.call(api, launch_ts, launch_dur)
        self.op(name, start, dur, corr, stream=stream)
        return corr

    def memcpy(self, kind: str, launch_ts: int, launch_dur: int, start: int, dur: int, *, api: str = "cudaMemcpyAsync",
               src: str = "Device", dst: str = "Pageable") -> int:
        corr = self.call(api, launch_ts, launch_dur)
        self.op(f"Memcpy {kind} ({src} -> {dst})", start, dur, corr, cat="gpu_memcpy", bytes=4)
        return corr

    def doc(self) -> dict[str, Any]:
        return {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "Synthetic GPU"}], **self.extra, "traceEvents": self.events}

    def write(self, path: Path) -> Path:
        data = json.dumps(self.doc()).encode()
        if path.suffix == ".gz":
            data = gzip.compress(data)
        path.write_bytes(data)
        return path


def http(url: str, body: Any = None, timeout: float = 900) -> tuple[int, str]:
    """GET (no body) or POST JSON to a test server: (status, text), HTTP errors included. The default
    timeout only guards against a hang (processes.HANG_S): a loaded host answers late, not wrong."""
    import urllib.error
    import urllib.request

    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method="GET" if body is None else "POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


# --- traces several test modules share (diff, reports, the CLI, Perfetto) ---

US = 1000
# a catalog with two optimizations: topk_v2 owns the topk category, cuda_graph none
CATALOG = SimpleNamespace(name="test", optimizations={"topk_v2": ("topk",), "cuda_graph": ()})


def decode_trace(kernels: list[tuple[str, int]], *, n: int = 6, period: int = 400, bs: int = 1, sync: bool = False,
                 gap_after: dict[str, int] | None = None, jitter: int = 0, stream2: list[tuple[str, int]] = ()) -> TraceBuilder:
    """n decode iterations of `period` µs; kernels (name, µs) run back to back from 20 µs into each
    iteration, launched well ahead; `gap_after[name]` µs of launch-bound idle after that kernel."""
    b = TraceBuilder()
    gap_after = gap_after or {}
    for i in range(n):
        s = i * period * US
        b.cpu("scheduler.run_batch", s, (period - 10) * US)
        b.cpu(f"step[DECODE bs={bs}]", s + 1 * US, (period - 12) * US)
        t = s + 20 * US
        lt = s + 2 * US
        for name, dur in kernels:
            d = (dur + (jitter if i % 2 else 0)) * US
            b.kernel(name, lt, t, d, launch_dur=500)
            lt += 1 * US
            t += d
            if name in gap_after:
                # the next kernel's launch starts after the GPU went idle: a launch bubble
                t += gap_after[name] * US
                lt = t - 1 * US
        for name, dur in stream2:
            b.kernel(name, s + 3 * US, s + 20 * US, dur * US, stream=9, launch_dur=500)
        if sync:
            b.cpu("aten::item", t + 1 * US, 20 * US, cat="cpu_op")
            b.cpu("aten::_local_scalar_dense", t + 2 * US, 18 * US, cat="cpu_op")
            b.memcpy("DtoH", t + 3 * US, 10 * US, t + 5 * US, 2 * US)
            b.call("cudaStreamSynchronize", t + 14 * US, 2 * US)
    return b


BASE = [("gemm_qkv", 40), ("attention_decode", 50), ("topk_select", 30), ("gemm_out", 40)]


def summarize(b: TraceBuilder, tmp_path: Path, name: str) -> dict:
    """summary.json of the trace `b` (written to tmp_path/name), generic catalog."""
    from profkit.analysis import analyze_trace
    from profkit.analysis.summary import build_summary
    from profkit.analysis.catalog import load_catalog
    from profkit.ingest import load_trace

    p = b.write(tmp_path / f"{name}.pt.trace.json.gz")
    return build_summary([analyze_trace(load_trace(p), catalog=load_catalog("generic"))])


def synthetic_trace() -> TraceBuilder:
    """Three decode iterations whose every number is fixed by construction (tests/test_analysis_synthetic.py)."""
    b = TraceBuilder()
    for i, (s, d) in enumerate(((0, 100), (200, 100), (400, 100))):
        b.cpu("scheduler.run_batch", s * US, d * US)
        b.cpu(f"step[DECODE bs={i + 1}]", (s + 1) * US, (d - 2) * US)
    # iteration 0: two back-to-back kernels, then a launch-bound gap, then an iteration-boundary gap
    b.kernel("k1", 10 * US, 20 * US, 10 * US)
    b.kernel("k2", 13 * US, 30 * US, 20 * US)
    b.kernel("k3", 80 * US, 85 * US, 10 * US)
    # iteration 1: .item() = pageable D2H copy + stream sync inside aten::_local_scalar_dense
    b.kernel("k4", 210 * US, 215 * US, 15 * US)
    b.cpu("aten::item", 217 * US, 34 * US, cat="cpu_op")
    b.cpu("aten::_local_scalar_dense", 218 * US, 32 * US, cat="cpu_op")
    b.memcpy("DtoH", 220 * US, 25 * US, 235 * US, 5 * US)
    b.call("cudaStreamSynchronize", 246 * US, 1 * US)
    b.kernel("k5", 260 * US, 265 * US, 5 * US)
    b.kernel("k6", 267 * US, 290 * US, 10 * US)  # launched before the GPU went idle at 270: gpu_wait
    b.kernel("x_late", 395 * US, 445 * US, 15 * US, stream=8)  # launched in it1, runs in it2's window
    # iteration 2: one graph launch replaying two kernels (same correlation)
    corr = b.call("cudaGraphLaunch", 410 * US, 5 * US)
    b.op("g1", 420 * US, 10 * US, corr)
    b.op("g2", 430 * US, 10 * US, corr)
    return b


# kernel names and a manifest that try to break out of HTML and Markdown
SCRIPT_NAME = "<script>alert(1)</script>"
HOSTILE = [
    (SCRIPT_NAME, 6),
    ("<img src=x onerror=\"document.body.setAttribute('data-pwned','img')\">", 4),
    ("</script><script>document.body.setAttribute('data-pwned','breakout')</script>", 3),
    ("evil|pipe `tick` @everyone **bold** [link](javascript:alert(2)) & <b>x</b>", 2),
]
HOSTILE_MANIFEST = {"command": "python serve.py --name '</script><script>alert(3)</script>'", "opts": ["topk_v2"],
                    "gpu": "<img src=y onerror=alert(4)>"}
