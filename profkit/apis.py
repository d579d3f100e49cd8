"""Names of the CUDA/HIP runtime and driver calls profkit counts, and their canonical CUDA twins.

DESIGN.md: every HIP call counts as its CUDA twin, so ROCm and CUDA traces give the same fields.
"""

from __future__ import annotations

import re

# HIP name -> CUDA twin. hipMemcpyWithStream blocks the host like cudaMemcpy does.
HIP_TWINS: dict[str, str] = {
    "hipLaunchKernel": "cudaLaunchKernel",
    "hipExtLaunchKernel": "cudaLaunchKernel",
    "hipLaunchKernelExC": "cudaLaunchKernelExC",
    "hipModuleLaunchKernel": "cuLaunchKernel",
    "hipExtModuleLaunchKernel": "cuLaunchKernel",
    "hipHccModuleLaunchKernel": "cuLaunchKernel",
    "hipLaunchCooperativeKernel": "cudaLaunchCooperativeKernel",
    "hipGraphLaunch": "cudaGraphLaunch",
    "hipMemcpyAsync": "cudaMemcpyAsync",
    "hipMemcpy": "cudaMemcpy",
    "hipMemcpyWithStream": "cudaMemcpy",
    "hipMemcpyDtoH": "cudaMemcpy",
    "hipMemcpyHtoD": "cudaMemcpy",
    "hipMemsetAsync": "cudaMemsetAsync",
    "hipMemset": "cudaMemset",
    "hipStreamSynchronize": "cudaStreamSynchronize",
    "hipDeviceSynchronize": "cudaDeviceSynchronize",
    "hipEventSynchronize": "cudaEventSynchronize",
    "hipCtxSynchronize": "cuCtxSynchronize",
}

KERNEL_LAUNCH_APIS = frozenset(
    {
        "cudaLaunchKernel",
        "cudaLaunchKernelExC",
        "cuLaunchKernel",
        "cuLaunchKernelEx",
        "cudaLaunchCooperativeKernel",
        "cuLaunchCooperativeKernel",
    }
)
GRAPH_LAUNCH_APIS = frozenset({"cudaGraphLaunch", "cuGraphLaunch"})
# The calls DESIGN.md counts in launch_calls (host calls that enqueue device work).
LAUNCH_APIS = KERNEL_LAUNCH_APIS | GRAPH_LAUNCH_APIS | frozenset({"cudaMemcpyAsync", "cudaMemsetAsync"})
# Synchronize calls that block the host until device work finishes.
SYNC_APIS = frozenset(
    {
        "cudaStreamSynchronize",
        "cudaDeviceSynchronize",
        "cudaEventSynchronize",
        "cudaThreadSynchronize",
        "cuStreamSynchronize",
        "cuCtxSynchronize",
        "cuEventSynchronize",
    }
)
# Copies that always block the host (the synchronous memcpy family).
BLOCKING_COPY_APIS = frozenset(
    {
        "cudaMemcpy",
        "cudaMemcpy2D",
        "cudaMemcpy3D",
        "cudaMemcpyToSymbol",
        "cudaMemcpyFromSymbol",
        "cudaMemcpyPeer",
        "cuMemcpy",
        "cuMemcpyDtoH",
        "cuMemcpyHtoD",
        "cuMemcpyDtoD",
        "cudaMemset",
    }
)
# Async copies: they block the host when one side is pageable memory.
ASYNC_COPY_APIS = frozenset({"cudaMemcpyAsync", "cuMemcpyAsync", "cuMemcpyDtoHAsync", "cuMemcpyHtoDAsync"})

_SUFFIX = re.compile(r"(_v\d+)?(_ptsz|_ptds)?$")


def canonical_api(name: str) -> str:
    """The CUDA spelling of a runtime/driver call: HIP twins mapped, CUPTI version suffixes dropped."""
    base = _SUFFIX.sub("", name) if "_" in name else name
    return HIP_TWINS.get(base, base)
