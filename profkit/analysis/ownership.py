"""Counts by ownership (DESIGN.md "Definitions"): a GPU op belongs to the iteration whose CPU window
holds the start of its launch call (same correlation id; kernels replayed from a CUDA graph share
the cudaGraphLaunch's id). The GPU windows that follow from it, and the work no iteration owns."""

from __future__ import annotations

import polars as pl

from profkit.analysis.clock import union_ns


def outside_work(ops: pl.DataFrame, win: pl.DataFrame, device_busy_ns: int) -> dict[str, int]:
    """GPU ops no iteration owns, by why: launched before the first iteration's window, after the
    last one's, or with no launch call in the trace; their count (and by kind: kernels, memcpy_<dir>,
    memset) and busy union (and, to compare it with, the device's busy union over the whole trace,
    as given)."""
    out = ops.filter(pl.col("iteration").is_null())
    first = win["cpu_start_ns"].min() if win.height else None
    no_launch = out.filter(pl.col("launch_ts_ns").is_null()).height
    before = out.filter(pl.col("launch_ts_ns") < first).height if first is not None else 0
    kinds = {"kernels": (pl.col("cat") == "kernel"), "memset": (pl.col("cat") == "gpu_memset"),
             **{f"memcpy_{d}": (pl.col("cat") == "gpu_memcpy") & (pl.col("direction").fill_null("other") == d) for d in ("h2d", "d2h", "d2d", "other")}}
    by_kind = out.select(**{k: e.sum() for k, e in kinds.items()}).row(0, named=True) if out.height else dict.fromkeys(kinds, 0)
    return {
        "gpu_ops": out.height, "gpu_ns": union_ns(out), "before_first": before,
        "after_last": out.height - no_launch - before, "no_launch_in_trace": no_launch, "device_busy_ns": device_busy_ns,
        **{k: int(v or 0) for k, v in by_kind.items()},
    }


def own_calls(calls: pl.DataFrame, win: pl.DataFrame) -> pl.DataFrame:
    w = win.select("iteration", "cpu_start_ns", "cpu_end_ns").sort("cpu_start_ns")
    out = by_time(calls).join_asof(w, left_on="ts_ns", right_on="cpu_start_ns", strategy="backward")
    return out.with_columns(
        pl.when(pl.col("ts_ns") < pl.col("cpu_end_ns")).then(pl.col("iteration")).otherwise(None).alias("iteration")
    ).drop("cpu_start_ns", "cpu_end_ns")


def own_ops(gpu_ops: pl.DataFrame, calls: pl.DataFrame) -> pl.DataFrame:
    """gpu_ops (in time order) with their launch call's iteration, launch_api, launch_ts_ns and
    launch_tid (the first call of their correlation id; null without one)."""
    launches = calls.select(
        "correlation", "iteration", pl.col("api").alias("launch_api"), pl.col("ts_ns").alias("launch_ts_ns"), pl.col("tid").alias("launch_tid"),
    ).filter(pl.col("correlation").is_not_null())
    corr = launches["correlation"]
    if launches.height and corr.is_sorted():
        # the calls in correlation order, as ingest leaves them: a binary search finds each op's
        # first call of its id, and only the four launch columns are gathered (a join would hash
        # both sides and copy every column of the ops)
        k = corr.search_sorted(gpu_ops["correlation"], side="left")
        hit = (k < launches.height) & (corr.gather(k.clip(upper_bound=launches.height - 1)) == gpu_ops["correlation"]).fill_null(False)
        got = launches.drop("correlation").gather(pl.select(pl.when(pl.lit(hit)).then(pl.lit(k))).to_series())
        return by_time(gpu_ops.hstack(got.get_columns()))
    if corr.n_unique() < launches.height:  # counting them is much cheaper than de-duplicating
        launches = launches.unique(subset="correlation", keep="first", maintain_order=True)
    return by_time(gpu_ops.join(launches, on="correlation", how="left"))


def by_time(frame: pl.DataFrame, col: str = "ts_ns") -> pl.DataFrame:
    """frame.sort(col), without sorting (and copying every column) when it is in that order
    already, as ingest leaves the tables: a sort by one column keeps equal values in their order."""
    return frame if frame[col].is_sorted() else frame.sort(col)


def gpu_windows(win: pl.DataFrame, owned: pl.DataFrame) -> pl.DataFrame:
    first = owned.group_by("iteration").agg(pl.col("ts_ns").min().alias("s"), pl.col("end_ns").max().alias("e"))
    rows = win.select("iteration").join(first, on="iteration", how="left").sort("iteration")
    its, ss, es = rows["iteration"].to_list(), rows["s"].to_list(), rows["e"].to_list()
    starts: list[int | None] = []
    running: int | None = None
    for s in ss:
        if s is None:
            starts.append(None)
            continue
        running = s if running is None else max(running, s)
        starts.append(running)
    ends: list[int | None] = [None] * len(its)
    nxt: int | None = None
    last_seen = True
    for i in range(len(its) - 1, -1, -1):
        if starts[i] is None:
            continue
        if last_seen:
            ends[i] = max(starts[i], es[i])
            last_seen = False
        else:
            ends[i] = nxt
        nxt = starts[i]
    return pl.DataFrame(
        {"iteration": its, "first_op_ns": ss, "gpu_start_ns": starts, "gpu_end_ns": ends},
        schema={"iteration": pl.Int64, "first_op_ns": pl.Int64, "gpu_start_ns": pl.Int64, "gpu_end_ns": pl.Int64},
    )
