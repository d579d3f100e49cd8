"""The shapes of a trace's CPU ops (`Input Dims` / `Input type`, written by `record_shapes=True`): one
row per complete `cpu_op` event with an args object, in file order (SHAPES_SCHEMA; `trace_shapes`).

The tables carry no shapes: traces without them decode as they always did, and their tables, cache
and outputs stay byte-identical. Where a view needs them (the kernels table and the diff's movers, by
the op that launched each GPU op: analysis/shapes.py), they come from one of two places:

- the decode itself (`Trace.cpu_shapes`, built by `shape_rows`): the C scanner keeps, for the CPU
  rows of a chunk that holds `Input Dims`, the ids of the raw JSON text of the two arrays (interned
  like the names: a trace repeats few shapes), and coded.py's finish turns them into this module's
  rows before the table is sorted. Only a file read whole by the scanner, of one rank, whose every
  cpu_op has args (`Strings.shape_rows_missing` unset);
- else a second, lighter decode of the file (`cpu_op_shapes`): a chunk msgspec decoded, a file of
  several ranks, the tables cache. Both give the same frame; tests/test_shapes.py compares them.

The second pass alone took 5.9 s and 3.9 GB at its peak for bench_ingest's 1 GB SGLang trace
(recorded with shapes), which the first reads at the scanner's speed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import polars as pl

from profkit.ingest.categories import canonical_cat
from profkit.ingest.units import US_LIMIT, us_to_ns

SHAPES_SCHEMA = {"name": pl.String, "pid": pl.String, "tid": pl.String, "ts_ns": pl.Int64, "end_ns": pl.Int64, "input_dims": pl.String,
                 "input_type": pl.String}


class _Args(msgspec.Struct, gc=False):
    dims: msgspec.Raw = msgspec.field(name="Input Dims", default=msgspec.Raw(b""))  # empty: absent
    types: msgspec.Raw = msgspec.field(name="Input type", default=msgspec.Raw(b""))


class _Ev(msgspec.Struct, gc=False):
    ph: Any = None
    cat: Any = None
    name: Any = None
    ts: Any = None
    dur: Any = None
    pid: Any = None
    tid: Any = None
    args: _Args | None = None


class _Doc(msgspec.Struct):
    traceEvents: list[_Ev] = []


_DEC = msgspec.json.Decoder(_Doc)
_DEC_LIST = msgspec.json.Decoder(list[_Ev])


def _compact(raw: msgspec.Raw | bytes, memo: dict[bytes, str | None]) -> str | None:
    """The raw JSON text of an array, compact (no spaces outside strings); None when it is absent or not an array."""
    b = bytes(raw)
    if not b:
        return None
    got = memo.get(b, "")
    if got != "":
        return got
    try:
        v = msgspec.json.decode(b)
        out = msgspec.json.encode(v).decode() if isinstance(v, list) else None
    except msgspec.DecodeError:
        out = None
    memo[b] = out
    return out


def cpu_op_shapes(path: Path) -> pl.DataFrame:
    """Every complete `cpu_op` event of the file: name, pid and tid (as the tables spell them), ts_ns, end_ns (as
    ingest converts them: units.us_to_ns), input_dims and input_type (compact JSON text, null where
    absent). An empty frame when the file cannot be read this way (ingest has read it: no new error)."""
    from profkit.ingest.decode import read_bytes

    try:
        data = read_bytes(path)
        head = data[:4096].lstrip()
        events = _DEC_LIST.decode(data) if head[:1] == b"[" else _DEC.decode(data).traceEvents
    except Exception:  # noqa: BLE001  (ingest already said what is wrong with the file)
        return pl.DataFrame(schema=SHAPES_SCHEMA)
    del data
    memo: dict[bytes, str | None] = {}
    cats: dict[Any, bool] = {}
    rows: dict[str, list[Any]] = {k: [] for k in SHAPES_SCHEMA}
    for e in events:
        if e.ph != "X" or e.args is None or not isinstance(e.ts, (int, float)) or not isinstance(e.dur, (int, float)):
            continue
        c = cats.get(e.cat)
        if c is None:
            c = cats[e.cat] = isinstance(e.cat, str) and canonical_cat(e.cat) == "cpu_op"
        if not c:
            continue
        if not (abs(e.ts) < US_LIMIT and abs(e.dur) < US_LIMIT) or e.dur < 0:
            continue
        ts, dur = us_to_ns(float(e.ts)), us_to_ns(float(e.dur))
        rows["name"].append(str(e.name) if e.name is not None else "")
        rows["pid"].append(str(e.pid) if e.pid is not None else "0")
        rows["tid"].append(str(e.tid) if e.tid is not None else "0")
        rows["ts_ns"].append(ts)
        rows["end_ns"].append(ts + dur)
        rows["input_dims"].append(_compact(e.args.dims, memo))
        rows["input_type"].append(_compact(e.args.types, memo))
    return pl.DataFrame(rows, schema=SHAPES_SCHEMA)


def trace_shapes(trace: Any) -> pl.DataFrame:
    """The CPU ops' shapes of a trace recorded with them: those its decode kept, else read from its file."""
    got = getattr(trace, "cpu_shapes", None)
    return got if got is not None else cpu_op_shapes(trace.path)


def shape_rows(cpu: pl.DataFrame, ids: tuple[str, str], texts: pl.Series, cpu_op: int) -> pl.DataFrame:
    """cpu_op_shapes' frame from the coded CPU table of a whole file, in file order (ingest/coded.py:
    string columns as ids into `texts`, `cpu_op` the id of "cpu_op"; `ids`: the columns of the ids of
    each row's raw `Input Dims` and `Input type` text, null where absent). Its rows are the usable
    complete events of category cpu_op, which are those cpu_op_shapes keeps when each has args."""
    rows = cpu.filter(pl.col("cat") == cpu_op)
    memo: dict[bytes, str | None] = {}
    out = [pl.lit(texts).gather(pl.col(c)).alias(c) for c in ("name", "pid", "tid")]
    for col, name in zip(ids, ("input_dims", "input_type")):
        distinct = rows[col].drop_nulls().unique()
        compact = [_compact(t.encode(), memo) for t in texts.gather(distinct).to_list()]
        out.append(pl.col(col).replace_strict(distinct, pl.Series(compact, dtype=pl.String), default=None, return_dtype=pl.String)
                   .alias(name))
    return rows.select(*out[:3], "ts_ns", "end_ns", *out[3:])
