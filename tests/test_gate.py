"""Issue 37: `profkit gate` on recorded data (no server): the H200 leave-one-out fixtures (tests/data/gpu_loo,
3 profile windows a side), an unusable public capture, stored baselines, policies, nightly history and the
PR comment. The figures a gate row shows are checked against tests/data/gpu_loo/plain_owned.py (stdlib
only, shares no code with profkit). Real proxy runs: tests/test_gate_proxy.py."""

from __future__ import annotations

import json
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from profkit.cli import app

import support
from support import public_trace

LOO = support.DATA / "gpu_loo"
UNUSABLE = "hta_cupti_profiler_benchmark_result_924719_1679055439_trace.json.gz"


def _gate(*args: str) -> tuple[int, str]:
    r = CliRunner().invoke(app, ["gate", *args])
    return r.exit_code, r.output


@pytest.fixture(scope="module")
def loo(tmp_path_factory) -> dict[str, dict]:
    """gate all (topk_v2 on) against all-topk_v2 (off): the candidate lost topk_v2; and the reverse."""
    d = tmp_path_factory.mktemp("gate")
    out = {}
    for name, (b, c) in {"removed": ("all", "all-topk_v2"), "added": ("all-topk_v2", "all")}.items():
        rc, text = _gate(str(LOO / b), str(LOO / c), "--json", str(d / f"{name}.json"), "--md", str(d / f"{name}.md"))
        out[name] = {"rc": rc, "output": text, "doc": json.loads((d / f"{name}.json").read_text()), "md": (d / f"{name}.md").read_text()}
    return out


def _plain_topk_per_iteration(run: str) -> list[float]:
    """Each profile window's owned topk time per compared iteration, by the plain script."""
    out = []
    for w in sorted((LOO / run).glob("window-*")):
        p = json.loads(subprocess.run([sys.executable, str(LOO / "plain_owned.py"), str(LOO / run), w.name.split("-")[1]],
                                      capture_output=True, text=True, check=True).stdout)
        out.append(p["owned_category_us"]["topk"] / len(p["iterations"]))
    return out


def test_removing_topk_v2_is_a_regression_naming_topk(loo):
    g = loo["removed"]
    assert g["rc"] == 5 and g["doc"]["decision"] == "regression" and g["doc"]["exit_code"] == 5
    assert g["doc"]["owned_term"] == "category_us.topk"
    assert "category_us.topk" in g["doc"]["regressions"]
    first = g["output"].splitlines()[0]
    assert first.startswith("regression: ") and "owned topk +" in first and "µs per step" in first


def test_the_topk_row_is_the_diffs_statistic_and_agrees_with_a_plain_count(loo):
    """The row's change is the median over paired windows of the per-window change and its noise the largest
    spread (attribution/windows.py), here recomputed from the plain script's per-window owned topk."""
    b, c = _plain_topk_per_iteration("all"), _plain_topk_per_iteration("all-topk_v2")
    change = statistics.median(y - x for x, y in zip(b, c))
    d = [y - x for x, y in zip(b, c)]
    noise = max(max(b) - min(b), max(c) - min(c), max(d) - min(d))
    row = next(r for r in loo["removed"]["doc"]["rows"] if r["metric"] == "category_us.topk")
    assert row["change"] == pytest.approx(change, rel=0.005)
    assert row["baseline"] == pytest.approx(statistics.median(b), rel=0.005)
    assert row["noise"] == pytest.approx(noise, rel=0.02, abs=0.05)
    assert row["verdict"] == "regression" and row["threshold"] == pytest.approx(max(0.02 * row["baseline"], row["floor"]))


def test_adding_topk_v2_passes(loo):
    g = loo["added"]
    assert g["rc"] == 0 and g["doc"]["decision"] == "pass" and g["doc"]["regressions"] == []
    assert g["output"].splitlines()[0].startswith("pass: ")


def test_every_row_has_the_issues_columns(loo):
    for g in loo.values():
        for r in g["doc"]["rows"]:
            assert {"metric", "baseline", "candidate", "change", "threshold", "noise", "mde", "verdict"} <= set(r)
        assert {r["metric"] for r in g["doc"]["rows"]} >= {"throughput.itl_ms_p50", "throughput.ttft_ms_p50", "throughput.tokens_per_s_per_user_p50",
                                                            "gpu_window_us", "category_us.topk", "phase_us.verify", "idle_us_by_cause.sync",
                                                            "counts.kernel_launches", "counts.syncs"}


