"""The fast ingest path: a Kineto file -> its tables, decoded in chunks, in parallel.

The file is decompressed as a stream (ISA-L's igzip or zlib-ng when installed, the stdlib
otherwise) straight into a few chunk-sized slots of memory, and the `traceEvents` array is cut at
event boundaries into chunks of a few tens of MB (ingest/reading.py, in a thread of its own). Each
chunk takes one route, `decode_chunk_tables`: the C scanner (scan.py) writes its rows of the four
tables with strings as ids into the file's `Strings` (ingest/coded.py); a chunk the scanner
declines (or every chunk, where there is no scanner) is decoded by msgspec into GC-free typed
Structs, normalized, encoded the same way and split (`decode_chunk_msgspec_tables`, the one
fallback). The chunks are decoded in threads (the scanner and polars release the GIL), or, without
the scanner, in worker processes whose ids are mapped to the file's on return; only
de-duplication and sorting (coded.finish_coded) are left for the whole file. Memory stays bounded
by the tables, a few chunks in flight and the slots: the decompressed JSON is never held whole.

Every cut is checked by the decoder itself: each chunk must decode as a complete JSON array, and
the document around the array (everything before and after it) must decode as a JSON object, so
the concatenation parses exactly as the whole file would. When anything is not as expected (a cut
inside a string, a schema variant, a broken file, a top-level array), `load_tables_fast` returns
None and the caller uses the tiered decoder in `decode.py`, which gives the same tables and the
precise warnings and errors. Results are identical to that path: both go through the same
functions of tables.py (normalize_events, unusable_counts, gpu_columns, call_columns, by_start).
"""

from __future__ import annotations

import gc
import io
import mmap
from concurrent.futures import Executor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import msgspec
import polars as pl

from profkit.ingest.decode import Args, TraceMeta
from profkit.ingest.identity import TraceFile, trace_file
from profkit.ingest.reading import CHUNK_BYTES, Cut, NotFast, Reader, decode_chunks, done, falls_back, parse_meta, slot_count
from profkit.ingest.units import us_to_ns

# Chrome trace-event phases. The complete events ('X') carry every field profkit uses; of the others
# only the timestamp is used (t0 is the earliest timestamp of any event).
_PHASES = "BEiIbnesStTpFfPNODMVvRcC()"

_NO_ARGS = Args()


class FX(msgspec.Struct, gc=False, tag_field="ph", tag="X"):
    cat: str = ""
    name: str = ""
    ts: float | None = None
    dur: float | None = None
    pid: int | str = 0
    tid: int | str = 0
    args: Args = _NO_ARGS  # frozen, shared: `args.x` reads need no None check


# Other phases are typed like decode.Event too (so a file the strict decoder would reject is
# rejected here as well, and takes the tiered path with its warnings), though only ts is used.
_OTHER_FIELDS = [
    ("cat", str, ""), ("name", str, ""), ("ts", float | None, None), ("dur", float | None, None),
    ("pid", int | str, 0), ("tid", int | str, 0), ("args", Args | None, None),
]
_OTHER = tuple(
    msgspec.defstruct(f"F_{ord(p)}", _OTHER_FIELDS, gc=False, tag_field="ph", tag=p) for p in _PHASES
)
_EventU = FX | _OTHER[0]
for _t in _OTHER[1:]:
    _EventU = _EventU | _t
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


def decode_chunk_msgspec(data: Any, strings: Any = None) -> tuple[pl.DataFrame, float | None, int]:
    """One chunk `[ev, ev, ...]` (any buffer) -> (frame of its 'X' events, RAW_SCHEMA; min ts of
    all events; event count), with msgspec's typed decode. Raises NotFast when the chunk does not
    decode strictly (a bad cut, or a schema variant). `strings`: an ingest.strings.Strings to note
    the earliest timestamp of each SGLang-labelled pid in (ingest/processes.py)."""
    enabled = gc.isenabled()
    gc.disable()  # millions of short-lived objects: no collections while building them
    try:
        try:
            events: list[Any] = _CHUNK_DEC.decode(data)
        except (msgspec.ValidationError, msgspec.DecodeError) as e:
            raise NotFast(str(e)) from None
        n = len(events)
        xs = [e for e in events if type(e) is FX]
        others = [e.ts for e in events if type(e) is not FX and e.ts is not None] if len(xs) != n else []
        if strings is not None and not strings.shapes and any(e.args.input_dims is not None for e in xs):
            strings.shapes = True  # recorded with shapes (ingest/shapes.py)
        if not xs:
            if strings is not None:
                _note_labelled(events, strings)
            return pl.DataFrame(schema=RAW_SCHEMA), (min(others) if others else None), n

        try:
            df = _columns(xs)
        except (TypeError, OverflowError, pl.exceptions.PolarsError) as e:  # an int beyond 64 bits: the tiered path warns
            raise NotFast(str(e)) from None
        if strings is not None and df["pid"].str.starts_with("[").any():  # perhaps SGLang's merged ranks
            _note_labelled(events, strings)
        del events
        ts = df["ts"]
        tmin = cast("float | None", ts.min())  # a Float64 column (RAW_SCHEMA)
        if others:
            tmin = min(others) if tmin is None else min(tmin, min(others))
        return df, tmin, n
    finally:
        if enabled:
            gc.enable()


