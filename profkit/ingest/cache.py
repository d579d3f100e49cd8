"""A parquet cache of the ingested tables next to each trace: `<trace>.profkit-cache/`.

A second `analyze` (or `diff`, `report`) of the same trace reads four parquet files instead of
decoding the JSON. The cache is used only when everything matches:

- the trace file's size, mtime_ns and a hash of its first and last MiB (checked on every read);
- CACHE_SCHEMA and the code fingerprint (identity.code_fingerprint: every source file of the package
  and the kernel catalogs, so a profkit change never reuses old tables);
- each parquet file's size and BLAKE2b digest, recorded in `manifest.json` when profkit wrote them
  (so a truncated, corrupted or hand-edited cache is never read as data).

Anything else (missing, stale, corrupt, unreadable) is a miss: the trace is decoded again and the
cache rewritten, with no error. A folder that is not writable means no cache, silently. Nothing is
pickled: the tables are parquet, the rest is JSON.

An Nsight Systems export holds several ranks, each an input of its own (TraceFile.part): each rank's
tables are an entry of the same kind in `parts/<part>/` of the export's folder, its source key
naming the rank, its manifest holding the rank's call stacks too. `export.json` names the version
of the export (and of the code) the folder is for: a rank written for another replaces the folder
whole (summaries and analyses with it), as a Kineto trace's tables do.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, TypedDict

import polars as pl

from profkit.ingest.decode import TraceMeta
from profkit.ingest.identity import (  # noqa: F401  (source_key, cache_disabled_by_env: used here and by callers)
    CACHE_SUFFIX, SourceKey, TraceFile, cache_disabled_by_env, code_fingerprint, estimated_json_bytes, source_key,
)

CACHE_SCHEMA = 1
SUFFIX = CACHE_SUFFIX
TABLES = ("gpu_ops", "calls", "cpu", "gpu_annotations")


# Traces smaller than this (estimated JSON: gzip counts 8x) decode in well under a second: they are
# not cached, so small traces (test corpora, quick captures) get no folder beside them.
MIN_BYTES = 16 << 20


def worth_caching(path: Path | TraceFile) -> bool:
    if isinstance(path, TraceFile) and path.sqlite and path.part is None:
        return False  # an Nsight Systems export read as one input (its first rank, with a warning): not cached
    try:
        return estimated_json_bytes(path) >= MIN_BYTES
    except OSError:
        return False


def cache_dir(path: Path) -> Path:
    return path.with_name(path.name + SUFFIX)


PARTS = "parts"  # an export's folder: one entry per rank
EXPORT = "export.json"  # an export's folder: the version it is for (source key without part, code fingerprint, CACHE_SCHEMA)


def entry_dir(path: Path | TraceFile) -> Path:
    """Where the tables of `path` are: its folder, or for one rank of an Nsight Systems export
    (TraceFile.part), parts/<part>/ in the export's folder."""
    if isinstance(path, TraceFile):
        return cache_dir(path.path) if path.part is None else cache_dir(path.path) / PARTS / _slug(path.part)
    return cache_dir(path)


def _slug(part: str) -> str:
    """A rank's name as a folder name: "device=1 pid=4242" -> "device=1_pid=4242"."""
    return re.sub(r"[^A-Za-z0-9=.-]+", "_", part)


class FileEntry(TypedDict):
    """One parquet file of a cache entry, in its manifest.json: what it must be to be read."""

    size: int
    blake2b: str  # hex, 32 bytes
    rows: int


class _Manifest(TypedDict):
    cache_schema: int
    code: str  # identity.code_fingerprint
    source: SourceKey
    sha256: str | None
    t0_ns: int
    n_events: int
    meta: TraceMeta
    warnings: list[str]
    files: dict[str, FileEntry]  # by table name (TABLES)


class Manifest(_Manifest, total=False):
    """The tables cache's manifest.json (keys in this order)."""

    call_stacks: list[tuple[int, list[str]]]  # an export's rank recorded with CUDA backtraces (Trace.call_stacks)


@dataclass
class Cached:
    tables: dict[str, pl.DataFrame]
    t0_ns: int
    n_events: int
    meta: TraceMeta
    warnings: list[str] = field(default_factory=list)
    sha256: str | None = None
    call_stacks: dict[int, tuple[str, ...]] = field(default_factory=dict)  # Trace.call_stacks (an export's rank)


_PENDING: list[threading.Thread] = []


def write_async(path: Path, cached: Cached, *, key: SourceKey | None = None) -> None:
    """`write` in a background thread (polars writes parquet without holding the GIL), so that
    analysis goes on meanwhile; `wait_pending` (called by `read` and the analysis cache) joins it.
    The thread is not a daemon: the process waits for it before exiting."""
    t = threading.Thread(target=write, args=(path, cached), kwargs={"key": key}, name="profkit-cache-write")
    t.start()
    _PENDING.append(t)


