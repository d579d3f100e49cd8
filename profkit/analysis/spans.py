"""Nesting on one CPU thread: which spans enclose a call (where a gap's CPU time went is analysis/bubbles.py)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import polars as pl


def innermost_enclosing(points: pl.DataFrame, spans: pl.DataFrame) -> list[int | None]:
    """For each point (ts_ns, end_ns, tid) the row index into `spans` of the innermost span on the
    same thread with span.ts <= point.ts and span.end >= point.end, or None.

    A stack sweep per thread: spans on one thread nest, so the innermost open span that has not
    ended is the answer. O((points + spans) log) with one Python pass.
    """
    if points.height == 0 or spans.height == 0:
        return [None] * points.height
    return _sweep_enclosing(points, candidate_spans(points, spans))


def innermost_enclosing_by(points: pl.DataFrame, spans: pl.DataFrame, by: str, keys: Sequence[Any], *,
                           cache: dict | None = None) -> dict[Any, list[int | None]]:
    """innermost_enclosing(points, spans.filter(pl.col(by) == key)) for each key, answered as row
    indices into `spans` itself (not into the filtered frame): one candidate search for all keys,
    and no copy of `spans`. `cache`: see thread_rows."""
    if points.height == 0 or spans.height == 0:
        return {k: [None] * points.height for k in keys}
    cand = candidate_spans(points, spans, cache=cache)
    cand = cand.with_columns(spans[by].gather(cand["_row"]).alias("_by"))
    return {k: _sweep_enclosing(points, cand.filter(pl.col("_by") == k)) for k in keys}


def _sweep_enclosing(points: pl.DataFrame, cand: pl.DataFrame) -> list[int | None]:
    # Only spans that hold some point's start on their thread can enclose a point; the answer is
    # the covering span latest in (ts, -end, row) order, so sweeping just those gives the same
    # answer as sweeping all of them (and a stack of python_function frames has millions).
    return [got[0] if got else None for got in _sweep_stacks(points, cand, innermost_only=True)]


def enclosing_stacks(points: pl.DataFrame, spans: pl.DataFrame, *, cache: dict | None = None) -> list[list[int]]:
    """For each point (ts_ns, end_ns, tid): the row indices into `spans` of every span on its thread
    with span.ts <= point.ts and span.end >= point.end, innermost first."""
    if points.height == 0 or spans.height == 0:
        return [[] for _ in range(points.height)]
    return _sweep_stacks(points, candidate_spans(points, spans, cache=cache), innermost_only=False)


def _sweep_stacks(points: pl.DataFrame, cand: pl.DataFrame, *, innermost_only: bool) -> list[list[int]]:
    """One stack sweep per thread over the candidate spans (`_row`, ts_ns, end_ns, tid) and the
    points: per point the spans holding it, innermost (latest in (ts, -end, row) order) first;
    only that one with innermost_only."""
    result: list[list[int]] = [[] for _ in range(points.height)]
    if cand.height == 0:
        return result
    by_tid: dict[Any, list[tuple[int, int, int, int]]] = defaultdict(list)
    # kind 0 = span (sorted before points at the same ts, longer spans first), kind 1 = point
    for i, ts, end, tid in zip(cand["_row"].to_list(), cand["ts_ns"].to_list(), cand["end_ns"].to_list(), cand["tid"].to_list()):
        by_tid[tid].append((ts, 0, -end, i))
    for i, (ts, end, tid) in enumerate(zip(points["ts_ns"].to_list(), points["end_ns"].to_list(), points["tid"].to_list())):
        if tid in by_tid and ts is not None and end is not None:  # on a thread without candidate spans: none
            by_tid[tid].append((ts, 1, end, i))
    for items in by_tid.values():
        items.sort()
        stack: list[tuple[int, int]] = []  # (end, span index), outermost first
        for ts, kind, x, i in items:
            while stack and stack[-1][0] < ts:
                stack.pop()
            if kind == 0:
                stack.append((-x, i))
                continue
            got = result[i]
            for s_end, s_idx in reversed(stack):
                if s_end >= x:
                    got.append(s_idx)
                    if innermost_only:
                        break
    return result


def candidate_spans(points: pl.DataFrame, spans: pl.DataFrame, *, cache: dict | None = None) -> pl.DataFrame:
    """Rows of `spans` (with their row number as `_row`) whose [ts, end] holds the start of some
    point on the same thread: a superset of the spans that enclose a point. In `spans` order.

    Per thread of the points: the spans starting at or before a point's start are a prefix of the
    thread's spans ordered by start, and of those the ones ending at or after it are found with a
    MaxTree of their ends, so the search costs about the spans found, not the whole prefix."""
    schema: dict[str, Any] = {"_row": pl.Int64, "ts_ns": pl.Int64, "end_ns": pl.Int64, "tid": spans.schema["tid"]}
    pt = points.select("ts_ns", "tid").filter(pl.col("ts_ns").is_not_null())
    starts: dict[Any, set[int]] = defaultdict(set)
    for ts, tid in zip(pt["ts_ns"].to_list(), pt["tid"].to_list()):
        starts[tid].add(ts)
    found = []
    for tid, ps in starts.items():
        ts, end, rows = thread_rows(spans, tid, cache=cache)
        if len(ts) == 0:
            continue
        p = pl.Series(sorted(ps), dtype=pl.Int64)
        q = pl.DataFrame({"q": pl.int_range(0, len(p), dtype=pl.Int64, eager=True), "lo": pl.zeros(len(p), pl.Int64, eager=True),
                          "hi": ts.search_sorted(p, side="right").cast(pl.Int64), "thr": p - 1})
        pos = MaxTree(end).above(q)["row"].unique()
        found.append(pos if rows is None else rows.gather(pos))
    if not found:
        return pl.DataFrame(schema=schema)
    r = pl.concat(found).sort()
    return pl.DataFrame({"_row": r.cast(pl.Int64)}).with_columns(
        spans["ts_ns"].gather(r), spans["end_ns"].gather(r), spans["tid"].gather(r)
    )


def thread_rows(frame: pl.DataFrame, tid: Any, *, cache: dict | None = None) -> tuple[pl.Series, pl.Series, pl.Series | None]:
    """(ts_ns, end_ns, row) of the events of `frame` on thread `tid` (None: a null tid) that have
    both times, ordered by start (ties in any order); row is their row in `frame`, None when that
    is every row in frame order (then nothing is copied: a frame of one thread is the common case).

    `cache`: a dict kept by the caller while `frame` lives (one analysis), so that the frame's
    threads are sorted out once."""
    key = (id(frame), tid)
    if cache is not None and key in cache:
        return cache[key]
    got = _thread_rows(frame, tid)
    if cache is not None:
        cache[key] = got
    return got


def _thread_rows(frame: pl.DataFrame, tid: Any) -> tuple[pl.Series, pl.Series, pl.Series | None]:
    tids = frame["tid"]
    ts, end = frame["ts_ns"], frame["end_ns"]
    rows: pl.Series | None = None
    whole = frame.height > 0 and (tids.null_count() == frame.height if tid is None else (tids.null_count() == 0 and bool((tids == tid).all())))
    if not whole or ts.null_count() or end.null_count():
        keep = (pl.col("tid").is_null() if tid is None else (pl.col("tid") == tid)) & pl.col("ts_ns").is_not_null() & pl.col("end_ns").is_not_null()
        sel = (
            frame.lazy()
            .select(pl.int_range(0, pl.len(), dtype=pl.Int64).alias("_row"), "ts_ns", "end_ns", "tid")
            .filter(keep)
            .collect()
        )
        ts, end, rows = sel["ts_ns"], sel["end_ns"], sel["_row"]
    if not ts.is_sorted():
        order = ts.arg_sort()
        rows = order.cast(pl.Int64) if rows is None else rows.gather(order)
        ts, end = ts.gather(order), end.gather(order)
    return ts, end, rows


class MaxTree:
    """Maxima of an integer column over blocks of 64 rows, of 64 blocks, and so on: the rows of an
    index range whose value exceeds a threshold are found by descending only into blocks whose
    maximum exceeds it, in time about (rows found) x 64 x depth rather than the range's length."""

    SHIFT = 6
    FAN = 1 << SHIFT

    def __init__(self, values: pl.Series) -> None:
        self.levels = [values]
        while len(self.levels[-1]) > self.FAN:
            v = self.levels[-1]
            full = len(v) // self.FAN * self.FAN
            top = v.slice(0, full).reshape((-1, self.FAN)).arr.max()
            if full < len(v):
                top = top.append(pl.Series([v.slice(full).max()], dtype=top.dtype))
            self.levels.append(top)

    def above(self, queries: pl.DataFrame) -> pl.DataFrame:
        """queries (q, lo, hi, thr) -> the pairs (q, row) with lo <= row < hi and value[row] > thr
        (a null value is not above anything), in no particular order."""
        cur = queries.select("q", "lo", "hi", "thr").filter(pl.col("hi") > pl.col("lo"))
        d = 1 << (self.SHIFT * (len(self.levels) - 1))  # rows per node of the top level
        cur = cur.with_columns(pl.int_ranges(pl.col("lo") // d, (pl.col("hi") - 1) // d + 1, dtype=pl.Int64).alias("node"))
        for level in range(len(self.levels) - 1, -1, -1):
            cur = cur.explode("node")
            cur = cur.filter(self.levels[level].gather(cur["node"]) > cur["thr"])
            if level == 0 or cur.height == 0:
                break
            d = 1 << (self.SHIFT * (level - 1))  # rows per node of the level below
            first = pl.max_horizontal(pl.col("node") * self.FAN, pl.col("lo") // d)
            last = pl.min_horizontal(pl.col("node") * self.FAN + self.FAN, (pl.col("hi") - 1) // d + 1)
            cur = cur.with_columns(pl.int_ranges(first, last, dtype=pl.Int64).alias("node"))
        return cur.select("q", pl.col("node").alias("row"))


def innermost_at(points: pl.DataFrame, spans: pl.DataFrame) -> list[int | None] | None:
    """innermost_enclosing for points of no length (ts_ns == end_ns, as a launch's start): the same
    answer (the covering span latest in (ts, -end, row) order), found by the native library in one
    pass per thread (scan.point_owner); None without the library (then innermost_enclosing)."""
    import numpy as np

    from profkit.ingest import scan

    if scan.lib() is None:
        return None
    out = np.full(points.height, -1, np.int64)
    pts = points.select(pl.int_range(0, pl.len(), dtype=pl.Int64).alias("_i"), "ts_ns", "tid").filter(
        pl.col("ts_ns").is_not_null() & pl.col("tid").is_not_null())
    if pts.height and spans.height:
        sp = spans.select(pl.int_range(0, pl.len(), dtype=pl.Int64).alias("_r"), "ts_ns", "end_ns", "tid").filter(
            pl.col("ts_ns").is_not_null() & pl.col("end_ns").is_not_null() & pl.col("tid").is_in(pts["tid"].unique().implode()))
        by_tid = sp.sort("ts_ns", "end_ns", "_r", descending=[False, True, False]).partition_by("tid", as_dict=True, include_key=False)
        for (tid,), mine in pts.group_by("tid"):
            s = by_tid.get((tid,))
            if s is None:
                continue
            mine = mine.sort("ts_ns")
            at = scan.point_owner(s["ts_ns"].to_numpy(), s["end_ns"].to_numpy(), mine["ts_ns"].to_numpy())
            if at is None:
                return None
            rows = s["_r"].to_numpy()
            out[mine["_i"].to_numpy()] = np.where(at >= 0, rows[np.maximum(at, 0)], -1)
    return [None if x < 0 else x for x in out.tolist()]
