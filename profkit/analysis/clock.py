"""Time inside a window is accounted by the clock (DESIGN.md "Definitions").

The GPU windows tile the device timeline: each iteration's window runs from its first owned op's
start to the next iteration's. Under an overlap scheduler an iteration's ops run past its window's
end (into the next one), so the busy time of a window is the union of *every* GPU op of the device
inside it, whichever iteration owns it (or none), and each op's time is split among the windows it
crosses. Summed over the windows this is the device's busy union over the analyzed span: no busy
time is lost and none is counted twice. All times integer ns.
"""

from __future__ import annotations

from typing import Any, cast

import polars as pl


def merge_intervals(iv: pl.DataFrame, by: str | None = None) -> pl.DataFrame:
    """Intervals (a, b), optionally grouped by `by`, -> their union as disjoint (by, a, b), sorted."""
    keys = [by] if by else []
    x = iv.filter(pl.col("b") > pl.col("a"))
    if x.height == 0:
        return x.select(*keys, "a", "b")
    # the order among intervals of equal start changes no run: already in start order (GPU ops
    # are), a stable sort by the group keeps it; else sorted as (by, a, b)
    if x["a"].is_sorted():
        x = x.sort(by, maintain_order=True) if by else x
    else:
        x = x.sort(*keys, "a", "b")
    cmax = pl.col("b").cum_max()
    prev = cmax.shift(1)
    if by:
        cmax, prev = cmax.over(by), prev.over(by)
    x = x.with_columns(cmax.alias("_max"), prev.alias("_prev"))
    # a run starts where an interval begins after every earlier one (of its group) has ended, and
    # ends at the row before the next run's start: its end is the running maximum there
    new = pl.col("_prev").is_null() | (pl.col("a") > pl.col("_prev"))
    x = x.with_columns(new.alias("_new")).with_columns(pl.col("_new").shift(-1, fill_value=True).alias("_last"))
    return x.filter(pl.col("_new")).select(*keys, "a").with_columns(x.filter(pl.col("_last"))["_max"].alias("b"))


def tiles(windows: pl.DataFrame) -> pl.DataFrame:
    """The GPU windows that exist (iteration, gpu_start_ns, gpu_end_ns), in start order: contiguous,
    each one ending where the next starts (some may be empty)."""
    return windows.filter(pl.col("gpu_start_ns").is_not_null()).select("iteration", "gpu_start_ns", "gpu_end_ns").sort(
        "gpu_start_ns", "iteration"
    )


def by_window(iv: pl.DataFrame, w: pl.DataFrame, keys: tuple[str, ...] = ()) -> pl.DataFrame:
    """Intervals (a, b, *keys) split at the window edges `w` (from `tiles`): the time inside each
    window, summed per (iteration, *keys) as dur_ns. Time outside every window is left out."""
    return by_windows(iv, w, keys)[0]


