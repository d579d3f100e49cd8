"""The fast ingest path: a Kineto file -> its tables, decoded in chunks, in parallel.

The file is decompressed as a stream (ISA-L's igzip or zlib-ng when installed, the stdlib
otherwise) straight into a few chunk-sized slots of memory, and the `traceEvents` array is cut at
event boundaries into chunks of a few tens of MB (ingest/reading.py, in a thread of its own); each
chunk is decoded by the C scanner (scan.py) or with msgspec into
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
from concurrent.futures import Executor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import polars as pl

from profkit.ingest.units import us_to_ns

from profkit.ingest.reading import (  # noqa: F401  (re-exported: the reading half of this path)
    CHUNK_BYTES, Cut, NotFast, Reader, decode_chunks, default_jobs, done, falls_back, gzip_library, open_decompressed,
    parse_meta, slot_count,
)

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


RAW_SCHEMA = {
    "name": pl.String, "cat": pl.String, "ts": pl.Float64, "dur": pl.Float64, "pid": pl.String,
    "tid": pl.String, "correlation": pl.Int64, "external_id": pl.Int64, "stream": pl.Int64,
    "device": pl.Int64, "bytes": pl.Int64,
}


def _ids(values: list, name: str) -> pl.Series:
    try:
        return pl.Series(name, values, dtype=pl.Int64, strict=True).cast(pl.String)
    except (TypeError, pl.exceptions.PolarsError, OverflowError):
        return pl.Series(name, [str(v) for v in values], dtype=pl.String)


# ---------------------------------------------------------------- the scanner's raw frame
#
# The C scanner's first pass (scan.py) read as a raw frame (RAW_SCHEMA), the form msgspec's decode
# takes: the chunks of worker processes and of the tiered comparison tests go through it.

from profkit.ingest.scan import V_BYTES, V_CORR, V_DEVICE, V_DUR, V_EXT, V_STREAM, V_TS  # noqa: E402

_NUMERIC = (("ts", V_TS, "ts"), ("dur", V_DUR, "dur"), ("corr", V_CORR, "correlation"), ("ext", V_EXT, "external_id"),
            ("stream", V_STREAM, "stream"), ("device", V_DEVICE, "device"), ("nbytes", V_BYTES, "bytes"))


def _numeric_columns(a: dict[str, Any], n: int, x: Any) -> list[Any]:
    """The seven numeric columns of the rows `x` (a mask over the events), null where their
    validity bit is not set, plus the `_v` column holding those bits."""
    import polars as pl

    return [pl.Series("_v", a["valid"][:n][x])] + [pl.Series(name, a[key][:n][x]) for key, _, name in _NUMERIC]


def _nullable() -> list[Any]:
    import polars as pl

    # one with_columns for all seven: the values where their validity bit is set, else null
    return [pl.when((pl.col("_v") & bit) != 0).then(pl.col(name)).otherwise(None).alias(name) for _, bit, name in _NUMERIC]


def scan_chunk(data: Any) -> tuple[Any, float | None, int] | None:
    """(raw frame of the 'X' events, min ts of all events, event count) as columnar.decode_chunk
    returns them, or None when the scanner is not there or does not accept the chunk."""
    from profkit.ingest.scan import INT_TEXT, X_PHASE, _scan, _tmin

    got = _scan(data)
    if got is None:
        return None
    a, n, texts, _ = got
    tmin = _tmin(a, n)
    x = a["ph"][:n] == X_PHASE
    if not x.any():
        return pl.DataFrame(schema=RAW_SCHEMA), tmin, n
    strings = pl.Series("s", texts, dtype=pl.String)

    def ids(key: str) -> pl.Series:
        return strings.gather(pl.Series(a[key][:n][x] & ~INT_TEXT)).alias(key)

    raw = pl.DataFrame([ids("name"), ids("cat"), ids("pid"), ids("tid"), *_numeric_columns(a, n, x)])
    df = raw.with_columns(_nullable()).select(*RAW_SCHEMA)
    return df, tmin, n



def decode_chunk(data: Any) -> tuple[pl.DataFrame, float | None, int]:
    """One chunk `[ev, ev, ...]` (any buffer) -> (raw frame of its 'X' events, min ts of all events, count).

    Raises NotFast when the chunk does not decode strictly (a bad cut, or a schema variant).
    The C scanner (scan.py) reads it when it is there and accepts the chunk; msgspec otherwise.
    """
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

    strings: an ingest.strings.Strings shared by the file's chunks: the rows are then coded (string
    columns as ids into it, see coded.py), which is what the scanner gives fastest."""
    from profkit.ingest.tables import normalize_events, split_rows, unusable_counts, usable_events

    if strings is not None:
        from profkit.ingest.coded import encode, scan_chunk_tables, split_coded

        got = scan_chunk_tables(data, strings)
        if got is not None:
            return got
        df, tmin, n = decode_chunk_msgspec(data)  # msgspec's frame, coded the same way
        df = encode(normalize_events(df), strings)
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

    parallel = executor is not None and jobs > 1
    threaded = isinstance(executor, ThreadPoolExecutor)
    shared = parallel and not threaded
    try:
        reader = Reader(path, chunk_bytes, slot_count(jobs if parallel else 1), shared)
    except OSError:
        return None
    view = reader.slots.view
    if not parallel:
        submit = lambda off, n: done(decode_view, view, off, n, tables, strings)  # noqa: E731
    elif threaded:
        submit = lambda off, n: executor.submit(decode_view, view, off, n, tables, strings)  # type: ignore[union-attr]  # noqa: E731
    else:
        submit = lambda off, n: executor.submit(decode_slot, reader.slots.path, off, n, tables)  # type: ignore[union-attr]  # noqa: E731
    try:
        results = decode_chunks(reader, submit)
        if tables and shared:  # Arrow IPC from the worker processes
            results = [(tuple(_from_ipc(b) for b in got[0]),) + tuple(got[1:]) for got in results]
        meta = parse_meta(reader.cut)
    except Exception as e:
        if falls_back(e):
            return None
        raise
    finally:
        reader.close()
    return results, reader.cut, meta


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
    t0 = us_to_ns(min(tmins)) if tmins else 0
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
    strings: Any = None  # strings.Strings of coded parts

    def tables(self, warnings: list[str]) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame, pl.DataFrame]:
        """The four tables (tables.finish_tables of the whole file's rows), duplicates warned about in `warnings`."""
        if self.strings is not None:
            from profkit.ingest.coded import finish_coded

            parts, self.parts = self.parts, []  # finish_coded drops each part once it is copied
            return finish_coded(parts, self.strings, warnings)
        from profkit.ingest.tables import finish_tables, normalize_events, split_rows, usable_events

        if not self.parts:
            whole = split_rows(usable_events(normalize_events(pl.DataFrame(schema=RAW_SCHEMA))))
        else:
            whole = tuple(pl.concat([p[k] for p in self.parts], how="vertical", rechunk=False) for k in range(4))
        return finish_tables(*whole, warnings)  # type: ignore[arg-type]


