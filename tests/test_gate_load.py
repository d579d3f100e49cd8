"""Issue 37, the A/A point: what else the machine did while a run recorded (capture/hostload.py, measured
on real processes here), a gate of sides recorded beside different other work (inconclusive, never a
regression), and which MDE a gate uses: the calibration's pair's for sides recorded together, the one
across sessions for sides recorded apart (a stored baseline). The gate figures are the H200
leave-one-out fixtures' (tests/data/gpu_loo), their manifests given a measured host load."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from msgspec import convert, to_builtins
from typer.testing import CliRunner

from profkit.attribution.gate import Figures, compare_load, decide, default_policy, judge_row, recorded_together, Rule
from profkit.documents import Calibration, CalibrationMetric, Comparability, Gate, gate_doc
from profkit.capture import hostload
from profkit.cli import app

import support

LOO = support.DATA / "gpu_loo"

# a busy loop that stops once it has used `cpu` seconds of CPU itself (however long a loaded machine makes that)
BUSY = "import time\nwhile time.process_time() < {cpu}: pass\n"


def _cpu_seconds(a: hostload.Sample, b: hostload.Sample, pid: int) -> float:
    return b.own.get(pid, 0.0) - a.own.get(pid, 0.0)


def test_a_childs_cpu_is_profkits_own_and_an_orphans_is_other_work():
    """A busy child (a server of profkit's) is its own CPU; a process outside its tree (double-forked, so
    reparented away) is other work: its CPU seconds show up in other_cpus x wall, whatever else runs."""
    a = hostload.sample()
    child = subprocess.Popen([sys.executable, "-c", BUSY.format(cpu=0.5) + "time.sleep(30)\n"])
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:  # until the child has spent its 0.5 s (it then sleeps, still alive)
            s = hostload.sample()
            if _cpu_seconds(a, s, child.pid) >= 0.45:  # its 0.5 s of CPU, read in clock ticks
                break
            time.sleep(0.05)
        b = hostload.sample()
        assert _cpu_seconds(a, b, child.pid) >= 0.45  # its 0.5 s of CPU, read in clock ticks
    finally:
        child.kill()
        child.wait()
    # an orphan: the middle process exits at once, its child (the busy loop) is reparented outside our tree
    a = hostload.sample()
    mid = subprocess.run([sys.executable, "-c", "import subprocess, sys\nsubprocess.Popen([sys.executable, '-c', sys.argv[1]], "
                          "start_new_session=True, stdout=subprocess.DEVNULL)\n", BUSY.format(cpu=0.6) + "open(%r, 'w').close()\n"
                          % str(Path(os.environ.get("TMPDIR", "/tmp")) / f"orphan-done-{os.getpid()}")], check=True)
    assert mid.returncode == 0
    done = Path(os.environ.get("TMPDIR", "/tmp")) / f"orphan-done-{os.getpid()}"
    deadline = time.monotonic() + 120
    while not done.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert done.exists()
    done.unlink()
    b = hostload.sample()
    other = hostload.other_cpus(a, b)
    assert other is not None and other * (b.wall_s - a.wall_s) >= 0.5, (other, b.wall_s - a.wall_s)


def test_other_cpus_arithmetic():
    a = hostload.Sample(0.0, 100.0, {1: 10.0, 2: 5.0})
    b = hostload.Sample(2.0, 103.0, {1: 11.0, 2: 5.5, 3: 0.5})  # 3 s of busy CPU: 2 s of ours (1 + 0.5 + the new child's 0.5)
    assert hostload.other_cpus(a, b) == pytest.approx(0.5)
    assert hostload.other_cpus(a, hostload.Sample(0.01, 100.0, {})) is None  # too short to say
    hl = hostload.HostLoad()
    hl.measure("repeat 1", a, b)
    hl.measure("profile window 1", b, hostload.Sample(4.0, 107.0, {1: 12.0, 2: 6.0, 3: 1.0}))
    doc = hl.doc()
    assert doc["other_cpus_median"] == pytest.approx(0.75) and doc["other_cpus_max"] == pytest.approx(1.0) and len(doc["steps"]) == 2


def _with_load(tmp: Path, run: str, other: float, name: str | None = None) -> Path:
    """A copy of a fixture run folder whose manifest says how much other work ran beside it."""
    dst = tmp / (name or run)
    shutil.copytree(LOO / run, dst)
    m = json.loads((dst / "manifest.json").read_text())
    m["host_load"] = {"cpus": 2, "other_cpus_median": other, "other_cpus_max": other, "steps": []}
    (dst / "manifest.json").write_text(json.dumps(m))
    return dst


def _gate(*args: str) -> tuple[int, str]:
    r = CliRunner().invoke(app, ["gate", *args])
    return r.exit_code, r.output


def test_a_side_recorded_on_a_busier_machine_is_inconclusive_never_a_regression(tmp_path):
    """topk_v2 removed is a regression when both sides ran beside the same other work; the same runs with the
    candidate beside one busy CPU of other work (as two busy loops read on the 2-core machine): inconclusive,
    and the line says which side ran on the busier machine. The other way round too (a busier baseline makes
    the candidate look fast: no pass either)."""
    on, off = _with_load(tmp_path, "all", 0.0), _with_load(tmp_path, "all-topk_v2", 0.2)
    rc, out = _gate(str(on), str(off), "--json", str(tmp_path / "same.json"))
    doc = json.loads((tmp_path / "same.json").read_text())
    assert rc == 5 and doc["decision"] == "regression" and doc["host_load"]["comparable"], out  # 0.2 apart: within 0.5
    busy = _with_load(tmp_path, "all-topk_v2", 1.0, "busy")
    rc, out = _gate(str(on), str(busy), "--json", str(tmp_path / "busy.json"), "--md", str(tmp_path / "busy.md"))
    doc = json.loads((tmp_path / "busy.json").read_text())
    first = out.splitlines()[0]
    assert rc == 5 and doc["decision"] == "inconclusive" and not doc["host_load"]["comparable"]
    assert first == "inconclusive: candidate ran on a busier machine (1.0 vs 0.0 CPUs of other work)"
    assert (tmp_path / "busy.md").read_text().splitlines()[0] == first and len(first) <= 80
    assert any("busier while the candidate recorded" in r for r in doc["reasons"])
    rc, out = _gate(str(_with_load(tmp_path, "all", 1.0, "busy-base")), str(off), "--inconclusive", "pass", "--json", str(tmp_path / "b2.json"))
    assert rc == 0 and json.loads((tmp_path / "b2.json").read_text())["decision"] == "inconclusive"
    assert out.startswith("inconclusive: baseline ran on a busier machine (1.0 vs 0.2 CPUs")


def test_load_limits():
    def man(other, cpus=2):
        return {"host_load": {"cpus": cpus, "other_cpus_median": other}}

    assert to_builtins(compare_load(man(0.0), man(0.5)))["comparable"] and not to_builtins(compare_load(man(0.0), man(0.51)))["comparable"]
    big = to_builtins(compare_load(man(0.0, 64), man(10.0, 64)))  # 25% of 64 CPUs: 16
    assert big["comparable"] and big["limit_cpus"] == 16
    unknown = to_builtins(compare_load({}, man(1.5)))
    assert unknown["comparable"] and not unknown["known"]  # recorded before profkit measured it: not compared


def test_which_runs_were_recorded_together():
    a = {"run_id": "20261207-120000-proxy-calibrate-a", "recorded_with": ["20261207-120000-proxy-calibrate-b"], "capture_order": "alternating"}
    b = {"run_id": "20261207-120000-proxy-calibrate-b", "recorded_with": ["20261207-120000-proxy-calibrate-a"], "capture_order": "alternating"}
    a2 = {"run_id": "20261207-120000-proxy-calibrate-2a", "recorded_with": ["20261207-120000-proxy-calibrate-2b"], "capture_order": "alternating"}
    assert recorded_together(a, b) and recorded_together(b, a)
    assert not recorded_together(a, a2)  # one command, two sessions: apart
    old_a = {k: v for k, v in a.items() if k != "recorded_with"}
    old_b = {k: v for k, v in b.items() if k != "recorded_with"}
    assert recorded_together(old_a, old_b)  # manifests before recorded_with: one command's alternating runs share its stamp
    assert not recorded_together({**old_a, "capture_order": "sequential"}, {**old_b, "capture_order": "sequential"})
    assert not recorded_together(None, b)


def test_a_gate_of_sides_recorded_apart_uses_the_mde_across_sessions():
    cal = {"aa_spread_pct": 3.0, "mde_pct": 5.0, "aa_spread_abs": 30.0, "mde_abs": 50.0,
           "stored_aa_spread_pct": 6.0, "stored_mde_pct": 14.0, "stored_aa_spread_abs": 60.0, "stored_mde_abs": 140.0}
    row = {"metric": "idle_us_by_cause.short_gaps", "baseline": 1000.0, "candidate": 1100.0, "change": 100.0, "noise": 20.0,
           "unit": "µs", "floor": 0.0, "not_judged": None}
    rule = Rule("idle_us_by_cause.*", "lower", 8.0)
    paired, apart = (to_builtins(judge_row(Figures(**row), rule, convert(cal, CalibrationMetric), paired=True)),
                     to_builtins(judge_row(Figures(**row), rule, convert(cal, CalibrationMetric), paired=False)))
    assert paired["verdict"] == "regression" and paired["mde_pct"] == 5.0 and paired["mde_from"] == "pair"
    # apart: 8% is below the 14% MDE across sessions: the row is refused, not called a regression
    assert apart["verdict"] == "cannot be judged here" and apart["mde_pct"] == 14.0 and apart["mde_from"] == "sessions"
    assert to_builtins(judge_row(Figures(**row), Rule("x", "lower", 15.0), convert(cal, CalibrationMetric), paired=False))["verdict"] == "below threshold"
    one_session = {k: v for k, v in cal.items() if not k.startswith("stored_")}
    assert to_builtins(judge_row(Figures(**row), rule, convert(one_session, CalibrationMetric), paired=False))["mde_from"] == "pair"


def test_a_one_session_calibration_says_so_for_sides_recorded_apart():
    diff = {"noise": {"available": True, "metrics": {}}, "manifests": {"baseline": {"run_id": "x"}, "candidate": {"run_id": "y"}}}
    doc = gate_doc(decide(diff, default_policy(), calibration=convert({"sessions": 1, "metrics": {}, "key": {}}, Calibration)))
    assert doc["pairing"] == "apart"
    doc = gate_doc(decide(diff, default_policy(), calibration=convert({"sessions": 1, "metrics": {}, "key": {}}, Calibration),
                          comparability=convert({"comparable": True, "differ": [], "unknown": [], "candidate": {"target": "proxy"}, "baseline": {}},
                                                Comparability)))
    assert "calibrate with --sessions 2 or more" in doc["calibration"]["note"]
    doc = gate_doc(decide(diff, default_policy(), calibration=convert({"sessions": 2, "metrics": {}, "key": {}}, Calibration),
                          comparability=convert({"comparable": True, "differ": [], "unknown": [], "candidate": {"target": "proxy"}, "baseline": {}},
                                                Comparability)))
    assert not doc["calibration"]["note"]


def test_the_decision_line_names_the_owned_term_when_the_headline_is_long():
    """A trial's first line (topk_v2 removed, TTFT the felt figure): the owned term still named, in 80 columns."""
    from profkit.report.gate import decision_line

    rows = [{"metric": "throughput.ttft_ms_p50", "unit": "ms", "change_pct": 62.04, "change": 400.0, "noise_pct": 33.3, "threshold_pct": 57.0,
             "mde_pct": 47.5, "verdict": "regression", "gated": True},
            {"metric": "category_us.topk", "unit": "µs", "change_pct": 204.7, "change": 3414.2, "noise_pct": 22.6, "threshold_pct": 25.0,
             "mde_pct": 23.8, "verdict": "regression", "gated": True}]
    doc = {"decision": "regression", "headline": "throughput.ttft_ms_p50", "owned_term": "category_us.topk", "rows": rows}
    assert decision_line(convert(doc, Gate)) == "regression: TTFT +62.0% (±33.3%, thr 57%, MDE 47.5%); owned topk +3,414 µs"
    # the window as the headline (a trial on the CPU proxy): its figure bare, so that the owned term still fits
    rows[0] = {"metric": "gpu_window_us", "unit": "µs", "change_pct": 35.47, "change": 4400.0, "noise_pct": 31.4, "threshold_pct": 35.0,
               "mde_pct": 34.9, "verdict": "regression", "gated": True}
    doc = {**doc, "headline": "gpu_window_us", "timeline": "cpu"}
    assert decision_line(convert(doc, Gate)) == "regression: CPU-op window +35.5%; owned topk +3,414 µs"


