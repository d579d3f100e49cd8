"""Each iteration's work, its hardware floor and the gap between its GPU window and that floor (DESIGN.md "Work
and the hardware floor").

From the GPU ops' work (analysis/work.py) and the device's peaks (analysis/peaks.py), per iteration:

- by ownership (the step's own work, as counts are): `flops`, `bytes`, `work_by_category` {category: {flops,
  bytes, floor_us}} (floor_us: the sum of its ops' own floors), and **`floor_us` = max(Σ bytes / peak
  bandwidth, Σ flops / peak FLOP/s of their dtype)** with `floor_bound` (memory or compute) and both terms
  (`floor_memory_us`, `floor_compute_us`);
- by the clock (as `gpu_window_us`, `gpu_idle_us`, `category_us` and `overlap_us` are): `gap_us`, the split of
  `gpu_window_us − floor_us`, exact per iteration:

      gpu_window − floor = idle + above_floor + floor_mix + unmodeled − overlap

  where, over every GPU op's time inside the window (an op that crosses the window's edge brings the part
  inside, and that share of its own floor): `above_floor_us` = Σ over ops with a work model of their time
  minus their own floor (by category), `unmodeled_us` = the time of ops without one (by category),
  `floor_mix_us` = Σ of those ops' own floors − the step's floor, in two parts (`floor_mix_parts_us`): the
  mix proper, Σ of the step's own ops' floors − its floor (memory-bound and compute-bound ops that could
  have overlapped; ≥ 0), and the edges, the floors by the clock − those of the step's own ops (work that ran
  across the window's edges: under an overlap scheduler, whose GPU runs 1-2 ms behind the host on the
  proxy, ±100-200 µs an iteration, near 0 on the mean of a steady run), `idle_us` = the window's idle time (by bubble cause,
  and `short_gaps` for the gaps under --min-bubble-us), and `overlap_us` the window's overlap. Since Σ of
  the ops' time inside the window − overlap = busy and busy + idle = window, the split is exact.

An op's own floor is max(its bytes / bandwidth, its FLOPs / the rate of its dtype); a dtype without a peak
counts its bytes only. All arithmetic in ns (floats); summary figures in µs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import msgspec

from profkit.documents import CategoryWork, FloorSection, GapSplit, IterationFloor, ModeledOp

if TYPE_CHECKING:
    import polars as pl

    from profkit.analysis.peaks import Peaks
    from profkit.analysis.rank import RankAnalysis

NO_SHAPES = ("no op shapes in this trace (Kineto's Input Dims): no work, floor or gap figures; record them with "
             "`profkit trace --record-shapes` (torch.profiler: record_shapes=True)")


def no_peaks(device: str | None) -> str:
    return (f"no peaks known for the device {device!r}: no floor or gap figures; give measured ones with --peaks FILE "
            "(benchmarks/gpu_peaks.py writes one; kernels/peaks/datasheet.toml shows the shape)")


def _r(ns: float) -> float:
    # + 0.0: a zero residual whose sign follows polars' summation order (-0.0 or 0.0 from run to run) is written as 0.0
    return round(ns / 1000.0, 3) + 0.0


def own_floor_ns(frame: pl.DataFrame, peaks: Peaks) -> pl.Series:
    """Each op's own floor in ns: max(bytes / bandwidth, FLOPs / its dtype's rate); null for ops without work."""
    import polars as pl

    bw = peaks.memory_tb_s * 1000.0  # TB/s = 1e12 B/s = 1e3 B/ns
    rate = pl.col("work_dtype").replace_strict({k: v * 1000.0 for k, v in peaks.dense_tflop_s.items()}, default=None,
                                               return_dtype=pl.Float64)
    mem = pl.col("work_bytes").cast(pl.Float64) / bw
    comp = (pl.col("work_flops").cast(pl.Float64) / rate).fill_null(0.0)
    return frame.select(pl.when(pl.col("work_kind").is_not_null()).then(pl.max_horizontal(mem.fill_null(0.0), comp))
                        .otherwise(None).alias("floor_ns"))["floor_ns"]


def _compute_ns(frame: pl.DataFrame, peaks: Peaks) -> pl.Expr:
    import polars as pl

    rate = pl.col("work_dtype").replace_strict({k: v * 1000.0 for k, v in peaks.dense_tflop_s.items()}, default=None, return_dtype=pl.Float64)
    return (pl.col("work_flops").cast(pl.Float64) / rate).fill_null(0.0)


@dataclass
class _Clock:
    """One window's op pieces by the clock: time above their own floors and unmodeled time (by category, ns), their floors inside."""
    above: dict[str, float] = field(default_factory=dict)
    unmodeled: dict[str, float] = field(default_factory=dict)
    floors: float = 0.0