_DEFERRED: list[Callable[[], bool]] = []


def write_later(path: Path, cached: Cached, *, key: SourceKey | None = None) -> None:
    """`write` when `wait_pending` is next called (the analysis cache calls it after the analysis):
    written during the analysis, the parquet encoding would take polars' threads from it."""
    _DEFERRED.append(lambda: write(path, cached, key=key))


def wait_pending() -> None:
    while _PENDING:
        _PENDING.pop().join()
    while _DEFERRED:
        _DEFERRED.pop(0)()


def read(path: Path | TraceFile) -> Cached | None:
    """The cached ingest of `path`, or None (a miss) when anything does not match. A TraceFile's
    identity is taken as it is (the file is not read again)."""
    wait_pending()
    d = entry_dir(path)
    try:
        man: Manifest = json.loads((d / "manifest.json").read_text())  # a key missing or of the wrong type: a miss
        if man["cache_schema"] != CACHE_SCHEMA or man["code"] != code_fingerprint() or man["source"] != source_key(path):
            return None
        tables: dict[str, pl.DataFrame] = {}
        for name in TABLES:
            info = man["files"][name]
            data = (d / f"{name}.parquet").read_bytes()
            if len(data) != info["size"] or hashlib.blake2b(data, digest_size=32).hexdigest() != info["blake2b"]:
                return None
            df = pl.read_parquet(io.BytesIO(data))
            if df.height != info["rows"]:
                return None
            tables[name] = df
        return Cached(
            tables=tables, t0_ns=int(man["t0_ns"]), n_events=int(man["n_events"]), meta=man["meta"],
            warnings=[str(w) for w in man["warnings"]], sha256=man["sha256"],
            call_stacks={int(c): tuple(str(x) for x in fr) for c, fr in man.get("call_stacks", [])},
        )
    except Exception:  # missing, unreadable, corrupt: a miss
        return None


def write(path: Path, cached: Cached, *, key: SourceKey | None = None) -> bool:
    """Write the cache next to `path` (atomically: a temporary folder renamed into place); `key`
    naming a rank of an export (its `part`): that rank's entry in the export's folder.
    Returns False, silently, when it cannot (read-only folder, disk full, ...)."""
    part = key.get("part") if key else None
    base = cache_dir(path)
    if base.exists() and not base.is_dir():
        return False  # something else has that name: leave it alone
    tmp: Path | None = None
    try:
        key = key or source_key(path)
        d = base if part is None else _export_folder(path, key) / _slug(part)
        tmp = d.with_name(f".{d.name.removesuffix(SUFFIX)}.{os.getpid()}.tmp{SUFFIX}")
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        files: dict[str, FileEntry] = {}
        for name in TABLES:
            buf = io.BytesIO()
            cached.tables[name].write_parquet(buf, compression="lz4", statistics=False)
            data = buf.getvalue()
            (tmp / f"{name}.parquet").write_bytes(data)
            files[name] = {"size": len(data), "blake2b": hashlib.blake2b(data, digest_size=32).hexdigest(),
                           "rows": cached.tables[name].height}
        man: Manifest = {
            "cache_schema": CACHE_SCHEMA, "code": code_fingerprint(), "source": key, "sha256": cached.sha256,
            "t0_ns": cached.t0_ns, "n_events": cached.n_events, "meta": cached.meta, "warnings": cached.warnings,
            "files": files,
        }
        if cached.call_stacks:
            man["call_stacks"] = [(c, list(fr)) for c, fr in cached.call_stacks.items()]
        (tmp / "manifest.json").write_text(json.dumps(man))
        now = source_key(path)
        if part is not None:
            now["part"] = part
        if key != now:  # the trace changed while we read it: do not keep tables for it
            shutil.rmtree(tmp, ignore_errors=True)
            return False
        _swap_in(tmp, d)
        return True
    except Exception:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        return False


def _swap_in(new: Path, dest: Path) -> None:
    """`new` in place of the cache folder `dest`: the old one moved aside (atomically) and removed."""
    if dest.exists():
        old = dest.with_name(f".{dest.name.removesuffix(SUFFIX)}.{os.getpid()}.old{SUFFIX}")
        shutil.rmtree(old, ignore_errors=True)
        os.replace(dest, old)
        shutil.rmtree(old, ignore_errors=True)
    os.replace(new, dest)


_FOLDER_LOCK = threading.Lock()  # the ranks of one export are written by threads of their own (write_async)