def by_windows(iv: pl.DataFrame, w: pl.DataFrame, *keysets: tuple[str, ...]) -> list[pl.DataFrame]:
    """by_window(iv, w, keys) for each of `keysets`, the intervals split at the window edges once
    and the sums found together (polars runs them in parallel)."""
    schemas: list[dict[str, Any]] = [{"iteration": pl.Int64, **{k: iv.schema[k] for k in keys}, "dur_ns": pl.Int64} for keys in keysets]
    if w.height == 0 or iv.height == 0:
        return [pl.DataFrame(schema=s) for s in schemas]
    starts, ends = w["gpu_start_ns"], w["gpu_end_ns"]
    lo, hi = cast(int, starts.min()), cast(int, ends.max())
    keys_used = list(dict.fromkeys(k for keys in keysets for k in keys))
    x = iv.select(pl.col("a").clip(lo, hi), pl.col("b").clip(lo, hi), *keys_used).filter(pl.col("b") > pl.col("a"))
    if x.height == 0:
        return [pl.DataFrame(schema=s) for s in schemas]
    # first window holding a (the last starting at or before it) .. last window starting before b
    i0 = (starts.search_sorted(x["a"], side="right").cast(pl.Int64) - 1).clip(lower_bound=0)
    i1 = (starts.search_sorted(x["b"], side="left").cast(pl.Int64) - 1).clip(lower_bound=0)
    x = x.with_columns(i0.alias("_k"))
    cross = i1 > i0
    # most intervals lie in one window: when each window ends where the next starts (as tiles'
    # do), all of such an interval is inside its window; only those crossing an edge are split,
    # one row per window
    if ends.head(-1).equals(starts.tail(-1)):
        inside = x.filter(~cross).select("_k", *keys_used, (pl.col("b") - pl.col("a")).alias("dur_ns"))
        split = x.filter(cross).with_columns(i1.filter(cross).alias("_i1"))
    else:
        inside = x.clear().select("_k", *keys_used, pl.lit(0, pl.Int64).alias("dur_ns"))
        split = x.with_columns(pl.max_horizontal(i0, i1).alias("_i1"))
    split = split.with_columns(pl.int_ranges("_k", pl.col("_i1") + 1, dtype=pl.Int64).alias("_k")).explode("_k")
    k = split["_k"]
    split = split.select(
        "_k", *keys_used, (pl.min_horizontal(pl.col("b"), ends.gather(k)) - pl.max_horizontal(pl.col("a"), starts.gather(k))).alias("dur_ns"),
    ).filter(pl.col("dur_ns") > 0)
    pieces = pl.concat([inside, split]).lazy()
    # summed per window (`_k`, one per iteration), then named by iteration and sorted by the whole key
    its = w.lazy().select(pl.int_range(0, pl.len(), dtype=pl.Int64).alias("_k"), "iteration")
    return pl.collect_all([
        pieces.group_by("_k", *keys).agg(pl.col("dur_ns").sum()).join(its, on="_k").sort("iteration", *keys).select(list(s))
        for keys, s in zip(keysets, schemas)
    ])


def device_union(ops: pl.DataFrame) -> pl.DataFrame:
    """The device's busy union: every GPU op's [ts_ns, end_ns) merged into disjoint (a, b)."""
    return merge_intervals(ops.select(pl.col("ts_ns").alias("a"), pl.col("end_ns").alias("b")))


def busy_by_window(union: pl.DataFrame, w: pl.DataFrame) -> pl.DataFrame:
    """iteration, gpu_busy_ns: the length of the device's busy union (device_union) inside each window."""
    return by_window(union, w).rename({"dur_ns": "gpu_busy_ns"})


def owned_and_spill(owned: pl.DataFrame) -> pl.DataFrame:
    """iteration, owned_gpu_ns (union of the iteration's own ops, unclipped), spill_ns (the part of
    it outside the iteration's window). `owned` needs gpu_start_ns / gpu_end_ns per row."""
    schema = {"iteration": pl.Int64, "owned_gpu_ns": pl.Int64, "spill_ns": pl.Int64}
    if owned.height == 0:
        return pl.DataFrame(schema=schema)
    u = merge_intervals(owned.select("iteration", pl.col("ts_ns").alias("a"), pl.col("end_ns").alias("b")), by="iteration")
    win = owned.group_by("iteration").agg(pl.col("gpu_start_ns").first(), pl.col("gpu_end_ns").first())
    u = u.join(win, on="iteration", how="left")
    inside = (pl.min_horizontal("b", "gpu_end_ns") - pl.max_horizontal("a", "gpu_start_ns")).clip(lower_bound=0).fill_null(0)
    return (
        u.group_by("iteration")
        .agg((pl.col("b") - pl.col("a")).sum().alias("owned_gpu_ns"), inside.sum().alias("_in"))
        .with_columns((pl.col("owned_gpu_ns") - pl.col("_in")).alias("spill_ns"))
        .select(list(schema))
        .sort("iteration")
    )


def union_ns(ops: pl.DataFrame) -> int:
    """Length of the union of the ops' [ts_ns, end_ns)."""
    return length_ns(device_union(ops)) if ops.height else 0


def length_ns(union: pl.DataFrame) -> int:
    """Total length of disjoint intervals (a, b)."""
    return int((union["b"] - union["a"]).sum() or 0)
