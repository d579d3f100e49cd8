"""Trim a recorded trace to its first N `scheduler.run_batch` iterations (real events, nothing edited).

    python tests/data/gpu_proxy/trim.py IN.trace.json.gz OUT.trace.json.gz [N]

Keeps every event that starts before the (N+1)-th run_batch marker, plus the GPU ops (and their
flows) whose launch call was kept, wherever they run; drops the rest.
"""

from __future__ import annotations

import gzip
import json
import sys


def trim(src: str, dst: str, n: int = 3) -> None:
    doc = json.loads(gzip.open(src).read())
    ev = doc["traceEvents"]
    marks = sorted(e["ts"] for e in ev if e.get("name") == "scheduler.run_batch" and e.get("cat") == "user_annotation")
    cut = marks[n] if len(marks) > n else float("inf")
    gpu = {"kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation"}
    kept_corr = {e["args"]["correlation"] for e in ev if e.get("cat") in ("cuda_runtime", "cuda_driver") and e["ts"] < cut
                 and "correlation" in e.get("args", {})}
    out = []
    for e in ev:
        if e.get("ph") == "M":
            out.append(e)
        elif e.get("cat") in gpu:
            c = e.get("args", {}).get("correlation")
            if c in kept_corr or (c is None and e["ts"] < cut):
                out.append(e)
        elif e.get("cat") == "ac2g":
            if e.get("id") in kept_corr:
                out.append(e)
        elif e.get("ts", 0) < cut:
            out.append(e)
    doc["traceEvents"] = out
    with gzip.open(dst, "wt", compresslevel=9) as f:
        json.dump(doc, f)


if __name__ == "__main__":
    trim(sys.argv[1], sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 3)
