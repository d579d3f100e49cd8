"""Kineto's event categories: one spelling each, and which of profkit's tables each goes to.
Polars-free (the C scanner's path uses it before polars is imported)."""

from __future__ import annotations

# Kineto category spellings across torch versions -> one name.
CAT_ALIASES: dict[str, str] = {
    "kernel": "kernel",
    "memcpy": "gpu_memcpy",
    "gpu_memcpy": "gpu_memcpy",
    "memset": "gpu_memset",
    "gpu_memset": "gpu_memset",
    "runtime": "cuda_runtime",
    "cuda_runtime": "cuda_runtime",
    "driver": "cuda_driver",
    "cuda_driver": "cuda_driver",
    "operator": "cpu_op",
    "cpu_op": "cpu_op",
    "user_annotation": "user_annotation",
    "gpu_user_annotation": "gpu_user_annotation",
    "python_function": "python_function",
}
GPU_OP_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
CALL_CATS = ("cuda_runtime", "cuda_driver")
CPU_CATS = ("cpu_op", "user_annotation", "python_function")


def canonical_cat(cat: str) -> str:
    """One spelling per category (CAT_ALIASES), lower case otherwise."""
    low = cat.lower()
    return CAT_ALIASES.get(low, low)


_TABLE_CODES = {**{c: 0 for c in GPU_OP_CATS}, **{c: 1 for c in CALL_CATS}, **{c: 2 for c in CPU_CATS}, "gpu_user_annotation": 3}


def table_code(canonical: str) -> int:
    """Which of split_rows' tables a canonical category goes to: 0 gpu_ops, 1 calls, 2 cpu, 3 gpu_annotations, -1 none."""
    return _TABLE_CODES.get(canonical, -1)


# Device timelines of accelerators that are not CUDA/HIP GPUs: Kineto names their events apart, and
# profkit does not analyze them (it says so rather than calling the trace CPU-only without a word).
FOREIGN_DEVICE_CATS: dict[str, str] = {
    "mtia_ccp_events": "MTIA",  # MTIA device ops (HTA's test data: dma_request, pe_exe, event_record, ...)
    "mtia_runtime": "MTIA",     # MTIA runtime calls
}


def foreign_device_warning(cats: object) -> str | None:
    """A warning when the trace's categories (any iterable of strings) include another
    accelerator's device or runtime events, else None."""
    found = sorted({c for c in cats if isinstance(c, str) and c in FOREIGN_DEVICE_CATS})  # type: ignore[attr-defined]
    if not found:
        return None
    kinds = sorted({FOREIGN_DEVICE_CATS[c] for c in found})
    return (f"the trace records an {'/'.join(kinds)} accelerator (event categories {', '.join(found)}), not a CUDA/HIP GPU: "
            "profkit analyzes GPU device timelines only, so that device's work is left out and the CPU timeline stands in")
