"""Optional Triton import (profkit's analysis side and CPU-only installs have no Triton)."""

from __future__ import annotations

import os

try:  # pragma: no cover - depends on the environment
    import triton
    import triton.language as tl

    HAVE_TRITON = True
except Exception:  # pragma: no cover
    triton = None
    tl = None
    HAVE_TRITON = False


def interpreting() -> bool:
    """True when Triton runs kernels on the CPU through its interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def use_triton(t) -> bool:
    """Dispatch rule: Triton for CUDA tensors, or for CPU tensors under the interpreter."""
    if not HAVE_TRITON:
        return False
    return t.is_cuda or interpreting()
