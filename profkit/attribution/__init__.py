"""Attribution: data only. The diff of two analyses (diff.json v1) and a sweep's ladder; the
renderers in profkit.report word and lay them out."""

from profkit.attribution.diff import compare_summaries, normalize_kernel_name
from profkit.attribution.ladder import ladder_steps

__all__ = ["compare_summaries", "ladder_steps", "normalize_kernel_name"]
