"""Frames in, frames out: iterations, GPU busy/idle, bubbles, syncs, launches, categories.

The package's names load on first use (PEP 562): importing a light submodule (graphs.find_capture_files
on a cached `analyze`) must not import polars through rank.py.
"""

from typing import Any

__all__ = ["RankAnalysis", "analyze_trace"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from profkit.analysis import rank

        return getattr(rank, name)
    raise AttributeError(f"module 'profkit.analysis' has no attribute {name!r}")
