"""Triton kernels behind the proxy engine's `topk_v2` and `indexer_fusion` switches.

Each public function dispatches: the Triton kernel on CUDA (when Triton is importable), a torch
twin of the same algorithm / math elsewhere (CPU). Importing this package never needs Triton or a
GPU; `HAVE_TRITON` says whether Triton is there.

profkit's kernel catalog (kernels/proxy.toml) recognises the Triton kernels by name:
`topk_v2_*` (owner `topk_v2`) and `indexer_k_fused_*` / `indexer_q_fused_*` (owner
`indexer_fusion`).

    topk_v2(scores, k, page_table=None, page_size=1, lengths=None) -> (indices, slots)
    topk_slots(scores, lengths, k, slot_table=None) -> slots   # the proxy's ops.topk_v2 contract
    indexer_k_fused(k, norm_w, norm_b, cos, sin, cache, out_slots, eps=1e-5) -> None
    indexer_q_fused(q, cos, sin, gate_raw, gate_scale) -> (q_fp8, gate)
"""

from __future__ import annotations

from ._triton import HAVE_TRITON
from .indexer import (
    indexer_k_fused,
    indexer_k_reference,
    indexer_q_fused,
    indexer_q_reference,
)
from .topk import topk_reference, topk_slots, topk_v2, topk_v2_twin

__all__ = [
    "HAVE_TRITON",
    "indexer_k_fused",
    "indexer_k_reference",
    "indexer_q_fused",
    "indexer_q_reference",
    "topk_reference",
    "topk_slots",
    "topk_v2",
    "topk_v2_twin",
]