def test_the_pr_comment_renders_and_leads_with_the_gate_json_verdict(loo):
    from markdown_it import MarkdownIt

    for g in loo.values():
        first = g["md"].splitlines()[0]
        assert len(first) <= 80
        assert first.split(":", 1)[0] == g["doc"]["decision"]
        tokens = MarkdownIt("commonmark").enable("table").parse(g["md"])
        assert tokens[0].type == "paragraph_open" and tokens[1].content == first  # the first block is the decision line
        assert any(t.type == "table_open" for t in tokens)
        heads = [tokens[i + 1].content for i, t in enumerate(tokens) if t.type == "th_open"]
        assert heads == ["metric", "baseline", "candidate", "change", "threshold", "noise", "MDE", "verdict"]


def test_a_diff_json_alone_gives_the_same_decision(loo, tmp_path):
    rc, _ = CliRunner().invoke(app, ["diff", str(LOO / "all"), str(LOO / "all-topk_v2"), "--json", str(tmp_path / "d.json")]).exit_code, None
    assert rc == 0
    rc, out = _gate(str(tmp_path / "d.json"), "--json", str(tmp_path / "g.json"))
    doc = json.loads((tmp_path / "g.json").read_text())
    assert rc == 5 and doc["decision"] == "regression" and doc["owned_term"] == "category_us.topk"
    assert doc["rows"] == loo["removed"]["doc"]["rows"]


def test_a_threshold_above_the_change_passes_and_the_policy_file_sets_it(loo, tmp_path):
    pol = tmp_path / "policy.toml"
    pol.write_text('[defaults]\nthreshold_pct = 500\n')
    rc, out = _gate(str(LOO / "all"), str(LOO / "all-topk_v2"), "--policy", str(pol), "--json", str(tmp_path / "g.json"))
    doc = json.loads((tmp_path / "g.json").read_text())
    assert rc == 0 and doc["decision"] == "pass", out
    pol.write_text('[metric."category_us.topk"]\nthreshold_pct = 1\n[defaults]\nthreshold_pct = 500\n')
    rc, out = _gate(str(LOO / "all"), str(LOO / "all-topk_v2"), "--policy", str(pol), "--json", str(tmp_path / "g.json"))
    doc = json.loads((tmp_path / "g.json").read_text())
    assert rc == 5 and doc["regressions"] == ["category_us.topk"], out


@pytest.mark.parametrize(("text", "words"), [("[defaults\n", "not a TOML policy"), ('[metric."gpu_window_us"]\ndirection = "up"\n', "direction 'up'"),
                                             ("[thresholds]\n", "unknown table")])
def test_a_bad_policy_is_one_line_naming_the_file(tmp_path, text, words):
    pol = tmp_path / "policy.toml"
    pol.write_text(text)
    rc, out = _gate(str(LOO / "all"), str(LOO / "all-topk_v2"), "--policy", str(pol))
    assert rc == 3 and str(pol) in out and words in out, out


def test_a_calibration_whose_mde_is_above_the_threshold_refuses_the_row(tmp_path):
    """An A/A of two windows-runs of the same fixture configuration is not at hand on the H200; the A/A here is the
    fixture's two windows-runs of one configuration (all against all): spread and MDE from the same statistic."""
    rc = CliRunner().invoke(app, ["diff", str(LOO / "all"), str(LOO / "all"), "--json", str(tmp_path / "aa.json")]).exit_code
    assert rc == 0
    from profkit.attribution.gate import calibration_from, run_key
    from profkit.documents import calibration_doc

    aa = json.loads((tmp_path / "aa.json").read_text())
    cal = calibration_doc(calibration_from(aa, run_key(aa["manifests"]["baseline"]), source="all vs all"))
    # the same windows on both sides: no A/A change, and the spread is that of the windows themselves
    win = cal["metrics"]["gpu_window_us"]
    assert win["aa_change_abs"] == 0 and win["mde_pct"] == pytest.approx(win["aa_spread_pct"]) and win["mde_pct"] > 0
    (tmp_path / "cal.json").write_text(json.dumps(cal))
    low = win["mde_pct"] / 2
    rc, out = _gate(str(LOO / "all"), str(LOO / "all-topk_v2"), "--calibration", str(tmp_path / "cal.json"),
                    "--threshold", f"{low}", "--json", str(tmp_path / "g.json"))
    doc = json.loads((tmp_path / "g.json").read_text())
    row = next(r for r in doc["rows"] if r["metric"] == "gpu_window_us")
    assert row["verdict"] == "cannot be judged here" and row["reason"].startswith(
        f"cannot be judged here: the A/A spread is {win['aa_spread_pct']:.1f}%")
    assert row["mde_pct"] == win["mde_pct"]


