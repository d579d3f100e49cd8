"""Time by ownership (DESIGN.md "Categories and phases by ownership in a diff"), integer ns.

Each iteration's own GPU ops (those whose launch call starts inside its CPU window), whole and
unclipped, by category and by phase. With ``owned_gpu_ns`` (the union of the same ops,
analysis/clock.owned_and_spill) they give ``owned_overlap_ns = sum(owned category) - owned_gpu``:
time the iteration's own ops ran at the same time as each other. A diff compares these instead of
time by the clock, so a change in how far the GPU runs behind the host (the backlog) never shows
up as a category's change.
"""

from __future__ import annotations

import polars as pl


def owned_by(owned: pl.DataFrame, key: str) -> pl.DataFrame:
    """iteration, `key`, dur_ns: the summed durations (end - start) of each iteration's own ops per
    value of `key` (``category`` or ``phase``; a missing value counts as "other")."""
    schema = {"iteration": pl.Int64, key: pl.String, "dur_ns": pl.Int64}
    if owned.height == 0:
        return pl.DataFrame(schema=schema)
    return (
        owned.lazy()
        .select("iteration", pl.col(key).cast(pl.String).fill_null("other"), (pl.col("end_ns") - pl.col("ts_ns")).alias("dur_ns"))
        .group_by("iteration", key).agg(pl.col("dur_ns").sum())
        .sort("iteration", key).select(list(schema)).collect()
    )
