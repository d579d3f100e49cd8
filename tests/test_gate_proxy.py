"""Issue 37 on real proxy runs (a server over HTTP, real traces): docs/ci.md's CPU recipe, run as written
(its `run:` steps, the baseline job's then the gate job's, in one folder), and on its outputs: the PR
comment against gate.json, a stored H200 baseline refused against the CPU run, a threshold below the
calibrated MDE refused; one trace with the fault-injection knob (docs/proxy.md), its busy-wait read
from the raw trace with the standard library."""

from __future__ import annotations

import gzip
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from profkit.cli import app

import support
from support import ROOT

pytestmark = pytest.mark.slow

LOO = support.DATA / "gpu_loo"


def recipe_steps() -> list[tuple[str, str]]:
    """The CPU recipe's steps that run here: (job, script) of every `run:` step that installs nothing, posts
    nothing and uses no `${{ }}` expression, the baseline job's first."""
    doc = (ROOT / "docs" / "ci.md").read_text()
    section = doc.split("## The same on a CPU runner (the proxy)", 1)[1]
    block = re.search(r"```yaml\n(.*?)```", section, re.S)
    assert block, "docs/ci.md: no yaml block in the CPU recipe"
    jobs = _steps(block.group(1))
    assert set(jobs) == {"baseline", "gate"}, jobs
    out = []
    for job in ("baseline", "gate"):
        for step in jobs[job]:
            run = step.get("run")
            if run is None or step.get("name", "").startswith(("Install", "Post")) or "${{" in run:
                continue
            out.append((job, run))
    return out


def _steps(text: str) -> dict[str, list[dict[str, str]]]:
    """The workflow's jobs -> steps ({name, run}) of the block-style YAML the recipe is written in (no YAML
    library in the test environment): a job is a 2-space key under `jobs:`, a step a `- ` item under its
    `steps:`, `run: |` a block of the lines indented below it."""
    jobs: dict[str, list[dict[str, str]]] = {}
    lines = text.splitlines()
    job = None
    i = lines.index("jobs:")
    while i < len(lines):
        ln = lines[i]
        m = re.match(r"^  ([A-Za-z_-]+):\s*$", ln)
        if m:
            job = m.group(1)
            jobs[job] = []
        step = re.match(r"^(\s*)- (.*)$", ln)
        if job is not None and step:
            jobs[job].append({})
            ln = step.group(1) + "  " + step.group(2)
        kv = re.match(r"^(\s*)(name|run): ?(.*)$", ln)
        if job is not None and kv and jobs[job]:
            indent, key, val = len(kv.group(1)), kv.group(2), kv.group(3)
            if val.strip() == "|":
                body = []
                while i + 1 < len(lines) and (not lines[i + 1].strip() or len(lines[i + 1]) - len(lines[i + 1].lstrip()) > indent):
                    i += 1
                    body.append(lines[i])
                width = min(len(b) - len(b.lstrip()) for b in body if b.strip())
                val = "\n".join(b[width:] for b in body).strip() + "\n"
            jobs[job][-1][key] = val
        i += 1
    return jobs


