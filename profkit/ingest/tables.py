"""Typed events -> the polars tables the analysis reads, with integer nanosecond times.

Kineto writes microsecond floats carrying nanosecond fractions; they are converted once, here
(`round(us * 1000)`), and never compared as floats afterwards.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl

from profkit.apis import canonical_api
from profkit.ingest.decode import Event, TraceMeta

from profkit.ingest.categories import CALL_CATS, CPU_CATS, GPU_OP_CATS, canonical_cat, foreign_device_warning
from profkit.ingest.units import US_LIMIT, us_to_ns

GPU_OPS_SCHEMA = {
    "name": pl.String, "cat": pl.String, "ts_ns": pl.Int64, "dur_ns": pl.Int64, "end_ns": pl.Int64,
    "device": pl.Int64, "stream": pl.Int64, "correlation": pl.Int64, "bytes": pl.Int64,
    "direction": pl.String, "pageable": pl.Boolean,
}
CALLS_SCHEMA = {
    "name": pl.String, "api": pl.String, "ts_ns": pl.Int64, "dur_ns": pl.Int64, "end_ns": pl.Int64,
    "pid": pl.String, "tid": pl.String, "correlation": pl.Int64, "external_id": pl.Int64,
}
CPU_SCHEMA = {
    "name": pl.String, "cat": pl.String, "ts_ns": pl.Int64, "dur_ns": pl.Int64, "end_ns": pl.Int64,
    "pid": pl.String, "tid": pl.String, "external_id": pl.Int64,
}


@dataclass
class Trace:
    """One rank's trace file, ingested.

    gpu_ops: kernels, memcpys, memsets on the device timeline (GPU_OPS_SCHEMA); `direction` is
    h2d/d2h/d2d/other for memcpys (null otherwise), `pageable` marks copies from/to pageable memory.
    calls: CUDA/HIP runtime and driver calls (CALLS_SCHEMA); `api` is the canonical CUDA spelling.
    cpu: cpu_op, user_annotation and python_function events (CPU_SCHEMA).
    gpu_annotations: gpu_user_annotation ranges (CPU_SCHEMA; pid/tid are device/stream).
    """

    path: Path
    rank: int
    device: str | None
    gpu_ops: pl.DataFrame
    calls: pl.DataFrame
    cpu: pl.DataFrame
    gpu_annotations: pl.DataFrame
    t0_ns: int
    n_events: int
    meta: TraceMeta = field(default_factory=TraceMeta)
    warnings: list[str] = field(default_factory=list)
    sha256: str | None = None  # of the file, when ingest already computed it (the cache does)
    # correlation id -> the frames of the call's backtrace, innermost first (an nsys export recorded
    # with CUDA backtraces: ingest/nsys.call_stacks); empty for Kineto traces
    call_stacks: dict[int, tuple[str, ...]] = field(default_factory=dict)
    # the CPU ops' shapes (ingest/shapes.SHAPES_SCHEMA) where the decode kept them (a file recorded with
    # shapes, read by the C scanner); None: ingest/shapes.cpu_op_shapes reads them from the file when needed
    cpu_shapes: pl.DataFrame | None = None


_DIRECTION = re.compile(r"\b(HtoD|DtoH|DtoD|PtoP|HtoH)\b")
_DIR_MAP = {"HtoD": "h2d", "DtoH": "d2h", "DtoD": "d2d", "PtoP": "d2d", "HtoH": "other"}


def _bytes(a: object) -> int | None:
    b = getattr(a, "bytes", None)
    if isinstance(b, str):
        return int(b) if b.isascii() and b.isdigit() else None
    return b


def _int64s(values: list, what: str, warnings: list[str]) -> list:
    """Integers outside the 64-bit range become null, with a warning (they cannot be ids or sizes)."""
    lo, hi = -(1 << 63), (1 << 63) - 1
    bad = sum(1 for v in values if isinstance(v, int) and not lo <= v <= hi)
    if not bad:
        return values
    warnings.append(f"ignored {bad} args.{what} values outside the 64-bit integer range")
    return [v if not isinstance(v, int) or lo <= v <= hi else None for v in values]


def events_frame(events: list[Event], warnings: list[str]) -> tuple[pl.DataFrame, int]:
    """All complete ('X') events as one frame: name, cat, ts_ns, dur_ns, pid, tid and the args profkit uses.

    Returns the frame and t0_ns (the earliest timestamp of any event, the origin of reported times).
    Events with no timestamp, no duration, or a negative duration are dropped with a warning.
    """
    xs = [e for e in events if e.ph == "X"]
    ts_all = [e.ts for e in events if e.ts is not None]
    t0 = us_to_ns(min(ts_all)) if ts_all else 0
    args = [e.args for e in xs]
    df = pl.DataFrame(
        {
            "name": [e.name for e in xs],
            "cat": [e.cat for e in xs],
            "ts": [e.ts for e in xs],
            "dur": [e.dur for e in xs],
            "pid": [str(e.pid) for e in xs],
            "tid": [str(e.tid) for e in xs],
            "correlation": _int64s([a.correlation if a is not None else None for a in args], "correlation", warnings),
            "external_id": _int64s([a.external_id if a is not None else None for a in args], "External id", warnings),
            "stream": _int64s([a.stream if a is not None else None for a in args], "stream", warnings),
            "device": _int64s([a.device if a is not None else None for a in args], "device", warnings),
            "bytes": _int64s([_bytes(a) for a in args], "bytes", warnings),
        },
        schema={
            "name": pl.String, "cat": pl.String, "ts": pl.Float64, "dur": pl.Float64, "pid": pl.String,
            "tid": pl.String, "correlation": pl.Int64, "external_id": pl.Int64, "stream": pl.Int64,
            "device": pl.Int64, "bytes": pl.Int64,
        },
    )
    return finish_events_frame(df, warnings), t0


def finish_events_frame(df: pl.DataFrame, warnings: list[str]) -> pl.DataFrame:
    """The raw 'X' events frame (name, cat, ts and dur in µs floats, pid, tid, args) -> the events
    frame: categories unified, integer ns times, unusable events dropped (with warnings)."""
    df = normalize_events(df)
    add_unusable_warnings(unusable_counts(df), warnings)
    return usable_events(df)


def _ns(us: pl.Expr) -> pl.Expr:
    """µs (float) -> integer ns: the whole µs times 1000 exactly, plus the fraction's ns rounded half
    to even (us * 1000 in floating point loses ns on epoch timestamps ~1.7e15 µs); null beyond
    units.US_LIMIT. The C scanner's to_ns computes the same."""
    whole = us.cast(pl.Int64, strict=False)
    ns = whole * 1000 + ((us - whole.cast(pl.Float64)) * 1000).round().cast(pl.Int64)
    return pl.when(us.abs() < US_LIMIT).then(ns).otherwise(None)


