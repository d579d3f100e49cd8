"""Tiny synthetic Kineto traces for edge cases no real trace shows on demand.

Times are given in integer nanoseconds and written as Kineto does: microsecond floats with three
decimals. Every GPU op is linked to its launch call by a fresh correlation id.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
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