@pytest.fixture(scope="module")
def recipe(tmp_path_factory) -> dict:
    d = tmp_path_factory.mktemp("recipe")
    env = {**os.environ, "GITHUB_OUTPUT": str(d / "github_output"), "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    ran = []
    for job, script in recipe_steps():
        r = subprocess.run(["bash", "-e", "-c", script], cwd=d, env=env, capture_output=True, text=True, timeout=900)
        ran.append((job, script, r.returncode))
        assert r.returncode == 0, f"{job}: {script}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return {"dir": d, "ran": ran}


def test_the_recipe_has_both_jobs_steps():
    steps = recipe_steps()
    text = "\n".join(s for _, s in steps)
    assert [j for j, _ in steps].count("baseline") == 1 and "profkit calibrate" in text and "profkit baseline save" in text
    assert "profkit trace" in text and "profkit gate --baseline main" in text


def test_the_recipe_gates_and_its_comment_leads_with_the_verdict(recipe):
    from markdown_it import MarkdownIt

    d = recipe["dir"]
    doc = json.loads((d / "gate.json").read_text())
    md = (d / "gate.md").read_text()
    first = md.splitlines()[0]
    assert first.split(":", 1)[0] == doc["decision"] and len(first) <= 80
    assert doc["decision"] in ("pass", "regression", "inconclusive")
    status = dict(ln.split("=", 1) for ln in (d / "github_output").read_text().split())
    assert int(status["status"]) == doc["exit_code"]
    assert doc["comparability"]["comparable"] and doc["calibration"]["used"]
    # a stored baseline against a later recording: recorded apart, each beside its measured other work
    assert doc["pairing"] == "apart" and doc["host_load"]["known"]
    if doc["decision"] == "inconclusive" and not doc["host_load"]["comparable"]:  # a neighbour's burst during one side
        assert int(status["status"]) == 5 and any("busier while the" in r for r in doc["reasons"])
    tokens = MarkdownIt("commonmark").enable("table").parse(md)
    assert tokens[1].content == first and any(t.type == "table_open" for t in tokens)
    # every gated row names its MDE (the calibration gave one) or why there is none
    cal = json.loads((d / "baselines" / "calibration.json").read_text())
    rows = [r for r in doc["rows"] if r["gated"] and r["baseline"] and not r["metric"].startswith("throughput.")]
    assert rows
    if cal["judged"]:
        assert all(r["mde_pct"] is not None for r in rows), rows
        # the MDE a gate of sides recorded apart uses: the calibration's across its sessions, where it has one
        for r in rows:
            m = cal["metrics"][r["metric"]]
            want = ("sessions", m["stored_mde_pct"]) if m.get("stored_mde_pct") is not None else ("pair", m["mde_pct"])
            assert (r["mde_from"], r["mde_pct"]) == want, r
    else:  # a loaded machine: the A/A's windows disagreed; the gate says the calibration gave no MDE
        assert all(r["mde_pct"] is None for r in rows) and "have no MDE" in doc["calibration"]["note"]
    assert list(d.glob("reports/*-proxy-topk_v2/report.html"))  # what the recipe uploads


def test_the_calibration_and_its_policy(recipe):
    import msgspec
    import tomllib

    from profkit.documents import Calibration

    d = recipe["dir"]
    cal = msgspec.convert(json.loads((d / "baselines" / "calibration.json").read_text()), Calibration)
    w = cal.metrics["gpu_window_us"]
    assert cal.key["gpu"] == "cpu" and cal.key["target"] == "proxy" and cal.sessions == 2
    pol = tomllib.loads((d / "baselines" / "policy.toml").read_text())
    if cal.judged:
        assert w.mde_pct == pytest.approx((w.aa_change_pct or 0) + (w.aa_spread_pct or 0))
        assert pol["metric"]["gpu_window_us"]["threshold_pct"] >= w.mde_pct
        if w.stored_mde_pct is not None:  # across the two sessions (both judged)
            assert w.stored_mde_pct == pytest.approx((w.stored_aa_change_pct or 0) + (w.stored_aa_spread_pct or 0))
            assert pol["metric"]["gpu_window_us"]["threshold_pct"] >= w.stored_mde_pct
    else:  # the A/A's windows disagreed (a loaded machine): no MDE, and the policy leaves the window at the built-in rule
        assert w.mde_pct is None and cal.note and "gpu_window_us" not in pol.get("metric", {})
    runs = sorted(p.name.rsplit("-", 1)[1] for p in d.glob("reports/*-calibrate-*") if p.is_dir() and not p.name.endswith("calibrate"))
    assert runs == ["2a", "2b", "a", "b"]


def test_a_threshold_below_the_mde_cannot_be_judged(recipe, tmp_path):
    d = recipe["dir"]
    a, b = sorted(d.glob("reports/*-calibrate-a"))[0], sorted(d.glob("reports/*-calibrate-b"))[0]
    cal = json.loads((d / "baselines" / "calibration.json").read_text())
    # rows without a materiality floor (the floor, 1 µs and 1% of the window, can sit above a small category's MDE)
    mdes = {k: m["mde_pct"] for k, m in cal["metrics"].items() if m["mde_pct"] and (k == "gpu_window_us" or k.startswith("throughput."))}
    if not mdes:
        pytest.skip("the A/A gave no MDE here (its windows and repeats disagreed): tests/test_gate.py checks the refusal on fixtures")
    key, mde = min(mdes.items(), key=lambda kv: kv[1])
    r = CliRunner().invoke(app, ["gate", str(a), str(b), "--calibration", str(d / "baselines" / "calibration.json"),
                                 "--threshold", f"{mde / 2}", "--json", str(tmp_path / "g.json")])
    doc = json.loads((tmp_path / "g.json").read_text())
    row = next(x for x in doc["rows"] if x["metric"] == key)
    assert row["verdict"] == "cannot be judged here" and "the A/A spread is" in row["reason"], r.output
    assert key not in doc["regressions"]


def test_an_h200_baseline_is_not_comparable_with_a_cpu_run(recipe, tmp_path):
    d = recipe["dir"]
    bdir = tmp_path / "baselines"
    assert CliRunner().invoke(app, ["baseline", "save", str(LOO / "all"), "--name", "main", "--dir", str(bdir)]).exit_code == 0
    cand = sorted(d.glob("reports/*-topk_v2-after"))[0]
    r = CliRunner().invoke(app, ["gate", "--baseline", "main", "--dir", str(bdir), str(cand), "--json", str(tmp_path / "g.json")])
    doc = json.loads((tmp_path / "g.json").read_text())
    assert r.exit_code == 5 and doc["decision"] == "inconclusive" and doc["rows"] == []
    differ = {x["field"]: x for x in doc["comparability"]["differ"]}
    assert differ["gpu"]["baseline"] == "NVIDIA H200" and differ["gpu"]["candidate"] == "cpu"
    assert r.output.startswith("inconclusive: not comparable: ") and "gpu" in r.output.splitlines()[0]
    # both entries stored under one name: the CPU run picks the CPU one
    both = d / "baselines"
    assert CliRunner().invoke(app, ["baseline", "save", str(LOO / "all"), "--name", "main", "--dir", str(both)]).exit_code == 0
    listing = CliRunner().invoke(app, ["baseline", "list", "--dir", str(both)]).output
    assert listing.count("main  target=proxy") == 2 and "gpu=cpu" in listing and "gpu=NVIDIA H200" in listing
    r = CliRunner().invoke(app, ["gate", "--baseline", "main", "--dir", str(both), str(cand), "--json", str(tmp_path / "g2.json")])
    assert (tmp_path / "g2.json").is_file(), (r.output, r.exception)
    assert json.loads((tmp_path / "g2.json").read_text())["comparability"]["comparable"]


def test_the_fault_knob_busy_waits_in_every_decode_step(tmp_path):
    delay = 3000
    r = subprocess.run([sys.executable, "-m", "profkit", "trace", "--fault", f"host_delay_us={delay}", "--turns", "2", "--num-steps", "4",
                        "--profile-windows", "2", "--traces-dir", str(tmp_path / "traces"), "--reports-dir", str(tmp_path / "reports")],
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    after = next((tmp_path / "traces").glob("*-fault-after"))
    before = next((tmp_path / "traces").glob("*-fault-before"))
    man = json.loads((after / "manifest.json").read_text())
    assert "--fault-host-delay-us" in man["argv"] and man["server_info"]["fault_host_delay_us"] == delay
    for run, want in ((after, True), (before, False)):
        for f in sorted(run.glob("window-*/*.trace.json.gz")):
            ev = json.loads(gzip.open(f).read())["traceEvents"]
            steps = [e for e in ev if e.get("ph") == "X" and e.get("name") == "scheduler.run_batch"]
            waits = [e for e in ev if e.get("ph") == "X" and e.get("name") == "proxy.fault.host_delay"]
            if not want:
                assert waits == [], f
                continue
            assert waits and all(e["dur"] >= delay for e in waits), f  # a busy-wait lasts at least its delay
            # one per decode step inside the profile window: every wait inside a run_batch span
            for w in waits:
                assert any(s["ts"] <= w["ts"] and w["ts"] + w["dur"] <= s["ts"] + s["dur"] for s in steps), f
