"""The capture path must run where the analysis packages are missing (a GPU box with torch but no
polars/msgspec/plotly): record there, analyze elsewhere."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

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
    return subprocess.run([sys.executable, "-c", BLOCK, *args], capture_output=True, text=True, cwd=Path(__file__).resolve().parent.parent)


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
                       capture_output=True, text=True, cwd=Path(__file__).resolve().parent.parent)
    assert p.returncode == 0, p.stderr


def test_nsys_mode_wraps_the_server(tmp_path):
    """--nsys composes `nsys profile --capture-range=cudaProfilerApi ...` around the server (dry run;
    a real capture needs Nsight Systems on a GPU machine)."""
    import os

    fake = tmp_path / "nsys"
    fake.write_text("#!/bin/sh\nexit 1\n")
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"}
    r = subprocess.run([sys.executable, "-m", "profkit", "trace", "--opt", "topk_v2", "--nsys", "--dry-run"], capture_output=True, text=True,
                       env=env, cwd=Path(__file__).resolve().parent.parent)
    assert r.returncode == 0, r.stderr
    line = next(ln for ln in r.stdout.splitlines() if "profkit.proxy.server" in ln)
    assert line.startswith(f"{fake} profile ") and "--capture-range=cudaProfilerApi" in line and "--cuda-graph-trace=node" in line
    r = subprocess.run([sys.executable, "-m", "profkit", "trace", "--opt", "topk_v2", "--nsys", "--dry-run"], capture_output=True, text=True,
                       env={**os.environ, "PATH": "/usr/bin:/bin"}, cwd=Path(__file__).resolve().parent.parent)
    assert r.returncode == 2 and "no `nsys` on PATH" in r.stderr
