"""Shapes per GPU op (issue 41 point 1; DESIGN.md "Work and the hardware floor"), checked against tests/plain_flops.py.

profkit gives each GPU op the `Input Dims` / `Input type` of the CPU op that launched it (analysis/shapes.py): eager,
the innermost `cpu_op` around the launch call; replayed from a CUDA graph, the op around its launch in the graph's
profiled capture. `plain_flops.py` (stdlib, no profkit code) finds "the GEMM op around each launch" from the raw
events on its own; here, per iteration, the GEMM ops profkit's kernels name (each op once: a split-K GEMM launches two
kernels) must be those plain_flops finds, shape for shape, on the H200 fixtures of tests/data/gpu_shapes/.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import polars as pl
import pytest

from support import DATA, ROOT

sys.path.insert(0, str(Path(__file__).parent))
import plain_flops  # noqa: E402  (the second opinion)

from support.helpers import SHAPE_CASES, SHAPES  # noqa: E402  (the fixtures both modules read)
CASES = SHAPE_CASES


def _key(op: str, dims: str, types: str) -> str:
    """plain_flops' shape text for an op: name, its non-empty Input Dims and Input type."""
    return f"{op}{[list(d) for d in json.loads(dims) if d]}{[t for t in json.loads(types) if t]}"


@pytest.mark.parametrize("case", sorted(CASES))
def test_gemm_shapes_per_iteration_equal_the_plain_count(case):
    from profkit.analysis.graphs import load_captures
    from profkit.analysis.rank import analyze_trace
    from profkit.ingest import load_trace

    trace, marker, captures = CASES[case]
    plain = plain_flops.count(str(trace), marker or plain_flops.DEFAULT_MARKER, str(captures) if captures else None)
    a = analyze_trace(load_trace(trace), marker=marker, captures=load_captures(sorted(captures.glob("*.json.gz"))) if captures else None)
    gemm = a.ops.filter(pl.col("shape_op").is_in(list(plain_flops.GEMM_OPS)) & pl.col("iteration").is_not_null())
    # one GEMM per launching op: an eager op by its start, a replayed one by its replay and capture-time start
    replay = pl.when(pl.col("launch_api") == "cudaGraphLaunch").then(pl.col("correlation")).otherwise(-1)
    ops = gemm.with_columns(replay.alias("_replay")).unique(["_replay", "shape_op_ns"], keep="first", maintain_order=True)
    assert ops.height < gemm.height  # the split-K GEMMs' second kernels: the dedupe is needed and done
    mine: dict[int, Counter] = {}
    for r in ops.iter_rows(named=True):
        mine.setdefault(r["iteration"], Counter())[_key(r["shape_op"], r["shape"], r["shape_dtypes"])] += 1
    assert len(plain["iterations"]) == 6 and sorted(mine) == list(range(6))
    for i, it in enumerate(plain["iterations"]):
        assert it["no_shapes"] == 0 and it["ambiguous_replays"] == 0
        assert dict(mine[i]) == it["shapes"], i
    if captures is not None:  # every GEMM of the graph iterations came from the captures
        assert all(it["replayed_gemms"] == it["gemms"] for it in plain["iterations"])
        assert gemm.filter(pl.col("launch_api") != "cudaGraphLaunch").height == 0


def test_kernels_table_and_summary_rows_carry_the_shape(tmp_path):
    out = tmp_path / "s.json"
    r = subprocess.run([sys.executable, "-m", "profkit", "analyze", str(CASES["hf_bs1"][0]), "--marker", "^decode_step$", "--no-cache",
                        "--json", str(out)], capture_output=True, text=True, cwd=ROOT, env={"PATH": "/usr/bin:/bin", "COLUMNS": "240"})
    assert r.returncode == 0, r.stderr
    kernels = json.loads(out.read_text())["ranks"][0]["kernels"]
    # the lm_head GEMM ([1, 2048] x [2048, 32000]) is its own row, under its own shape
    lm = [k for k in kernels if k.get("shape") == "[[1,2048],[2048,32000]]"]
    assert lm and {k["shape_op"] for k in lm} == {"aten::mm"} and lm[0]["shape_dtypes"] == '["c10::BFloat16","c10::BFloat16"]'
    assert "shape" in r.stdout and "[1,2048]x[2048,32000]" in r.stdout


def _diff(tmp_path, base: Path, cand: Path, *extra: str) -> dict:
    out = tmp_path / "diff.json"
    r = subprocess.run([sys.executable, "-m", "profkit", "diff", str(base), str(cand), *extra, "--json", str(out)], capture_output=True,
                       text=True, cwd=ROOT, env={"PATH": "/usr/bin:/bin", "COLUMNS": "200", "PROFKIT_NO_CACHE": "1"})
    assert r.returncode == 0, r.stderr
    return json.loads(out.read_text())


def test_diff_movers_by_kernel_and_shape(tmp_path):
    d = _diff(tmp_path, SHAPES / "proxy_eager", SHAPES / "proxy_graphs")
    movers = d["top_movers"]
    assert movers and all(m.get("shape") for m in movers)
    # plain_flops: the projections' GEMM shapes are the same eager and captured, so each of their rows is on both
    # sides (never added or removed); attention's bmm follows the context (207 positions eager, the graphs' 256 bucket): new rows
    listed = d["kernels_added"] + d["kernels_removed"]
    assert listed and all(k.get("shape") for k in listed)
    assert not any(k["shape"].startswith(("aten::mm ", "aten::addmm_ ")) for k in listed)
    assert any(m["shape"].startswith("aten::bmm ") and m["status"] == "added" and "256]" in m["shape"] for m in movers)
    assert not any("shapes were recorded" in w for w in d["warnings"])


def test_diff_with_shapes_on_one_side_says_so_once_and_compares_by_name(tmp_path):
    d = _diff(tmp_path, DATA / "gpu" / "eager_decode.pt.trace.json.gz", CASES["hf_bs1"][0], "--allow-shape-mismatch")
    notes = [w for w in d["warnings"] if "shapes were recorded" in w]
    assert len(notes) == 1 and "candidate only" in notes[0] and "--record-shapes" in notes[0]
    assert d["top_movers"] and not any("shape" in m for m in d["top_movers"])


@pytest.mark.parametrize(("trace", "has"), [(CASES["hf_bs1"][0], True), (DATA / "gpu" / "eager_decode.pt.trace.json.gz", False)])
def test_both_decoders_note_a_file_with_shapes(trace, has):
    """The C scanner and msgspec's chunk decoder both say whether the events carry `Input Dims` (and the tables
    stay as they were: tests/test_scan.py); ingest puts it in Trace.meta["shapes"]."""
    import gzip

    from profkit.ingest import load_trace, scan
    from profkit.ingest.columnar import decode_chunk_msgspec
    from profkit.ingest.strings import Strings

    chunk = json.dumps(json.loads(gzip.decompress(trace.read_bytes()))["traceEvents"]).encode()
    s = Strings()
    decode_chunk_msgspec(chunk, s)
    assert s.shapes is has
    if scan.lib() is not None:
        s = Strings()
        assert scan.scan_chunk_rows(chunk, s) is not None
        assert s.shapes is has
    assert bool(load_trace(trace).meta.get("shapes")) is has
