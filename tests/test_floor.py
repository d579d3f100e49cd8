"""Work per op, each step's hardware floor and the gap's split (issue 41 points 2-6; DESIGN.md "Work and the hardware floor").

Expected values come from code that shares nothing with profkit: tests/plain_flops.py (GEMM FLOPs and bytes per
iteration from the raw `Input Dims`), the Hugging Face model's parameter bytes as its recorder measured them from the
module's tensors (tests/data/gpu_shapes/hf_llama12.meta.json), and tests/data/gpu_loo/plain_owned.py (GPU time by
ownership per category, for the leave-one-out fixtures of tests/data/gpu_shapes_loo/).
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from support import DATA, ROOT

sys.path.insert(0, str(Path(__file__).parent))
import plain_flops  # noqa: E402  (the second opinion)

from support.helpers import SHAPE_CASES, SHAPES  # noqa: E402  (the fixtures both modules read)
LOO = DATA / "gpu_shapes_loo"
CASES = SHAPE_CASES
LOO_WINDOWS = sorted(LOO.glob("*/window-*/*.trace.json.gz"))
ENV = {"PATH": "/usr/bin:/bin", "COLUMNS": "200", "PROFKIT_NO_CACHE": "1"}


def _analysis(trace: Path, marker: str | None, captures: Path | None):
    from profkit.analysis.graphs import load_captures
    from profkit.analysis.rank import analyze_trace
    from profkit.ingest import load_trace

    return analyze_trace(load_trace(trace), marker=marker, captures=load_captures(sorted(captures.glob("*.json.gz"))) if captures else None)


def _summary(trace: Path, marker: str | None = None, captures: Path | None = None) -> dict:
    from profkit.analysis.summary import build_summary

    return build_summary([_analysis(trace, marker, captures)])


@pytest.mark.parametrize("case", sorted(CASES))
def test_gemm_work_per_iteration_equals_the_plain_count(case):
    """Per iteration, the FLOPs and bytes of profkit's GEMM ops equal plain_flops' within 0.5% (they agree exactly)."""
    trace, marker, captures = CASES[case]
    plain = plain_flops.count(str(trace), marker or plain_flops.DEFAULT_MARKER, str(captures) if captures else None)
    a = _analysis(trace, marker, captures)
    assert a.device_work is not None
    g = (a.device_work.filter((pl.col("work_kind") == "gemm") & pl.col("iteration").is_not_null())
         .group_by("iteration").agg(pl.col("work_flops").sum(), pl.col("work_bytes").sum()).sort("iteration"))
    mine = {i: (f, b) for i, f, b in g.iter_rows()}
    assert len(plain["iterations"]) == 6 and sorted(mine) == list(range(6))
    for i, it in enumerate(plain["iterations"]):
        assert it["flops"] > 0 and it["ambiguous_replays"] == 0
        f, b = mine[i]
        assert abs(f - it["flops"]) <= 0.005 * it["flops"], (i, f, it["flops"])
        assert abs(b - it["bytes"]) <= 0.005 * it["bytes"], (i, b, it["bytes"])


@pytest.mark.parametrize("case", ["hf_bs1", "hf_bs8"])
def test_hf_decode_gemm_bytes_are_the_linear_weights_plus_activations(case):
    """A decode step's GEMMs read every nn.Linear weight once: parameter bytes (measured from the module's tensors at record
    time) plus activations, within 1%."""
    meta = json.loads((SHAPES / "hf_llama12.meta.json").read_text())
    params = meta["linear_param_bytes_measured"]
    assert params == 1_213_202_432
    trace, _, _ = CASES[case]
    a = _analysis(trace, r"^decode_step$", None)
    g = a.device_work.filter((pl.col("work_kind") == "gemm") & pl.col("iteration").is_not_null()).group_by("iteration").agg(pl.col("work_bytes").sum())
    assert g.height == 5
    for b in g["work_bytes"].to_list():
        assert params <= b <= 1.01 * params, b


def _residuals(summary: dict) -> list[float]:
    from profkit.analysis.floor import identity_residual_us

    return [identity_residual_us(it) for r in summary["ranks"] for it in r["iterations"] if "gap_us" in it]


@pytest.mark.parametrize("trace", [c[0] for c in CASES.values()] + LOO_WINDOWS, ids=lambda p: p.parent.name + "/" + p.name[:24])
def test_the_gap_splits_exactly(trace):
    """gpu_window − floor = idle + above_floor + floor_mix + unmodeled − overlap, to 0.01 µs, in every iteration."""
    case = next((c for c in CASES.values() if c[0] == trace), None)
    marker, captures = (case[1], case[2]) if case else (None, trace.parent.parent / "graph_capture_profile")
    s = _summary(trace, marker, captures)
    its = s["ranks"][0]["iterations"]
    res = _residuals(s)
    assert len(res) == len(its) > 0
    assert max(abs(x) for x in res) < 0.01
    for it in its:
        g = it["gap_us"]
        assert it["floor_us"] > 0 and it["floor_bound"] in ("memory", "compute")
        assert g["floor_mix_parts_us"]["mix_us"] >= 0  # by ownership: Σ own floors >= the step's floor
        assert abs(g["floor_mix_us"] - sum(g["floor_mix_parts_us"].values())) < 0.002
        assert abs(g["idle_us"] - sum(g["idle_us_by_cause"].values())) < 0.01
        assert abs(g["above_floor_us"] - sum(g["above_floor_us_by_category"].values())) < 0.01
        # the floor is the larger of the step's bytes and FLOPs over the peaks
        peaks = s["ranks"][0]["floor"]["peaks"]
        assert it["floor_memory_us"] == pytest.approx(it["bytes"] / peaks["memory_tb_s"] / 1e6, abs=0.001)
        assert it["floor_us"] == max(it["floor_memory_us"], it["floor_compute_us"])


def _plain_owned(run: Path, window: int) -> dict:
    out = subprocess.run([sys.executable, str(DATA / "gpu_loo" / "plain_owned.py"), str(run), str(window)], capture_output=True, text=True,
                         check=True)
    return json.loads(out.stdout)


@pytest.mark.parametrize(("opt", "category"), [("topk_v2", "topk"), ("indexer_fusion", "indexer")])
def test_leave_one_out_states_the_gap_each_optimization_closed(opt, category, tmp_path):
    """H100 leave-one-out with CUDA graphs (tests/data/gpu_shapes_loo): the diff says what the optimization closed of the
    gap, within 5% of its owned category's change as plain_owned.py counts it (median over the 2 windows)."""
    before, after = (next(LOO.glob(f"*-{opt}-{s}")) for s in ("before", "after"))
    out = tmp_path / "diff.json"
    r = subprocess.run([sys.executable, "-m", "profkit", "diff", str(before), str(after), "--opt", opt, "--json", str(out)],
                       capture_output=True, text=True, cwd=ROOT, env=ENV)
    assert r.returncode == 0, r.stderr
    d = json.loads(out.read_text())
    o = d["floor"]["optimization"]
    assert o["categories"] == [category]
    changes = []
    for w in (0, 1):
        b, c = _plain_owned(before, w), _plain_owned(after, w)
        changes.append((c["owned_category_us"][category] - b["owned_category_us"][category]) / len(b["iterations"]))
    plain = statistics.median(changes)
    assert plain < -100  # the optimization's own effect is there to close
    assert abs(o["closed_us"] - -plain) <= 0.05 * abs(plain), (o, plain)
    assert 0 < o["closed_us"] < o["baseline_gap_us"]
    assert f"{opt} closed " in r.stdout and "gap between the step and its floor" in r.stdout
    assert "gap to the floor on each side" in r.stdout