def test_an_unusable_capture_is_inconclusive_never_pass(tmp_path):
    """The public HTA CUPTI trace has launch calls and no device record (health: unusable). As a run of two
    identical profile windows a side, everything is judged and nothing changes, and still no pass."""
    t = public_trace(UNUSABLE)
    for side in ("a", "b"):
        for w in (0, 1):
            (tmp_path / side / f"window-{w}").mkdir(parents=True)
            shutil.copy(t, tmp_path / side / f"window-{w}" / t.name)
    rc, out = _gate(str(tmp_path / "a"), str(tmp_path / "b"), "--json", str(tmp_path / "g.json"))
    doc = json.loads((tmp_path / "g.json").read_text())
    assert rc == 5 and doc["decision"] == "inconclusive", out
    assert any("capture health is unusable" in r for r in doc["reasons"]) and out.startswith("inconclusive: capture health unusable")
    assert not any(r.startswith("not judged") for r in doc["reasons"])  # judged: the unusable capture alone decides
    rc, _ = _gate(str(tmp_path / "a"), str(tmp_path / "b"), "--inconclusive", "pass", "--json", str(tmp_path / "g2.json"))
    assert rc == 0 and json.loads((tmp_path / "g2.json").read_text())["decision"] == "inconclusive"


def test_stored_baselines_are_picked_by_key(tmp_path):
    bdir = tmp_path / "baselines"
    r = CliRunner().invoke(app, ["baseline", "save", str(LOO / "all"), "--name", "main", "--dir", str(bdir)])
    assert r.exit_code == 0 and "saved main" in r.output and "gpu=NVIDIA H200" in r.output, r.output
    r = CliRunner().invoke(app, ["baseline", "list", "--dir", str(bdir)])
    assert r.exit_code == 0 and r.output.count("main  target=proxy") == 1
    rc, out = _gate("--baseline", "main", "--dir", str(bdir), str(LOO / "all-topk_v2"), "--json", str(tmp_path / "g.json"))
    doc = json.loads((tmp_path / "g.json").read_text())
    assert rc == 5 and doc["decision"] == "regression" and doc["owned_term"] == "category_us.topk", out
    rc, out = _gate("--baseline", "nightly", "--dir", str(bdir), str(LOO / "all-topk_v2"))
    assert rc == 2 and "no stored baseline named 'nightly'" in out and "stored: main" in out


def test_a_baseline_of_another_workload_is_not_comparable_and_names_what_differs(tmp_path):
    """The H200 leave-one-out run (isl 8000, three 256-token turns) against the H200 TP2 proxy run of tests/data/gpu_tp2
    (another workload): refused as not comparable, nothing compared."""
    other = support.DATA / "gpu_tp2"
    bdir = tmp_path / "baselines"
    assert CliRunner().invoke(app, ["baseline", "save", str(LOO / "all"), "--name", "main", "--dir", str(bdir)]).exit_code == 0
    rc, out = _gate("--baseline", "main", "--dir", str(bdir), str(other), "--json", str(tmp_path / "g.json"), "--md", str(tmp_path / "g.md"))
    doc = json.loads((tmp_path / "g.json").read_text())
    assert rc == 5 and doc["decision"] == "inconclusive" and doc["rows"] == []
    fields = [d["field"] for d in doc["comparability"]["differ"]]
    assert "workload" in fields
    assert out.startswith("inconclusive: not comparable: ") and "workload" in out.splitlines()[0]
    assert (tmp_path / "g.md").read_text().startswith("inconclusive: not comparable")


