"""The last step of the cache: the finished summary of an `analyze` run, stored beside its first
trace (`<trace>.profkit-cache/summary/<key>.json`), so a repeated `analyze` of unchanged traces
with the same options prints and writes it without importing polars or reading any table.

Every command that turns traces into a summary reads and writes it (analysis/summarize.py):
analyze, diff, report, and trace after its capture.

The key covers everything the summary depends on: each input's path as given and its
ingest/identity.py source key (size, mtime_ns, hash of the first and last MiB), the options that
change results (marker, minimum bubble, a --peaks file's content, and the catalog's one identity, analysis/catalog.catalog_identity,
which the per-option analysis cache uses too), SCHEMA and identity.code_fingerprint (profkit's
version, the installed polars version, every source file of the package and the shipped kernel
catalogs). Output-only options (--top, --json, stdout) are not in it. A file whose key or digest does not match, or that does not parse, is a miss. Nothing here
imports polars: this module is what keeps a cached `analyze` near interpreter start-up time.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from profkit.ingest.identity import CACHE_SUFFIX as SUFFIX  # the folder ingest/cache.py writes

SCHEMA = 2  # the stored summary's own layout: bump it when the key or the file changes shape


def summary_key(files: list[Any], *, marker: str | None, min_bubble_us: float, catalog: Any, peaks: Any = None) -> str | None:
    """The key of this run's summary, or None when it is not to be cached (small or unreadable
    inputs). `files`: paths or ingest TraceFiles. `catalog`: the chosen catalog's identity
    (CatalogChoice.identity; None: picked by kernel names)."""
    from profkit.ingest.identity import code_fingerprint, estimated_json_bytes, source_key

    try:
        for f in files:
            if estimated_json_bytes(f) < _MIN_BYTES:
                return None
        blob: dict[str, Any] = {
            "schema": SCHEMA,
            "code": code_fingerprint(),
            "inputs": [[str(getattr(f, "path", f)), source_key(f)] for f in files],  # paths or ingest TraceFiles
            "options": {"marker": marker, "min_bubble_us": repr(float(min_bubble_us)), "catalog": catalog},
        }
        if peaks is not None:  # --peaks: the file's content (the datasheet is part of the code fingerprint)
            blob["options"]["peaks"] = hashlib.blake2b(Path(peaks).read_bytes(), digest_size=16).hexdigest()
    except OSError:
        return None
    return hashlib.blake2b(json.dumps(blob, sort_keys=True).encode(), digest_size=16).hexdigest()


_MIN_BYTES = 16 << 20  # as ingest/cache.MIN_BYTES: small traces are analyzed in well under a second


def _file(first: Path, key: str) -> Path:
    return first.with_name(first.name + SUFFIX) / "summary" / f"{key}.json"


def _meta(first: Path, key: str) -> Path:
    return first.with_name(first.name + SUFFIX) / "summary" / f"{key}.meta"


# The stored summary is the exact text `--json` writes (store.json_text), beside a small meta file
# with its key and digest: a cached `analyze --json` writes those bytes as they are, without encoding
# the summary again, and they are the bytes an uncached run writes.

def read_summary(first: Path, key: str) -> tuple[dict[str, Any], str] | None:
    """The stored summary and the JSON text it was stored as, or None (a miss)."""
    import msgspec

    try:
        meta = msgspec.json.decode(_meta(first, key).read_bytes())
        body = _file(first, key).read_bytes()
        if meta.get("key") != key or meta.get("schema") != SCHEMA or meta.get("blake2b") != hashlib.blake2b(body, digest_size=16).hexdigest():
            return None
        summary = msgspec.json.decode(body)
        if not isinstance(summary, dict):
            return None
        return summary, body.decode()
    except (OSError, msgspec.DecodeError, KeyError, TypeError, AttributeError, UnicodeDecodeError):
        return None


def write_summary(first: Path, key: str, summary: dict[str, Any]) -> bool:
    """Store the summary (atomically: the text, then the meta that makes it valid); False,
    silently, when the cache folder cannot be written."""
    import msgspec

    from profkit.errors import ProfkitError
    from profkit.store import json_text, write_bytes_atomic

    d = first.with_name(first.name + SUFFIX)
    if not d.is_dir():
        return False  # no tables cache beside this trace (not writable, or disabled): no summary either
    try:
        body = json_text(summary).encode()
        (d / "summary").mkdir(exist_ok=True)
        write_bytes_atomic(_file(first, key), body)
        meta = {"key": key, "schema": SCHEMA, "blake2b": hashlib.blake2b(body, digest_size=16).hexdigest()}
        write_bytes_atomic(_meta(first, key), msgspec.json.encode(meta))
        return True
    except (OSError, ProfkitError, TypeError, ValueError, msgspec.EncodeError):
        return False