def _note_labelled(events: list, strings: Any) -> None:
    """The earliest timestamp of each SGLang-labelled pid among a chunk's events, noted in `strings`."""
    from profkit.ingest.processes import min_ts_by_label

    named = [e for e in events if type(e.pid) is str and e.pid[:1] == "["]
    if named:
        strings.note_min_ts(min_ts_by_label([e.pid for e in named], [e.ts for e in named]))


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


# what decode_chunk_tables returns: a chunk's coded parts of the four tables, (no ts, no dur,
# negative dur) counts, min ts, event count
ChunkTables = tuple[tuple[pl.DataFrame, ...], tuple[int, int, int], float | None, int]


def decode_chunk_tables(data: Any, strings: Any) -> ChunkTables:
    """One chunk -> its rows of the four tables, coded (string columns as ids into `strings`, an
    ingest.strings.Strings shared by the file's chunks; see coded.py), before de-duplication and
    sorting, which need the whole file; the unusable-event counts, min ts and event count.

    The one route of every chunk: the C scanner when it is there and accepts the chunk, else
    msgspec (decode_chunk_msgspec_tables). Raises NotFast when msgspec rejects it too."""
    from profkit.ingest.coded import scan_chunk_tables

    got = scan_chunk_tables(data, strings)
    if got is not None:
        return got
    return decode_chunk_msgspec_tables(data, strings)


def decode_chunk_msgspec_tables(data: Any, strings: Any) -> ChunkTables:
    """decode_chunk_tables with msgspec's typed decode: the frame normalized, coded and split as the
    scanner's rows are (coded.encode, coded.split_coded)."""
    from profkit.ingest.coded import encode, split_coded
    from profkit.ingest.tables import normalize_events, unusable_counts, usable_events

    df, tmin, n = decode_chunk_msgspec(data, strings)
    if strings is not None:
        strings.shape_rows_missing = True  # its rows' `Input Dims` are not kept: ingest/shapes.py reads the file
    df = encode(normalize_events(df), strings)
    return split_coded(usable_events(df)), unusable_counts(df), tmin, n


_SLOT_FILES: dict[str, mmap.mmap] = {}


def decode_slot(path: str, offset: int, length: int) -> Any:
    """Worker-process side: decode the chunk at [offset, offset+length) of the shared slot file,
    coded with ids of its own (the worker's texts are sent back for _recode)."""
    from profkit.ingest.strings import Strings

    mm = _SLOT_FILES.get(path)
    if mm is None:
        with open(path.split("#", 1)[0], "r+b") as f:
            mm = mmap.mmap(f.fileno(), 0)
        _SLOT_FILES.clear()  # one load at a time: drop the previous file's mapping
        _SLOT_FILES[path] = mm
    strings = Strings()
    with memoryview(mm) as mv:
        view = mv[offset: offset + length]
        try:
            parts, counts, tmin, n = decode_chunk_tables(view, strings)
        finally:
            view.release()
    # Arrow IPC bytes, not pickled frames: several times cheaper to send back
    return (tuple(_to_ipc(df) for df in parts), counts, tmin, n, strings.texts, strings.labelled_min_ts, strings.shapes,
            strings.shape_rows_missing)


def _recode(got: Any, strings: Any) -> ChunkTables:
    """A worker's decode_slot result -> decode_chunk_tables' with ids into this file's `strings`."""
    from profkit.ingest.coded import SHAPE_IDS, STRING_COLS

    ipc, counts, tmin, n, texts, labelled, shapes, missing = got
    strings.note_min_ts(labelled)
    strings.shapes = strings.shapes or shapes
    strings.shape_rows_missing = strings.shape_rows_missing or missing
    ids = pl.Series(strings.ids(texts))
    parts = tuple(
        df.with_columns(pl.lit(ids).gather(pl.col(c)).alias(c) for c in STRING_COLS + SHAPE_IDS if c in df.columns)
        for df in (_from_ipc(b) for b in ipc)
    )
    return parts, counts, tmin, n


def decode_view(view: memoryview, offset: int, length: int, strings: Any) -> ChunkTables:
    """Thread side: decode the chunk at [offset, offset+length) of the slots' memory (the scanner
    and polars release the GIL, so chunks decode in parallel with the decompression)."""
    v = view[offset: offset + length]
    try:
        return decode_chunk_tables(v, strings)
    finally:
        v.release()


def _to_ipc(df: pl.DataFrame) -> bytes:
    buf = io.BytesIO()
    df.write_ipc(buf, compression="uncompressed")
    return buf.getvalue()


def _from_ipc(data: bytes) -> pl.DataFrame:
    return pl.read_ipc(io.BytesIO(data))


# ---------------------------------------------------------------- the whole file


