"""The last step of the cache: the finished summary of an `analyze` run, stored beside its first
trace (`<trace>.profkit-cache/summary/<key>.json`), so a repeated `analyze` of unchanged traces
with the same options prints and writes it without importing polars or reading any table.

The key covers everything the summary depends on: each input's path as given and its
ingest/identity.py source key (size, mtime_ns, hash of the first and last MiB), the options that
change results (marker, minimum bubble, catalog: name, or the content of a .toml), SCHEMA and
identity.code_fingerprint (profkit's version, the installed polars version, every source file of
the package and the shipped kernel catalogs). Output-only options (--top, --json, stdout) are not
in it. A file whose key or digest does not match, or that does not parse, is a miss. Nothing here
imports polars: this module is what keeps a cached `analyze` near interpreter start-up time.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from profkit.ingest.identity import CACHE_SUFFIX as SUFFIX  # the folder ingest/cache.py writes

SCHEMA = 1  # the stored summary's own layout: bump it when the key or the file changes shape


def summary_key(files: list[Path], *, marker: str | None, min_bubble_us: float, catalog: str | None) -> str | None:
    """The key of this run's summary, or None when it is not to be cached (small or unreadable inputs)."""
    from profkit.ingest.identity import code_fingerprint, estimated_json_bytes, source_key

    try:
        for f in files:
            if estimated_json_bytes(f) < _MIN_BYTES:
                return None
        cat: Any = catalog
        if catalog is not None and (catalog.endswith(".toml") or "/" in catalog or "\\" in catalog):
            cat = {"path": catalog, "sha256": hashlib.sha256(Path(catalog).read_bytes()).hexdigest()}
        blob = {
            "schema": SCHEMA,
            "code": code_fingerprint(),
            "inputs": [[str(f), source_key(f)] for f in files],
            "options": {"marker": marker, "min_bubble_us": repr(float(min_bubble_us)), "catalog": cat},
        }
    except OSError:
        return None
    return hashlib.blake2b(json.dumps(blob, sort_keys=True).encode(), digest_size=16).hexdigest()


_MIN_BYTES = 16 << 20  # as ingest/cache.MIN_BYTES: small traces are analyzed in well under a second


def _file(first: Path, key: str) -> Path:
    return first.with_name(first.name + SUFFIX) / "summary" / f"{key}.json"


def read_summary(first: Path, key: str) -> dict[str, Any] | None:
    import msgspec

    try:
        doc = msgspec.json.decode(_file(first, key).read_bytes())
        body = msgspec.json.encode(doc["summary"])
        if doc.get("key") != key or doc.get("blake2b") != hashlib.blake2b(body, digest_size=16).hexdigest():
            return None
        return doc["summary"]
    except (OSError, msgspec.DecodeError, KeyError, TypeError):
        return None


def write_summary(first: Path, key: str, summary: dict[str, Any]) -> bool:
    """Store the summary (atomically); False, silently, when the cache folder cannot be written."""
    import msgspec

    from profkit.errors import ProfkitError
    from profkit.store import write_bytes_atomic

    d = first.with_name(first.name + SUFFIX)
    if not d.is_dir():
        return False  # no tables cache beside this trace (not writable, or disabled): no summary either
    try:
        body = msgspec.json.encode(summary)
        doc = {"key": key, "blake2b": hashlib.blake2b(body, digest_size=16).hexdigest(), "summary": msgspec.json.decode(body)}
        (d / "summary").mkdir(exist_ok=True)
        write_bytes_atomic(_file(first, key), msgspec.json.encode(doc))
        return True
    except (OSError, ProfkitError, TypeError, msgspec.EncodeError):
        return False