def test_a_trace_without_shapes_says_so_once(tmp_path):
    """No shapes: one line saying what is missing and what to run; no floor key in any iteration (never a 0)."""
    trace = DATA / "gpu" / "eager_decode.pt.trace.json.gz"
    out = tmp_path / "s.json"
    r = subprocess.run([sys.executable, "-m", "profkit", "analyze", str(trace), "--json", str(out)], capture_output=True, text=True,
                       cwd=ROOT, env=ENV)
    assert r.returncode == 0, r.stderr
    lines = [ln for ln in (r.stdout + r.stderr).splitlines() if "--record-shapes" in ln]
    assert len(lines) == 1 and lines[0].startswith("floor: no op shapes"), lines
    s = json.loads(out.read_text())
    rank = s["ranks"][0]
    assert "record-shapes" in rank["floor"]["note"] and "peaks" not in rank["floor"]
    for it in [*rank["iterations"], rank["median"]]:
        assert not {"flops", "bytes", "floor_us", "gap_us", "work_by_category"} & set(it)


def test_measured_peaks_replace_the_datasheet(tmp_path):
    """--peaks FILE: the measured H200 bandwidth (4.198 TB/s) instead of the datasheet's 4.8; the floor grows by 4.8/4.198."""
    trace = CASES["hf_bs1"][0]
    got = {}
    for name, extra in (("datasheet", []), ("measured", ["--peaks", str(ROOT / "benchmarks/results/peaks_h200_2026-12-04.toml")])):
        out = tmp_path / f"{name}.json"
        r = subprocess.run([sys.executable, "-m", "profkit", "analyze", str(trace), "--marker", "^decode_step$", "--json", str(out), *extra],
                           capture_output=True, text=True, cwd=ROOT, env=ENV)
        assert r.returncode == 0, r.stderr
        got[name] = json.loads(out.read_text())["ranks"][0]
        assert "floor:" in r.stdout and "gap to the floor" in r.stdout
    assert got["datasheet"]["floor"]["peaks"]["memory_tb_s"] == 4.8 and got["measured"]["floor"]["peaks"]["memory_tb_s"] == 4.198
    for a, b in zip(got["datasheet"]["iterations"], got["measured"]["iterations"]):
        assert a["bytes"] == b["bytes"] and a["floor_bound"] == b["floor_bound"] == "memory"
        assert b["floor_us"] == pytest.approx(a["floor_us"] * 4.8 / 4.198, rel=1e-4)


