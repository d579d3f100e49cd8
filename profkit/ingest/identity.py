"""What identifies a trace file for the caches, how much JSON it holds, and the code fingerprint
all three caches (tables, per-option analysis, summary) are keyed by: polars-free, so the summary
cache (profkit/summary_cache.py) can use it without importing the tables."""

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


# --- the code fingerprint: one for every cache (tables, per-option analysis, summary) -------------
#
# Every source file of the package, found by a glob (no hand-kept list to fall behind): all
# profkit/**/*.py and profkit/**/*.c, and the shipped kernel catalogs (the checkout's kernels/*.toml,
# or profkit/_kernels/*.toml in a wheel). The engine/capture side (proxy/, capture/, ...) is in it
# too: the whole computation takes ~4 ms (once per process), and keeping it out would need an
# argument that no cached result can ever depend on it. Plus profkit's version and the installed
# polars version (from its metadata: this module stays polars-free, the summary cache uses it
# before polars is imported).

_SOURCE_SUFFIXES = (".py", ".c")
_FINGERPRINT: str | None = None


def package_root() -> Path:
    """The folder of the installed (or checked-out) profkit package."""
    return Path(__file__).resolve().parent.parent


def _catalog_dir(root: Path) -> Path:
    """As profkit.catalog.catalog_dir, for a given package folder: the checkout's kernels/ beside
    it, else the wheel's _kernels/ inside it."""
    repo = root.parent / "kernels"
    return repo if repo.is_dir() else root / "_kernels"


def fingerprint_files(root: Path | None = None) -> list[tuple[str, Path]]:
    """The files the code fingerprint covers, as (path relative to the package, path), sorted by the
    relative path. Catalogs are named `_kernels/<name>.toml` wherever they live, so a checkout and
    the wheel built from it agree."""
    root = package_root() if root is None else Path(root)
    out: list[tuple[str, Path]] = []
    for d, dirs, names in os.walk(root):
        dirs[:] = [x for x in dirs if x != "__pycache__"]
        rel_d = Path(d).relative_to(root).as_posix()
        prefix = "" if rel_d == "." else rel_d + "/"
        out += [(prefix + n, Path(d) / n) for n in names if n.endswith(_SOURCE_SUFFIXES)]
    kdir = _catalog_dir(root)
    if kdir.is_dir():
        out += [(f"_kernels/{p.name}", p) for p in kdir.glob("*.toml") if p.is_file()]
    return sorted(set(out))


def _polars_version() -> str:
    from importlib import metadata

    try:
        return metadata.version("polars")
    except metadata.PackageNotFoundError:
        return "?"


def code_fingerprint(root: Path | None = None) -> str:
    """Hash of profkit's version, the installed polars version and every file of
    `fingerprint_files(root)` (each with its relative path and length): results written by other code
    never match. Computed once per process for the running package; a given `root` (a copy of the
    package, in tests) is hashed afresh on every call."""
    global _FINGERPRINT
    if root is None and _FINGERPRINT is not None:
        return _FINGERPRINT
    from profkit import __version__

    h = hashlib.blake2b(digest_size=16)
    h.update(f"profkit {__version__}\0polars {_polars_version()}\0".encode())
    for rel, p in fingerprint_files(root):
        try:
            data = p.read_bytes()
        except OSError:
            h.update(f"{rel}\0unreadable\0".encode())
            continue
        h.update(f"{rel}\0{len(data)}\0".encode())
        h.update(data)
    fp = h.hexdigest()
    if root is None:
        _FINGERPRINT = fp
    return fp


def short_label(path: str) -> str:
    """A file's name without the trace suffixes: ``traces/x/eager.pt.trace.json.gz`` -> ``eager``."""
    name = path.replace("\\", "/").rstrip("/").rsplit("/", 1)[-1]
    for suf in (".gz", ".json", ".trace", ".pt"):
        name = name.removesuffix(suf)
    return name or path
