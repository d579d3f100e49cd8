"""Kernels behind the proxy engine's `topk_v2` and `indexer_fusion` switches.

Each public function dispatches: on CUDA the CUDA C++ TopK-V2 (topk_cuda.py, sm_90+, built with
the machine's nvcc at first use) or the Triton kernel (when Triton is importable), a torch twin of
the same algorithm / math elsewhere (CPU). Importing this package never needs Triton, nvcc or a
GPU; `HAVE_TRITON` says whether Triton is there, `backends(device)` which implementation each
switch runs on a device (the proxy reports it in /server_info, hence in the run's manifest).

profkit's kernel catalog (kernels/proxy.toml) recognises the Triton kernels by name:
`topk_v2_*` (owner `topk_v2`; the CUDA kernel is `topk_v2_cluster_kernel<C>`) and `indexer_k_fused_*` / `indexer_q_fused_*` (owner
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
from .topk import backend as topk_backend
from .topk import topk_reference, topk_slots, topk_v2, topk_v2_twin


def backends(device=None) -> dict:
    """{"topk_v2": "cuda" | "triton" | "torch", "indexer_fusion": "triton" | "torch"} on `device`
    (what the switches run when on; may build the CUDA TopK-V2 library)."""
    import torch

    dev = torch.device(device) if device is not None else None
    on_cuda = dev is not None and dev.type == "cuda"
    out = {"topk_v2": topk_backend(dev),
           "indexer_fusion": "triton" if (HAVE_TRITON and on_cuda) else "torch"}
    if out["topk_v2"] == "cuda":
        from . import topk_cuda

        out["topk_v2_kernel"] = topk_cuda.KERNEL_NAME
    elif on_cuda:
        from . import topk_cuda

        out["topk_v2_cuda_unavailable"] = topk_cuda.unavailable_reason(dev)
    return out


__all__ = [
    "HAVE_TRITON",
    "backends",
    "indexer_k_fused",
    "indexer_k_reference",
    "indexer_q_fused",
    "indexer_q_reference",
    "topk_backend",
    "topk_reference",
    "topk_slots",
    "topk_v2",
    "topk_v2_twin",
]