def iteration_floors(a: RankAnalysis, peaks: Peaks, causes: tuple[str, ...]) -> dict[int, IterationFloor]:
    """iteration -> its work, floor and gap keys (the module doc), for a rank whose ops carry work."""
    import polars as pl

    from profkit.analysis.clock import tiles

    dev = a.device_work
    if dev is None:
        return {}
    bw = peaks.memory_tb_s * 1000.0
    dev = dev.with_columns(own_floor_ns(dev, peaks).alias("floor_ns"), _compute_ns(dev, peaks).alias("compute_ns"),
                           pl.col("category").fill_null("other"))
    out: dict[int, IterationFloor] = {}
    # by ownership: the step's own work
    owned = dev.filter(pl.col("iteration").is_not_null() & pl.col("work_kind").is_not_null())
    per = owned.group_by("iteration").agg(pl.col("work_flops").sum().alias("flops"), pl.col("work_bytes").sum().alias("bytes"),
                                          pl.col("compute_ns").sum().alias("compute_ns"), pl.col("floor_ns").sum().alias("own_floors_ns"))
    by_cat = owned.group_by("iteration", "category").agg(pl.col("work_flops").sum().alias("flops"), pl.col("work_bytes").sum().alias("bytes"),
                                                         pl.col("floor_ns").sum().alias("floor_ns")).sort("iteration", "category")
    cats: dict[int, dict[str, CategoryWork]] = {}
    for it, cat, fl, by, fns in by_cat.iter_rows():
        cats.setdefault(it, {})[cat] = CategoryWork(flops=int(fl or 0), bytes=int(by or 0), floor_us=_r(fns or 0.0))
    work = {it: (int(fl or 0), int(by or 0), float(cns or 0.0), float(ofl or 0.0)) for it, fl, by, cns, ofl in per.iter_rows()}
    # by the clock: each op's time inside each window, and that share of its own floor
    w = tiles(a.iterations.select("iteration", "gpu_start_ns", "gpu_end_ns"))
    pieces = _pieces(dev, w)
    clock: dict[int, _Clock] = {}
    for it, cat, modeled, inside, fshare in pieces.iter_rows():
        c = clock.setdefault(it, _Clock())
        if modeled:
            c.above[cat] = c.above.get(cat, 0.0) + inside - fshare
            c.floors += fshare
        else:
            c.unmodeled[cat] = c.unmodeled.get(cat, 0.0) + inside
    for r in a.iterations.iter_rows(named=True):
        i = r["iteration"]
        if r["gpu_start_ns"] is None:
            continue
        fl, by, cns, own_floors = work.get(i, (0, 0, 0.0, 0.0))
        mem_ns = by / bw
        floor_ns = max(mem_ns, cns)
        c = clock.get(i) or _Clock()
        above, unmodeled, floors = c.above, c.unmodeled, c.floors
        idle = float(r["gpu_idle_ns"])
        by_cause = {k: float(r.get(f"bubble_{k}_ns") or 0) for k in causes}
        by_cause["short_gaps"] = idle - float(r["bubble_ns"] or 0)
        out[i] = IterationFloor(
            flops=fl,
            bytes=by,
            work_by_category=dict(sorted(cats.get(i, {}).items())),
            floor_us=_r(floor_ns),
            floor_bound="compute" if cns > mem_ns else "memory",
            floor_memory_us=_r(mem_ns),
            floor_compute_us=_r(cns),
            gap_us=GapSplit(
                total_us=_r(float(r["gpu_window_ns"]) - floor_ns),
                idle_us=_r(idle),
                idle_us_by_cause={k: _r(v) for k, v in by_cause.items()},
                above_floor_us=_r(sum(above.values())),
                above_floor_us_by_category={k: _r(v) for k, v in sorted(above.items())},
                floor_mix_us=_r(floors - floor_ns),
                # its two parts: the mix proper (the step's own ops' floors, by ownership, minus the step's floor: >= 0) and
                # the edges (the floors inside the window by the clock minus those of the step's own ops: work that ran
                # across the window's edges, large under an overlap scheduler, ~0 in steady state over many steps)
                floor_mix_parts_us={"mix_us": _r(own_floors - floor_ns), "edges_us": _r(floors - own_floors)},
                unmodeled_us=_r(sum(unmodeled.values())),
                unmodeled_us_by_category={k: _r(v) for k, v in sorted(unmodeled.items())},
                overlap_us=_r(float(r["overlap_ns"])),
            ),
        )
    return out


