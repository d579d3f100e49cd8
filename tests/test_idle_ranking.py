"""Why the GPU is idle, answered the same way in every report (issue 14, point 5).

tests/data/gpu_overlap/eager_long_gap: an eager H200 loop whose every step holds one ~5 ms GPU-idle
gap inside `aten::sort` (on a CPU tensor) and ~100 short launch gaps in `aten::mul`.
`expected.json` (tests/data/gpu_overlap/check.py, stdlib only) ranks the CPU ops over all gaps by
the exclusive time they account for and by the number of gaps they appear in: the two rankings
disagree, and profkit must name the first one's winner first in the terminal, the diff Markdown and
the HTML report.
"""

from __future__ import annotations

import json
import re

import pytest
from typer.testing import CliRunner

from profkit.cli import app

import support

DATA = support.DATA / "gpu_overlap"
TRACE = DATA / "eager_long_gap.trace.json.gz"
runner = CliRunner()


@pytest.fixture(scope="module")
def expected() -> dict:
    return json.loads((DATA / "expected.json").read_text())["traces"]["eager_long_gap.trace.json.gz"]


def test_the_checker_ranks_differently_by_idle_time_and_by_count(expected):
    assert expected["top_ops_by_idle_us"][0][0] == "aten::sort"
    assert expected["top_ops_by_gap_count"][0][0] == "aten::mul"


def test_terminal_names_the_long_op_first(expected, tmp_path):
    r = runner.invoke(app, ["analyze", str(TRACE), "--no-cache", "--json", str(tmp_path / "s.json")], env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    out = r.output
    row = next(line for line in out.splitlines() if re.match(r"\s*launch\s+[\d,.]+\s+\d+\s", line))
    assert row.split()[3] == "aten::sort", row  # "CPU was in" of the launch bubbles
    big = out[out.index("largest bubbles"):].splitlines()[2]
    assert big.split()[3] == "aten::sort", big
    s = json.loads((tmp_path / "s.json").read_text())["ranks"][0]
    assert s["bubble_cpu_ops"][0]["cpu_op"] == "aten::sort"
    # by gap count another op leads: the summary keeps that count too
    most = max((x for x in s["bubble_cpu_ops"] if x["cpu_op"].startswith("aten::")), key=lambda x: x["bubbles"])
    assert most["cpu_op"] == "aten::mul"


def test_diff_markdown_and_html_name_it_first(tmp_path):
    r = runner.invoke(app, ["diff", str(TRACE), str(TRACE), "--md", str(tmp_path / "d.md"), "--html", str(tmp_path / "d.html"),
                            "--json", str(tmp_path / "d.json")], env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    md = (tmp_path / "d.md").read_text()
    sec = md[md.index("#### Largest bubbles"):]
    first = next(line for line in sec.splitlines() if line.startswith("| baseline"))
    assert first.split("|")[5].strip().startswith("aten::sort"), first
    d = json.loads((tmp_path / "d.json").read_text())
    assert d["bubbles"]["candidate"]["idle_cpu_ops"][0]["name"] == "aten::sort"
    assert d["bubbles"]["candidate"]["largest"][0]["cpu_ops"][0]["name"] == "aten::sort"
    html = (tmp_path / "d.html").read_text()
    assert "CPU in aten::sort" in html  # the timeline's bubble hovers list their CPU ops