def _export_folder(path: Path, key: SourceKey) -> Path:
    """The parts/ folder of the export at `path`, for the version `key` names (without its part) and
    this code: a folder for another (or for none) is replaced by a new one first (atomically), as a
    Kineto trace's folder is when its tables are written."""
    base = cache_dir(path)
    version = {"cache_schema": CACHE_SCHEMA, "code": code_fingerprint(), "source": {k: v for k, v in key.items() if k != "part"}}
    with _FOLDER_LOCK:
        try:
            if json.loads((base / EXPORT).read_text()) == version and (base / PARTS).is_dir():
                return base / PARTS
        except (OSError, ValueError):
            pass
        new = base.with_name(f".{base.name.removesuffix(SUFFIX)}.{os.getpid()}.new{SUFFIX}")
        shutil.rmtree(new, ignore_errors=True)
        (new / PARTS).mkdir(parents=True)
        (new / EXPORT).write_text(json.dumps(version))
        _swap_in(new, base)
    return base / PARTS


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(8 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


# ---------------------------------------------------------------- analysis results
#
# A second layer in the same folder: `analysis/<key>/`, one entry per set of analysis options, so
# that re-running `analyze` with the same options reads the per-rank results (small frames)
# instead of the tables. The key covers the trace (source_key), CACHE_SCHEMA, the code fingerprint
# (every source file and the kernel catalogs) and the options, which the caller hands in as data
# (analysis/parallel.py: marker, minimum bubble, the catalog's identity from analysis/catalog.py; the
# cache knows no catalog); entries carry the same size + BLAKE2b checks as the tables.

ANALYSIS_FRAMES = ("iterations", "categories", "launch_calls", "ops", "bubbles", "syncs")
# stored when the analysis has them: every GPU op's work, for a trace recorded with shapes (analysis/rank.py device_work)
OPTIONAL_FRAMES = ("device_work",)
MAX_ANALYSIS_ENTRIES = 4  # per rank: an export's folder keeps as many for each of its ranks (parts/)


def analysis_key(source: SourceKey, options: dict[str, Any]) -> str:
    blob = json.dumps({"schema": CACHE_SCHEMA, "source": source, "code": code_fingerprint(), "options": options}, sort_keys=True, default=str)
    return hashlib.blake2b(blob.encode(), digest_size=16).hexdigest()


def read_analysis(path: Path, key: str) -> tuple[dict[str, pl.DataFrame], dict[str, Any]] | None:
    wait_pending()
    d = cache_dir(path) / "analysis" / key
    try:
        man = json.loads((d / "manifest.json").read_text())
        if man.get("key") != key or man.get("cache_schema") != CACHE_SCHEMA:
            return None
        frames: dict[str, pl.DataFrame] = {}
        for name in (*ANALYSIS_FRAMES, *(n for n in OPTIONAL_FRAMES if n in man["files"])):
            info = man["files"][name]
            data = (d / f"{name}.parquet").read_bytes()
            if len(data) != info["size"] or hashlib.blake2b(data, digest_size=32).hexdigest() != info["blake2b"]:
                return None
            df = pl.read_parquet(io.BytesIO(data))
            if df.height != info["rows"]:
                return None
            frames[name] = df
        return frames, dict(man["fields"])
    except Exception:
        return None


def write_analysis(path: Path, key: str, frames: dict[str, pl.DataFrame], fields: dict[str, Any]) -> bool:
    wait_pending()  # the tables' folder first
    base = cache_dir(path)
    if not base.is_dir():
        return False
    adir = base / "analysis"
    d = adir / key
    tmp = adir / f".{key}.{os.getpid()}.tmp"
    try:
        adir.mkdir(exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        files: dict[str, FileEntry] = {}
        for name in (*ANALYSIS_FRAMES, *(n for n in OPTIONAL_FRAMES if frames.get(n) is not None)):
            buf = io.BytesIO()
            frames[name].write_parquet(buf, compression="lz4", statistics=False)
            data = buf.getvalue()
            (tmp / f"{name}.parquet").write_bytes(data)
            files[name] = {"size": len(data), "blake2b": hashlib.blake2b(data, digest_size=32).hexdigest(), "rows": frames[name].height}
        (tmp / "manifest.json").write_text(json.dumps({"cache_schema": CACHE_SCHEMA, "key": key, "files": files, "fields": fields}))
        shutil.rmtree(d, ignore_errors=True)
        os.replace(tmp, d)
        entries = sorted((p for p in adir.iterdir() if p.is_dir() and not p.name.startswith(".")), key=lambda p: p.stat().st_mtime_ns)
        ranks = sum(1 for p in (base / PARTS).iterdir() if p.is_dir() and not p.name.startswith(".")) if (base / PARTS).is_dir() else 1
        for old in entries[:-MAX_ANALYSIS_ENTRIES * max(1, ranks)]:
            shutil.rmtree(old, ignore_errors=True)
        return True
    except Exception:
        shutil.rmtree(tmp, ignore_errors=True)
        return False
