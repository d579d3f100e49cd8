"""Nsight Systems SQLite exports (profkit/ingest/nsys.py, docs/nsys.md).

The five real exports in ../shared/public-traces/nsys (third-party, never committed: skipped with
the reason when absent; one recorded with CUDA backtraces) are checked against tests/plain_nsys.py,
a stdlib-sqlite3 script that shares no code with profkit: per device, kernels, copies by direction,
memsets, launch calls, synchronizations, blocking copies, their blocked time and the device's busy
union, all equal to profkit's iterations plus its work outside every iteration. The exports made
here (tmp_path) are checked against it too. Bad and foreign SQLite files are made here.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import sqlite3
import stat
from pathlib import Path

import pytest
from typer.testing import CliRunner

from profkit.cli import app

HERE = Path(__file__).parent
NSYS = Path(os.environ.get("PROFKIT_NSYS_TRACES") or HERE.parent.parent / "shared" / "public-traces" / "nsys")
FILES = ("h100_2gpu_1s.sqlite", "healthy_1pct.sqlite", "mfu_2gpu_before.sqlite", "mfu_2gpu_after.sqlite",
         "pipit_saxpy-mpi-cuda_nsys_perlmutter0.sqlite")  # the last: recorded with CUDA backtraces (eventClass 67 rows)
BACKTRACED = "pipit_saxpy-mpi-cuda_nsys_perlmutter0.sqlite"
DIRS = ("h2d", "d2h", "d2d", "other")

_spec = importlib.util.spec_from_file_location("plain_nsys", HERE / "plain_nsys.py")
plain = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(plain)  # type: ignore[union-attr]

runner = CliRunner()


def _export(name: str) -> Path:
    p = NSYS / name
    if not p.is_file():
        pytest.skip(f"{name} is not in {NSYS} (third-party nsys exports, see ../shared/public-traces/nsys/README.md; "
                    "or set PROFKIT_NSYS_TRACES)")
    return p


_SUMMARIES: dict[tuple, dict] = {}


def _summary(path: Path, marker: str | None = None) -> dict:
    from profkit.analysis.summarize import SummarizeOptions, summarize

    key = (str(path), marker)
    if key not in _SUMMARIES:
        _SUMMARIES[key] = summarize([path], SummarizeOptions(marker=marker, cache=False)).summary
    return _SUMMARIES[key]


def _totals(rank: dict) -> dict:
    """profkit's whole-capture figures of one rank: its iterations plus the work outside every iteration."""
    its, o = rank["iterations"], rank["outside_iterations"]
    return {
        "kernels": sum(i["gpu_kernels"] for i in its) + o["gpu_kernels"],
        "memcpy": {d: sum(i["memcpy"][d] for i in its) + o["memcpy"][d] for d in DIRS},
        "memset": sum(i["memset"] for i in its) + o["memset"],
        "launch_calls": sum(sum(i["launch_calls"].values()) for i in its) + o["launch_calls"],
        "syncs": sum(i["syncs"] for i in its) + o["syncs"],
        "blocking_copies": sum(i["sync_copies"] for i in its) + o["sync_copies"],
    }


def _plain_equal(summary: dict, want: dict, label: str) -> None:
    """Every figure of the plain script equal to profkit's, rank by rank (a rank: a device and the
    process that ran work on it, "<device>/<pid>" in the script's `ranks`)."""
    names = [f"{r['source']['device_id']}/{'?' if r['source']['pid'] is None else r['source']['pid']}" for r in summary["ranks"]]
    assert names == list(want["ranks"]), label
    for name, rank in zip(names, summary["ranks"]):
        w = want["ranks"][name]
        got = _totals(rank)
        for k in ("kernels", "memcpy", "memset", "launch_calls", "syncs", "blocking_copies"):
            assert got[k] == w[k], (label, rank["rank"], k)
        its, o = rank["iterations"], rank["outside_iterations"]
        assert sum(i["kernel_launches"] for i in its) == w["kernel_launches"], label
        assert sum(i["graph_launches"] for i in its) == w["graph_launches"], label
        # blocked time: every sync and blocking copy is in an iteration here (none outside), each counted once
        assert o["syncs"] == 0 and o["sync_copies"] == 0, label
        assert sum(i["sync_us"] for i in its) * 1000 == pytest.approx(w["sync_ns"], abs=1e-3 * len(its)), label
        assert sum(i["sync_copy_us"] for i in its) * 1000 == pytest.approx(w["blocking_copy_ns"], abs=1e-3 * len(its)), label


