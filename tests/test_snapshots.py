"""Snapshots of every command's terminal output at 80 and 120 columns (tests/snapshots/).

The tables must keep every number at 80 columns: names are cut in the middle, strings a user copies
(APIs, triggers, switches, paths) are never cut. A snapshot that differs fails with a diff.

Refresh them after an intended change of the output, then read the diff before committing:

    PROFKIT_UPDATE_SNAPSHOTS=1 python -m pytest tests/test_snapshots.py
"""

from __future__ import annotations

import difflib
import os
import re
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from profkit import __version__
from profkit import cli

from conftest import NO_PUBLIC, PUBLIC_TRACES, ROOT, SAMPLE

SNAP = Path(__file__).resolve().parent / "snapshots"
UPDATE = bool(os.environ.get("PROFKIT_UPDATE_SNAPSHOTS"))

# paths relative to the checkout (the commands run there): the output is the same wherever it is cloned
EAGER = str((SAMPLE / "eager_sync.pt.trace.json.gz").relative_to(ROOT))
GRAPH = str((SAMPLE / "graph_decode.pt.trace.json.gz").relative_to(ROOT))
# third-party traces (never committed): ../shared/public-traces beside the checkout, spelled that way in
# the snapshots wherever $PROFKIT_PUBLIC_TRACES points
PUBLIC_REL = os.path.relpath(PUBLIC_TRACES, ROOT)
CAPTURE = os.path.join(PUBLIC_REL, "tracelens_sglang_qwen3-8b_mi300x_graph_capture_bs32.json.gz")
MIXED = os.path.join(PUBLIC_REL, "tracelens_vllm_gpt-oss-20b_mi300x_mixed_piecewise_step.json.gz")

COMMANDS = {
    "analyze-eager": ["analyze", EAGER, "--no-cache"],
    "analyze-graph-capture": ["analyze", CAPTURE, "--no-cache"],
    "analyze-vllm-mixed": ["analyze", MIXED, "--no-cache"],
    "analyze-list-markers": ["analyze", EAGER, "--no-cache", "--list-markers"],
    "diff": ["diff", EAGER, GRAPH],
    "opts-proxy": ["opts", "--target", "proxy"],
    "opts-sglang": ["opts", "--target", "sglang"],
    "trace-dry-run": ["trace", "--opt", "topk_v2", "--dry-run"],
    "sweep-dry-run": ["sweep", "--opts", "overlap,topk_v2", "--mode", "ladder", "--dry-run"],
    "report": ["report", EAGER, "-o", "{tmp}/report.html"],
}


def _normalize(text: str, tmp: Path) -> str:
    # the interpreter first: it usually lives inside the checkout (.venv), which is <repo> next
    text = text.replace(sys.executable, "<python>").replace(str(tmp), "<tmp>").replace(str(ROOT), "<repo>")
    text = text.replace(__version__, "<version>").replace(PUBLIC_REL + os.sep, "../shared/public-traces/")
    text = re.sub(r"\(\d[\d,]* bytes", "(<n> bytes", text)
    return "\n".join(line.rstrip() for line in text.splitlines()) + "\n"


def _run(args: list[str], width: int, tmp: Path) -> str:
    saved = cli.out.width, cli.err.width
    cli.out.width = cli.err.width = width
    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        r = CliRunner().invoke(cli.app, [a.replace("{tmp}", str(tmp)) for a in args], env={"PROFKIT_NO_CACHE": "1"})
    finally:
        os.chdir(cwd)
        cli.out._width, cli.err._width = None, None
        del saved
    return _normalize(f"$ profkit {' '.join(args)}\n[exit {r.exit_code}]\n", tmp) + _normalize(r.output, tmp)


@pytest.mark.parametrize("width", [80, 120])
@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_snapshot(name, width, tmp_path):
    if PUBLIC_REL in " ".join(COMMANDS[name]) and not PUBLIC_TRACES.is_dir():
        pytest.skip(NO_PUBLIC)
    got = _run(COMMANDS[name], width, tmp_path)
    path = SNAP / f"{name}-{width}.txt"
    if UPDATE or not path.exists():
        SNAP.mkdir(exist_ok=True)
        path.write_text(got)
        if not UPDATE:
            pytest.skip(f"wrote new snapshot {path.name}")
        return
    want = path.read_text()
    if got != want:
        diff = "".join(difflib.unified_diff(want.splitlines(True), got.splitlines(True), f"{path.name} (stored)", "output now"))
        pytest.fail(f"output differs from {path.name}; if intended, refresh with PROFKIT_UPDATE_SNAPSHOTS=1\n{diff}")
    assert "[exit 0]" in got


@pytest.mark.parametrize("name", ["analyze-eager", "diff"])
def test_numbers_survive_80_columns(name, tmp_path):
    """Every number of the 120-column output is in the 80-column output too (nothing was cut)."""
    wide, narrow = (_run(COMMANDS[name], w, tmp_path) for w in (120, 80))
    nums = lambda s: [t for t in s.split() if re.fullmatch(r"[-+]?\d[\d,]*(\.\d+)?%?", t)]  # noqa: E731
    have = set(narrow.split())
    missing = [n for n in nums(wide) if n not in have]
    assert not missing, missing[:10]
    for copy in ("cudaStreamSynchronize", "aten::_local_scalar_dense"):
        assert copy in narrow
