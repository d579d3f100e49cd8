"""The fast ingest path: a Kineto file -> its tables, decoded in chunks, in parallel.

The file is decompressed as a stream (ISA-L's igzip or zlib-ng when installed, the stdlib
otherwise) straight into a few chunk-sized slots of shared memory, and the `traceEvents` array is
cut at event boundaries into chunks of a few tens of MB; each chunk is decoded with msgspec into
GC-free typed Structs (only the fields profkit reads), turned into columns, normalized and split
into the four tables' rows (tables.split_rows), in worker processes when `jobs > 1`; only
de-duplication and sorting (tables.finish_tables) are left for the whole file. Memory stays
bounded by the tables, a few chunks in flight and the slots: the decompressed JSON is never held
whole.

Every cut is checked by the decoder itself: each chunk must decode as a complete JSON array, and
the document around the array (everything before and after it) must decode as a JSON object, so
the concatenation parses exactly as the whole file would. When anything is not as expected (a cut
inside a string, a schema variant, a broken file, a top-level array), `load_raw_frame` returns None
and the caller uses the tiered decoder in `decode.py`, which gives the same frame and the precise
warnings and errors. Results are identical to that path: both go through the same functions of
tables.py (normalize_events, unusable_counts, split_rows, finish_tables), row-wise ones per chunk.
"""

from __future__ import annotations

import gc
import io
import os
import re
import tempfile
from concurrent.futures import Executor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import msgspec
import polars as pl

CHUNK_BYTES = 24 << 20  # raw JSON per decoded chunk
READ_BYTES = 8 << 20  # decompressed bytes per read

# Chrome trace-event phases. The complete events ('X') carry every field profkit uses; of the others
# only the timestamp is used (t0 is the earliest timestamp of any event).
_PHASES = "BEiIbnesStTpFfPNODMVvRcC()"


class FArgs(msgspec.Struct, gc=False, frozen=True):
    correlation: int | None = None
    external_id: int | None = msgspec.field(name="External id", default=None)
    stream: int | None = None
    device: int | None = None
    bytes: int | str | None = None


_NO_ARGS = FArgs()


class FX(msgspec.Struct, gc=False, tag_field="ph", tag="X"):
    cat: str = ""
    name: str = ""
    ts: float | None = None
    dur: float | None = None
    pid: int | str = 0
    tid: int | str = 0
    args: FArgs = _NO_ARGS  # frozen, shared: `args.x` reads need no None check


