"""Host syncs (DESIGN.md "Sync"): synchronize calls (kind sync) and copies that block the host
(kind sync_copy), each with its direction, blocked time, trigger (the innermost enclosing cpu_op)
and stack (the innermost Python frame in a .py file, then its callers).

A call that carries its own backtrace (an nsys export recorded with CUDA backtraces,
Trace.call_stacks) gets its trigger from the backtrace when no cpu_op encloses it (the innermost
frame outside CUDA's libraries: the code that made the call, before any annotation around it), and
its stack from the backtrace's frames when the trace has no Python frames around it."""

from __future__ import annotations

import bisect
import re
from typing import Any

import polars as pl

from profkit.apis import ASYNC_COPY_APIS, BLOCKING_COPY_APIS, SYNC_APIS
from profkit.analysis.spans import enclosing_stacks, innermost_enclosing_by
from profkit.ingest import Trace

# A Python frame in user code, as Kineto names it: "path/file.py(123): function"
_USER_FRAME = re.compile(r"\.py\(\d+\): ")
STACK_DEPTH = 6  # frames kept: the innermost one in a .py file, then its callers
STACK_SEP = " ← "


def _pick(col: pl.Series, idx: list[int | None]) -> list[Any]:
    """col[i] for each i in idx (None stays None), gathering only those rows."""
    got = col.gather(pl.Series([i for i in idx], dtype=pl.Int64)).to_list() if idx else []
    return [v if i is not None else None for v, i in zip(got, idx)]


def _user_stacks(pts: pl.DataFrame, cpu: pl.DataFrame) -> list[str | None]:
    """For each point: its enclosing Python frames in .py files (never a built-in method or an
    address), innermost first, at most STACK_DEPTH, joined by STACK_SEP; None without any."""
    out: list[str | None] = [None] * pts.height
    if pts.height == 0 or cpu.height == 0:
        return out
    py = cpu["cat"] == "python_function"
    if not py.any():
        return out
    frames = cpu.select("name", "ts_ns", "end_ns", "tid").filter(py)
    stacks = enclosing_stacks(pts, frames)  # no rows cache: `frames` is a temporary (the cache keys by id)
    names = frames["name"]
    for k, rows in enumerate(stacks):
        if not rows:
            continue
        got = [n for n in names.gather(rows).to_list() if n and _USER_FRAME.search(n)]
        if got:
            out[k] = STACK_SEP.join(got[:STACK_DEPTH])
    return out


def find_syncs(trace: Trace, calls: pl.DataFrame, ops: pl.DataFrame, rows_cache: dict | None = None) -> pl.DataFrame:
    """Host-blocking calls: synchronize calls (kind sync) and blocking copies (kind sync_copy); `api`
    is the call's CUDA spelling (what is counted, apis.canonical_api), `name` the trace's own
    (`hipMemcpyWithStream` on a ROCm trace)."""
    op_info = (
        ops.select("cat", "correlation", "direction", "pageable").filter(pl.col("cat") == "gpu_memcpy")
        .unique(subset="correlation", keep="first")
        .select("correlation", pl.col("direction").alias("op_direction"), "pageable")
    )
    # the syncs and copies alone (a few of the calls) take their copy's direction
    c = calls.filter(pl.col("api").is_in(SYNC_APIS | ASYNC_COPY_APIS | BLOCKING_COPY_APIS)).join(
        op_info, on="correlation", how="left", maintain_order="left")
    copies = c.filter(pl.col("api").is_in(ASYNC_COPY_APIS | BLOCKING_COPY_APIS))
    blocking = c.filter(
        pl.col("api").is_in(SYNC_APIS)
        | pl.col("api").is_in(BLOCKING_COPY_APIS)
        | (pl.col("api").is_in(ASYNC_COPY_APIS) & pl.col("pageable").fill_null(False))
    ).with_columns(pl.when(pl.col("api").is_in(SYNC_APIS)).then(pl.lit("sync")).otherwise(pl.lit("sync_copy")).alias("kind"))
    schema = {
        "iteration": pl.Int64, "api": pl.String, "name": pl.String, "kind": pl.String, "direction": pl.String, "ts_ns": pl.Int64,
        "end_ns": pl.Int64, "blocked_ns": pl.Int64, "tid": pl.String, "trigger": pl.String, "stack": pl.String,
    }
    if blocking.height == 0:
        return pl.DataFrame(schema=schema)
    pts = blocking.select("ts_ns", "end_ns", "tid")
    # the innermost cpu_op and annotation around each call, as rows of trace.cpu (one search for
    # both); the Python frames around it are _user_stacks' (the whole stack, not the innermost)
    found = innermost_enclosing_by(pts, trace.cpu, "cat", ("cpu_op", "user_annotation"), cache=rows_cache)
    trig_idx, ann_idx = found["cpu_op"], found["user_annotation"]
    # only the rows found above, not whole columns
    op_names, op_ts = _pick(trace.cpu["name"], trig_idx), _pick(trace.cpu["ts_ns"], trig_idx)
    ann_names = _pick(trace.cpu["name"], ann_idx)
    py_names = _user_stacks(pts, trace.cpu)
    # For a sync call: the direction of the latest copy on its thread inside the same trigger op.
    copies_by_tid: dict[str, tuple[list[int], list[str | None]]] = {}
    for tid, ts, d in copies.sort("ts_ns", maintain_order=True).select("tid", "ts_ns", "op_direction").iter_rows():
        got = copies_by_tid.setdefault(tid, ([], []))
        got[0].append(ts)
        got[1].append(d)
    # a call's own backtrace (an nsys export recorded with CUDA backtraces): its frames, innermost first
    back = getattr(trace, "call_stacks", None) or {}
    corrs = blocking["correlation"].to_list() if back else [None] * blocking.height
    directions, triggers, stacks = [], [], []
    for k, (kind, tid, ts, opd) in enumerate(
        zip(blocking["kind"].to_list(), blocking["tid"].to_list(), blocking["ts_ns"].to_list(), blocking["op_direction"].to_list())
    ):
        ti = trig_idx[k]
        frames = back.get(corrs[k]) if corrs[k] is not None else None
        # the innermost cpu_op, else the backtrace's innermost frame (the code that made the call), else the annotation
        triggers.append(op_names[k] if ti is not None else (frames[0] if frames else (ann_names[k] if ann_idx[k] is not None else None)))
        stacks.append(py_names[k] if py_names[k] is not None or not frames else STACK_SEP.join(frames[:STACK_DEPTH]))
        if kind == "sync_copy":
            directions.append(opd or "none")
            continue
        lo = op_ts[k] if ti is not None else None
        d = "none"
        if lo is not None and tid in copies_by_tid:
            # the latest copy on the thread starting at or before the sync, if inside the trigger op
            cts, cds = copies_by_tid[tid]
            j = bisect.bisect_right(cts, ts) - 1
            if j >= 0 and cts[j] >= lo:
                d = cds[j] or "none"
        directions.append(d)
    return blocking.select(
        "iteration", "api", "name", "kind",
        pl.Series("direction", directions, dtype=pl.String), "ts_ns", "end_ns", pl.col("dur_ns").alias("blocked_ns"), "tid",
        pl.Series("trigger", triggers, dtype=pl.String), pl.Series("stack", stacks, dtype=pl.String),
    ).sort("ts_ns")
