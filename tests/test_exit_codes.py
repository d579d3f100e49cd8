"""DESIGN.md's exit codes: 1 only for nothing to analyze, 2 usage, 3 input and unwritable outputs,
70 a bug (one line; the traceback in a file whose path is printed)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

from profkit.cli import app
from processes import HANG_S

from support import DATA

TRACE = DATA / "gpu" / "eager_sync.pt.trace.json.gz"
runner = CliRunner()


def test_bad_option_value_is_a_usage_error(tmp_path):
    r = runner.invoke(app, ["analyze", str(TRACE), "--timeline", str(tmp_path / "x.txt")])
    assert r.exit_code == 2, r.output
    assert "--timeline" in r.output


def test_a_file_that_cannot_be_written_is_exit_3(tmp_path):
    (tmp_path / "a_file").write_text("")  # a file where the folder should be
    r = runner.invoke(app, ["analyze", str(TRACE), "--json", str(tmp_path / "a_file" / "s.json")])
    assert r.exit_code == 3, r.output
    assert "cannot write" in r.output


def test_a_marker_matching_nothing_is_exit_1():
    r = runner.invoke(app, ["analyze", str(TRACE), "--marker", "^no such span$"])
    assert r.exit_code == 1, r.output


def test_a_bug_exits_70_with_the_traceback_in_a_file(tmp_path):
    code = (
        "import sys\n"
        "import profkit.analysis.parallel as p\n"
        "def boom(*a, **k):\n"
        "    raise RuntimeError('simulated bug')\n"
        "p.analyze_runs = boom\n"
        f"sys.argv = ['profkit', 'analyze', {str(TRACE)!r}, '--no-cache']\n"
        "from profkit.cli import main\n"
        "main()\n"
    )
    env = {"TMPDIR": str(tmp_path), "PATH": "/usr/bin:/bin", "COLUMNS": "300"}
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=HANG_S)
    assert p.returncode == 70, p.stderr
    lines = [x for x in p.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and "simulated bug" in lines[0] and "traceback in" in lines[0], p.stderr
    crash = Path(lines[0].rsplit("traceback in ", 1)[1].strip())
    assert crash.parent == tmp_path and "RuntimeError: simulated bug" in crash.read_text() and "Traceback" in crash.read_text()
