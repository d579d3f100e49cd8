"""Every iteration, GPU op, bubble, sync and launch of an analysis as parquet tables, for fleets of
runs: `--tables DIR` writes `DIR/<table>/run=<run>/rank=<rank>/part-0.parquet` (hive layout), so
DuckDB (`read_parquet('DIR/bubbles/**/*.parquet', hive_partitioning = true)`) and Spark read the
tables of many runs as one, with `run` and `rank` as columns. summary.json keeps aggregates and the
largest items; these tables keep every row. Times are integer ns, absolute (the trace's clock, as
`t0_ns` in `iterations`), so rows join across tables; README.md lists the columns.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import Any

import polars as pl

TABLES = ("iterations", "gpu_ops", "bubbles", "syncs", "launches")
_SAFE = re.compile(r"[^A-Za-z0-9._-]+")


def run_name(path: Path) -> str:
    """A run's name for the `run=` partition: its run folder (traces/<run_id>/), else the trace's stem."""
    p = Path(path)
    name = p.parent.name if p.parent.name and (p.parent / "manifest.json").is_file() else p.name.split(".")[0]
    return _SAFE.sub("_", name) or "run"


def frames(a: Any) -> dict[str, pl.DataFrame]:
    """The five tables of one RankAnalysis (profkit.analysis.rank)."""
    it = a.iterations.drop("marker").with_columns(pl.lit(a.t0_ns, pl.Int64).alias("t0_ns"))
    cats = a.categories.pivot(on="category", index="iteration", values="dur_ns") if a.categories.height else None
    if cats is not None:
        it = it.join(cats.rename({c: f"category_{c}_ns" for c in cats.columns if c != "iteration"}), on="iteration", how="left")
    phases = a.phases.pivot(on="phase", index="iteration", values="dur_ns") if a.phases.height else None
    if phases is not None:
        it = it.join(phases.rename({c: f"phase_{c}_ns" for c in phases.columns if c != "iteration"}), on="iteration", how="left")
    ops = a.ops.select(
        "iteration", "name", "cat", "category", *(["phase"] if "phase" in a.ops.columns else []), "stream", "correlation", "ts_ns", "dur_ns",
        "end_ns", "launch_api", "launch_ts_ns", "direction", "bytes",
    )
    launches = (
        a.ops.filter(pl.col("launch_api").is_not_null())
        .group_by("correlation")
        .agg(pl.col("iteration").first(), pl.col("launch_api").first().alias("api"), pl.col("launch_ts_ns").first(),
             pl.col("ts_ns").min().alias("first_op_ts_ns"), pl.len().cast(pl.Int64).alias("gpu_ops"))
        .with_columns((pl.col("first_op_ts_ns") - pl.col("launch_ts_ns")).alias("latency_ns"))
        .sort("launch_ts_ns", "correlation")
    )
    bubbles = a.bubbles.select("iteration", "start_ns", "dur_ns", "cause", "cpu_ops", "cpu_ops_ns")
    syncs = a.syncs.select("iteration", "api", "kind", "direction", "ts_ns", "end_ns", "blocked_ns", "trigger", "stack")
    return {"iterations": it, "gpu_ops": ops, "bubbles": bubbles, "syncs": syncs, "launches": launches}


def write_tables(analyses: list[Any], out_dir: Path) -> list[Path]:
    """Write every rank's tables under out_dir (each partition replaced whole, through a temporary
    folder and a rename, so an interrupted write never leaves half a partition). The files written."""
    out_dir = Path(out_dir)
    written = []
    for a in analyses:
        run = run_name(a.path)
        for table, df in frames(a).items():
            part = out_dir / table / f"run={run}" / f"rank={a.rank}"
            tmp = part.with_name(f".{part.name}.{os.getpid()}.tmp")
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
            df.write_parquet(tmp / "part-0.parquet", compression="zstd")
            shutil.rmtree(part, ignore_errors=True)
            os.replace(tmp, part)
            written.append(part / "part-0.parquet")
    return written