@pytest.mark.parametrize("name", FILES)
def test_totals_equal_the_plain_script(name):
    p = _export(name)
    want = plain.figures(str(p))
    s = _summary(p)
    _plain_equal(s, want, name)
    assert [r["source"]["device_id"] for r in s["ranks"]] == sorted(int(d) for d in want["devices"])  # one rank per device
    for rank in s["ranks"]:
        w = want["devices"][str(rank["source"]["device_id"])]
        busy = rank["outside_iterations"]["device_busy_us"] * 1000
        assert busy == pytest.approx(w["busy_ns"], rel=0.005)
        # the one window (no marker in these captures) owns what was launched inside the capture
        its = rank["iterations"]
        assert len(its) == 1 and rank["marker"] == "<whole trace>"
        assert its[0]["gpu_kernels"] == w["in_window"]["kernels"]
        assert its[0]["memcpy"] == w["in_window"]["memcpy"]
        assert its[0]["memset"] == w["in_window"]["memset"]
        assert any("no iteration marker found" in x for x in rank["warnings"])
        # the export's schema version, read and reported
        assert rank["source"]["format"] == "nsys-sqlite"
        assert rank["source"]["schema_version"] == want["schema_version"]


def test_nvtx_marker_splits_iterations_and_keeps_totals():
    """--marker on an NVTX range: one iteration per range (counted in the raw table), and the
    iterations plus the outside work still add up to the whole capture."""
    p = _export("h100_2gpu_1s.sqlite")
    marker = r"^FSDP::pre_forward \(encoder\.block\.\d+\.layer\.0\)$"
    con = sqlite3.connect(f"file:{p}?mode=ro", uri=True)
    per_process = dict(con.execute("SELECT globalTid >> 24, COUNT(*) FROM NVTX_EVENTS WHERE text LIKE 'FSDP::pre_forward (encoder.block.%.layer.0), op_id = %' "
                                   "GROUP BY 1").fetchall())
    con.close()
    s = _summary(p, marker)
    want = plain.figures(str(p))
    assert sorted(per_process.values()) == [len(r["iterations"]) for r in s["ranks"]]
    assert all(len(r["iterations"]) > 10 for r in s["ranks"])
    for rank in s["ranks"]:
        w = want["devices"][str(rank["source"]["device_id"])]
        got = _totals(rank)
        for k in ("kernels", "memcpy", "memset", "launch_calls", "syncs", "blocking_copies"):
            assert got[k] == w[k], (rank["rank"], k)
        assert rank["outside_iterations"]["before_first"] > 0  # the work before the first marked range


def test_diff_counts_match_the_plain_script(tmp_path):
    b, c = _export("mfu_2gpu_before.sqlite"), _export("mfu_2gpu_after.sqlite")
    out = tmp_path / "diff.json"
    r = runner.invoke(app, ["diff", str(b), str(c), "--json", str(out)])
    assert r.exit_code == 0, r.output
    flat = " ".join(r.output.split())
    assert "GPU kernels" in flat and "kernel launches" in flat
    d = json.loads(out.read_text())
    wb, wc = plain.figures(str(b))["devices"]["0"], plain.figures(str(c))["devices"]["0"]  # rank 0 = device 0
    pairs = {
        "gpu_kernels": (wb["in_window"]["kernels"], wc["in_window"]["kernels"]),
        "kernel_launches": (wb["kernel_launches"], wc["kernel_launches"]),
        "graph_launches": (wb["graph_launches"], wc["graph_launches"]),
        "syncs": (wb["syncs"], wc["syncs"]),
        "sync_copies": (wb["blocking_copies"], wc["blocking_copies"]),
        "memcpy_h2d": (wb["in_window"]["memcpy"]["h2d"], wc["in_window"]["memcpy"]["h2d"]),
        "memcpy_d2h": (wb["in_window"]["memcpy"]["d2h"], wc["in_window"]["memcpy"]["d2h"]),
    }
    for k, (before, after) in pairs.items():
        assert d["counts"][k] == {"baseline": before, "candidate": after, "delta": after - before}, k
    assert d["counts"]["gpu_kernels"]["delta"] == -193  # the script's difference, shown as printed
    assert re.search(r"GPU kernels\s+1,981\s+1,788\s+-193", flat)
    assert d["decomposition"]["residual_us"] == pytest.approx(0, abs=1e-6)


def test_report_and_perfetto_run_on_an_export(tmp_path):
    p = _export("healthy_1pct.sqlite")
    r = runner.invoke(app, ["report", str(p), "-o", str(tmp_path / "r.html")])
    assert r.exit_code == 0, r.output
    assert "elementwise_add" in (tmp_path / "r.html").read_text()
    for name in ("h100_2gpu_1s.sqlite", "healthy_1pct.sqlite"):  # healthy_1pct's times start below 0: shifted, not refused
        r = runner.invoke(app, ["export-perfetto", str(_export(name)), "-o", str(tmp_path / f"{name}.perfetto-trace")])
        assert r.exit_code == 0, r.output
        assert (tmp_path / f"{name}.perfetto-trace").stat().st_size > 1000


