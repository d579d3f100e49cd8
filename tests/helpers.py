"""Helpers several test modules share that are no part of profkit (profkit keeps no test-only code)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import polars as pl


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
