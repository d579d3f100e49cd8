"""A sweep's ladder: every configuration against the first and against the one before it.

Pure: summaries in, rows out. Each comparison takes the same iterations and the same exact means
as `compare_summaries` (rank 0, the shape both sides share), so a ladder row and the diff of the
same two runs agree to the bit; only the headline numbers are computed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, TypedDict

from profkit.attribution.diff import compare_summaries
from profkit.documents import Summary, summary_of, throughput_of


class Tokens(TypedDict):
    """A run's first unprofiled workload point: tokens/s per user and in all (medians over its repeats; None: none)."""
    tokens_per_s_per_user: float | None
    tokens_per_s: float | None


class LadderStep(Tokens):
    """One run of the ladder (ladder_steps says what each figure is)."""
    label: str
    shape: str
    wall_us: float
    gpu_window_us: float
    wall_delta_vs_first_us: float | None
    wall_delta_vs_previous_us: float | None
    windows: int


def ladder_steps(runs: Sequence[tuple[str, Summary | Mapping[str, Any]]], *, rank: int = 0,
                 windows: Sequence[Sequence[Summary | Mapping[str, Any]]] | None = None) -> list[LadderStep]:
    """One step per run, in order: ``label``; ``shape``, the label of the shape compared with the
    first run; ``wall_us`` and ``gpu_window_us``, the run's means over those iterations (µs per
    iteration); ``wall_delta_vs_first_us`` and ``wall_delta_vs_previous_us`` (None on the first
    step); ``windows``, how many profile windows each figure is the median over; ``tokens_per_s_per_user``
    and ``tokens_per_s``, the run's first unprofiled workload point (median over its repeats; None
    without one). Fewer than two runs make no ladder: [].

    `windows`: each run's profile-window summaries (empty or absent: the run's one summary). Then
    every figure is the diff's statistic (DESIGN.md "One statistic, everywhere"): a run's figure the
    median over its windows, a change the median over paired windows (window i of each run) of the
    per-window change, so a ladder row and the step's diff show the same numbers. Raises as
    `compare_summaries` does (UsageError without the rank, NothingToAnalyze without iterations to compare)."""
    steps: list[LadderStep] = []
    if len(runs) < 2:
        return steps
    typed = [(label, summary_of(s)) for label, s in runs]  # decoded once: each run is compared twice
    given = list(windows) if windows is not None else [()] * len(typed)
    wins = [[summary_of(w) for w in ws] for ws in given]
    first = prev = 0
    for i, ((label, s), w) in enumerate(zip(typed, wins)):
        # each figure is the step's diff's own (compare_summaries: the shape from the first windows that share one,
        # windows without it left out, the median over the rest): a loaded run's empty profile window once made
        # the ladder's median over every pair disagree with the diff's
        d0 = _diff(typed[first][1], wins[first], s, w, rank)
        dp = d0 if prev == first else _diff(typed[prev][1], wins[prev], s, w, rank)
        tokens = _tokens(s)
        steps.append(LadderStep(
            label=label, shape=d0.shape.label,
            wall_us=float(d0.wall_us.candidate or 0.0),
            gpu_window_us=float(d0.gpu_window_us.candidate or 0.0),
            wall_delta_vs_first_us=None if i == 0 else d0.wall_us.delta,
            wall_delta_vs_previous_us=None if i == 0 else dp.wall_us.delta,
            windows=min(len(wins[first]) or 1, len(w) or 1),
            tokens_per_s_per_user=tokens["tokens_per_s_per_user"], tokens_per_s=tokens["tokens_per_s"],
        ))
        prev = i
    return steps


def _diff(base: Summary, base_windows: Sequence[Summary], cand: Summary, cand_windows: Sequence[Summary], rank: int) -> Any:
    """compare_summaries of two runs with their profile windows (none: the run's summary alone)."""
    return compare_summaries(base, cand, baseline_repeats=base_windows, candidate_repeats=cand_windows, rank=rank)


def _tokens(summary: Summary) -> Tokens:
    """The run's unprofiled tokens/s (its manifest's, or its `run` section's, first workload point)."""
    pts = throughput_of(summary.manifest) or throughput_of(summary.run)
    if not pts:
        return Tokens(tokens_per_s_per_user=None, tokens_per_s=None)
    return Tokens(tokens_per_s_per_user=pts[0].median("tokens_per_s_per_user_p50"), tokens_per_s=pts[0].median("tokens_per_s"))