def test_nightly_history_needs_two_regressing_runs(tmp_path):
    h = tmp_path / "history"
    args = [str(LOO / "all"), str(LOO / "all-topk_v2"), "--history", str(h)]
    rc, out = _gate(*args, "--json", str(tmp_path / "1.json"))
    one = json.loads((tmp_path / "1.json").read_text())
    assert rc == 0 and one["decision"] == "suspect" and out.startswith("suspect: ") and one["history"]["status"] == "suspect"
    rc, out = _gate(*args, "--json", str(tmp_path / "2.json"))
    two = json.loads((tmp_path / "2.json").read_text())
    assert rc == 5 and two["decision"] == "regression" and "category_us.topk" in two["history"]["confirmed"]
    assert len(list(h.glob("gate-*.json"))) == 2
    # a passing night in between resets it
    _gate(str(LOO / "all-topk_v2"), str(LOO / "all"), "--history", str(h))
    rc, _ = _gate(*args, "--json", str(tmp_path / "3.json"))
    assert rc == 0 and json.loads((tmp_path / "3.json").read_text())["decision"] == "suspect"


def test_gate_json_is_its_typed_document(loo):
    import msgspec

    from profkit.documents import Gate

    g = msgspec.convert(loo["removed"]["doc"], Gate)
    assert g.decision == "regression" and g.rows and g.rows[0].verdict


def test_gate_argument_errors(tmp_path):
    rc, out = _gate()
    assert rc == 2 and "missing CANDIDATE" in out
    rc, out = _gate(str(LOO / "all"))
    assert rc == 2 and "must be a diff.json" in out


def test_fault_specs_are_checked():
    from profkit.errors import UsageError
    from profkit.targets.proxy import fault_args

    assert fault_args("host_delay_us=200,gpu_op=64") == ["--fault-host-delay-us", "200.0", "--fault-gpu-op", "64"]
    for bad in ("host_delay=3", "gpu_op=1.5", "host_delay_us=-1", ""):
        with pytest.raises(UsageError):
            fault_args(bad)
    r = CliRunner().invoke(app, ["trace", "--fault", "host_delay_us=500", "--dry-run"])
    assert r.exit_code == 0 and r.output.count("--fault-host-delay-us 500.0") == 1, r.output
    r = CliRunner().invoke(app, ["trace", "--target", "sglang", "--fault", "host_delay_us=500", "--dry-run", "--opt", "topk_v2"])
    assert r.exit_code == 2 and "--fault is the proxy engine's knob" in r.output


def test_the_trace_still_needs_an_optimization_without_a_fault():
    r = CliRunner().invoke(app, ["trace", "--dry-run"])
    assert r.exit_code == 2 and "missing --opt" in r.output


def _paths_in(p: Path) -> list[str]:
    return sorted(str(x.relative_to(p)) for x in p.rglob("*") if x.is_file())


def test_a_calibration_no_session_of_which_is_judged_gives_no_mde_apart_either(tmp_path):
    """Sessions whose own A/A is not judged (unstable windows) give no MDE, and none across sessions either, even when
    two of their recordings compare stably with each other (a loaded CI run: the recipe's gate used an MDE apart
    from a calibration that said it was not judged)."""
    rc = CliRunner().invoke(app, ["diff", str(LOO / "all"), str(LOO / "all"), "--json", str(tmp_path / "aa.json")]).exit_code
    assert rc == 0
    from profkit.attribution.gate import calibration_from, run_key
    from profkit.documents import calibration_doc

    aa = json.loads((tmp_path / "aa.json").read_text())
    unstable = {**aa, "noise": {**aa["noise"], "available": False, "note": "not judged: unstable"}}
    key = run_key(aa["manifests"]["baseline"])
    apart = calibration_doc(calibration_from([unstable, unstable], key, across=[aa]))
    assert not apart["judged"] and apart["note"].startswith("2 of 2 session(s) not judged")
    assert apart["metrics"]["gpu_window_us"]["mde_pct"] is None
    assert all(m["stored_mde_pct"] is None for m in apart["metrics"].values())
    with_one = calibration_doc(calibration_from([aa, unstable], key, across=[aa]))  # one session judged: both MDEs
    assert with_one["judged"] and with_one["metrics"]["gpu_window_us"]["stored_mde_pct"] is not None
