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
