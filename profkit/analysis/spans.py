"""Nesting on one CPU thread: which span encloses a call, and where a gap's CPU time went."""

from __future__ import annotations

from collections import defaultdict

import polars as pl


def innermost_enclosing(points: pl.DataFrame, spans: pl.DataFrame) -> list[int | None]:
    """For each point (ts_ns, end_ns, tid) the row index into `spans` of the innermost span on the
    same thread with span.ts <= point.ts and span.end >= point.end, or None.

    A stack sweep per thread: spans on one thread nest, so the innermost open span that has not
    ended is the answer. O((points + spans) log) with one Python pass.
    """
    result: list[int | None] = [None] * points.height
    if points.height == 0 or spans.height == 0:
        return result
    # Only spans that hold some point's start on their thread can enclose a point; the answer is
    # the covering span latest in (ts, -end, row) order, so sweeping just those gives the same
    # answer as sweeping all of them (and a stack of python_function frames has millions).
    cand = candidate_spans(points, spans)
    by_tid: dict[str, list[tuple[int, int, int, int]]] = defaultdict(list)
    # kind 0 = span (sorted before points at the same ts, longer spans first), kind 1 = point
    for i, ts, end, tid in zip(cand["_row"].to_list(), cand["ts_ns"].to_list(), cand["end_ns"].to_list(), cand["tid"].to_list()):
        by_tid[tid].append((ts, 0, -end, i))
    for i, (ts, end, tid) in enumerate(zip(points["ts_ns"].to_list(), points["end_ns"].to_list(), points["tid"].to_list())):
        by_tid[tid].append((ts, 1, end, i))
    for items in by_tid.values():
        items.sort()
        stack: list[tuple[int, int]] = []  # (end, span index)
        for ts, kind, x, i in items:
            while stack and stack[-1][0] < ts:
                stack.pop()
            if kind == 0:
                stack.append((-x, i))
            else:
                end = x
                for s_end, s_idx in reversed(stack):
                    if s_end >= end:
                        result[i] = s_idx
                        break
    return result


_NULL_TID = "\x00<null tid>"


def candidate_spans(points: pl.DataFrame, spans: pl.DataFrame) -> pl.DataFrame:
    """Rows of `spans` (with their row number as `_row`) whose [ts, end] holds the start of some
    point on the same thread: a superset of the spans that enclose a point."""
    sp = spans.select(
        pl.int_range(0, pl.len(), dtype=pl.Int64).alias("_row"), "ts_ns", "end_ns", "tid",
        pl.col("tid").fill_null(_NULL_TID).alias("_k"),
    ).sort("ts_ns")
    pt = (
        points.select(pl.col("ts_ns").alias("_p"), pl.col("tid").fill_null(_NULL_TID).alias("_k"))
        .filter(pl.col("_p").is_not_null())
        .sort("_p")
    )
    if pt.height == 0:
        return sp.clear().drop("_k")
    j = sp.join_asof(pt, left_on="ts_ns", right_on="_p", by="_k", strategy="forward", check_sortedness=False)
    return j.filter(pl.col("_p").is_not_null() & (pl.col("_p") <= pl.col("end_ns"))).select("_row", "ts_ns", "end_ns", "tid")


def exclusive_top(events: list[tuple[int, int, str]], g0: int, g1: int, top: int = 3) -> list[str]:
    """Names of the events (ts, end, name) on one thread with the most exclusive time inside [g0, g1).

    Each instant goes to the deepest (latest-started) event covering it.
    """
    clipped = sorted(((max(ts, g0), min(end, g1), name) for ts, end, name in events if end > g0 and ts < g1),
                     key=lambda e: (e[0], -e[1]))
    excl: dict[str, int] = defaultdict(int)
    stack: list[list] = []  # [end, name, covered_until]
    cursor = g0

    def advance(to: int) -> None:
        nonlocal cursor
        # time from cursor to `to` goes to the deepest open event, popping finished ones
        while cursor < to:
            while stack and stack[-1][0] <= cursor:
                stack.pop()
            if not stack:
                cursor = to
                return
            seg_end = min(to, stack[-1][0])
            excl[stack[-1][1]] += seg_end - cursor
            cursor = seg_end

    for s, e, name in clipped:
        advance(s)
        stack.append([e, name])
    advance(g1)
    ranked = sorted(excl.items(), key=lambda kv: (-kv[1], kv[0]))
    return [name for name, t in ranked[:top] if t > 0]