def test_missing_columns_are_one_warning_naming_them():
    p = _export("healthy_1pct.sqlite")  # a reduced export: no memset, NVTX or ThreadNames tables, no copy memory kinds
    rank = _summary(p)["ranks"][0]
    lacks = [w for w in rank["warnings"] if "lacks" in w]
    assert len(lacks) == 1
    for what in ("CUPTI_ACTIVITY_KIND_MEMSET", "NVTX_EVENTS", "CUPTI_ACTIVITY_KIND_MEMCPY.srcKind", "3.24.14"):
        assert what in lacks[0]
    assert rank["device"] == "NVIDIA H100 80GB HBM3"  # TARGET_INFO_GPU


# --- exports made here -----------------------------------------------------------------------


# a made backtrace's frames, innermost first (symbol, module, unresolved): the profiler's and CUDA's own,
# then the code that made the call (`{user}`), then the interpreter
_CHAIN = (("0x7f3a10700588", "/opt/nvidia/nsight-systems/2026.2.1/target-linux-x64/libcupti.so.12", 1),
          ("0x7f3a1b6226b6", "/usr/lib/x86_64-linux-gnu/libcuda.so.1", 1),
          ("{api}", "/usr/local/cuda/lib64/libcudart.so.12", None),
          ("{user}", "/venv/lib/python3.12/site-packages/torch/lib/libtorch_cuda.so", None),
          ("_PyEval_EvalFrameDefault", "/usr/bin/python3.12", None))
SYNC_FRAME = "at::native::_local_scalar_dense_cuda(at::Tensor const&)"
LAUNCH_FRAME = "at::native::gemm_out(at::Tensor&)"


def make_export(path: Path, *, kernel_table: bool = True, steps: int = 3, kernels_per_step: int = 4, backtraces: bool = False) -> Path:
    """A small export in the nsys schema's shape: one process on device 0, `steps` NVTX ranges
    named scheduler.run_batch, each launching `kernels_per_step` kernels, a stream sync each.
    `backtraces`: recorded as `nsys profile --cudabacktrace=all` writes it (schema 3.x): each call has
    a second RUNTIME row of eventClass 67 (TRACE_PROCESS_EVENT_CUDABACKTRACE) with its
    correlationId, wrapping it, whose callchainId is the id of its frames in CUDA_CALLCHAINS."""
    con = sqlite3.connect(path)
    con.executescript("""
        CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT NOT NULL);
        CREATE TABLE META_DATA_EXPORT (name TEXT NOT NULL, value TEXT);
        CREATE TABLE CUPTI_ACTIVITY_KIND_RUNTIME (start INTEGER NOT NULL, "end" INTEGER NOT NULL, eventClass INTEGER NOT NULL,
            globalTid INTEGER, correlationId INTEGER, nameId INTEGER NOT NULL, returnValue INTEGER NOT NULL, callchainId INTEGER);
        CREATE TABLE NVTX_EVENTS (start INTEGER NOT NULL, "end" INTEGER, eventType INTEGER NOT NULL, rangeId INTEGER, category INTEGER,
            color INTEGER, text TEXT, globalTid INTEGER, endGlobalTid INTEGER, textId INTEGER, domainId INTEGER);
    """)
    if kernel_table:
        con.execute("""CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INTEGER NOT NULL, "end" INTEGER NOT NULL, deviceId INTEGER NOT NULL,
            contextId INTEGER NOT NULL, streamId INTEGER NOT NULL, correlationId INTEGER, globalPid INTEGER, demangledName INTEGER NOT NULL,
            shortName INTEGER NOT NULL, graphNodeId INTEGER, graphId INTEGER)""")
    con.executemany("INSERT INTO StringIds VALUES (?, ?)", [(1, "cudaLaunchKernel_v7000"), (2, "void gemm_kernel<float>(float*)"),
                                                           (3, "gemm_kernel"), (4, "cudaStreamSynchronize_v3020")])
    con.executemany("INSERT INTO META_DATA_EXPORT VALUES (?, ?)", [("EXPORT_PRODUCT_VERSION", "2026.2.1.210"), ("EXPORT_SCHEMA_VERSION", "3.25.0")])
    pid = (1 << 48) | (4242 << 24)
    tid = pid | 4242
    t, corr = 1_000_000, 100
    strings = {"cudaLaunchKernel": 5, "cudaStreamSynchronize": 6}

    def string(v: str) -> int:
        if v not in strings:
            strings[v] = 10 + len(strings)
            con.execute("INSERT INTO StringIds VALUES (?, ?)", (strings[v], v))
        return strings[v]

    if backtraces:
        con.executemany("INSERT INTO StringIds VALUES (?, ?)", [(v, k) for k, v in strings.items()])
        con.execute("""CREATE TABLE CUDA_CALLCHAINS (id INTEGER NOT NULL, symbol INTEGER NOT NULL, module INTEGER NOT NULL,
            unresolved INTEGER, originalIP INTEGER, stackDepth INTEGER NOT NULL, PRIMARY KEY (id, stackDepth))""")

    def call(s: int, e: int, c: int, name_id: int, api: str, user: str) -> None:
        con.execute("INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (?, ?, 0, ?, ?, ?, 0, NULL)", (s, e, tid, c, name_id))
        if backtraces:
            chain = c  # one chain per call, as nsys writes them
            for depth, (sym, mod, unres) in enumerate(_CHAIN):
                con.execute("INSERT INTO CUDA_CALLCHAINS VALUES (?, ?, ?, ?, ?, ?)",
                            (chain, string(sym.format(api=api, user=user)), string(mod), unres, 0x400000 + depth, depth))
            con.execute("INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (?, ?, 67, ?, ?, ?, 0, ?)", (s - 300, e + 200, tid, c, strings[api], chain))

    for _ in range(steps):
        start = t
        for _ in range(kernels_per_step):
            call(t, t + 2_000, corr, 1, "cudaLaunchKernel", LAUNCH_FRAME)
            if kernel_table:
                con.execute("INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (?, ?, 0, 1, 7, ?, ?, 2, 3, NULL, NULL)", (t + 5_000, t + 15_000, corr, pid))
            t += 20_000
            corr += 1
        call(t, t + 3_000, corr, 4, "cudaStreamSynchronize", SYNC_FRAME)
        corr += 1
        t += 10_000
        con.execute("INSERT INTO NVTX_EVENTS VALUES (?, ?, 59, NULL, NULL, NULL, ?, ?, NULL, NULL, 0)", (start - 100, t, "scheduler.run_batch", tid))
    con.commit()
    con.close()
    return path


