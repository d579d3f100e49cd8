"""The command `profkit trace` prints to reproduce its attribution gives the same diff.json
(issue 17, point 5), and `--opt` is inferred from the manifests: the one switch whose state differs.
End to end on the proxy engine on CPU, with a tiny workload."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from profkit.flows.inputs import infer_optimization
from processes import run_to_end, free_port

SMALL = ["--isl", "64", "--turns", "3", "--turn-tokens", "16", "--output-tokens", "24", "--num-steps", "5", "--profile-windows", "2"]


def _strip(doc):
    """diff.json without what may differ between two invocations: profkit's version and input paths."""
    if isinstance(doc, dict):
        return {k: _strip(v) for k, v in doc.items() if k not in ("profkit_version", "path", "paths")}
    if isinstance(doc, list):
        return [_strip(v) for v in doc]
    return doc


def test_infer_optimization_from_switch_states():
    base = {"optimizations": {"overlap": True, "topk_v2": False, "cuda_graph": True}}
    cand = {"optimizations": {"overlap": True, "topk_v2": True, "cuda_graph": True}}
    assert infer_optimization(base, cand) == "topk_v2"
    assert infer_optimization(cand, base) == "topk_v2"  # the candidate removing it is still that switch
    two = {"optimizations": {"overlap": False, "topk_v2": True, "cuda_graph": True}}
    assert infer_optimization(base, two) is None  # two switches differ: no single optimization
    assert infer_optimization({"opts": "a"}, {"opts": "a,b"}) == "b"
    assert infer_optimization(None, None) is None