def test_a_run_noisier_than_its_calibration_is_never_a_pass(tmp_path):
    """With a calibration that promised a small MDE (0.5% of every metric), the H200 fixtures' own window spread
    is wider: adding topk_v2 (a pass without a calibration) is inconclusive, its rows "too noisy"; removing it is
    still a regression (a change beyond the run's own noise is seen whatever the calibration said)."""
    rc, _ = _gate(str(LOO / "all-topk_v2"), str(LOO / "all"), "--json", str(tmp_path / "plain.json"))
    plain = json.loads((tmp_path / "plain.json").read_text())
    assert rc == 0 and plain["decision"] == "pass"
    keys = [r["metric"] for r in plain["rows"]]
    metric = {"unit": "µs", "baseline": 1.0, "aa_change_pct": 0.25, "aa_spread_pct": 0.25, "mde_pct": 0.5,
              "aa_change_abs": 0.0025, "aa_spread_abs": 0.0025, "mde_abs": 0.005}
    cal = {"schema_version": 1, "kind": "calibration", "source": "a promise", "judged": True, "sessions": 2, "key": {},
           "metrics": {k: metric for k in keys}}
    (tmp_path / "cal.json").write_text(json.dumps(cal))
    args = ["--calibration", str(tmp_path / "cal.json"), "--threshold", "50"]
    rc, out = _gate(str(LOO / "all-topk_v2"), str(LOO / "all"), *args, "--json", str(tmp_path / "added.json"))
    doc = json.loads((tmp_path / "added.json").read_text())
    noisy = [r for r in doc["rows"] if r["verdict"] == "too noisy"]
    assert rc == 5 and doc["decision"] == "inconclusive" and noisy and not doc["regressions"], out
    for r in noisy:  # within this run's noise, and that noise wider than the MDE the calibration promised
        assert abs(r["change"]) < r["noise"] and r["noise"] > r["mde"] and r["reason"].startswith("too noisy here: this run's spread is")
    assert out.splitlines()[0].startswith(f"inconclusive: {len(noisy)} metrics too noisy here (") and len(out.splitlines()[0]) <= 80
    assert any("figures users feel noisier in this run than the calibration's MDE" in r for r in doc["reasons"])
    rc, out = _gate(str(LOO / "all"), str(LOO / "all-topk_v2"), *args, "--json", str(tmp_path / "removed.json"))
    doc = json.loads((tmp_path / "removed.json").read_text())
    assert rc == 5 and doc["decision"] == "regression" and doc["owned_term"] == "category_us.topk", out


