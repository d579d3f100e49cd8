"""The shapes of a trace's CPU ops (`Input Dims` / `Input type`, written by `record_shapes=True`), read
in a light second pass over the file, only for a file that has them.

Ingest's decoders (the C scanner and msgspec's) only note that a file holds `Input Dims`
(`Trace.meta["shapes"]`); they do not carry the shapes in the tables, so traces without shapes
decode exactly as fast as before. Where a view needs the shapes (the kernels table and the diff's
movers, by the op that launched each GPU op: analysis/shapes.py), this module decodes the file once
more, keeping only the CPU ops' name, thread, times and the two arrays as their compact JSON text.
The file is small next to the tables when it was recorded with shapes (the profiler's own overhead
keeps such captures short).

Why a second pass and not two more interned columns in the scanner's tables: traces without shapes
must not slow down or change (their tables, cache and outputs stay byte-identical), and the pass is
cheap where it runs. Measured 2026-12-04 on the shared 2-core VM (load 3.5-4.2): bench_ingest's dense
256 MB file (no shapes), uncached `analyze`, 5 runs each: 1.45 s median before, 1.46 s after (parse
0.58 / 0.57 s: noise); the msgspec path (PROFKIT_NO_SCANNER=1) on a 16 MB proxy trace 0.105 s before,
0.106-0.107 s after. This pass: 2-84 ms on the TraceLens traces recorded with shapes (up to 8,004
CPU ops); `analyze` of the 0.8 MB gpt-oss-120b B200 trace 0.74-0.86 s before, 0.83-1.06 s after.
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


def _compact(raw: msgspec.Raw, memo: dict[bytes, str | None]) -> str | None:
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