def test_made_export_uses_the_default_marker_chain(tmp_path):
    p = make_export(tmp_path / "capture.sqlite")
    s = _summary(p)
    rank = s["ranks"][0]
    assert rank["marker"] == r"^scheduler\.run_batch$"
    assert [i["gpu_kernels"] for i in rank["iterations"]] == [4, 4, 4]
    assert [i["syncs"] for i in rank["iterations"]] == [1, 1, 1]
    assert [i["kernel_launches"] for i in rank["iterations"]] == [4, 4, 4]
    assert all(i["gpu_busy_us"] == pytest.approx(40.0) for i in rank["iterations"])
    assert rank["kernels"][0]["name"] == "void gemm_kernel<float>(float*)"
    assert rank["source"] == {"format": "nsys-sqlite", "schema_version": "3.25.0", "nsys_version": "2026.2.1.210", "device_id": 0, "pid": 4242}
    _plain_equal(s, plain.figures(str(p)), "made")


def test_made_export_with_backtraces_counts_each_call_once(tmp_path):
    """The same capture recorded with CUDA backtraces: every figure equal to the one without (and to
    the plain script's); the sync's trigger and stack are its backtrace's frames, the code that made
    the call (no aten op encloses it here, only the scheduler.run_batch annotation)."""
    plain_export = make_export(tmp_path / "capture.sqlite")
    traced = make_export(tmp_path / "traced.sqlite", backtraces=True)
    con = sqlite3.connect(traced)
    assert con.execute("SELECT eventClass, COUNT(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME GROUP BY 1").fetchall() == [(0, 15), (67, 15)]
    con.close()
    a, b = _summary(plain_export)["ranks"][0], _summary(traced)["ranks"][0]
    keys = ("gpu_kernels", "kernel_launches", "launch_calls", "launch_us", "syncs", "sync_us", "sync_copies", "gpu_busy_us", "bubble_count")
    assert [{k: i[k] for k in keys} for i in b["iterations"]] == [{k: i[k] for k in keys} for i in a["iterations"]]
    assert [i["syncs"] for i in b["iterations"]] == [1, 1, 1] and [i["kernel_launches"] for i in b["iterations"]] == [4, 4, 4]
    _plain_equal(_summary(traced), plain.figures(str(traced)), "traced")
    assert plain.figures(str(traced))["devices"] == plain.figures(str(plain_export))["devices"]
    assert {s["trigger"] for s in a["syncs"]} == {"scheduler.run_batch"}  # without backtraces: the annotation around it
    assert [(s["trigger"], s["stack"]) for s in b["syncs"]] == [(SYNC_FRAME, f"{SYNC_FRAME} ← _PyEval_EvalFrameDefault")] * 3
    assert [(g["trigger"], g["count"]) for g in b["sync_groups"]] == [(SYNC_FRAME, 3)]


