"""One vocabulary per device timeline, the same in every renderer.

A CPU-only trace has no device records: profkit takes the outermost aten ops on the iteration's
thread as its "device" timeline (summary.json's ``device_timeline: "cpu"``). Its windows, busy and
idle time are of that CPU-op timeline and its "kernels" are aten ops, and every renderer says so
(plain data: no rich, no HTML).
"""

from __future__ import annotations

from profkit.documents import Diff, Rank
from profkit.terms import GPU_ONLY_COUNTS, PER_ITERATION

GPU_WORDS = {"device": "GPU", "window": "GPU window", "busy": "GPU busy", "idle": "GPU idle", "kernels": "GPU kernels", "kernel": "kernel",
             "kernels_plain": "kernels", "kernel_time": "kernel-time"}
CPU_WORDS = {"device": "CPU-op", "window": "CPU-op window", "busy": "CPU-op busy", "idle": "CPU-op idle", "kernels": "aten ops",
             "kernel": "aten op", "kernels_plain": "aten ops", "kernel_time": "aten-op-time"}
# GPU_ONLY_COUNTS (profkit/terms.py): counts a CPU-only timeline never has (the banner says they are 0): not listed for a
# CPU-only run (issue 40: "kernel launches 0 → 0")
__all__ = ["GPU_ONLY_COUNTS", "banner", "count_label", "diff_timeline", "rank_timeline", "words"]
_LABELS = {f.key: f.label for f in PER_ITERATION}
CPU_BANNER = ("CPU-only run: these traces hold no GPU activity. The outermost aten ops on the iteration thread stand in for device "
              "ops, so window, busy and idle are of that CPU-op timeline and aten ops take the place of kernels; kernel launches, "
              "graph launches and syncs are 0.")
MIXED_BANNER = ("One side is a CPU-only run (its aten ops stand in for device ops) and the other a GPU run: their windows, busy "
                "and idle times are of different timelines and do not compare.")


def rank_timeline(rank: Rank) -> str:
    return "cpu" if rank.device_timeline == "cpu" else "gpu"


def diff_timeline(diff: Diff) -> str:
    """"cpu" when both sides are CPU-only, "mixed" when one is, else "gpu" (diff.json's sides)."""
    t = {str(s.device_timeline or "gpu") for s in (diff.baseline, diff.candidate)}
    return "mixed" if len(t) > 1 else t.pop()


def words(timeline: str) -> dict[str, str]:
    return CPU_WORDS if timeline == "cpu" else GPU_WORDS


def banner(timeline: str) -> str | None:
    return CPU_BANNER if timeline == "cpu" else MIXED_BANNER if timeline == "mixed" else None


def count_label(key: str, timeline: str) -> str:
    """The label of a per-iteration count in diff.json's ``counts``."""
    if key == "gpu_kernels":
        return words(timeline)["kernels"]
    return _LABELS.get(key, key.replace("_", " "))
