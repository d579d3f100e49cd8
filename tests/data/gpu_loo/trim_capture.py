"""Trim a graph-capture profile to what profkit reads: runtime/driver calls, ranges, GPU records.

    python tests/data/gpu_loo/trim_capture.py IN.json.gz OUT.json.gz

Drops cpu_op, python_function, ac2g and other events (real events only, nothing edited).
"""

from __future__ import annotations

import gzip
import json
import sys

KEEP = {"cuda_runtime", "cuda_driver", "user_annotation", "kernel", "gpu_memcpy", "gpu_memset"}


def trim(src: str, dst: str) -> None:
    doc = json.loads(gzip.open(src).read())
    doc["traceEvents"] = [e for e in doc["traceEvents"] if e.get("ph") == "M" or e.get("cat") in KEEP]
    with gzip.open(dst, "wt", compresslevel=9) as f:
        json.dump(doc, f)


if __name__ == "__main__":
    trim(sys.argv[1], sys.argv[2])