def test_backtrace_rows_of_a_real_export_are_the_calls_stack():
    """pipit's saxpy export (Nsight Systems 2022.2, schema 2.9.1, --cudabacktrace): 5 kernel launches,
    15 blocking cudaMemcpy, 374,336.827 µs blocked (the issue's figures, each call counted once), and
    each copy's trigger and stack from its backtrace: the frames CUDA_CALLCHAINS holds above the
    cudaMemcpy frame (this schema numbers callchainId from 0, the chains from 1: the call's chain is
    callchainId + 1, the one holding its own API frame)."""
    p = _export(BACKTRACED)
    con = sqlite3.connect(f"file:{p}?mode=ro", uri=True)
    chains = {}
    for corr, chain in con.execute("SELECT r.correlationId, r.callchainId FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN StringIds n ON n.id = r.nameId "
                                   "WHERE r.eventClass = 67 AND n.value = 'cudaMemcpy'"):
        frames = [sym for sym, in con.execute("SELECT s.value FROM CUDA_CALLCHAINS c JOIN StringIds s ON s.id = c.symbol "
                                              "WHERE c.id = ? ORDER BY c.stackDepth", (chain + 1,))]
        chains[corr] = frames[frames.index("cudaMemcpy") + 1:]  # the frames above the API's own
    con.close()
    assert len(chains) == 15 and {tuple(f) for f in chains.values()} == {("main", "__libc_start_main", "_start")}
    rank = _summary(p)["ranks"][0]
    it = rank["iterations"][0]
    assert (it["kernel_launches"], it["sync_copies"], it["syncs"]) == (5, 15, 0)
    assert it["sync_copy_us"] == pytest.approx(374_336.827, abs=1e-6)
    assert rank["syncs_total"] == 15
    assert {(s["api"], s["trigger"], s["stack"]) for s in rank["syncs"]} == {("cudaMemcpy", "main", "main ← __libc_start_main ← _start")}
    assert rank["device"] == "NVIDIA A100-SXM4-40GB"  # TARGET_INFO_GPU
    assert rank["source"]["schema_version"] == "2.9.1"  # EXPORT_META_DATA, this schema's name for META_DATA_EXPORT
    r = runner.invoke(app, ["analyze", str(p)])
    assert r.exit_code == 0, r.output
    table = r.output[r.output.index("host syncs and blocking copies"):]
    assert re.search(r"\n\s+10\s+186,574\.5\s+sync_copy\s+h2d\s+cudaMemcpy\s+main\s+main", table)
    assert "Python frame" not in table  # native frames: the column says "frame"


def test_device_names_from_the_target_tables(tmp_path):
    """TARGET_INFO_CUDA_DEVICE maps the process's CUDA device (the deviceId of its kernels) to the GPU
    TARGET_INFO_GPU names (CUDA_VISIBLE_DEVICES renumbers one and not the other); an export with
    neither table names no device: h100_2gpu_1s holds no TARGET_INFO_GPU / _CUDA_DEVICE, and its
    TARGET_INFO_SYSTEM_ENV's GpuInfo is empty, so "unknown device" is what it says."""
    p = make_export(tmp_path / "mapped.sqlite", steps=1)
    con = sqlite3.connect(p)
    con.executescript("""
        CREATE TABLE TARGET_INFO_GPU (id INTEGER, name TEXT);
        INSERT INTO TARGET_INFO_GPU VALUES (0, 'NVIDIA H200'), (1, 'NVIDIA H100 80GB HBM3');
        CREATE TABLE TARGET_INFO_CUDA_DEVICE (gpuId INTEGER, cudaId INTEGER, pid INTEGER, uuid TEXT, numMultiprocessors INTEGER);
        INSERT INTO TARGET_INFO_CUDA_DEVICE VALUES (1, 0, 4242, 'GPU-1', 132);
    """)
    con.commit()
    con.close()
    assert _summary(p)["ranks"][0]["device"] == "NVIDIA H100 80GB HBM3"  # CUDA device 0 of pid 4242 is GPU 1
    _plain_equal(_summary(p), plain.figures(str(p)), "mapped")
    h = _export("h100_2gpu_1s.sqlite")
    con = sqlite3.connect(f"file:{h}?mode=ro", uri=True)
    tables = {t for t, in con.execute("SELECT name FROM sqlite_master WHERE name LIKE 'TARGET_INFO%'")}
    gpu_info = con.execute("SELECT value FROM TARGET_INFO_SYSTEM_ENV WHERE name = 'GpuInfo'").fetchall()
    con.close()
    assert not tables & {"TARGET_INFO_GPU", "TARGET_INFO_CUDA_DEVICE"} and gpu_info == [("{}",)]
    assert [r["device"] for r in _summary(h)["ranks"]] == [None, None]
    r = runner.invoke(app, ["analyze", str(h)])
    assert r.exit_code == 0 and "unknown device" in r.output


def _bad(tmp_path: Path, p: Path, text: str) -> None:
    out = tmp_path / "s.json"
    r = runner.invoke(app, ["analyze", str(p), "--json", str(out)])
    assert r.exit_code == 3, r.output
    assert "Traceback" not in r.output
    first = r.output.strip().splitlines()[0]
    assert str(p) in " ".join(r.output.split()) and text in " ".join(r.output.split()), r.output
    assert first.startswith("error:") or str(p.name) in first
    assert not out.exists()


