"""The names of the decomposition's terms and per-iteration figures that analysis, catalogs, attribution and the
renderers share (no profkit imports: a catalog checks its optimizations' phases and idle causes against these without
loading polars)."""

from __future__ import annotations

from typing import NamedTuple

# where in the iteration an op ran (DESIGN.md "Phase"), in precedence order (profkit.analysis.phases)
PHASES = ("draft_extend", "draft", "verify", "decode", "extend", "sampling", "other")
# what a bubble waited for (DESIGN.md "Bubble"; profkit.analysis.bubbles). "python" only on a CPU-only
# timeline (analysis/rank.cpu_as_device): a gap between two aten ops inside an iteration is host time in
# Python (model glue, the sampler's bookkeeping, the scheduler), never a kernel launch
CAUSES = ("sync", "launch", "iteration_boundary", "gpu_wait", "python")


class PerIteration(NamedTuple):
    """A per-iteration figure, declared once: summary.json's iteration field (``memcpy_d2h`` is memcpy["d2h"]) and
    diff.json's key under `counts` or `timings`. The diff (attribution/diff.py), its renderers (terminal, HTML,
    Markdown, the figures) and diff.json's `series` iterate PER_ITERATION, so a new count is one line here plus
    its computation (analysis/rank.py, analysis/summary.py) and its field on documents.Iteration."""
    key: str
    unit: str  # "count" or "µs"
    label: str  # in words, as a diff's tables say it (a GPU timeline's; report/vocab.py words gpu_kernels per timeline)
    kind: str  # "count": diff.json's counts (the median per iteration); "timing": its timings (the median µs)
    gpu_only: bool = False  # a CPU-only timeline never has it (the banner says it is 0): not listed for one
    series: bool = False  # in diff.json's `series` (every iteration, for the per-iteration figure)
    panel: int | None = None  # the per-iteration figure's panel: 1 launches, 2 syncs and bubbles; None: not drawn
    card: bool = False  # a headline card of the HTML diff
    md_label: str | None = None  # a timing's label in the Markdown diff; None: not in its table


PER_ITERATION = (
    PerIteration("gpu_kernels", "count", "GPU kernels", "count", series=True),
    PerIteration("kernel_launches", "count", "kernel launches", "count", gpu_only=True, series=True, panel=1, card=True),
    PerIteration("graph_launches", "count", "graph launches", "count", gpu_only=True, series=True, panel=1),
    PerIteration("syncs", "count", "host syncs", "count", gpu_only=True, series=True, panel=2, card=True),
    PerIteration("sync_copies", "count", "blocking copies", "count", gpu_only=True, series=True, panel=2),
    PerIteration("memcpy_d2h", "count", "D2H copies", "count", gpu_only=True),
    PerIteration("memcpy_h2d", "count", "H2D copies", "count", gpu_only=True),
    PerIteration("bubble_count", "count", "bubbles", "count", series=True, panel=2, card=True),
    PerIteration("launch_us", "µs", "launch host µs", "timing", md_label="launch host µs"),
    PerIteration("launch_latency_us_p50", "µs", "launch latency p50 µs", "timing"),
    PerIteration("sync_us", "µs", "sync µs", "timing", md_label="sync blocked µs"),
    PerIteration("sync_copy_us", "µs", "sync copy µs", "timing"),
    PerIteration("bubble_us", "µs", "bubble µs", "timing", md_label="bubble µs"),
)
COUNT_KEYS = tuple(f.key for f in PER_ITERATION if f.kind == "count")
TIMING_KEYS = tuple(f.key for f in PER_ITERATION if f.kind == "timing")
# diff.json's `series`: each iteration's wall and window, then the counts drawn per iteration
SERIES_FIELDS = ("wall_us", "gpu_window_us", *(f.key for f in PER_ITERATION if f.series))
GPU_ONLY_COUNTS = tuple(f.key for f in PER_ITERATION if f.gpu_only)


def term_label(key: str) -> str:
    """A decomposition term's key in words: category_us.topk -> topk, phase_us.draft -> draft phase,
    idle_us_by_cause.sync -> sync idle."""
    group, _, name = key.partition(".")
    if not name:
        return key.removesuffix("_us")  # backlog_us -> backlog
    return {"phase_us": f"{name} phase", "idle_us_by_cause": f"{name.replace('_', ' ')} idle"}.get(group, name)