def _from_early(run: Any) -> TablesLoad | None:
    """The TablesLoad of a decode early.start began: the scanner's rows made into coded parts, the
    chunks it declined decoded by msgspec here, as decode_chunk_tables would."""
    if run.fallback:
        return None
    from profkit.ingest.coded import frames_of

    got, cut, meta = run.result
    results = []
    try:
        for item in got:
            if isinstance(item, bytes):
                results.append(decode_chunk_tables(item, run.strings))
            else:
                results.append((frames_of(item), item.unusable, item.tmin, item.n_events))
    except NotFast:
        return None
    unusable = tuple(sum(r[1][k] for r in results) for k in range(3))
    tmins = [r[2] for r in results if r[2] is not None]
    return TablesLoad(parts=[r[0] for r in results], unusable=unusable, t0_ns=us_to_ns(min(tmins)) if tmins else 0,  # type: ignore[arg-type]
                      n_events=sum(r[3] for r in results), meta=meta, raw_bytes=cut.raw_bytes, strings=run.strings)


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
        from profkit.ingest import early
        from profkit.ingest.strings import Strings

        run = early.take(path, chunk_bytes=chunk_bytes, jobs=jobs)
        if run is not None:
            return _from_early(run)
        strings = Strings()
    got = _decode_file(path, executor, jobs, chunk_bytes, tables=True, strings=strings)
    if got is None:
        return None
    results, cut, meta = got
    unusable = tuple(sum(r[1][k] for r in results) for k in range(3))
    tmins = [r[2] for r in results if r[2] is not None]
    t0 = us_to_ns(min(tmins)) if tmins else 0
    return TablesLoad(parts=[r[0] for r in results], unusable=unusable, t0_ns=t0,  # type: ignore[arg-type]
                      n_events=sum(r[3] for r in results), meta=meta, raw_bytes=cut.raw_bytes, strings=strings)


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
