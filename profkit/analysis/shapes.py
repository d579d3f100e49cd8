"""The shapes of each GPU op: those of the CPU op that launched it (DESIGN.md "Work and the hardware floor").

With `record_shapes=True` every CPU op carries Kineto's `Input Dims` and `Input type`. A GPU op takes
those of its launching op:

- launched eagerly: the innermost CPU op (`cpu_op`, by time nesting on the launching thread) around
  its launch call (the runtime call of the same correlation), so `aten::linear -> aten::matmul ->
  aten::mm -> cudaLaunchKernel` gives the kernel `aten::mm`'s shapes;
- replayed from a CUDA graph: the op around its launch during the graph's profiled capture, as
  analysis/graphs.py maps the replay's ops to their captured launches (an op that mapping leaves
  out has no shape).

Three columns on the ops frame, null where there is none: `shape_op` (the launching op's name),
`shape` (its `Input Dims`, compact JSON text, e.g. `[[1,2048],[2048,2048]]`) and `shape_dtypes` (its
`Input type`, e.g. `["c10::BFloat16","c10::BFloat16"]`). Only a trace recorded with shapes gets them.
"""

from __future__ import annotations

from typing import Any

import polars as pl

from profkit.apis import GRAPH_LAUNCH_APIS

SHAPE_COLUMNS = ("shape_op", "shape", "shape_dtypes")
NO_SHAPES = "no shapes recorded: kernels are grouped by name alone; record with `profkit trace --record-shapes` for shapes"


def attach_shapes(ops: pl.DataFrame, trace: Any, replayed: dict[int, tuple[str, str | None, str | None]]) -> pl.DataFrame:
    """`ops` (rank.py's frame: launch_api, launch_ts_ns, launch_tid per row) with SHAPE_COLUMNS; `replayed`: the
    graph-replayed rows' capture-time (op, dims, types) (graphs.apply)."""
    from profkit.analysis.spans import innermost_enclosing
    from profkit.ingest.shapes import cpu_op_shapes

    n = ops.height
    op: list[str | None] = [None] * n
    dims: list[str | None] = [None] * n
    types: list[str | None] = [None] * n
    if trace.meta.get("shapes") and n:
        cpu = cpu_op_shapes(trace.path)
        eager = (ops["launch_ts_ns"].is_not_null() & ops["launch_tid"].is_not_null()
                 & ~ops["launch_api"].is_in(list(GRAPH_LAUNCH_APIS)).fill_null(False))
        pos = eager.arg_true().to_list()
        if pos and cpu.height:
            pts = ops.filter(eager).select(pl.col("launch_ts_ns").alias("ts_ns"), pl.col("launch_ts_ns").alias("end_ns"),
                                           pl.col("launch_tid").cast(pl.String).alias("tid"))
            names, d, t = cpu["name"].to_list(), cpu["input_dims"].to_list(), cpu["input_type"].to_list()
            for p, i in zip(pos, innermost_enclosing(pts, cpu)):
                if i is not None:
                    op[p], dims[p], types[p] = names[i], d[i], t[i]
    for p, (o, d_, t_) in replayed.items():
        op[p], dims[p], types[p] = o, d_, t_
    return ops.with_columns(pl.Series("shape_op", op, dtype=pl.String), pl.Series("shape", dims, dtype=pl.String),
                            pl.Series("shape_dtypes", types, dtype=pl.String))


def has_shapes(ops: pl.DataFrame) -> bool:
    return "shape" in ops.columns and ops["shape"].is_not_null().any()
