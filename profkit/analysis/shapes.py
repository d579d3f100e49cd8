"""The shapes of each GPU op: those of the CPU op that launched it (DESIGN.md "Work and the hardware floor").

With `record_shapes=True` every CPU op carries Kineto's `Input Dims` and `Input type`. A GPU op takes
those of its launching op:

- launched eagerly: the innermost CPU op (`cpu_op`, by time nesting on the launching thread) around
  its launch call (the runtime call of the same correlation), so `aten::linear -> aten::matmul ->
  aten::mm -> cudaLaunchKernel` gives the kernel `aten::mm`'s shapes;
- replayed from a CUDA graph: the op around its launch during the graph's profiled capture, as
  analysis/graphs.py maps the replay's ops to their captured launches (an op that mapping leaves
  out has no shape).

Four columns on the ops frame, null where there is none: `shape_op` (the launching op's name),
`shape` (its `Input Dims`, compact JSON text, e.g. `[[1,2048],[2048,2048]]`), `shape_dtypes` (its
`Input type`, e.g. `["c10::BFloat16","c10::BFloat16"]`) and `shape_op_ns` (the op's start, ns on
its own file's clock: this trace's for an eager op, the capture profile's for a replayed one). The
kernels one op launched share `shape_op_ns` (eager) or (`correlation`, `shape_op_ns`) (one graph
replay): a split-K GEMM's two kernels are one GEMM. Only a trace recorded with shapes gets them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import polars as pl

from profkit.apis import GRAPH_LAUNCH_APIS
from profkit.terms import shape_text  # noqa: F401  (where attribution/diff.py reads it; the words live in terms.py)

SHAPE_COLUMNS = ("shape_op", "shape", "shape_dtypes")  # what the kernels table and the movers group by


def attach_shapes(ops: pl.DataFrame, trace: Any, replayed: dict[int, tuple[str, str | None, str | None, int]]) -> pl.DataFrame:
    """`ops` (rank.py's frame: launch_api, launch_ts_ns, launch_tid per row) with SHAPE_COLUMNS and shape_op_ns;
    `replayed`: the graph-replayed rows' capture-time (op, dims, types, start ns) (graphs.apply)."""
    import polars as pl

    from profkit.analysis.spans import innermost_at, innermost_enclosing
    from profkit.ingest.shapes import trace_shapes

    n = ops.height
    op: list[str | None] = [None] * n
    dims: list[str | None] = [None] * n
    types: list[str | None] = [None] * n
    start: list[int | None] = [None] * n
    if trace.meta.get("shapes") and n:
        cpu = trace_shapes(trace)
        pids = set(trace.cpu["pid"].unique().to_list()) if trace.cpu.height and getattr(trace, "cpu_shapes", None) is None else set()
        if pids and cpu["pid"].is_in(list(pids)).any():  # read from a file of several ranks: this rank's ops only
            cpu = cpu.filter(pl.col("pid").is_in(list(pids)))
        eager = (ops["launch_ts_ns"].is_not_null() & ops["launch_tid"].is_not_null()
                 & ~ops["launch_api"].is_in(list(GRAPH_LAUNCH_APIS)).fill_null(False))
        pos = eager.arg_true().to_list()
        if pos and cpu.height:
            pts = ops.filter(eager).select(pl.col("launch_ts_ns").alias("ts_ns"), pl.col("launch_ts_ns").alias("end_ns"),
                                           pl.col("launch_tid").cast(pl.String).alias("tid"))
            owner = innermost_at(pts, cpu)  # launches have no length: the native sweep, else the Python one
            hit = [(p, i) for p, i in zip(pos, owner if owner is not None else innermost_enclosing(pts, cpu)) if i is not None]
            if hit:  # the rows of the ops found, not every CPU op's
                got = cpu.select("name", "input_dims", "input_type", "ts_ns")[pl.Series([i for _, i in hit], dtype=pl.Int64)]
                for (p, _), row in zip(hit, got.iter_rows()):
                    op[p], dims[p], types[p], start[p] = row
    for p, (o, d_, t_, s_) in replayed.items():
        op[p], dims[p], types[p], start[p] = o, d_, t_, s_
    return ops.with_columns(pl.Series("shape_op", op, dtype=pl.String), pl.Series("shape", dims, dtype=pl.String),
                            pl.Series("shape_dtypes", types, dtype=pl.String), pl.Series("shape_op_ns", start, dtype=pl.Int64))


def has_shapes(ops: pl.DataFrame) -> bool:
    return "shape" in ops.columns and ops["shape"].is_not_null().any()