def test_not_an_sqlite_file(tmp_path):
    p = tmp_path / "capture.sqlite"
    p.write_text("this is not a database\n")
    _bad(tmp_path, p, "not an SQLite database")


def test_foreign_sqlite_database(tmp_path):
    p = tmp_path / "inventory.sqlite"
    con = sqlite3.connect(p)
    con.execute("CREATE TABLE items (id INTEGER, name TEXT)")
    con.executemany("INSERT INTO items VALUES (?, ?)", [(i, f"item {i}") for i in range(100)])
    con.commit()
    con.close()
    _bad(tmp_path, p, "not an Nsight Systems export")


def test_export_without_the_kernel_table(tmp_path):
    p = make_export(tmp_path / "nokernels.sqlite", kernel_table=False)
    _bad(tmp_path, p, "without CUPTI_ACTIVITY_KIND_KERNEL")


def test_truncated_export(tmp_path):
    whole = make_export(tmp_path / "whole.sqlite", steps=400, kernels_per_step=20)
    data = whole.read_bytes()
    assert len(data) > 200_000
    p = tmp_path / "cut.sqlite"
    p.write_bytes(data[: len(data) // 3])
    _bad(tmp_path, p, "truncated or corrupt SQLite file")


def test_report_without_nsys_names_the_command(tmp_path, monkeypatch):
    rep = tmp_path / "capture.nsys-rep"
    rep.write_bytes(b"not read: the export is what profkit reads")
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    r = runner.invoke(app, ["analyze", str(rep)])
    assert r.exit_code == 3, r.output
    flat = " ".join(r.output.split())
    assert f"nsys export --type sqlite --force-overwrite true -o {tmp_path / 'capture.sqlite'} {rep}" in flat


def test_report_is_exported_with_nsys(tmp_path, monkeypatch):
    """With nsys on PATH, the report is exported (the command shown) and the export analyzed. The
    `nsys` here is a stand-in that writes an export as `nsys export` would."""
    src = make_export(tmp_path / "made.sqlite")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "nsys"
    # nsys export --type sqlite --force-overwrite true -o OUT REP: copy the made export to OUT
    fake.write_text(f'#!/bin/sh\nset -e\n[ "$1" = export ] || exit 9\ncp "{src}" "$7"\n')
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    rep = tmp_path / "run" / "capture.nsys-rep"
    rep.parent.mkdir()
    rep.write_bytes(b"report")
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")
    r = runner.invoke(app, ["analyze", str(rep.parent), "--json", str(tmp_path / "s.json")])
    assert r.exit_code == 0, r.output
    assert "nsys export --type sqlite" in " ".join(r.output.split())
    assert (rep.parent / "capture.sqlite").is_file()
    s = json.loads((tmp_path / "s.json").read_text())
    assert [i["gpu_kernels"] for i in s["ranks"][0]["iterations"]] == [4, 4, 4]
    assert shutil.which("nsys") == str(fake)


def test_docs_examples_run(monkeypatch):
    """The commands of docs/nsys.md, run as written from the checkout (they read the public exports beside it)."""
    import shlex

    root = HERE.parent
    if not (root.parent / "shared" / "public-traces" / "nsys" / "h100_2gpu_1s.sqlite").is_file():
        pytest.skip("../shared/public-traces/nsys is not beside this checkout (the docs' examples read it)")
    doc = (root / "docs" / "nsys.md").read_text()
    cmds = [ln[2:] for ln in doc.split("```console", 1)[1].split("```", 1)[0].splitlines() if ln.startswith("$ profkit ")]
    assert len(cmds) == 3
    monkeypatch.chdir(root)
    for c in cmds:
        r = runner.invoke(app, shlex.split(c)[1:])
        assert r.exit_code == 0, (c, r.output)
        assert "Traceback" not in r.output


def test_trace_nsys_analyzes_its_own_capture(tmp_path):
    """`profkit trace --nsys` against the real proxy server over HTTP, wrapped by a stand-in `nsys`
    (no Nsight Systems here): `nsys profile ... -o OUT cmd` runs the server and writes OUT.nsys-rep
    when it exits, `nsys export` writes an export (made here) as the real one would. trace then
    exports the report (the command printed) and analyzes the export like any capture."""
    from profkit.http import free_port
    import subprocess
    import sys

    pytest.importorskip("torch")
    made = make_export(tmp_path / "made.sqlite")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "nsys"
    fake.write_text(f"""#!/bin/sh
if [ "$1" = export ]; then cp "{made}" "$7"; exit 0; fi
[ "$1" = profile ] || exit 9
shift
while [ "$1" != "-o" ]; do shift; done
out="$2"; shift 2
"$@" &
child=$!
trap 'kill -TERM $child 2>/dev/null' TERM INT
wait $child; wait $child
echo report > "$out.nsys-rep"
""")
    fake.chmod(0o755)
    port = free_port()
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    argv = [sys.executable, "-m", "profkit", "trace", "--opt", "topk_v2", "--nsys", "--isl", "64", "--turns", "3", "--turn-tokens", "16",
            "--output-tokens", "24", "--num-steps", "6", "--traces-dir", str(tmp_path / "traces"), "--reports-dir", str(tmp_path / "reports"),
            "--port", str(port)]
    p = subprocess.run(argv, capture_output=True, text=True, cwd=tmp_path, env=env, timeout=500)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "exporting the Nsight Systems report: nsys export --type sqlite" in " ".join(p.stderr.split())
    ms = [json.loads(m.read_text()) for m in sorted((tmp_path / "traces").glob("*/manifest.json"))]
    assert len(ms) == 2 and all(m["status"] == "ok" for m in ms)
    for m in ms:
        assert [Path(f).suffix for f in m["trace_files"]] == [".nsys-rep", ".sqlite"]
    group = next(d for d in (tmp_path / "reports").iterdir() if (d / "diff.json").exists())
    before = json.loads((group / "before.json").read_text())
    r = before["ranks"][0]
    assert r["source"]["format"] == "nsys-sqlite" and r["marker"] == r"^scheduler\.run_batch$"
    assert [i["gpu_kernels"] for i in r["iterations"]] == [4, 4, 4]


def _two_device_export(path: Path, *, one_process: bool) -> Path:
    """Kernels on two devices: from one process driving both (3 launches onto device 0, 1 onto
    device 1, then a stream sync on the same thread), or from two processes that each see "device 0"."""
    p = make_export(path, steps=0)
    con = sqlite3.connect(p)
    pids = [(1 << 48) | (100 << 24), (1 << 48) | (200 << 24)]
    t, corr = 1_000_000, 1
    plan = [(0, 0), (0, 0), (0, 0), (1, 0)] if one_process else [(0, 0), (0, 0), (0, 0), (0, 1)]
    for dev, who in plan:
        pid = pids[0] if one_process else pids[who]
        con.execute("INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (?, ?, 0, ?, ?, 1, 0, NULL)", (t, t + 2_000, pid | 7, corr))
        con.execute("INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (?, ?, ?, 1, 7, ?, ?, 2, 3, NULL, NULL)", (t + 5_000, t + 15_000, dev, corr, pid))
        t, corr = t + 20_000, corr + 1
    con.execute("INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (?, ?, 0, ?, ?, 4, 0, NULL)", (t, t + 3_000, pids[0] | 7, corr))
    con.commit()
    con.close()
    return p


@pytest.mark.parametrize("one_process", [True, False], ids=["one-process-two-devices", "two-processes-device-0"])
def test_ranks_follow_devices_and_processes(tmp_path, one_process):
    s = _summary(_two_device_export(tmp_path / "two.sqlite", one_process=one_process))
    ranks = s["ranks"]
    assert [(r["source"]["device_id"], r["source"]["pid"]) for r in ranks] == ([(0, 100), (1, 100)] if one_process else [(0, 100), (0, 200)])
    assert [r["iterations"][0]["gpu_kernels"] for r in ranks] == [3, 1]
    assert [r["iterations"][0]["kernel_launches"] for r in ranks] == [3, 1]
    assert [r["iterations"][0]["syncs"] for r in ranks] == [1, 0]  # the sync: the thread that launched onto device 0 (pid 100)
    _plain_equal(s, plain.figures(str(tmp_path / "two.sqlite")), "two devices")


# --- reading: texts, SQLite builds --------------------------------------------------------------


def _tables(path: Path) -> dict:
    from profkit.ingest import load_traces

    return {(t.rank, name): getattr(t, name) for t in load_traces([path], cache=False) for name in ("gpu_ops", "calls", "cpu")}


def test_texts_holding_the_row_separators(tmp_path):
    """The reader moves texts out of SQLite apart by the ASCII record separator: a text that holds it
    or the unit separator is read with spaces for them (the rest of its chunk as it is), emit_nvtx's
    decoration cut after that; an empty text is an empty name."""
    p = make_export(tmp_path / "capture.sqlite", steps=6)
    con = sqlite3.connect(p)
    ids = [r[0] for r in con.execute("SELECT rowid FROM NVTX_EVENTS ORDER BY rowid")]
    texts = ["a\x1eb, seq = 3", "c\x1fd", "aten::mm\x1f, op_id = 4", "ü\x1e", "", "e, sizes = [[2]], seq = 1"]
    con.executemany("UPDATE NVTX_EVENTS SET text = ? WHERE rowid = ?", list(zip(texts, ids)))
    con.commit()
    con.close()
    cpu = _tables(p)[(0, "cpu")].sort("ts_ns")
    assert cpu["name"].to_list() == ["a b", "c d", "aten::mm ", "ü ", "", "e"]
    assert cpu["cat"].to_list() == ["user_annotation"] * 2 + ["cpu_op"] + ["user_annotation"] * 3


def test_tables_the_same_without_sqlites_json_functions(monkeypatch, tmp_path):
    """Integers leave SQLite as JSON arrays; a build without the JSON functions (SQLite before 3.38
    without JSON1) joins them as text instead: the same tables."""
    from profkit.ingest import nsys

    paths = [make_export(tmp_path / "traced.sqlite", backtraces=True), _two_device_export(tmp_path / "two.sqlite", one_process=True)]
    paths += [NSYS / n for n in FILES if (NSYS / n).is_file()]
    for p in paths:
        monkeypatch.setattr(nsys, "_JSON", [True])
        a = _tables(p)
        monkeypatch.setattr(nsys, "_JSON", [False])
        b = _tables(p)
        assert a.keys() == b.keys()
        for k in a:
            assert a[k].equals(b[k]), (p.name, k)


# --- the cache: an export's ranks, its summary ---------------------------------------------------


@pytest.fixture
def _cache_small(monkeypatch):
    from profkit.analysis import summary_cache
    from profkit.ingest import cache as pcache

    monkeypatch.setattr(pcache, "MIN_BYTES", 0)
    monkeypatch.setattr(summary_cache, "_MIN_BYTES", 0)
    monkeypatch.delenv("PROFKIT_NO_CACHE", raising=False)


def _same_traces(a: list, b: list) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b):
        for name in ("gpu_ops", "calls", "cpu", "gpu_annotations"):
            assert getattr(x, name).schema == getattr(y, name).schema and getattr(x, name).equals(getattr(y, name)), name
        for name in ("path", "rank", "device", "t0_ns", "n_events", "meta", "warnings", "sha256", "call_stacks"):
            assert getattr(x, name) == getattr(y, name), name


def test_export_ranks_cached_and_read_back(tmp_path, monkeypatch, _cache_small):
    """Each rank of an export is a tables-cache entry of its own (parts/<part>/ in the export's
    folder, its call stacks with it): read back, the export is not read for its tables and they are
    the same; a changed export is read again and its folder replaced whole (summaries with it)."""
    from profkit.ingest import cache as pcache
    from profkit.ingest import load_traces, nsys

    two = _two_device_export(tmp_path / "two.sqlite", one_process=False)
    traced = make_export(tmp_path / "traced.sqlite", backtraces=True)
    first = {p: load_traces([p], cache=True) for p in (two, traced)}
    pcache.wait_pending()
    assert sorted(d.name for d in (pcache.cache_dir(two) / "parts").iterdir()) == ["device=0_pid=100", "device=0_pid=200"]
    assert first[traced][0].call_stacks  # recorded with backtraces: the syncs' stacks
    with monkeypatch.context() as m:
        m.setattr(nsys, "read_all", lambda f: pytest.fail(f"{f.path.name} read again"))
        for p, traces in first.items():
            _same_traces(traces, load_traces([p], cache=True))
    stale = pcache.cache_dir(two) / "summary"
    stale.mkdir()
    con = sqlite3.connect(two)
    con.execute("INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (10, 20, 1, 1, 7, 999, ?, 2, 3, NULL, NULL)", ((1 << 48) | (100 << 24),))
    con.commit()
    con.close()
    again = load_traces([two], cache=True)
    pcache.wait_pending()
    _same_traces(again, load_traces([two], cache=False))
    assert len(again) == 3 and not stale.exists()  # a new rank (device 1 of pid 100); the old folder's summaries gone
    assert json.loads((pcache.cache_dir(two) / "export.json").read_text())["source"]["size"] == two.stat().st_size


def test_export_analyzed_twice_reads_the_stored_summary(tmp_path, monkeypatch, _cache_small):
    """`analyze` of an export a second time: the stored summary (in the export's folder), nothing
    analyzed; the same bytes as the first run and as a run with no cache."""
    from profkit.analysis import parallel
    from profkit.ingest import cache as pcache

    p = _two_device_export(tmp_path / "two.sqlite", one_process=True)

    def analyze(i: int, *extra: str) -> bytes:
        out = tmp_path / f"{i}.json"
        r = runner.invoke(app, ["analyze", str(p), *extra, "--json", str(out)])
        assert r.exit_code == 0, r.output
        return out.read_bytes()

    first = analyze(0)
    assert len(list((pcache.cache_dir(p) / "summary").glob("*.json"))) == 1
    with monkeypatch.context() as m:
        m.setattr(parallel, "analyze_runs", lambda *a, **k: pytest.fail("analyzed again"))
        assert analyze(1) == first
    assert analyze(2, "--no-cache") == first
