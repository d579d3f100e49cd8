"""What identifies a trace file for the caches, and how much JSON it holds: polars-free, so the
summary cache (profkit/summary_cache.py) can use it without importing the tables."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

_MIB = 1 << 20
CACHE_SUFFIX = ".profkit-cache"  # the cache folder beside a trace: <trace>.profkit-cache/


def source_key(path: Path) -> dict[str, Any]:
    """size, mtime_ns and a hash of the first and last MiB of the trace file."""
    st = path.stat()
    h = hashlib.sha256()
    with open(path, "rb") as f:
        h.update(f.read(_MIB))
        if st.st_size > 2 * _MIB:
            f.seek(st.st_size - _MIB)
            h.update(f.read(_MIB))
        elif st.st_size > _MIB:
            h.update(f.read())
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "head_tail_sha256": h.hexdigest()}


def estimated_json_bytes(path: Path) -> int:
    """The file's size, times 8 when it is gzipped (Kineto JSON compresses about 8x). Raises OSError."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        gz = f.read(2) == b"\x1f\x8b"
    return size * 8 if gz else size


def cache_disabled_by_env() -> bool:
    """PROFKIT_NO_CACHE set (to anything but 0/false/no): no cache is read or written."""
    return os.environ.get("PROFKIT_NO_CACHE", "").strip() not in ("", "0", "false", "no")
