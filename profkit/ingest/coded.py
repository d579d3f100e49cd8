"""The tables of one file with strings as ids until the end: the chunk-parallel ingest's format.

A chunk's rows carry, in place of name, cat, pid and tid, ids into the file's `Strings` (each
distinct string once, shared by the chunks, which may be decoded in parallel threads). The C
scanner writes them so directly (coded.scan_chunk_tables); a chunk it declines is decoded by msgspec
and encoded (`encode`, `split_coded`). Filtering,
concatenating, de-duplicating and sorting millions of rows then moves integers, not strings; the
strings are put in once per table at the end (`finish_coded`), as views into one buffer. The
result is tables.finish_tables(*tables.split_rows(...)) of the same events: the same functions
compute every derived column (tables.gpu_columns, tables.call_columns), and two rows have equal ids
exactly when they have equal strings, so de-duplication keeps the same rows.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import polars as pl

from profkit.ingest.categories import foreign_device_warning, table_code
from profkit.ingest.scan import NO_TEXT, V_BYTES, V_CORR, V_DEVICE, V_EXT, V_STREAM, Rows
from profkit.ingest.strings import Strings
from profkit.ingest.tables import CPU_SCHEMA, Tables, _dedupe, by_start, call_columns, gpu_columns

# the columns of a chunk's coded parts, per table (ids for the string columns)
GPU_CODED = ["name", "cat", "ts_ns", "dur_ns", "end_ns", "device", "stream", "correlation", "bytes", "pid", "tid"]
CALLS_CODED = ["name", "ts_ns", "dur_ns", "end_ns", "pid", "tid", "correlation", "external_id"]
CPU_CODED = list(CPU_SCHEMA)
STRING_COLS = ("name", "cat", "pid", "tid")
# the CPU part's ids of its rows' `Input Dims` and `Input type` text, in the parts of chunks that have them
# (ingest/shapes.py's rows come from these: the file is not read again); dropped from the table itself
SHAPE_IDS = ("_dims", "_types")


def encode(df: pl.DataFrame, strings: Strings) -> pl.DataFrame:
    """A normalized events frame with strings (tables.normalize_events of msgspec's chunk, for
    the chunks the scanner declines) -> the same with the string columns as ids and `_t` the table
    of each row, for split_coded."""
    cols = []
    for c in STRING_COLS:
        distinct = df[c].drop_nulls().unique()
        cols.append(pl.col(c).replace_strict(distinct, pl.Series(strings.ids(distinct.to_list())), default=None,
                                             return_dtype=pl.UInt32))
    cats = df["cat"].drop_nulls().unique()
    tables = pl.Series([table_code(c) for c in cats.to_list()], dtype=pl.Int8)
    return df.with_columns(*cols, pl.col("cat").replace_strict(cats, tables, default=-1, return_dtype=pl.Int8).alias("_t"))


# the scanner's array and validity bit of each nullable coded column
_NULLABLE = {"correlation": ("corr", V_CORR), "external_id": ("ext", V_EXT), "stream": ("stream", V_STREAM),
             "device": ("device", V_DEVICE), "bytes": ("nbytes", V_BYTES)}
_PLAIN = {"name": "name", "cat": "cat", "pid": "pid", "tid": "tid", "ts_ns": "ts", "dur_ns": "dur", "end_ns": "end"}
_COLUMNS = (GPU_CODED, CALLS_CODED, CPU_CODED, CPU_CODED)


def coded_frame(table: int, cols: dict[str, np.ndarray]) -> pl.DataFrame:
    """Table `table`'s coded part from the scanner's row arrays (coded.scan_chunk_tables): the
    columns share the arrays' memory; a nullable column is null where its validity bit is unset."""
    valid = cols["valid"]
    series = []
    for c in _COLUMNS[table]:
        if c in _PLAIN:
            series.append(pl.Series(c, cols[_PLAIN[c]]))
        else:
            key, bit = _NULLABLE[c]
            series.append(pl.Series(c, np.ma.masked_array(cols[key], (valid & bit) == 0)))
    if table == 2 and "dims" in cols:
        for c, key in zip(SHAPE_IDS, ("dims", "types")):
            series.append(pl.Series(c, np.ma.masked_array(cols[key], cols[key] == NO_TEXT)))
    return pl.DataFrame(series)


def frames_of(rows: Rows) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    """scan.Rows -> the chunk's coded parts of the four tables."""
    return tuple(coded_frame(t, rows.table(t)) for t in range(4))  # type: ignore[return-value]


