"""The names of the decomposition's terms that analysis, catalogs and attribution share (no imports:
a catalog checks its optimizations' phases and idle causes against these without loading polars)."""

from __future__ import annotations

# where in the iteration an op ran (DESIGN.md "Phase"), in precedence order (profkit.analysis.phases)
PHASES = ("draft_extend", "draft", "verify", "decode", "extend", "sampling", "other")
# what a bubble waited for (DESIGN.md "Bubble"; profkit.analysis.bubbles). "python" only on a CPU-only
# timeline (analysis/rank.cpu_as_device): a gap between two aten ops inside an iteration is host time in
# Python (model glue, the sampler's bookkeeping, the scheduler), never a kernel launch
CAUSES = ("sync", "launch", "iteration_boundary", "gpu_wait", "python")