def test_a_bad_peaks_file_is_a_usage_error(tmp_path):
    bad = tmp_path / "p.toml"
    bad.write_text("not = [toml")
    r = subprocess.run([sys.executable, "-m", "profkit", "analyze", str(CASES["hf_bs1"][0]), "--peaks", str(bad)], capture_output=True,
                       text=True, cwd=ROOT, env=ENV)
    assert r.returncode == 2 and "--peaks" in r.stderr


def test_a_rank_floor_decodes_typed_and_reads_as_before():
    """A rank's `floor` (the note form, with modeled ops but no peaks) and an iteration's `work_by_category` decode as
    their structs: the note and the op rows read as the dicts did; a median's halves (FLOPs of an even count) decode."""
    from profkit.documents import CategoryWork, FloorSection, ModeledOp, UNSET, rank_of
    from profkit.report.floor_view import floor_note, op_rows

    op = {"shape_op": "aten::mm", "shape": "[[1,2],[2,3]]", "shape_dtypes": '["c10::BFloat16","c10::BFloat16"]', "kind": "gemm",
          "gpu_ops": 4, "total_us": 12.5, "bytes": 1000, "flops": 2000, "tb_s": 0.08, "tflop_s": 0.16}
    rank = rank_of({"bubbles_by_cause": {}, "sync_groups": [], "floor": {"note": "no peaks known", "gpu_ops": 9, "modeled_gpu_ops": 4, "ops": [op]},
                    "median": {"work_by_category": {"gemm": {"flops": 2.5, "bytes": 3, "floor_us": 0.125}}}})
    assert isinstance(rank.floor, FloorSection) and rank.floor.peaks is UNSET and rank.floor.ops == [ModeledOp(**op)]
    assert rank.median.work_by_category == {"gemm": CategoryWork(flops=2.5, bytes=3, floor_us=0.125)}
    assert floor_note(rank) == "floor: no peaks known"
    assert op_rows(rank) == [("aten::mm [1,2]x[2,3] bf16", "4", "12.5", "0.16", "0.080", "–", "–")]
