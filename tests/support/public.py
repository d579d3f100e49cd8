"""Third-party traces (TraceLens, HTA) are never committed: they live in ../shared/public-traces beside
the checkout (or $PROFKIT_PUBLIC_TRACES); what profkit must report on them is the project's own
expected_public.json (tests/data/public/, computed by expected_public.py from the raw events)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from support.paths import DATA, ROOT

PUBLIC_TRACES = Path(os.environ.get("PROFKIT_PUBLIC_TRACES") or ROOT.parent / "shared" / "public-traces")
PUBLIC_EXPECTED = DATA / "public"
NO_PUBLIC = (f"third-party traces not found in {PUBLIC_TRACES}: put shared/public-traces beside the "
             "checkout or set PROFKIT_PUBLIC_TRACES")
# the six TraceLens serving-step traces (SGLang / vLLM on MI300X and B200; tests/data/public/README.md)
TRACELENS_STEPS = (
    "tracelens_sglang_qwen3-8b_mi300x_decode_step.json.gz",
    "tracelens_sglang_qwen3-8b_mi300x_extend_step.json.gz",
    "tracelens_sglang_qwen3-8b_mi300x_graph_capture_bs32.json.gz",
    "tracelens_vllm_gpt-oss-120b_b200_tp8_eager_prefill_step.json.gz",
    "tracelens_vllm_gpt-oss-20b_mi300x_decode_fullgraph_step.json.gz",
    "tracelens_vllm_gpt-oss-20b_mi300x_mixed_piecewise_step.json.gz",
)
needs_public = pytest.mark.skipif(not PUBLIC_TRACES.is_dir(), reason=NO_PUBLIC)


def public_trace(name: str) -> Path:
    """The third-party trace `name` from PUBLIC_TRACES; skips the calling test when it is absent."""
    path = PUBLIC_TRACES / name
    if not path.is_file():
        pytest.skip(f"{name}: {NO_PUBLIC}")
    return path


def public_steps() -> list[Path]:
    """The six TraceLens step traces that are present (none when PUBLIC_TRACES is absent)."""
    return [PUBLIC_TRACES / n for n in TRACELENS_STEPS if (PUBLIC_TRACES / n).is_file()]
