"""What identifies a trace file (`TraceFile`: read once, passed down) for the caches, how much
JSON it holds, and the code fingerprint all three caches (tables, per-option analysis, summary)
are keyed by: polars-free, so the summary cache (profkit/analysis/summary_cache.py) can use it without
importing the tables."""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypedDict


TP_RANK = re.compile(r"-TP-(\d+)")  # a rank file's name: <run>-TP-<rank>.trace.json.gz (SGLang, the proxy)

_MIB = 1 << 20
SQLITE_MAGIC = b"SQLite format 3\x00"  # the first 16 bytes of every SQLite database file
CACHE_SUFFIX = ".profkit-cache"  # the cache folder beside a trace: <trace>.profkit-cache/


class _SourceKey(TypedDict):
    size: int
    mtime_ns: int
    head_tail_sha256: str  # of the first and last MiB


class SourceKey(_SourceKey, total=False):
    """What identifies a trace file's content in every cache key (TraceFile.source_key): the tables
    cache's manifest.json `source`, the per-option analysis key, the stored summary's inputs."""

    part: str  # the rank of an Nsight Systems export (TraceFile.part), when one


@dataclass(frozen=True)
class TraceFile:
    """One trace file as ingest first saw it, read once (`TraceFile.of`: one open, one fstat, at
    most 2 MiB read) and passed down to whoever needs to know about it: the run grouping
    (ingest/runs.py reads the metadata from `head`), the caches (`source_key`), the choice of
    workers (`estimated_json_bytes`) and the decoder (`gzip`), so none of them opens or stats the
    file again. The decoder still opens it once to read it whole.

    head: the file's first MiB as stored (compressed for gzip); tail: the bytes after it up to
    the end when the file is at most 2 MiB (`whole` is then head + tail), else its last MiB.
    """

    path: Path
    size: int
    mtime_ns: int
    gzip: bool  # by the content's magic bytes, not the name
    head_tail_sha256: str  # of the first and last MiB (of the whole file, up to 2 MiB)
    head: bytes = field(default=b"", repr=False, compare=False)
    tail: bytes = field(default=b"", repr=False, compare=False)
    # One rank of a file that holds several (an Nsight Systems export: ingest/nsys.py), e.g.
    # "device=1 pid=4242"; None for a file that is one rank (every Kineto trace)
    part: str | None = None

    @classmethod
    def of(cls, path: Path) -> TraceFile:
        """Inspect `path`. Raises OSError (missing, unreadable, a folder): decode.check_readable
        turns that into the user's one line."""
        path = Path(path)
        with open(path, "rb") as f:
            st = os.fstat(f.fileno())
            head = f.read(_MIB)
            tail = b""
            if st.st_size > 2 * _MIB:
                f.seek(st.st_size - _MIB)
                tail = f.read(_MIB)
            elif st.st_size > _MIB:
                tail = f.read()
        h = hashlib.sha256(head)
        h.update(tail)
        return cls(path=path, size=st.st_size, mtime_ns=st.st_mtime_ns, gzip=head[:2] == b"\x1f\x8b",
                   head_tail_sha256=h.hexdigest(), head=head, tail=tail)

    @property
    def sqlite(self) -> bool:
        """An SQLite database (an Nsight Systems export), by its magic bytes."""
        return self.head[:16] == SQLITE_MAGIC

    @property
    def estimated_json_bytes(self) -> int:
        """The file's size, times 8 when it is gzipped (Kineto JSON compresses about 8x)."""
        return self.size * 8 if self.gzip else self.size

    @property
    def held_whole(self) -> bool:
        """Whether `head` and `tail` hold all of the file (files of up to 2 MiB)."""
        return self.size <= 2 * _MIB and len(self.head) + len(self.tail) == self.size

    @property
    def whole(self) -> bytes | None:
        """The file's bytes when `head` and `tail` hold all of it, else None."""
        return self.head + self.tail if self.held_whole else None

    @property
    def sha256(self) -> str | None:
        """The whole file's SHA-256 when it is held whole (the head/tail hash is then that hash)."""
        return self.head_tail_sha256 if self.held_whole else None

    def source_key(self) -> SourceKey:
        """What identifies the file's content for the caches: size, mtime_ns, the head/tail hash."""
        key = SourceKey(size=self.size, mtime_ns=self.mtime_ns, head_tail_sha256=self.head_tail_sha256)
        if self.part is not None:
            key["part"] = self.part
        return key


def trace_file(path: Path | TraceFile) -> TraceFile:
    """`path` inspected (TraceFile.of), or the TraceFile itself. Raises OSError."""
    return path if isinstance(path, TraceFile) else TraceFile.of(path)


def source_key(path: Path | TraceFile) -> SourceKey:
    """size, mtime_ns and a hash of the first and last MiB of the trace file (TraceFile.source_key;
    a path is read afresh). Raises OSError."""
    return trace_file(path).source_key()


def estimated_json_bytes(path: Path | TraceFile) -> int:
    """The file's size, times 8 when it is gzipped (TraceFile.estimated_json_bytes; a path is read
    afresh). Raises OSError."""
    if isinstance(path, TraceFile):
        return path.estimated_json_bytes
    size = os.stat(path).st_size
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
    """As profkit.analysis.catalog.catalog_dir, for a given package folder: the checkout's kernels/ beside
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
