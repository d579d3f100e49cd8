"""The fast ingest path: a Kineto file -> the raw events frame, decoded in chunks, in parallel.

The file is decompressed as a stream (ISA-L's igzip or zlib-ng when installed, the stdlib
otherwise) and the `traceEvents` array is cut at event boundaries into chunks of a few tens of MB;
each chunk is decoded with msgspec into GC-free typed Structs (only the fields profkit reads;
events other than complete 'X' events keep only their timestamp) and turned into columns, in worker
processes when `jobs > 1`. Memory stays bounded by the compressed file, a few chunks in flight and
the columns: the whole decompressed JSON is never held at once.

Every cut is checked by the decoder itself: each chunk must decode as a complete JSON array, and
the document around the array (everything before and after it) must decode as a JSON object, so
the concatenation parses exactly as the whole file would. When anything is not as expected (a cut
inside a string, a schema variant, a broken file, a top-level array), `load_raw_frame` returns None
and the caller uses the tiered decoder in `decode.py`, which gives the same frame and the precise
warnings and errors. Results are identical to that path: `tables.events_frame` and this module
share `finish_events_frame`.
"""

from __future__ import annotations

import gc
import hashlib
import os
import re
from concurrent.futures import Executor
from dataclasses import dataclass, field
from operator import attrgetter
from pathlib import Path
from typing import Any, Callable, Iterator

import msgspec
import polars as pl

CHUNK_BYTES = 24 << 20  # raw JSON per decoded chunk
READ_BYTES = 8 << 20  # decompressed bytes per read

# Chrome trace-event phases. The complete events ('X') carry every field profkit uses; the others
# are decoded for their timestamp only (t0 is the earliest timestamp of any event).
_PHASES = "BEiIbnesStTpFfPNODMVvRcC()"


class FArgs(msgspec.Struct, gc=False):
    correlation: int | None = None
    external_id: int | None = msgspec.field(name="External id", default=None)
    stream: int | None = None
    device: int | None = None
    bytes: int | str | None = None


class FX(msgspec.Struct, gc=False, tag_field="ph", tag="X"):
    cat: str = ""
    name: str = ""
    ts: float | None = None
    dur: float | None = None
    pid: int | str = 0
    tid: int | str = 0
    args: FArgs | None = None


_OTHER = tuple(
    msgspec.defstruct(f"F_{ord(p)}", [("ts", "float | None", None)], gc=False, tag_field="ph", tag=p)  # type: ignore[arg-type]
    for p in _PHASES
)
# defstruct needs real types, not strings
_OTHER = tuple(
    msgspec.defstruct(f"F_{ord(p)}", [("ts", float | None, None)], gc=False, tag_field="ph", tag=p) for p in _PHASES
)
_EventU = FX | _OTHER[0]
for _t in _OTHER[1:]:
    _EventU = _EventU | _t  # type: ignore[assignment]
_CHUNK_DEC = msgspec.json.Decoder(list[_EventU])  # type: ignore[valid-type]


class _DevProp(msgspec.Struct):
    name: str = ""


class _Dist(msgspec.Struct):
    rank: int | None = None
    world_size: int | None = None


class _Meta(msgspec.Struct):
    traceEvents: list[int]  # always [] here: the events are cut out
    deviceProperties: list[_DevProp] | None = None
    distributedInfo: _Dist | None = None


_META_DEC = msgspec.json.Decoder(_Meta)

RAW_SCHEMA = {
    "name": pl.String, "cat": pl.String, "ts": pl.Float64, "dur": pl.Float64, "pid": pl.String,
    "tid": pl.String, "correlation": pl.Int64, "external_id": pl.Int64, "stream": pl.Int64,
    "device": pl.Int64, "bytes": pl.Int64,
}

_EMPTY_ARGS = FArgs()
_X_FIELDS = attrgetter("name", "cat", "ts", "dur", "pid", "tid", "args")
_A_FIELDS = attrgetter("correlation", "external_id", "stream", "device", "bytes")


class NotFast(Exception):
    """The file is not in the shape the fast path handles; use the tiered decoder."""


def _ids(values: tuple, name: str) -> pl.Series:
    try:
        return pl.Series(name, values, dtype=pl.Int64, strict=True).cast(pl.String)
    except (TypeError, pl.exceptions.PolarsError, OverflowError):
        return pl.Series(name, [str(v) for v in values], dtype=pl.String)