def _pieces(dev: pl.DataFrame, w: pl.DataFrame) -> pl.DataFrame:
    """(window iteration, category, modeled, ns inside, floor ns inside) of every op piece inside a window."""
    import polars as pl

    from profkit.analysis.clock import by_window

    x = dev.with_row_index("_op").select(pl.col("ts_ns").alias("a"), pl.col("end_ns").alias("b"), "_op")
    inside = by_window(x, w, ("_op",))
    meta = dev.with_row_index("_op").select("_op", "category", pl.col("work_kind").is_not_null().alias("modeled"), "floor_ns",
                                            (pl.col("end_ns") - pl.col("ts_ns")).alias("_dur"))
    j = inside.join(meta, on="_op", how="left")
    share = pl.when(pl.col("_dur") > 0).then(pl.col("dur_ns").cast(pl.Float64) / pl.col("_dur")).otherwise(1.0)
    return j.select("iteration", "category", "modeled", pl.col("dur_ns").cast(pl.Float64),
                    (pl.col("floor_ns").fill_null(0.0) * share).alias("fshare"))


def identity_residual_us(rec: dict[str, Any]) -> float:
    """gpu_window − floor − (idle + above_floor + floor_mix + unmodeled − overlap) of one iteration's record (µs)."""
    g = rec["gap_us"]
    return rec["gpu_window_us"] - rec["floor_us"] - (g["idle_us"] + g["above_floor_us"] + g["floor_mix_us"] + g["unmodeled_us"] - g["overlap_us"])


def op_rows(a: RankAnalysis, peaks: Peaks | None, n: int = 40) -> list[ModeledOp]:
    """The modeled launching ops by (op, shape, dtypes), most time first: count of GPU ops, time, FLOPs, bytes,
    achieved TFLOP/s and TB/s and their share of the peaks, and which bound their own floor is."""
    import polars as pl

    dev = a.device_work
    if dev is None:
        return []
    own = dev.filter(pl.col("iteration").is_not_null() & pl.col("work_kind").is_not_null() & pl.col("shape_op").is_not_null())
    g = (own.group_by("shape_op", "shape", "shape_dtypes", "work_kind", "work_dtype")
         .agg(pl.len().alias("gpu_ops"), pl.col("dur_ns").sum().alias("ns"), pl.col("work_flops").sum().alias("flops"),
              pl.col("work_bytes").sum().alias("bytes"))
         .sort("ns", "shape_op", "shape", descending=[True, False, False]).head(n))
    rows = []
    for op, shape, dts, kind, dtype, k, ns, fl, by in g.iter_rows():
        r = ModeledOp(shape_op=op, shape=shape, shape_dtypes=dts, kind=kind, gpu_ops=int(k), total_us=_r(ns), bytes=int(by or 0))
        if kind not in ("gemm", "attention"):
            fl = None  # bytes-only ops: no FLOPs counted (a sum of nulls reads 0)
        if fl is not None:
            r.flops = int(fl)
        if ns:
            r.tb_s = tb_s = round((by or 0) / ns / 1000.0, 4)
            tflop_s = None
            if fl is not None:
                r.tflop_s = tflop_s = round(fl / ns / 1000.0, 4)
            if peaks is not None:
                r.memory_share = round(tb_s / peaks.memory_tb_s, 4)
                rate = peaks.dense_tflop_s.get(dtype or "")
                if fl is not None and tflop_s is not None and rate:
                    r.compute_share = round(tflop_s / rate, 4)
                    r.bound = "compute" if fl / rate > (by or 0) / peaks.memory_tb_s else "memory"
                else:
                    r.bound = "memory"
        rows.append(r)
    return rows


def rank_floor(a: RankAnalysis, records: list[dict[str, Any]], peaks_file: Any, causes: tuple[str, ...]) -> FloorSection:
    """Adds each iteration's work, floor and gap keys to `records` (summary.iteration_records' dicts, being built)
    where the rank has shapes and peaks; returns the rank's `floor` section: what was used, or why nothing."""
    from profkit.analysis.peaks import peaks_for

    if a.device_work is None:
        return FloorSection(note=NO_SHAPES)
    peaks = peaks_for(a.device, peaks_file)
    modeled = a.device_work.filter(a.device_work["iteration"].is_not_null())
    has = modeled["work_kind"].is_not_null()
    gpu_ops, modeled_ops = modeled.height, int(has.sum())
    if peaks is None:
        return FloorSection(note=no_peaks(a.device), gpu_ops=gpu_ops, modeled_gpu_ops=modeled_ops, ops=op_rows(a, None))
    floors = iteration_floors(a, peaks, causes)
    for rec in records:
        f = floors.get(rec["index"])
        if f is not None:
            rec.update(msgspec.to_builtins(f))
    return FloorSection(peaks=peaks.as_doc(), gpu_ops=gpu_ops, modeled_gpu_ops=modeled_ops, ops=op_rows(a, peaks))


__all__ = ["NO_SHAPES", "iteration_floors", "identity_residual_us", "op_rows", "rank_floor"]
