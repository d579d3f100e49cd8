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


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_decode_keeps_the_rows_the_second_pass_reads(case):
    """A file the C scanner reads whole keeps its CPU ops' shapes (Trace.cpu_shapes): the very frame
    ingest/shapes.cpu_op_shapes reads from the file again, row for row and in file order."""
    from profkit.ingest import load_trace, scan
    from profkit.ingest.shapes import cpu_op_shapes

    if scan.lib() is None:
        pytest.skip("no C compiler here: the decode keeps no shapes, cpu_op_shapes reads them")
    trace = load_trace(CASES[case][0])
    assert trace.cpu_shapes is not None and trace.cpu_shapes.height > 0
    assert trace.cpu_shapes.equals(cpu_op_shapes(trace.path))
    assert list(trace.cpu.columns) == ["name", "cat", "ts_ns", "dur_ns", "end_ns", "pid", "tid", "external_id"]


def _odd_events() -> list[dict]:
    """cpu_op events with what the scanner must read as msgspec does: spaces in the arrays, a repeated
    args (the last one counts), Input Dims null or a string, an escape inside Input type, a second
    repeat of the key, no Input type; other categories with Input Dims; events without shapes."""
    ev = []
    for i in range(40):
        ev.append({"ph": "X", "cat": "cpu_op", "name": f"aten::op{i % 3}", "pid": 7, "tid": 9, "ts": 100.0 + 10 * i, "dur": 5.5,
                   "args": {"External id": i, "Input Dims": [[1, i % 4], []], "Input type": ["float", "c10::\"Half\""]}})
    ev.append({"ph": "X", "cat": "cpu_op", "name": "twice", "pid": 7, "tid": 9, "ts": 600, "dur": 1,
               "args": {"Input Dims": [[9]]}, "dup": 1})
    ev.append({"ph": "X", "cat": "cpu_op", "name": "null_dims", "pid": 7, "tid": 9, "ts": 601, "dur": 1,
               "args": {"Input Dims": None, "Input type": "not a list"}})
    ev.append({"ph": "X", "cat": "user_annotation", "name": "step", "pid": 7, "tid": 9, "ts": 90, "dur": 900,
               "args": {"Input Dims": [[5, 5]]}})
    for i in range(40):  # a stretch without any Input Dims (its chunks have none)
        ev.append({"ph": "X", "cat": "cpu_op", "name": "plain", "pid": 7, "tid": "9", "ts": 700 + i, "dur": 0.5, "args": {"Sequence number": i}})
    ev.append({"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 120, "dur": 3, "args": {"correlation": 1}})
    return ev


def _write(tmp_path: Path, events: list[dict], text_of=json.dumps) -> Path:
    import gzip

    p = tmp_path / "odd.pt.trace.json.gz"
    p.write_bytes(gzip.compress(text_of({"traceEvents": events}).encode()))
    return p


def _repeat_args(text: str) -> str:
    # the "twice" event: a first args object, then the one that counts (msgspec keeps the last)
    return text.replace('"args": {"Input Dims": [[9]]}, "dup": 1', '"args": {"Input Dims": [[8, 8]], "Input type": ["x"]}, "args": {"Input Dims": [[9]]}')


@pytest.mark.parametrize("chunk_bytes", [1 << 20, 2048])
def test_the_kept_rows_equal_the_second_pass_on_odd_args(tmp_path, chunk_bytes):
    """Odd args, in one chunk and cut into many (some without any Input Dims): the kept frame equals
    cpu_op_shapes' on the same file; a cpu_op without args (which cpu_op_shapes leaves out and a table
    row cannot tell apart) sends the file to the second pass."""
    from profkit.ingest import scan
    from profkit.ingest.columnar import load_tables_fast
    from profkit.ingest.shapes import cpu_op_shapes

    if scan.lib() is None:
        pytest.skip("no C compiler here: the decode keeps no shapes")
    path = _write(tmp_path, _odd_events(), lambda d: _repeat_args(json.dumps(d)))
    got = load_tables_fast(path, chunk_bytes=chunk_bytes)
    assert got is not None
    got.tables([])
    want = cpu_op_shapes(path)
    assert got.cpu_shapes is not None and got.cpu_shapes.equals(want)
    twice = want.filter(pl.col("name") == "twice").row(0, named=True)
    assert (twice["input_dims"], twice["input_type"]) == ("[[9]]", None)
    assert want.filter(pl.col("name") == "null_dims").select("input_dims", "input_type").row(0) == (None, None)
    assert want.filter(pl.col("name") == "aten::op1")["input_type"][0] == '["float","c10::\\"Half\\""]'

    no_args = _odd_events() + [{"ph": "X", "cat": "cpu_op", "name": "bare", "pid": 7, "tid": 9, "ts": 990, "dur": 1}]
    path = _write(tmp_path, no_args)
    got = load_tables_fast(path, chunk_bytes=chunk_bytes)
    assert got is not None
    got.tables([])
    assert got.cpu_shapes is None and "bare" not in cpu_op_shapes(path)["name"].to_list()


@pytest.mark.parametrize("seed", range(6))
def test_the_native_sweep_finds_the_op_the_python_sweep_finds(seed):
    """spans.innermost_at (scan.point_owner per thread) against spans.innermost_enclosing on random
    spans that nest, overlap, tie in start and end, and repeat; points at span edges included."""
    import random

    from profkit.analysis.spans import innermost_at, innermost_enclosing
    from profkit.ingest import scan

    if scan.lib() is None:
        pytest.skip("no C compiler here: innermost_enclosing alone is used")
    rnd = random.Random(seed)
    spans = []
    for _ in range(300):
        ts = rnd.randrange(0, 200)
        spans.append((str(rnd.randrange(3)), ts, ts + rnd.choice([0, 1, 5, 20, 80])))
    spans += spans[:20]  # exact repeats: the later row wins
    sp = pl.DataFrame(spans, schema={"tid": pl.String, "ts_ns": pl.Int64, "end_ns": pl.Int64}, orient="row")
    pts = [rnd.choice([s[1], s[2], rnd.randrange(-5, 300)]) for s in spans[:150]]
    tids = [rnd.choice(["0", "1", "2", "9", None]) for _ in pts]
    p = pl.DataFrame({"ts_ns": pts, "end_ns": pts, "tid": tids}, schema={"ts_ns": pl.Int64, "end_ns": pl.Int64, "tid": pl.String})
    assert innermost_at(p, sp) == innermost_enclosing(p, sp)