def normalize_events(df: pl.DataFrame) -> pl.DataFrame:
    """Row by row: one spelling per category, times in integer ns (round(us * 1000), half to even;
    the C scanner's profkit_emit computes the same)."""
    # the mapping is built for the few distinct spellings present, not per row
    spellings = {c: canonical_cat(c) for c in df["cat"].unique().to_list() if c is not None}
    return df.with_columns(
        pl.col("cat").replace_strict(spellings, default=None, return_dtype=pl.String),
        # a time beyond units.US_LIMIT (~285 years) is no time: null, and the event is skipped with a warning
        _ns(pl.col("ts")).alias("ts_ns"),
        _ns(pl.col("dur")).alias("dur_ns"),
    ).drop("ts", "dur")


def unusable_counts(df: pl.DataFrame) -> tuple[int, int, int]:
    """(no timestamp, no duration, negative duration) among normalized events."""
    r = df.select(
        pl.col("ts_ns").is_null().sum().alias("a"),
        (pl.col("dur_ns").is_null() & pl.col("ts_ns").is_not_null()).sum().alias("b"),
        (pl.col("dur_ns") < 0).sum().alias("c"),
    ).row(0)
    return int(r[0] or 0), int(r[1] or 0), int(r[2] or 0)


def add_unusable_warnings(counts: tuple[int, int, int], warnings: list[str]) -> None:
    bad_ts, no_dur, neg = counts
    if bad_ts:
        warnings.append(f"skipped {bad_ts} events without a timestamp")
    if no_dur:
        warnings.append(f"skipped {no_dur} complete events without a duration ('dur')")
    if neg:
        warnings.append(f"skipped {neg} events with a negative duration")


def usable_events(df: pl.DataFrame) -> pl.DataFrame:
    df = df.filter(pl.col("ts_ns").is_not_null() & (pl.col("dur_ns") >= 0))
    return df.with_columns((pl.col("ts_ns") + pl.col("dur_ns")).alias("end_ns"))


def _dedupe(df: pl.DataFrame, what: str, keys: list[str], warnings: list[str]) -> pl.DataFrame:
    if df.height == 0:
        return df
    # a key column without a repeated value (correlation, start): no two rows share the whole key.
    # Counting that is ~50x cheaper than de-duplicating by a key with strings in it
    if any(k in keys and df[k].n_unique() == df.height for k in ("correlation", "ts_ns")):
        return df
    out = df.unique(subset=keys, keep="first", maintain_order=True)
    if out.height != df.height:
        warnings.append(f"dropped {df.height - out.height} duplicated {what} events")
    return out