def split_coded(df: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    """The usable encoded events of a chunk -> its coded parts of the four tables, in event order:
    what coded.scan_chunk_tables gives for the chunks it reads."""
    t = pl.col("_t")
    return (df.filter(t == 0).select(GPU_CODED), df.filter(t == 1).select(CALLS_CODED),
            df.filter(t == 2).select(CPU_CODED), df.filter(t == 3).select(CPU_CODED))


def empty_parts() -> tuple[pl.DataFrame, ...]:
    schema = {"name": pl.UInt32, "cat": pl.UInt32, "pid": pl.UInt32, "tid": pl.UInt32}
    ints = {c: pl.Int64 for c in ("ts_ns", "dur_ns", "end_ns", "device", "stream", "correlation", "bytes", "external_id")}
    both = {**schema, **ints}
    return tuple(pl.DataFrame(schema={c: both[c] for c in cols}) for cols in (GPU_CODED, CALLS_CODED, CPU_CODED, CPU_CODED))


def _decoded(df: pl.DataFrame, strings: pl.Series) -> pl.DataFrame:
    # as expressions, so polars gathers the columns in parallel
    return df.with_columns(pl.lit(strings).gather(pl.col(c)).alias(c) for c in STRING_COLS if c in df.columns)


def finish_coded(parts: list[tuple[pl.DataFrame, ...]], strings: Strings,
                 warnings: list[str]) -> tuple[tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame, pl.DataFrame], pl.DataFrame | None]:
    """The chunks' coded parts, in file order -> the four tables (as tables.finish_tables gives them),
    and the CPU ops' shapes (ingest/shapes.py: None where the parts cannot give them).

    `parts` is emptied as it is used: each step's input is dropped as soon as its output exists, so
    the next step's allocations reuse that memory instead of touching new pages (on a VM, first
    touches of memory cost about as much as the copying itself)."""
    return _finish(_concat(parts, strings, warnings), strings, warnings)


def finish_coded_ranks(parts: list[tuple[pl.DataFrame, ...]], strings: Strings,
                       warnings: list[str]) -> tuple[Any, list[tuple[Tables, list[str]]], pl.DataFrame | None]:
    """finish_coded, for a file that may hold several ranks (ingest/processes.py): (the Split, or
    None for a file of one rank; per rank, its four tables and its warnings, which begin with
    `warnings`). Each rank's rows are de-duplicated and sorted on their own, with their pids as the
    rank's own file wrote them, as if its file had been read alone. Third, the CPU ops' shapes of a
    file of one rank (ingest/shapes.py; None for several ranks: each reads them from its file)."""
    tables = _concat(parts, strings, warnings)
    split = _coded_split(tables, strings)
    if split is None:
        got, shapes = _finish(tables, strings, warnings)
        return None, [(got, warnings)], shapes
    if SHAPE_IDS[0] in tables[2].columns:
        tables[2] = tables[2].drop(SHAPE_IDS)
    n = len(split.names)
    rank_of = np.full(len(strings.texts), -1, np.int32)
    new_id = np.arange(len(strings.texts), dtype=np.uint32)
    for t in tables:
        for i in t["pid"].unique().to_list():
            got = split.locate(strings.texts[i])
            if got is not None:
                rank_of[i] = got[0]
                new_id[i] = strings.ids([got[1]])[0]
    r, ids = pl.Series(rank_of), pl.Series(new_id)
    marked = [t.with_columns(pl.lit(r).gather(pl.col("pid")).alias("_rank"), pl.lit(ids).gather(pl.col("pid")).alias("pid"))
              for t in tables]
    tables.clear()
    lost = sum(int((m["_rank"] < 0).sum()) for m in marked)
    out = []
    for k in range(n):
        w = list(warnings)
        if lost:
            w.append(f"left out {lost} events whose pid names no rank of this merged file")
        mine = [m.filter(pl.col("_rank") == k).drop("_rank") for m in marked]
        out.append((_finish(mine, strings, w)[0], w))
    return split, out, None


def _coded_split(tables: list[pl.DataFrame], strings: Strings) -> Any:
    """processes.plan_split of the coded tables: their GPU ops' (pid, device) and the pids of the GPU
    ops and runtime calls (of the CPU events and annotations when there are neither)."""
    from profkit.ingest.processes import plan_split

    gpu, calls, cpu, ann = tables
    texts = strings.texts
    gpu_ids = set(gpu["pid"].unique().to_list())
    ids = gpu_ids | set(calls["pid"].unique().to_list())
    if not ids:
        ids = set(cpu["pid"].unique().to_list()) | set(ann["pid"].unique().to_list())
    if len(gpu_ids) < 2 and not any(texts[i][:1] == "[" for i in ids):
        return None  # one process on one device (the common case): no pair is looked at
    pairs = {(texts[p], d) for p, d in gpu.select("pid", "device").unique().iter_rows()} if gpu.height else set()
    return plan_split(pairs, {texts[i] for i in ids})


