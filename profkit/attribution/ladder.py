"""A sweep's ladder: every configuration against the first and against the one before it.

Pure: summaries in, rows out. Each comparison takes the same iterations and the same exact means
as `compare_summaries` (rank 0, the shape both sides share), so a ladder row and the diff of the
same two runs agree to the bit; only the headline numbers are computed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from profkit.attribution.diff import compare_means
from profkit.documents import Summary, summary_of, throughput_of


def ladder_steps(runs: Sequence[tuple[str, Summary | Mapping[str, Any]]], *, rank: int = 0) -> list[dict[str, Any]]:
    """One step per run, in order: ``label``; ``shape``, the label of the shape compared with the
    first run; ``wall_us`` and ``gpu_window_us``, the run's means over those iterations (µs per
    iteration); ``wall_delta_vs_first_us`` and ``wall_delta_vs_previous_us`` (None on the first
    step); ``tokens_per_s_per_user`` and ``tokens_per_s``, the run's first unprofiled workload point
    (median over its repeats; None without one). Fewer than two runs make no ladder: []. Raises as `compare_summaries` does (UsageError
    without the rank, NothingToAnalyze without iterations to compare)."""
    steps: list[dict[str, Any]] = []
    if len(runs) < 2:
        return steps
    typed = [(label, summary_of(s)) for label, s in runs]  # decoded once: each run is compared twice
    first = typed[0][1]
    prev = first
    for i, (label, s) in enumerate(typed):
        d0 = compare_means(first, s, rank=rank)
        dp = d0 if prev is first else compare_means(prev, s, rank=rank)  # against the first: the same comparison
        steps.append({
            "label": label, "shape": d0["shape_label"],
            "wall_us": d0["wall_us"]["candidate"], "gpu_window_us": d0["gpu_window_us"]["candidate"],
            "wall_delta_vs_first_us": None if i == 0 else d0["wall_us"]["delta"],
            "wall_delta_vs_previous_us": None if i == 0 else dp["wall_us"]["delta"],
            **_tokens(s),
        })
        prev = s
    return steps


def _tokens(summary: Summary) -> dict[str, float | None]:
    """The run's unprofiled tokens/s (its manifest's, or its `run` section's, first workload point)."""
    pts = throughput_of(summary.manifest) or throughput_of(summary.run)
    if not pts:
        return {"tokens_per_s_per_user": None, "tokens_per_s": None}
    return {"tokens_per_s_per_user": pts[0].median("tokens_per_s_per_user_p50"), "tokens_per_s": pts[0].median("tokens_per_s")}