def split_rows(df: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    """The row-by-row part of split_tables: (gpu_ops, calls, cpu, gpu_annotations) in event order,
    with their columns, before de-duplication and sorting. Chunks of events can be split apart and
    their parts concatenated: the result is the split of the whole."""
    in_gpu, in_calls = pl.col("cat").is_in(GPU_OP_CATS), pl.col("cat").is_in(CALL_CATS)
    in_cpu, in_ann = pl.col("cat").is_in(CPU_CATS), pl.col("cat") == "gpu_user_annotation"
    return (gpu_columns(df.filter(in_gpu)), call_columns(df.filter(in_calls)), df.filter(in_cpu).select(list(CPU_SCHEMA)),
            df.filter(in_ann).select(list(CPU_SCHEMA)))


def gpu_columns(gpu: pl.DataFrame) -> pl.DataFrame:
    """GPU-op rows (events columns) -> GPU_OPS_SCHEMA: stream and device from tid and pid where the
    args lack them, the direction and pageable flag of memcpys."""
    return gpu.with_columns(
        pl.col("stream").fill_null(pl.col("tid").cast(pl.Int64, strict=False)),
        pl.col("device").fill_null(pl.col("pid").cast(pl.Int64, strict=False)),
        pl.when(pl.col("cat") == "gpu_memcpy")
        .then(pl.col("name").str.extract(_DIRECTION.pattern, 1).replace_strict(_DIR_MAP, default="other"))
        .alias("direction"),
        ((pl.col("cat") == "gpu_memcpy") & pl.col("name").str.contains("Pageable")).alias("pageable"),
    ).select(list(GPU_OPS_SCHEMA))


def call_columns(calls: pl.DataFrame) -> pl.DataFrame:
    """Runtime-call rows (events columns) -> CALLS_SCHEMA: `api` is the name's canonical CUDA spelling."""
    names = calls["name"].unique().to_list()
    return calls.with_columns(
        pl.col("name").replace_strict({n: canonical_api(n) for n in names}, return_dtype=pl.String).alias("api")
    ).select(list(CALLS_SCHEMA))


def finish_tables(gpu: pl.DataFrame, calls: pl.DataFrame, cpu: pl.DataFrame, ann: pl.DataFrame,
                  warnings: list[str]) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    """The whole-table part of split_tables: duplicates dropped (with warnings), sorted by start."""
    gpu = by_start(_dedupe(gpu, "GPU op", ["name", "ts_ns", "dur_ns", "stream", "correlation"], warnings))
    calls = by_start(_dedupe(calls, "runtime call", ["name", "ts_ns", "dur_ns", "tid", "correlation"], warnings))
    return gpu, calls, by_start(cpu), by_start(ann)


def by_start(df: pl.DataFrame) -> pl.DataFrame:
    """Sorted by ts_ns, events with equal starts in file order (a stable sort). Traces are mostly
    written in start order already: then this is one pass over the column, not a sort."""
    if df.height < 2 or df["ts_ns"].is_sorted():
        return df
    return df.sort("ts_ns", maintain_order=True)


def split_tables(df: pl.DataFrame, warnings: list[str]) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    """(gpu_ops, calls, cpu, gpu_annotations) from the events frame."""
    foreign = foreign_device_warning(df["cat"].drop_nulls().unique().to_list()) if "cat" in df.columns else None
    if foreign:
        warnings.append(foreign)
    return finish_tables(*split_rows(df), warnings)


Tables = tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame, pl.DataFrame]  # gpu_ops, calls, cpu, gpu_annotations


def split_tables_ranks(df: pl.DataFrame, warnings: list[str]) -> tuple[Any, list[tuple[Tables, list[str]]]]:
    """split_tables, for a file that may hold several ranks (ingest/processes.py): (the Split, or
    None for one rank; per rank, its four tables and its warnings, which begin with `warnings`),
    each rank's rows with their pids as its own file wrote them, finished on their own."""
    from profkit.ingest.processes import plan_split

    gpu = df.filter(pl.col("cat").is_in(GPU_OP_CATS))
    gpu_ids = set(gpu["pid"].unique().to_list())
    ids = gpu_ids | set(df.filter(pl.col("cat").is_in(CALL_CATS))["pid"].unique().to_list())
    if not ids:
        ids = set(df["pid"].unique().to_list())
    split = None
    if len(gpu_ids) >= 2 or any(str(i)[:1] == "[" for i in ids):
        split = plan_split(set(gpu.select("pid", "device").unique().iter_rows()), {str(i) for i in ids})
    if split is None:
        return None, [(split_tables(df, warnings), warnings)]
    foreign = foreign_device_warning(df["cat"].drop_nulls().unique().to_list())
    if foreign:
        warnings.append(foreign)
    pids = [p for p in df["pid"].unique().to_list() if p is not None]
    where = {p: split.locate(p) for p in pids}
    df = df.with_columns(
        pl.col("pid").replace_strict({p: g[0] for p, g in where.items() if g is not None}, default=-1, return_dtype=pl.Int64).alias("_rank"),
        pl.col("pid").replace_strict({p: g[1] for p, g in where.items() if g is not None}, default=pl.col("pid"), return_dtype=pl.String),
    )
    tabled = pl.col("cat").is_in([*GPU_OP_CATS, *CALL_CATS, *CPU_CATS, "gpu_user_annotation"])
    lost = df.filter((pl.col("_rank") < 0) & tabled).height
    out = []
    for k in range(len(split.names)):
        w = list(warnings)
        if lost:
            w.append(f"left out {lost} events whose pid names no rank of this merged file")
        out.append((finish_tables(*split_rows(df.filter(pl.col("_rank") == k).drop("_rank")), w), w))
    return split, out