def test_a_category_noisier_than_its_calibration_is_not_judged_and_does_not_block_a_pass(tmp_path):
    """Only the figures users feel (ITL, tok/s per user, TTFT, the step's window) too noisy make a gate inconclusive; a
    category too noisy is left out ("too noisy", named in the notes): with a calibration that promised 0.5% for the
    categories alone, adding topk_v2 still passes."""
    rc, _ = _gate(str(LOO / "all-topk_v2"), str(LOO / "all"), "--json", str(tmp_path / "plain.json"))
    keys = [r["metric"] for r in json.loads((tmp_path / "plain.json").read_text())["rows"]]
    tight = {"unit": "µs", "baseline": 1.0, "aa_change_pct": 0.25, "aa_spread_pct": 0.25, "mde_pct": 0.5}
    loose = {"unit": "µs", "baseline": 1.0, "aa_change_pct": 20.0, "aa_spread_pct": 25.0, "mde_pct": 45.0}
    cal = {"schema_version": 1, "kind": "calibration", "source": "categories tight", "judged": True, "sessions": 2, "key": {},
           "metrics": {k: tight if k.startswith("category_us.") else loose for k in keys}}
    (tmp_path / "cal.json").write_text(json.dumps(cal))
    rc, out = _gate(str(LOO / "all-topk_v2"), str(LOO / "all"), "--calibration", str(tmp_path / "cal.json"), "--threshold", "50",
                    "--json", str(tmp_path / "g.json"))
    doc = json.loads((tmp_path / "g.json").read_text())
    noisy = [r for r in doc["rows"] if r["verdict"] == "too noisy"]
    assert rc == 0 and doc["decision"] == "pass" and noisy, out
    felt = ("throughput.itl_ms_p50", "throughput.tokens_per_s_per_user_p50", "throughput.ttft_ms_p50", "gpu_window_us")
    assert any(r["metric"].startswith("category_us.") for r in noisy) and not any(r["metric"] in felt for r in noisy)
    assert f"{len(noisy)} row{'s' if len(noisy) > 1 else ''} too noisy here, not judged" in out


