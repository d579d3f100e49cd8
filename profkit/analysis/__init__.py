"""Frames in, frames out: iterations, GPU busy/idle, bubbles, syncs, launches, categories."""

from profkit.analysis.rank import RankAnalysis, analyze_trace

__all__ = ["RankAnalysis", "analyze_trace"]
