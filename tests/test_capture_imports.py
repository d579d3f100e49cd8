"""The capture path must run where the analysis packages are missing (a GPU box with torch but no
polars/msgspec/plotly): record there, analyze elsewhere."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from support import ROOT
from processes import HANG_S, run_to_end

BLOCK = r"""
import sys, importlib.abc, runpy
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split('.')[0] in ('polars', 'msgspec', 'plotly', 'perfetto', 'nvtx', 'pyarrow'):
            raise ImportError(f"blocked {name}")
sys.meta_path.insert(0, Block())
sys.argv = ['profkit'] + sys.argv[1:]
runpy.run_module('profkit', run_name='__main__')
"""


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", BLOCK, *args], capture_output=True, text=True, cwd=ROOT)


def test_cli_and_capture_import_without_analysis_packages():
    r = run("--help")
    assert r.returncode == 0, r.stderr
    r = run("trace", "--opt", "topk_v2", "--dry-run")
    assert r.returncode == 0, r.stderr
    assert "profkit.proxy.server" in r.stdout
    r = run("sweep", "--opts", "topk_v2,overlap", "--dry-run")
    assert r.returncode == 0, r.stderr


def test_proxy_server_help_without_analysis_packages():
    p = subprocess.run([sys.executable, "-c", BLOCK.replace("runpy.run_module('profkit', run_name='__main__')",
                                                             "runpy.run_module('profkit.proxy.server', run_name='__main__')"), "--help"],
                       capture_output=True, text=True, cwd=ROOT)
    assert p.returncode == 0, p.stderr


def test_nsys_mode_wraps_the_server(tmp_path):
    """--nsys composes `nsys profile --capture-range=cudaProfilerApi ...` around the server (dry run;
    a real capture needs Nsight Systems on a GPU machine)."""

    fake = tmp_path / "nsys"
    fake.write_text("#!/bin/sh\nexit 1\n")
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"}
    r = subprocess.run([sys.executable, "-m", "profkit", "trace", "--opt", "topk_v2", "--nsys", "--dry-run"], capture_output=True, text=True,
                       env=env, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    line = next(ln for ln in r.stdout.splitlines() if "profkit.proxy.server" in ln)
    assert line.startswith(f"{fake} profile ") and "--capture-range=cudaProfilerApi" in line and "--cuda-graph-trace=node" in line
    r = subprocess.run([sys.executable, "-m", "profkit", "trace", "--opt", "topk_v2", "--nsys", "--dry-run"], capture_output=True, text=True,
                       env={**os.environ, "PATH": "/usr/bin:/bin"}, cwd=ROOT)
    assert r.returncode == 2 and "no `nsys` on PATH" in r.stderr


SITE = """
import importlib.abc, os, sys
if os.environ.get("PROFKIT_TEST_PIDS"):
    with open(os.environ["PROFKIT_TEST_PIDS"], "a") as f:
        f.write(f"{os.getpid()} {' '.join(sys.argv)[:200]}\\n")
class _Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split('.')[0] in ('polars', 'msgspec', 'plotly', 'perfetto', 'nvtx', 'pyarrow'):
            raise ImportError(f"blocked {name}")
sys.meta_path.insert(0, _Block())
"""


def test_a_real_capture_runs_without_analysis_packages(tmp_path):
    """`trace --capture-only` on the proxy engine (CPU), end to end, with the analysis packages
    blocked in profkit and in the server it starts (a sitecustomize on PYTHONPATH applies to both)."""
    import json
    import os
    from profkit.http import free_port

    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITE)
    port = free_port()
    pids = tmp_path / "pids.txt"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(Path(__file__).resolve().parent.parent)]), "PROFKIT_TEST_PIDS": str(pids)}
    r = run_to_end([sys.executable, "-m", "profkit", "trace", "--opt", "topk_v2", "--capture-only", "--profile-windows", "1",
                        "--isl", "64", "--turns", "2", "--turn-tokens", "16", "--output-tokens", "16", "--num-steps", "4",
                        "--traces-dir", str(tmp_path / "traces"), "--reports-dir", str(tmp_path / "reports"), "--port", str(port)],
                       env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    runs = sorted((tmp_path / "traces").glob("*/manifest.json"))
    assert len(runs) == 2, runs  # the baseline and the candidate
    for m in runs:
        doc = json.loads(m.read_text())
        assert doc["status"] == "ok" and doc.get("error") is None, (doc["status"], doc["stage"], doc.get("error"))
        assert list(m.parent.rglob("*.trace.json.gz")), f"no trace in {m.parent}"
    assert "blocked" not in r.stderr
    started = pids.read_text().splitlines()
    # the block reached the servers too (their argv: `-m --host 127.0.0.1 --port N --opts ...` at start-up)
    assert sum("--host 127.0.0.1" in x for x in started) >= 2, started
    assert not (tmp_path / "reports").exists() or not list((tmp_path / "reports").rglob("summary.json"))  # capture only: no analysis


def test_a_real_capture_only_run_without_analysis_packages(tmp_path):
    """Issue 15: the capture path's import boundary, on a real run. `trace --capture-only` on the
    proxy (CPU) records both sides with polars, msgspec, plotly, perfetto and pyarrow blocked in the
    CLI's process (the engine is its own process); the runs are then analyzed elsewhere, here by a
    plain `profkit diff` of the two run folders (the switch inferred from their manifests)."""
    pytest.importorskip("torch")
    root = ROOT
    env = {**os.environ, "PYTHONPATH": str(root)}
    # 128 output tokens: the profiled turn decodes long enough for the profiler to open on a loaded host (with 24, a
    # CI run beside other work once opened the baseline's window after its decode: a window of no iterations)
    argv = [sys.executable, "-c", BLOCK, "trace", "--opt", "topk_v2", "--capture-only", "--isl", "64", "--turns", "3", "--turn-tokens", "16",
            "--output-tokens", "128", "--num-steps", "4", "--profile-windows", "1", "--traces-dir", "traces", "--reports-dir", "reports"]
    r = run_to_end(argv, cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stderr
    runs = sorted((tmp_path / "traces").iterdir(), key=lambda d: not d.name.endswith("-before"))
    assert len(runs) == 2 and all(list(d.glob("*.trace.json.gz")) and (d / "manifest.json").is_file() for d in runs)
    assert not (tmp_path / "reports").exists()  # nothing analyzed on the capture side
    assert f"profkit diff {Path('traces') / runs[0].name} {Path('traces') / runs[1].name}" in r.stdout
    d = subprocess.run([sys.executable, "-m", "profkit", "diff", *map(str, runs), "--json", "d.json"], capture_output=True, text=True,
                       cwd=tmp_path, env=env, timeout=HANG_S)
    assert d.returncode == 0, d.stderr
    assert json.loads((tmp_path / "d.json").read_text())["optimization"] == "topk_v2"