@dataclass
class TablesLoad:
    parts: list[tuple[pl.DataFrame, ...]]  # the chunks' coded parts (four tables each), in file order
    unusable: tuple[int, int, int]  # tables.unusable_counts of the whole file
    t0_ns: int
    n_events: int
    meta: TraceMeta
    raw_bytes: int
    strings: Any  # strings.Strings: the texts of the parts' ids
    # the CPU ops' shapes (ingest/shapes.py), set by `tables` or `ranks` where the parts gave them; None: read from the file
    cpu_shapes: pl.DataFrame | None = None

    def tables(self, warnings: list[str]) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame, pl.DataFrame]:
        """The four tables (as tables.finish_tables gives them for the whole file's rows),
        duplicates warned about in `warnings`."""
        from profkit.ingest.coded import finish_coded

        parts, self.parts = self.parts, []  # finish_coded drops each part once it is copied
        got, self.cpu_shapes = finish_coded(parts, self.strings, warnings)
        return got

    def ranks(self, warnings: list[str]) -> tuple[Any, list[tuple[Any, list[str]]]]:
        """The four tables of each rank the file holds (coded.finish_coded_ranks: (Split or None,
        [(tables, warnings)]), one entry for a file of one rank, whose tables are `tables`')."""
        from profkit.ingest.coded import finish_coded_ranks

        parts, self.parts = self.parts, []
        split, ranks, self.cpu_shapes = finish_coded_ranks(parts, self.strings, warnings)
        return split, ranks


def _load(results: list[ChunkTables], cut: Cut, meta: TraceMeta, strings: Any) -> TablesLoad:
    unusable = tuple(sum(r[1][k] for r in results) for k in range(3))
    tmins = [r[2] for r in results if r[2] is not None]
    return TablesLoad(parts=[r[0] for r in results], unusable=unusable, t0_ns=us_to_ns(min(tmins)) if tmins else 0,  # type: ignore[arg-type]
                      n_events=sum(r[3] for r in results), meta=meta, raw_bytes=cut.raw_bytes, strings=strings)


def _from_early(decode: Any) -> TablesLoad | None:
    """The TablesLoad of a decode early.start began: the scanner's rows made into coded parts, the
    chunks it declined decoded by msgspec here, as decode_chunk_tables would."""
    from profkit.ingest.coded import frames_of

    got, cut, meta = decode.result
    decode.result = None  # the rows are the parts' now: the handle, which lives through the analysis, keeps none of them
    results = []
    try:
        for item in got:
            if isinstance(item, bytes):
                results.append(decode_chunk_msgspec_tables(item, decode.strings))
            else:
                results.append((frames_of(item), item.unusable, item.tmin, item.n_events))
    except NotFast:
        return None
    return _load(results, cut, meta, decode.strings)


def load_tables_fast(path: Path | TraceFile, *, executor: Executor | None = None, jobs: int = 1,
                     chunk_bytes: int = CHUNK_BYTES, early: Any = None) -> TablesLoad | None:
    """The chunks of one file decoded (decode_chunk_tables: in the executor's workers when there
    is one and jobs > 1, else here) into their coded parts, leaving only de-duplication and
    sorting (TablesLoad.tables); None when the fast path does not apply (see the module doc).

    Threads decode straight from the slots' memory; worker processes (a ProcessPoolExecutor: the
    way without the C scanner) from a shared-memory file. `early`: an early.EarlyDecode that
    ingest/early.py began for this file, taken over instead of decoding again (its result is the
    same whatever `jobs` it ran with)."""
    from concurrent.futures import ThreadPoolExecutor

    from profkit.ingest.strings import Strings

    try:
        f = trace_file(path)
    except OSError:
        return None  # the tiered decoder says what is wrong
    if early is not None:
        decode = early.take(f)
        if decode is not None:
            return _from_early(decode) if not decode.fallback else None
    strings = Strings()
    parallel = executor is not None and jobs > 1
    shared = parallel and not isinstance(executor, ThreadPoolExecutor)
    try:
        reader = Reader(f.path, f.gzip, chunk_bytes, slot_count(jobs if parallel else 1), shared)
    except OSError:  # no memory for the slots: the tiered decoder
        return None
    view = reader.slots.view
    pool = executor if parallel else None
    slot_path = cast(str, reader.slots.path)  # a shared Reader's slots are a named file (None otherwise, and then unused)
    if pool is None:
        submit = lambda off, n: done(decode_view, view, off, n, strings)  # noqa: E731
    elif not shared:
        submit = lambda off, n: pool.submit(decode_view, view, off, n, strings)  # noqa: E731
    else:
        submit = lambda off, n: pool.submit(decode_slot, slot_path, off, n)  # noqa: E731
    try:
        results = decode_chunks(reader, submit)
        if shared:
            results = [_recode(got, strings) for got in results]
        meta = parse_meta(reader.cut)
    except Exception as e:
        if falls_back(e):
            return None
        raise
    finally:
        reader.close()
    return _load(results, reader.cut, meta, strings)


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
