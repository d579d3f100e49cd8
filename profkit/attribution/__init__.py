"""Attribution: the diff of two analyses (diff.json v1) and, later, ablation ladders."""

from profkit.attribution.diff import compare_summaries, normalize_kernel_name

__all__ = ["compare_summaries", "normalize_kernel_name"]
