"""Nsight Systems SQLite exports (profkit/ingest/nsys.py, docs/nsys.md).

The four real exports in ../shared/public-traces/nsys (third-party, never committed: skipped with
the reason when absent) are checked against tests/plain_nsys.py, a stdlib-sqlite3 script that
shares no code with profkit: per device, kernels, copies by direction, memsets, launch calls,
synchronizations, blocking copies and the device's busy union, all equal to profkit's iterations
plus its work outside every iteration. Bad and foreign SQLite files are made here, in tmp_path.
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
FILES = ("h100_2gpu_1s.sqlite", "healthy_1pct.sqlite", "mfu_2gpu_before.sqlite", "mfu_2gpu_after.sqlite")
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


@pytest.mark.parametrize("name", FILES)
def test_totals_equal_the_plain_script(name):
    p = _export(name)
    want = plain.figures(str(p))
    s = _summary(p)
    assert [r["source"]["device_id"] for r in s["ranks"]] == sorted(int(d) for d in want["devices"])  # one rank per device
    for rank in s["ranks"]:
        w = want["devices"][str(rank["source"]["device_id"])]
        got = _totals(rank)
        for k in ("kernels", "memcpy", "memset", "launch_calls", "syncs", "blocking_copies"):
            assert got[k] == w[k], (name, rank["rank"], k)
        busy = rank["outside_iterations"]["device_busy_us"] * 1000
        assert busy == pytest.approx(w["busy_ns"], rel=0.005)
        # the one window (no marker in these captures) owns what was launched inside the capture
        its = rank["iterations"]
        assert len(its) == 1 and rank["marker"] == "<whole trace>"
        assert its[0]["gpu_kernels"] == w["in_window"]["kernels"]
        assert its[0]["memcpy"] == w["in_window"]["memcpy"]
        assert its[0]["memset"] == w["in_window"]["memset"]
        assert its[0]["kernel_launches"] == w["kernel_launches"]
        assert its[0]["graph_launches"] == w["graph_launches"]
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


def make_export(path: Path, *, kernel_table: bool = True, steps: int = 3, kernels_per_step: int = 4) -> Path:
    """A small export in the nsys schema's shape: one process on device 0, `steps` NVTX ranges
    named scheduler.run_batch, each launching `kernels_per_step` kernels, a stream sync each."""
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
    for _ in range(steps):
        start = t
        for _ in range(kernels_per_step):
            con.execute("INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (?, ?, 0, ?, ?, 1, 0, NULL)", (t, t + 2_000, tid, corr))
            if kernel_table:
                con.execute("INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (?, ?, 0, 1, 7, ?, ?, 2, 3, NULL, NULL)", (t + 5_000, t + 15_000, corr, pid))
            t += 20_000
            corr += 1
        con.execute("INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (?, ?, 0, ?, ?, 4, 0, NULL)", (t, t + 3_000, tid, corr))
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
