"""Trace helpers several test modules share: the shape fixtures' table, a plain second count over raw events,
analysis run after run, reading and writing trace JSON."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import polars as pl

from support.paths import DATA

# the H200 traces recorded with shapes (tests/data/gpu_shapes/README.md): trace, --marker, graph-capture profiles
SHAPES = DATA / "gpu_shapes"
CAPTURES = SHAPES / "proxy_graphs" / "graph_capture_profile"
SHAPE_CASES = {
    "hf_bs1": (SHAPES / "hf_llama12_bs1.pt.trace.json.gz", r"^(decode_step|prefill)$", None),
    "hf_bs8": (SHAPES / "hf_llama12_bs8.pt.trace.json.gz", r"^(decode_step|prefill)$", None),
    "proxy_eager": (next((SHAPES / "proxy_eager").glob("*.trace.json.gz")), None, None),
    "proxy_graphs": (next((SHAPES / "proxy_graphs").glob("*.trace.json.gz")), None, CAPTURES),
}


def analyze_paths(paths: list[Path], **kw: Any) -> list[Any]:
    """Every rank analysis of the runs `paths` hold, run after run (analysis.parallel.analyze_runs, which
    `analyze` and `diff` use, flattened)."""
    from profkit.analysis.parallel import analyze_runs

    return [a for r in analyze_runs(paths, **kw) for a in r.analyses]


def gap_cpu_ops(trace: Any, g0s: pl.Series, g1s: pl.Series, tids: pl.Series) -> pl.DataFrame:
    """analysis.bubbles.gap_tops as rows (_g: the gap's position, name, ns), most time first within a gap."""
    import numpy as np

    from profkit.analysis.bubbles import gap_tops

    top_id, top_ns, names = gap_tops(trace, g0s, g1s, tids)
    n, top = top_id.shape
    flat = pl.DataFrame({"_g": np.repeat(np.arange(n, dtype=np.int64), top), "k": top_id.reshape(-1), "ns": top_ns.reshape(-1)})
    flat = flat.filter(pl.col("k") >= 0)
    return flat.select("_g", names.gather(flat["k"]).alias("name"), "ns")


def gzip_library() -> str:
    """The gzip module profkit's reader can import first (ingest/reading.py tries isal, then zlib-ng, then the stdlib)."""
    for mod, label in (("isal", "isal"), ("zlib_ng", "zlib-ng")):
        try:
            __import__(mod)
            return label
        except ImportError:
            pass
    return "zlib"


# A plain count over a trace's raw events (gzip + json, no profkit code): the independent side of the
# time identities (DESIGN.md "Time inside a window": every GPU op of any owner, by the clock).
GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset", "memcpy", "memset"}


def raw_gpu_ops(path: Path) -> list[tuple[int, int]]:
    """Every GPU op of the file as (start, end) in absolute integer ns (round(µs * 1000), exact)."""
    import gzip
    import json
    from fractions import Fraction

    def ns(us: Any) -> int:
        return round(Fraction(us) * 1000)

    with gzip.open(path, "rb") as f:
        doc = json.load(f)
    evs = doc["traceEvents"] if isinstance(doc, dict) else doc
    out = []
    for e in evs:
        if e.get("ph") == "X" and str(e.get("cat", "")).lower() in GPU_CATS and e.get("dur") is not None and e.get("ts") is not None:
            a = ns(e["ts"])
            out.append((a, a + ns(e["dur"])))
    return out


def union_inside(ops: list[tuple[int, int]], g0: int, g1: int) -> int:
    """ns of [g0, g1) covered by at least one op."""
    iv = sorted((max(a, g0), min(b, g1)) for a, b in ops if min(b, g1) > max(a, g0))
    total, cur = 0, None
    for a, b in iv:
        if cur is None or a > cur[1]:
            total += 0 if cur is None else cur[1] - cur[0]
            cur = [a, b]
        else:
            cur[1] = max(cur[1], b)
    return total + (0 if cur is None else cur[1] - cur[0])


def sum_inside(ops: list[tuple[int, int]], g0: int, g1: int) -> int:
    """ns of the ops inside [g0, g1), each clipped to it, overlaps counted twice."""
    return sum(min(b, g1) - max(a, g0) for a, b in ops if min(b, g1) > max(a, g0))


def load_trace_json(path: Path) -> dict:
    """A gzipped Kineto trace as plain JSON (for tests that alter a real trace)."""
    import gzip
    import json

    with gzip.open(path, "rt") as f:
        return json.load(f)


def save_trace_json(doc: dict, path: Path) -> Path:
    """Write an altered trace back, gzipped."""
    import gzip
    import json

    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt") as f:
        json.dump(doc, f)
    return path