def test_printed_command_reproduces_the_attribution(tmp_path):
    pytest.importorskip("torch")
    argv = [sys.executable, "-m", "profkit", "trace", "--opt", "topk_v2", *SMALL, "--port", str(free_port()),
            "--traces-dir", "traces", "--reports-dir", "reports"]
    p = run_to_end(argv, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    line = next(x for x in p.stderr.splitlines() if x.startswith("reproduce the attribution: "))
    cmd = shlex.split(line.split(": ", 1)[1])
    assert cmd[:2] == ["profkit", "diff"]
    group = next(d for d in (tmp_path / "reports").iterdir() if (d / "diff.json").is_file())
    wrote = json.loads((group / "diff.json").read_text())
    again = subprocess.run([sys.executable, "-m", "profkit", *cmd[1:], "--json", "again.json"], capture_output=True, text=True, cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    got = json.loads((tmp_path / "again.json").read_text())
    assert _strip(got) == _strip(wrote)
    assert wrote["optimization"] == "topk_v2"
    # --profile-windows windows a side: judged, or (on a loaded host, where a window's length swings) "not judged:
    # unstable" — both are answers. On a loaded host a window can also open late, after its turn's decode,
    # and hold no iteration of the compared shape: it is left out and a warning counts it. What must not
    # happen is a window lost without a word, or "no noise estimate" with every window there
    noise = wrote["noise"]
    dropped = sum(int(m.group(1)) for w in wrote["warnings"] if (m := re.match(r"(\d+) profile window\(s\) hold no iterations", w)))
    asked = 2 * int(SMALL[SMALL.index("--profile-windows") + 1])
    assert sum(noise["repeats"].values()) + dropped == asked, (noise, wrote["warnings"])
    assert noise["available"] or noise.get("unstable") or dropped, noise
    assert wrote["throughput"]["baseline"] and wrote["baseline"]["label"].endswith("-before")

    # without --opt: inferred from the switch states (false -> true), the same diff
    inferred = subprocess.run([sys.executable, "-m", "profkit", *[c for c in cmd[1:] if c not in ("--opt", "topk_v2")], "--json", "inf.json"],
                              capture_output=True, text=True, cwd=tmp_path)
    assert inferred.returncode == 0, inferred.stderr
    assert _strip(json.loads((tmp_path / "inf.json").read_text())) == _strip(wrote)

    # the summaries trace wrote keep the labels, the throughput and the expected-effect check
    # (and, issue 40 point 3, the profile windows they came with: the run folders' window-*/, found from their run id)
    pair = subprocess.run([sys.executable, "-m", "profkit", "diff", str(group / "before.json"), str(group / "after.json"), "--json", "pair.json"],
                          capture_output=True, text=True, cwd=tmp_path)
    assert pair.returncode == 0, pair.stderr
    d = json.loads((tmp_path / "pair.json").read_text())
    assert (d["baseline"]["label"], d["candidate"]["label"]) == (wrote["baseline"]["label"], wrote["candidate"]["label"])
    assert d["throughput"] == wrote["throughput"] and d["optimization"] == "topk_v2" and d["expected_effect"]["optimization"] == "topk_v2"
    # every window of each side: the trace's decomposition itself (the median over the windows, issue 30; window 0 alone before issue 40)
    assert d["decomposition"]["per_window"] == wrote["decomposition"]["per_window"]
    assert {k: d["decomposition"][k] for k in ("category_us", "overlap_us", "idle_us_by_cause", "backlog_us", "phase_us")} == \
        {k: wrote["decomposition"][k] for k in ("category_us", "overlap_us", "idle_us_by_cause", "backlog_us", "phase_us")}

    # the run folders under traces/ (what --capture-only prints): the switch inferred from the manifests
    runs = sorted((tmp_path / "traces").iterdir(), key=lambda d: not d.name.endswith("-before"))
    raw = subprocess.run([sys.executable, "-m", "profkit", "diff", *map(str, runs), "--json", "raw.json"], capture_output=True, text=True, cwd=tmp_path)
    assert raw.returncode == 0, raw.stderr
    r = json.loads((tmp_path / "raw.json").read_text())
    assert r["optimization"] == "topk_v2" and r["expected_effect"]["optimization"] == "topk_v2"
    assert r["throughput"] == wrote["throughput"]


def test_sweep_names_its_steps_and_announces_its_report(tmp_path):
    """Issue 17, point 11: ladder folders keep their steps apart ("plus-a-plus-b", not "plus-aplus-b"),
    the sweep says where its report.html is, and its ladder table has tokens/s per user."""
    pytest.importorskip("torch")
    from profkit.capture.sweep import label_slug

    assert label_slug("+overlap+topk_v2") == "plus-overlap-plus-topk_v2" and label_slug("all-topk_v2") == "all-topk_v2"
    argv = [sys.executable, "-m", "profkit", "sweep", "--opts", "topk_v2,indexer_fusion", "--mode", "ladder", *SMALL[:8],
            "--num-steps", "4", "--profile-windows", "1", "--port", str(free_port()), "--traces-dir", "traces", "--reports-dir", "reports"]
    p = run_to_end(argv, cwd=tmp_path, env={"PATH": "/usr/bin:/bin", "COLUMNS": "160"})
    assert p.returncode == 0, p.stderr
    names = sorted(d.name.split("-ladder-", 1)[1] for d in (tmp_path / "traces").iterdir())
    assert names == ["baseline", "plus-topk_v2", "plus-topk_v2-plus-indexer_fusion"]
    sweep = next((tmp_path / "reports").glob("*-sweep-ladder"))
    assert sorted(d.name for d in sweep.iterdir() if d.is_dir()) == ["baseline__plus-topk_v2", "plus-topk_v2__plus-topk_v2-plus-indexer_fusion"]
    assert f"wrote {Path('reports') / sweep.name / 'sweep.json'}, {Path('reports') / sweep.name / 'report.html'}" in p.stdout
    assert (sweep / "report.html").is_file()
    table = p.stdout.split("attribution (ladder)", 1)[1]
    assert "tok/s/user" in table
    assert all("→" in line for line in table.splitlines() if line.strip().startswith("+"))