def test_a_first_profile_window_without_the_compared_shape_does_not_hide_the_others(tmp_path):
    """A CI run of the docs/ci.md recipe on a loaded host: the candidate's window 0 opened as its turn's decode ended
    and held one iteration of no known kind, and gate --baseline said "the two sides share no iteration shape
    (baseline: verify bs=1; candidate: unknown)" (exit 2) although windows 1 and 2 held 6 verify steps each. The same
    on the H200 fixtures' summaries, window 0 of the candidate cut to one 'unknown' iteration: the shape comes from
    the first window that shares one, and the cut window is left out with its warning."""
    from profkit.attribution.diff import compare_summaries
    from profkit.documents import diff_doc

    def summaries(run: str) -> list[dict]:
        out = []
        for w in sorted((LOO / run).glob("window-*")):
            j = tmp_path / f"{run}-{w.name}.json"
            r = CliRunner().invoke(app, ["analyze", str(w), "--json", str(j)])
            assert r.exit_code == 0, r.output
            out.append(json.loads(j.read_text()))
        return out

    base, cand = summaries("all"), summaries("all-topk_v2")
    whole = diff_doc(compare_summaries(base[0], cand[0], baseline_repeats=base, candidate_repeats=cand))
    cut = json.loads(json.dumps(cand[0]))
    it = cut["ranks"][0]["iterations"][0]
    it["kind"], it["batch_size"] = None, None
    cut["ranks"][0]["iterations"] = [it]
    d = diff_doc(compare_summaries(base[0], cut, baseline_repeats=base, candidate_repeats=[cut, *cand[1:]]))
    assert d["shape"]["kind"] == whole["shape"]["kind"] and d["shape"]["kind"] is not None
    assert any("1 profile window(s) hold no iterations of the compared shape" in w for w in d["warnings"])
    assert d["noise"]["repeats"]["candidate"] == 2 and d["noise"]["repeats"]["baseline"] == 3