def decode_chunk(data: bytes) -> tuple[pl.DataFrame, float | None, int]:
    """One chunk `[ev, ev, ...]` -> (raw frame of its 'X' events, min ts of all events, event count).

    Raises NotFast when the chunk does not decode strictly (a bad cut, or a schema variant).
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        try:
            events = _CHUNK_DEC.decode(data)
        except (msgspec.ValidationError, msgspec.DecodeError) as e:
            raise NotFast(str(e)) from None
        n = len(events)
        ts_all = [e.ts for e in events if e.ts is not None]
        tmin = min(ts_all) if ts_all else None
        del ts_all
        xs = [e for e in events if type(e) is FX]
        del events
        if not xs:
            return pl.DataFrame(schema=RAW_SCHEMA), tmin, n
        name, cat, ts, dur, pid, tid, args = zip(*map(_X_FIELDS, xs))
        del xs
        corr, ext, stream, device, nbytes = zip(*map(_A_FIELDS, [a if a is not None else _EMPTY_ARGS for a in args]))
        del args
        if any(type(b) is str for b in nbytes):
            nbytes = tuple((int(b) if b.isdigit() else None) if type(b) is str else b for b in nbytes)
        df = pl.DataFrame(
            [
                pl.Series("name", name, dtype=pl.String),
                pl.Series("cat", cat, dtype=pl.String),
                pl.Series("ts", ts, dtype=pl.Float64),
                pl.Series("dur", dur, dtype=pl.Float64),
                _ids(pid, "pid"),
                _ids(tid, "tid"),
                pl.Series("correlation", corr, dtype=pl.Int64),
                pl.Series("external_id", ext, dtype=pl.Int64),
                pl.Series("stream", stream, dtype=pl.Int64),
                pl.Series("device", device, dtype=pl.Int64),
                pl.Series("bytes", nbytes, dtype=pl.Int64),
            ]
        )
        return df, tmin, n
    finally:
        if enabled:
            gc.enable()


# ---------------------------------------------------------------- reading and cutting


def open_decompressed(path: Path, head: bytes):
    """A binary file object yielding the JSON bytes: gunzipped (fastest library available) or plain."""
    if head[:2] != b"\x1f\x8b":
        return open(path, "rb")
    try:
        from isal import igzip

        return igzip.open(path, "rb")
    except ImportError:
        pass
    try:
        from zlib_ng import gzip_ng

        return gzip_ng.open(path, "rb")
    except ImportError:
        import gzip

        return gzip.open(path, "rb")


def gzip_library() -> str:
    for mod, label in (("isal", "isal"), ("zlib_ng", "zlib-ng")):
        try:
            __import__(mod)
            return label
        except ImportError:
            pass
    return "zlib"


_WS = b" \t\r\n"
_KEY = re.compile(rb'"traceEvents"\s*:\s*\[')


def _last_boundary(buf: bytes | bytearray, lo: int) -> int:
    """Position just after the ',' of the last `} , {` (between two events) in buf[lo:], or -1."""
    pos = len(buf)
    while True:
        pos = buf.rfind(b"{", lo, pos)
        if pos <= lo:
            return -1
        j = pos - 1
        while j > lo and buf[j] in _WS:
            j -= 1
        if buf[j] == 0x2C:  # ','
            k = j - 1
            while k > lo and buf[k] in _WS:
                k -= 1
            if buf[k] == 0x7D:  # '}'
                return j + 1
        # not a boundary: keep looking further back


@dataclass
class Cut:
    head: bytes = b""  # the document up to and including the array's '['
    tail: bytes = b""  # the document after the array's ']'
    raw_bytes: int = 0
    sha256: str = ""
    chunks: int = 0
    warnings: list[str] = field(default_factory=list)


def iter_chunks(path: Path, cut: Cut, chunk_bytes: int = CHUNK_BYTES) -> Iterator[bytes]:
    """Yield `[ev, ..., ev]` byte chunks of the traceEvents array; fills `cut` (head, tail, sizes, sha256).

    Raises NotFast when the file does not look like a Kineto object document.
    """
    h = hashlib.sha256()
    with open(path, "rb") as raw_f:
        head = raw_f.read(2)
    # hash the compressed file as it is on disk (summary.json's inputs[].sha256), in the same pass
    fh = open_decompressed(path, head)
    try:
        buf = bytearray()
        total = 0
        eof = False

        def fill(min_len: int) -> None:
            nonlocal eof, total
            while not eof and len(buf) < min_len:
                b = fh.read(READ_BYTES)
                if not b:
                    eof = True
                    break
                total += len(b)
                buf.extend(b)

        fill(1 << 20)
        m = _KEY.search(buf, 0, min(len(buf), 1 << 20))
        if m is None or buf.lstrip()[:1] != b"{":
            raise NotFast("no traceEvents array near the start")
        cut.head = bytes(buf[: m.end()])
        del buf[: m.end()]
        while True:
            fill(chunk_bytes + READ_BYTES)
            if eof:
                break
            b = _last_boundary(buf, 0)
            if b <= 0:
                # one event longer than a chunk? read more and try again
                fill(len(buf) * 2)
                continue
            chunk = b"[" + bytes(buf[: b - 1]) + b"]"
            del buf[:b]
            cut.chunks += 1
            yield chunk
        # the rest holds the last events, the array's ']' and the document's tail
        end = _array_end(buf)
        cut.tail = bytes(buf[end + 1:])
        chunk = b"[" + bytes(buf[:end]) + b"]"
        del buf
        cut.raw_bytes = total
        cut.chunks += 1
        yield chunk
    finally:
        fh.close()
    with open(path, "rb") as f:
        for blk in iter(lambda: f.read(8 << 20), b""):
            h.update(blk)
    cut.sha256 = h.hexdigest()


def _array_end(buf: bytearray) -> int:
    """Index of the ']' closing the events array: the last ']' after which the document's tail
    (`}` or `, "key": value ... }`) decodes; every candidate is validated by the decoders later."""
    pos = len(buf)
    while True:
        pos = buf.rfind(b"]", 0, pos)
        if pos < 0:
            raise NotFast("no end of the traceEvents array")
        tail = bytes(buf[pos + 1:])
        try:
            msgspec.json.decode(b'{"traceEvents": []' + tail)
            return pos
        except msgspec.DecodeError:
            continue


def parse_meta(cut: Cut) -> dict[str, Any]:
    try:
        doc = _META_DEC.decode(cut.head + b"]" + cut.tail)
    except (msgspec.ValidationError, msgspec.DecodeError) as e:
        raise NotFast(f"document around the events: {e}") from None
    meta: dict[str, Any] = {}
    if doc.deviceProperties:
        meta["devices"] = [d.name for d in doc.deviceProperties]
    if doc.distributedInfo is not None:
        meta["rank"] = doc.distributedInfo.rank
        meta["world_size"] = doc.distributedInfo.world_size
    return meta


@dataclass
class RawLoad:
    frame: pl.DataFrame  # RAW_SCHEMA: every 'X' event, in file order
    t0_ns: int
    n_events: int
    meta: dict[str, Any]
    raw_bytes: int
    sha256: str


def load_raw_frame(path: Path, *, executor: Executor | None = None, chunk_bytes: int = CHUNK_BYTES) -> RawLoad | None:
    """The raw events frame of one file, or None when the fast path does not apply (see module doc)."""
    cut = Cut()
    frames: list[pl.DataFrame] = []
    tmins: list[float] = []
    n = 0
    try:
        if executor is None:
            for chunk in iter_chunks(path, cut, chunk_bytes):
                df, tmin, k = decode_chunk(chunk)
                frames.append(df)
                n += k
                if tmin is not None:
                    tmins.append(tmin)
        else:
            futures = []
            inflight_limit = 2 * max(1, getattr(executor, "_max_workers", 2)) + 1
            results: list = []
            for chunk in iter_chunks(path, cut, chunk_bytes):
                futures.append(executor.submit(decode_chunk, chunk))
                del chunk
                # bound the chunks in flight (memory): wait for the oldest
                while sum(1 for f in futures if not f.done()) > inflight_limit:
                    futures[len(results)].result()
                    results.append(None)
            for f in futures:
                df, tmin, k = f.result()
                frames.append(df)
                n += k
                if tmin is not None:
                    tmins.append(tmin)
        meta = parse_meta(cut)
    except NotFast:
        return None
    frame = pl.concat(frames, how="vertical", rechunk=True) if frames else pl.DataFrame(schema=RAW_SCHEMA)
    t0 = round(min(tmins) * 1000) if tmins else 0
    return RawLoad(frame=frame, t0_ns=t0, n_events=n, meta=meta, raw_bytes=cut.raw_bytes, sha256=cut.sha256)


def default_jobs(n_files: int = 1) -> int:
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count() or 1
    return max(1, cores)


def make_executor(jobs: int) -> Executor | None:
    if jobs <= 1:
        return None
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    return ProcessPoolExecutor(max_workers=jobs, mp_context=mp.get_context("spawn"))


def run_in(executor: Executor | None, fn: Callable, *args: Any) -> Any:
    return fn(*args) if executor is None else executor.submit(fn, *args).result()