# Other phases are typed like decode.Event too (so a file the strict decoder would reject is
# rejected here as well, and takes the tiered path with its warnings), though only ts is used.
_OTHER_FIELDS = [
    ("cat", str, ""), ("name", str, ""), ("ts", float | None, None), ("dur", float | None, None),
    ("pid", int | str, 0), ("tid", int | str, 0), ("args", FArgs | None, None),
]
_OTHER = tuple(
    msgspec.defstruct(f"F_{ord(p)}", _OTHER_FIELDS, gc=False, tag_field="ph", tag=p) for p in _PHASES
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
    baseTimeNanoseconds: int | None = None  # typed as decode.TraceDoc types it, for the same verdict


_META_DEC = msgspec.json.Decoder(_Meta)

RAW_SCHEMA = {
    "name": pl.String, "cat": pl.String, "ts": pl.Float64, "dur": pl.Float64, "pid": pl.String,
    "tid": pl.String, "correlation": pl.Int64, "external_id": pl.Int64, "stream": pl.Int64,
    "device": pl.Int64, "bytes": pl.Int64,
}


class NotFast(Exception):
    """The file is not in the shape the fast path handles; use the tiered decoder."""


def _ids(values: list, name: str) -> pl.Series:
    try:
        return pl.Series(name, values, dtype=pl.Int64, strict=True).cast(pl.String)
    except (TypeError, pl.exceptions.PolarsError, OverflowError):
        return pl.Series(name, [str(v) for v in values], dtype=pl.String)


def decode_chunk(data: Any) -> tuple[pl.DataFrame, float | None, int]:
    """One chunk `[ev, ev, ...]` (any buffer) -> (raw frame of its 'X' events, min ts of all events, count).

    Raises NotFast when the chunk does not decode strictly (a bad cut, or a schema variant).
    The C scanner (scan.py) reads it when it is there and accepts the chunk; msgspec otherwise.
    """
    from profkit.ingest.scan import scan_chunk

    got = scan_chunk(data)
    if got is not None:
        return got
    return decode_chunk_msgspec(data)


def decode_chunk_msgspec(data: Any) -> tuple[pl.DataFrame, float | None, int]:
    """decode_chunk with msgspec's typed decode (where the C scanner is not there or declines)."""
    enabled = gc.isenabled()
    gc.disable()  # millions of short-lived objects: no collections while building them
    try:
        try:
            events = _CHUNK_DEC.decode(data)
        except (msgspec.ValidationError, msgspec.DecodeError) as e:
            raise NotFast(str(e)) from None
        n = len(events)
        xs = [e for e in events if type(e) is FX]
        others = [e.ts for e in events if type(e) is not FX and e.ts is not None] if len(xs) != n else []
        del events
        if not xs:
            return pl.DataFrame(schema=RAW_SCHEMA), (min(others) if others else None), n

        try:
            df = _columns(xs)
        except (TypeError, OverflowError, pl.exceptions.PolarsError) as e:  # an int beyond 64 bits: the tiered path warns
            raise NotFast(str(e)) from None
        ts = df["ts"]
        tmin = ts.min()
        if others:
            tmin = min(others) if tmin is None else min(tmin, min(others))
        return df, tmin, n
    finally:
        if enabled:
            gc.enable()


def _columns(xs: list) -> pl.DataFrame:
    """The raw frame of decoded 'X' events (RAW_SCHEMA)."""
    nbytes = [e.args.bytes for e in xs]
    try:
        s_bytes = pl.Series("bytes", nbytes, dtype=pl.Int64, strict=True)
    except (TypeError, pl.exceptions.PolarsError, OverflowError):
        s_bytes = pl.Series("bytes", [(int(b) if b.isascii() and b.isdigit() else None) if type(b) is str else b for b in nbytes], dtype=pl.Int64)
    del nbytes
    return pl.DataFrame(
        [
            pl.Series("name", [e.name for e in xs], dtype=pl.String),
            pl.Series("cat", [e.cat for e in xs], dtype=pl.String),
            pl.Series("ts", [e.ts for e in xs], dtype=pl.Float64),
            pl.Series("dur", [e.dur for e in xs], dtype=pl.Float64),
            _ids([e.pid for e in xs], "pid"),
            _ids([e.tid for e in xs], "tid"),
            pl.Series("correlation", [e.args.correlation for e in xs], dtype=pl.Int64),
            pl.Series("external_id", [e.args.external_id for e in xs], dtype=pl.Int64),
            pl.Series("stream", [e.args.stream for e in xs], dtype=pl.Int64),
            pl.Series("device", [e.args.device for e in xs], dtype=pl.Int64),
            s_bytes,
        ]
    )


_SLOT_FILES: dict[str, Any] = {}


def decode_chunk_tables(data: Any, strings: Any = None) -> tuple[tuple[pl.DataFrame, ...], tuple[int, int, int], float | None, int]:
    """One chunk -> its rows of the four tables (tables.split_rows: before de-duplication and
    sorting, which need the whole file), the unusable-event counts, min ts and event count.

    strings: an ingest.coded.Strings shared by the file's chunks: the rows are then coded (string
    columns as ids into it, see coded.py), which is what the scanner gives fastest."""
    from profkit.ingest.tables import normalize_events, split_rows, unusable_counts, usable_events

    if strings is not None:
        from profkit.ingest.coded import encode, split_coded
        from profkit.ingest.scan import scan_chunk_coded

        got = scan_chunk_coded(data, strings)
        if got is None:  # msgspec's frame, coded the same way
            df, tmin, n = decode_chunk_msgspec(data)
            df = encode(normalize_events(df), strings)
        else:
            df, tmin, n = got
            df = normalize_events(df)
        return split_coded(usable_events(df)), unusable_counts(df), tmin, n
    df, tmin, n = decode_chunk(data)
    df = normalize_events(df)
    return split_rows(usable_events(df)), unusable_counts(df), tmin, n


def decode_slot(path: str, offset: int, length: int, tables: bool = False) -> Any:
    """Worker side: decode the chunk at [offset, offset+length) of the shared slot file."""
    import mmap

    mm = _SLOT_FILES.get(path)
    if mm is None:
        with open(path.split("#", 1)[0], "r+b") as f:
            mm = mmap.mmap(f.fileno(), 0)
        _SLOT_FILES.clear()  # one load at a time: drop the previous file's mapping
        _SLOT_FILES[path] = mm
    with memoryview(mm) as mv:
        view = mv[offset: offset + length]
        try:
            if not tables:
                return decode_chunk(view)
            parts, counts, tmin, n = decode_chunk_tables(view)
        finally:
            view.release()
    # Arrow IPC bytes, not pickled frames: several times cheaper to send back for string columns
    return tuple(_to_ipc(df) for df in parts), counts, tmin, n


def decode_view(view: memoryview, offset: int, length: int, tables: bool, strings: Any = None) -> Any:
    """Thread side: decode the chunk at [offset, offset+length) of the slots' memory (the scanner
    and polars release the GIL, so chunks decode in parallel with the decompression)."""
    v = view[offset: offset + length]
    try:
        return decode_chunk_tables(v, strings) if tables else decode_chunk(v)
    finally:
        v.release()


def _to_ipc(df: pl.DataFrame) -> bytes:
    buf = io.BytesIO()
    df.write_ipc(buf, compression="uncompressed")
    return buf.getvalue()


def _from_ipc(data: bytes) -> pl.DataFrame:
    return pl.read_ipc(io.BytesIO(data))


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
    chunks: int = 0


_LB = ord("[")
_RB = ord("]")
_SEARCH = 1 << 20  # look for a cut in the last MiB of a chunk first


class _Slots:
    """k buffers of `size` bytes: one shared-memory file that the workers map, or plain memory."""

    def __init__(self, k: int, size: int, shared: bool) -> None:
        import mmap

        self.k, self.size, self.path, self.mm = k, size, None, None
        self._fd: int | None = None
        self._name: str | None = None
        if shared:
            d = "/dev/shm" if _room_in("/dev/shm", 2 * k * size) else None  # else the temp folder (page cache)
            fd, name = tempfile.mkstemp(prefix="profkit-ingest-", dir=d)
            try:
                os.ftruncate(fd, k * size)
                self.mm = mmap.mmap(fd, k * size)
            except BaseException:
                os.close(fd)
                os.unlink(name)
                raise
            proc = f"/proc/{os.getpid()}/fd/{fd}"
            if os.path.exists(proc):
                # Linux: the workers open it through /proc, so the name can go now and a killed
                # process leaves nothing behind; '#name' keeps the key unique when fds are reused
                os.unlink(name)
                self._fd, self.path = fd, f"{proc}#{name}"
            else:
                os.close(fd)
                self._name = self.path = name
            self.view = memoryview(self.mm)
        else:
            self.view = memoryview(bytearray(k * size))

    def close(self) -> None:
        self.view.release()
        if self.mm is not None:
            self.mm.close()
        if self._fd is not None:
            os.close(self._fd)
        if self._name:
            try:
                os.unlink(self._name)
            except OSError:
                pass


def _room_in(folder: str, need: int) -> bool:
    """Whether `folder` is writable with `need` bytes free: a small /dev/shm (containers often have
    64 MB) would end in SIGBUS when the mapping's pages are touched."""
    try:
        st = os.statvfs(folder)
        return os.access(folder, os.W_OK) and st.f_bavail * st.f_frsize >= need
    except OSError:
        return False


def _read_into(fh: Any, view: memoryview) -> int:
    """Fill view from fh; the bytes read (fewer only at the end of the file)."""
    got = 0
    n = len(view)
    while got < n:
        k = fh.readinto(view[got: min(n, got + READ_BYTES)])
        if not k:
            break
        got += k
    return got


def _cut_in(view: memoryview, lo: int, hi: int) -> int:
    """Index of the ',' of the last event boundary in view[lo:hi], or -1."""
    start = max(lo, hi - _SEARCH)
    while True:
        b = _last_boundary(bytes(view[start:hi]), 0)
        if b > 0:
            return start + b - 1
        if start == lo:
            return -1
        start = max(lo, start - 8 * _SEARCH)


def iter_slot_chunks(fh: Any, slots: _Slots, cut: Cut, wait_slot: Callable[[int], None]) -> Iterator[tuple[int, int, int]]:
    """Fill the slots round-robin with `[ev, ..., ev]` chunks of the traceEvents array, decompressing
    straight into them; yields (slot, offset, length). `wait_slot(i)` returns once slot i is free."""
    size = slots.size
    view = slots.view
    carry = b""
    first = True
    i = -1
    total = 0
    while True:
        i = (i + 1) % slots.k
        wait_slot(i)
        base = i * size
        pos = base + 1  # view[base] becomes the chunk's '['
        if len(carry) >= size - 1:
            raise NotFast("an event larger than a chunk")
        view[pos: pos + len(carry)] = carry
        room = size - 1 - len(carry)
        got = _read_into(fh, view[pos + len(carry): base + size])
        total += got
        data_end = pos + len(carry) + got
        eof = got < room
        if first:
            first = False
            probe = bytes(view[pos: min(data_end, pos + (1 << 20))])
            m = _KEY.search(probe)
            if m is None or probe.lstrip()[:1] != b"{":
                raise NotFast("no traceEvents array near the start")
            cut.head = probe[: m.end()]
            rest = bytes(view[pos + m.end(): data_end])
            view[pos: pos + len(rest)] = rest
            data_end = pos + len(rest)
        if eof:
            end = _array_end(view, pos, data_end)
            cut.tail = bytes(view[end + 1: data_end])
            view[base] = _LB
            view[end] = _RB
            cut.raw_bytes = total
            cut.chunks += 1
            yield i, base, end + 1 - base
            return
        c = _cut_in(view, pos, data_end)
        if c < 0:
            raise NotFast("no event boundary inside a chunk (an event larger than a chunk?)")
        carry = bytes(view[c + 1: data_end])
        view[base] = _LB
        view[c] = _RB
        cut.chunks += 1
        yield i, base, c + 1 - base


def _array_end(view: memoryview, lo: int, hi: int) -> int:
    """Index of the ']' closing the events array: the last ']' after which the document's tail
    (`}` or `, "key": value ... }`) decodes; the chunk before it is validated by its decode."""
    start = max(lo, hi - _SEARCH)
    window = bytes(view[start:hi])
    pos = len(window)
    while True:
        pos = window.rfind(b"]", 0, pos)
        if pos < 0:
            if start == lo:
                raise NotFast("no end of the traceEvents array")
            start = lo
            window = bytes(view[start:hi])
            pos = len(window)
            continue
        try:
            msgspec.json.decode(b'{"traceEvents": []' + window[pos + 1:])
            return start + pos
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


def _decode_file(path: Path, executor: Executor | None, jobs: int, chunk_bytes: int, tables: bool,
                 strings: Any = None) -> tuple[list[Any], Cut, dict[str, Any]] | None:
    """Decode every chunk of the file (in the workers when there is an executor); None: not fast-path material.
    strings: decode_chunk_tables' (not for worker processes)."""
    from concurrent.futures import ThreadPoolExecutor

    cut = Cut()
    parallel = executor is not None and jobs > 1
    threaded = isinstance(executor, ThreadPoolExecutor)
    k = 2 * jobs + 1 if parallel else 1
    pending: dict[int, Any] = {}
    order: list[Any] = []
    try:
        with open(path, "rb") as f:
            head = f.read(2)
    except OSError:
        return None
    slots = _Slots(k, chunk_bytes + (1 << 20), shared=parallel and not threaded)
    ok = False
    try:
        def wait_slot(i: int) -> None:
            fut = pending.pop(i, None)
            if fut is not None:
                fut.result()  # re-raises NotFast from the worker

        with open_decompressed(path, head) as fh:
            for i, off, length in iter_slot_chunks(fh, slots, cut, wait_slot):
                if parallel:
                    if threaded:
                        fut = executor.submit(decode_view, slots.view, off, length, tables, strings)  # type: ignore[union-attr]
                    else:
                        fut = executor.submit(decode_slot, slots.path, off, length, tables)  # type: ignore[union-attr]
                    pending[i] = fut
                    order.append(fut)
                else:
                    v = slots.view[off: off + length]
                    try:
                        order.append(decode_chunk_tables(v, strings) if tables else decode_chunk(v))
                    finally:
                        v.release()
        if parallel:
            results = []
            for r in order:
                got = r.result()
                if tables and not threaded:
                    got = (tuple(_from_ipc(b) for b in got[0]),) + tuple(got[1:])
                results.append(got)
        else:
            results = order
        meta = parse_meta(cut)
        ok = True
    except NotFast:
        return None
    except (OSError, EOFError):  # a broken gzip and the like: the tiered path reports it
        return None
    except Exception as e:
        if _is_decompress_error(e):
            return None
        raise
    finally:
        if not ok:
            for fut in pending.values():
                fut.cancel()
        for fut in pending.values():
            try:
                fut.result()
            except BaseException:
                pass
        slots.close()
    return results, cut, meta


def load_raw_frame(path: Path, *, executor: Executor | None = None, jobs: int = 1,
                   chunk_bytes: int = CHUNK_BYTES) -> RawLoad | None:
    """The raw events frame of one file, or None when the fast path does not apply (see module doc).

    With an executor (a process pool of `jobs` workers) the chunks are decoded by the workers
    straight from a shared-memory file; without one, here.
    """
    got = _decode_file(path, executor, jobs, chunk_bytes, tables=False)
    if got is None:
        return None
    results, cut, meta = got
    frames = [r[0] for r in results]
    tmins = [r[1] for r in results if r[1] is not None]
    n = sum(r[2] for r in results)
    frame = pl.concat(frames, how="vertical", rechunk=True) if frames else pl.DataFrame(schema=RAW_SCHEMA)
    t0 = round(min(tmins) * 1000) if tmins else 0
    return RawLoad(frame=frame, t0_ns=t0, n_events=n, meta=meta, raw_bytes=cut.raw_bytes)


@dataclass
class TablesLoad:
    # the chunks' parts of the four tables, in file order: tables.split_rows's, or coded (see
    # ingest/coded.py) when `strings` is set
    parts: list[tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame, pl.DataFrame]]
    unusable: tuple[int, int, int]  # tables.unusable_counts of the whole file
    t0_ns: int
    n_events: int
    meta: dict[str, Any]
    raw_bytes: int
    strings: Any = None  # coded.Strings of coded parts

    def tables(self, warnings: list[str]) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame, pl.DataFrame]:
        """The four tables (tables.finish_tables of the whole file's rows), duplicates warned about in `warnings`."""
        if self.strings is not None:
            from profkit.ingest.coded import finish_coded

            return finish_coded(self.parts, self.strings, warnings)
        from profkit.ingest.tables import finish_tables, normalize_events, split_rows, usable_events

        if not self.parts:
            whole = split_rows(usable_events(normalize_events(pl.DataFrame(schema=RAW_SCHEMA))))
        else:
            whole = tuple(pl.concat([p[k] for p in self.parts], how="vertical", rechunk=False) for k in range(4))
        return finish_tables(*whole, warnings)  # type: ignore[arg-type]