def _concat(parts: list[tuple[pl.DataFrame, ...]], strings: Strings, warnings: list[str]) -> list[pl.DataFrame]:
    """The chunks' coded parts -> the four coded tables of the whole file (`parts` emptied)."""
    if not parts:
        parts.append(empty_parts())
    foreign = foreign_device_warning(strings.texts)
    if foreign:
        warnings.append(foreign)
    tables = [_stack([p[k] for p in parts]) for k in range(4)]
    parts.clear()
    return tables


def _stack(frames: list[pl.DataFrame]) -> pl.DataFrame:
    """One table's parts, end to end (no copy: the sort that finishes the table makes it contiguous);
    the parts of chunks without shapes get null SHAPE_IDS when others have them."""
    if any(SHAPE_IDS[0] in f.columns for f in frames) and not all(SHAPE_IDS[0] in f.columns for f in frames):
        frames = [f if SHAPE_IDS[0] in f.columns else f.with_columns(pl.lit(None, pl.UInt32).alias(c) for c in SHAPE_IDS) for f in frames]
    return pl.concat(frames, how="vertical", rechunk=False)


def _finish(tables: list[pl.DataFrame], strings: Strings,
            warnings: list[str]) -> tuple[tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame, pl.DataFrame], pl.DataFrame | None]:
    """Four coded tables -> the four tables (`tables` emptied as they are used), and the CPU ops'
    shapes (ingest/shapes.shape_rows) where every chunk gave its rows' (else None)."""
    s = strings.series()
    shapes = None
    if SHAPE_IDS[0] in tables[2].columns:
        from profkit.ingest.shapes import shape_rows

        if strings.shapes and not strings.shape_rows_missing:
            shapes = shape_rows(tables[2], SHAPE_IDS, s, int(strings.ids(["cpu_op"])[0]))
        tables[2] = tables[2].drop(SHAPE_IDS)
    # GPU ops and runtime calls are few next to the CPU events: their strings go in first, for the
    # derived columns (stream and device from tid and pid, memcpy direction, api) and de-duplication
    gpu = by_start(_dedupe(gpu_columns(_decoded(tables[0], s)), "GPU op", ["name", "ts_ns", "dur_ns", "stream", "correlation"], warnings))
    calls = by_start(_dedupe(call_columns(_decoded(tables[1], s)), "runtime call", ["name", "ts_ns", "dur_ns", "tid", "correlation"], warnings))
    tables[:2] = [None, None]  # type: ignore[list-item]
    out = [gpu, calls]
    for k in (2, 3):  # CPU events, GPU annotations
        ordered = by_start(tables[k])
        tables[k] = None  # type: ignore[call-overload]
        out.append(_decoded(ordered, s))
        del ordered
    give_back_freed_memory()  # the chunks' rows, freed by now: no longer counted in the process's memory
    return tuple(out), shapes  # type: ignore[return-value]


def give_back_freed_memory() -> None:
    """Return the C heap's free memory to the system (glibc's malloc_trim; elsewhere nothing). The
    chunks' row arrays are numpy's, allocated with malloc: once glibc has freed one large block it
    raises its mmap threshold (up to 32 MB), so the later arrays come from its heaps and stay mapped
    after they are freed, hundreds of MB of a large trace's peak memory for the rest of the run."""
    global _TRIM
    if _TRIM is None:
        import ctypes
        import ctypes.util
        import sys

        try:
            _TRIM = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim if sys.platform.startswith("linux") else False
        except (OSError, AttributeError):
            _TRIM = False
    if _TRIM:
        _TRIM(0)


_TRIM: Any = None


def scan_chunk_tables(data: Any, strings: Any) -> tuple[tuple[Any, ...], tuple[int, int, int], float | None, int] | None:
    """A chunk -> what columnar.decode_chunk_tables returns for it, coded (ingest/coded.py): its
    parts of the four tables (frames sharing scan_chunk_rows' arrays), the unusable-event counts,
    min ts and event count; None when the scanner is not there or does not accept the chunk."""
    from profkit.ingest.scan import scan_chunk_rows

    rows = scan_chunk_rows(data, strings)
    if rows is None:
        return None
    return frames_of(rows), rows.unusable, rows.tmin, rows.n_events
