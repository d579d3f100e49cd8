"""A real TP=2 NCCL trace pair of the proxy engine (tests/data/gpu_tp2): per-rank summaries, iterations
aligned across ranks, collective counts equal on both ranks and equal to the construction's."""

from __future__ import annotations

import json
import subprocess
import sys

from profkit.analysis import analyze_trace
from profkit.analysis.ranks import cross_rank
from profkit.ingest import load_traces

import support

DATA = support.DATA / "gpu_tp2"


def test_tp2_ranks_align_and_collectives_match():
    analyses = [analyze_trace(t) for t in load_traces([DATA])]
    assert [a.rank for a in analyses] == [0, 1]
    assert all(a.device == "NVIDIA H200" and a.warnings == [] for a in analyses)
    x = cross_rank(analyses)
    assert x["aligned_iterations"] == 4 and x["warnings"] == []
    assert abs(x["clock_offsets_us"]["1"]) < 50  # one host: the clocks agree
    for it in x["iterations"]:
        assert it["kind"] == "verify"
        assert it["collectives"] == {"0": 18, "1": 18}  # 2(S-1) + 2L + 2 all-reduces, S=5, L=4
        assert min(it["comm_wait_us"].values()) == 0.0
        assert it["straggler_rank"] in (0, 1)
    assert sum(s["times_straggler"] for s in x["stragglers"]) == 4
    m = json.loads((DATA / "manifest.json").read_text())
    assert m["world_size"] == 2 and "--tp 2" in m["command"]


def test_cli_prints_the_straggler_table(tmp_path):
    r = subprocess.run([sys.executable, "-m", "profkit", "analyze", str(DATA), "--json", str(tmp_path / "s.json")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "stragglers" in r.stdout and "across 2 ranks" in r.stdout
    s = json.loads((tmp_path / "s.json").read_text())
    assert len(s["ranks"]) == 2 and s["cross_rank"]["aligned_iterations"] == 4