def load_tables_fast(path: Path, *, executor: Executor | None = None, jobs: int = 1,
                     chunk_bytes: int = CHUNK_BYTES) -> TablesLoad | None:
    """Like load_raw_frame, but each chunk is also normalized and split into the four tables where
    it was decoded (in parallel), leaving only de-duplication and sorting (TablesLoad.tables).
    Where the C scanner is there and the chunks are decoded in this process, the parts are coded
    (ingest/coded.py)."""
    from concurrent.futures import ProcessPoolExecutor

    from profkit.ingest.scan import lib

    strings = None
    if lib() is not None and not (isinstance(executor, ProcessPoolExecutor) and jobs > 1):
        from profkit.ingest.coded import Strings

        strings = Strings()
    got = _decode_file(path, executor, jobs, chunk_bytes, tables=True, strings=strings)
    if got is None:
        return None
    results, cut, meta = got
    unusable = tuple(sum(r[1][k] for r in results) for k in range(3))
    tmins = [r[2] for r in results if r[2] is not None]
    t0 = round(min(tmins) * 1000) if tmins else 0
    return TablesLoad(parts=[r[0] for r in results], unusable=unusable, t0_ns=t0,  # type: ignore[arg-type]
                      n_events=sum(r[3] for r in results), meta=meta, raw_bytes=cut.raw_bytes, strings=strings)


def _is_decompress_error(e: Exception) -> bool:
    s = f"{type(e).__name__} {e}".lower()
    return any(w in s for w in ("gzip", "deflate", "compress", "crc", "header", "zlib", "isal", "igzip"))


def default_jobs(n_files: int = 1) -> int:
    """min(cores, files): the cores this process may use, at most one per file for several files."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count() or 1
    return max(1, cores if n_files <= 1 else min(cores, n_files))


def make_executor(jobs: int, *, chunks: bool = False) -> Executor | None:
    """A pool of `jobs` workers, or None for 1. For the chunks of one file (`chunks`), threads when
    the C scanner is there (it and polars release the GIL: no process start-up, no copying of the
    tables between processes); otherwise, and for whole files, spawned processes (safe with
    polars' threads)."""
    if jobs <= 1:
        return None
    if chunks:
        from profkit.ingest.scan import lib

        if lib() is not None:
            from concurrent.futures import ThreadPoolExecutor

            return ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="profkit-chunk")
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    return ProcessPoolExecutor(max_workers=jobs, mp_context=mp.get_context("spawn"))
