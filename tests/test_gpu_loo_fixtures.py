"""Issue 19 on real H200 traces (tests/data/gpu_loo, README there): the proxy engine with everything on
(CUDA graphs too), leave-one-out, 3 profile windows a side, graph-capture profiles. The CPU suite
re-checks the issue's "Done when" list; the points the data does not meet are strict xfails that say
why (found on the data, not tuned away)."""

from __future__ import annotations

import json
from dataclasses import asdict

import msgspec
import pytest

from profkit.analysis.summary import build_summary
from profkit.attribution.diff import compare_summaries
from profkit.documents import diff_doc
from profkit.analysis.catalog import load_catalog

from support import public_trace
from support.helpers import analyze_paths

import support

DATA = support.DATA / "gpu_loo"
CAT = load_catalog("proxy")


def _windows(run: str, captures: bool = True) -> list[dict]:
    d = DATA / run
    caps = sorted((d / "graph_capture_profile").glob("*.json.gz")) if captures else []
    return [build_summary(analyze_paths([w], catalog=CAT, captures=caps or None, cache=False)) for w in sorted(d.glob("window-*"))]


@pytest.fixture(scope="module")
def runs() -> dict[str, list[dict]]:
    return {r: _windows(r) for r in ("all", "all-topk_v2", "all-indexer_fusion", "all-index_share", "all-overlap", "all-cuda_graph")}


def _diff(runs, opt: str) -> dict:
    b, c = runs[f"all-{opt}"], runs["all"]
    return diff_doc(compare_summaries(b[0], c[0], opt=opt, catalog=CAT, baseline_repeats=b, candidate_repeats=c))


def _kernel_time(d: dict) -> float:
    return sum(d["decomposition"]["category_us"].values())


def test_every_replay_maps_to_its_capture(runs):
    for run, ws in runs.items():
        for s in ws:
            g = s["ranks"][0].get("graph_capture")
            if run == "all-cuda_graph":
                assert g is None  # eager: no capture profile, nothing replayed
                continue
            assert g["replays"] > 0 and g["replays_mapped"] == g["replays"] and g["unmapped_us"] == 0, (run, g)


def test_no_spec_category(runs):
    for ws in runs.values():
        assert "spec" not in ws[0]["ranks"][0]["median"]["category_us"]


def test_topk_v2(runs):
    d = _diff(runs, "topk_v2")
    cats = d["decomposition"]["category_us"]
    assert cats["topk"] < 0
    other = d["noise"]["metrics"].get("category_us.other")
    assert other is None and "other" not in cats or other["within_noise"]  # "other" moves within noise (or holds nothing on either side)


def test_topk_v2_share(runs):
    # 88% (topk -353.8 of -399.8 µs; 93% on the previous recording); the sort path's own cub memsets/DtoD copies
    # inside proxy.indexer.topk are top-k work (rule 1 of kernels/proxy.toml); as memcpy they had made it 72%
    d = _diff(runs, "topk_v2")
    assert d["decomposition"]["category_us"]["topk"] / _kernel_time(d) >= 0.80


def test_indexer_fusion(runs):
    d = _diff(runs, "indexer_fusion")
    ix = d["decomposition"]["category_us"]["indexer"]
    assert ix < 0 and ix / _kernel_time(d) >= 0.70


def test_index_share_in_draft_phase(runs):
    d = _diff(runs, "index_share")
    assert d["decomposition"]["phase_us"]["draft"] / _kernel_time(d) >= 0.80


def test_overlap_sync_and_launch_carry_the_change(runs):
    # sync -607.6 and launch -91.3 of a -628.3 µs GPU window change (kernel time -69.2); on the previous recording
    # sync -626.2, launch -558.2 of -1,173.3: the launch part follows the host's pace, which differs between
    # device sessions (the eager baseline's window was 44.6 ms there, 26.5 ms here), the sync part does not
    d = _diff(runs, "overlap")
    dec = d["decomposition"]
    idle = dec["idle_us_by_cause"]
    dw = d["gpu_window_us"]["candidate"] - d["gpu_window_us"]["baseline"]
    terms = {**{f"cat:{k}": v for k, v in dec["category_us"].items()}, **{f"idle:{k}": v for k, v in idle.items()}}
    assert dw < 0 and max(terms, key=lambda k: abs(terms[k])) == "idle:sync" and idle["launch"] < 0
    assert (idle["sync"] + idle["launch"]) / dw >= 0.9  # the two carry the change
    assert abs(_kernel_time(d)) < 0.15 * abs(dw)  # kernels hardly move
    assert not d["noise"]["metrics"]["idle_us_by_cause.sync"]["within_noise"]


def test_no_flag_within_noise(runs):
    for opt in ("topk_v2", "indexer_fusion", "index_share", "overlap"):
        d = _diff(runs, opt)
        m = d["noise"]["metrics"]
        for ch in d["expected_effect"]["changes"]:
            if ch["flagged"]:
                assert not m[f"category_us.{ch['category']}"]["within_noise"], (opt, ch)


def test_one_window_is_not_judged(runs):
    b, c = runs["all-topk_v2"], runs["all"]
    d = diff_doc(compare_summaries(b[0], c[0], opt="topk_v2", catalog=CAT))
    assert not d["noise"]["available"] and d["expected_effect"]["flags"] == []


def test_other_at_most_5_percent(runs):
    # with the capture trace: every replayed kernel gets its capture-time ranges; the glue outside
    # every proxy.* sub-range (the MTP head's gathers, concatenations, fills: ~120 µs/iteration, 6.3%
    # while the proxy catalog had no name rule for them) is elementwise/reduce by name
    for s in runs["all"]:
        m = s["ranks"][0]["median"]
        assert m["category_us"].get("other", 0) <= 0.05 * m["gpu_busy_us"], m["category_us"]


def test_without_capture_replayed_kernels_lose_their_ranges(runs):
    # the same windows without their capture profile: replayed kernels have only their names, so
    # the range-defined categories (attention, moe: kernels named like any GEMM or elementwise op)
    # vanish into gemm/elementwise; with it they are there
    for with_cap, bare in zip(runs["all"], _windows("all", captures=False)):
        c, b = with_cap["ranks"][0]["median"]["category_us"], bare["ranks"][0]["median"]["category_us"]
        assert c.get("attention", 0) > 0 and c.get("moe", 0) > 0
        assert b.get("attention", 0) == 0 and b.get("moe", 0) == 0 and b["gemm"] > c["gemm"]


def _eager_vs_graphs(runs) -> dict[str, float]:
    """Per category, the change (graphs - eager) / eager of the mean over the compared iterations, as the diff has it."""
    d = _diff(runs, "cuda_graph")  # all-cuda_graph (eager) -> all (graphs)
    b, c = d["decomposition"]["baseline"]["category_us"], d["decomposition"]["candidate"]["category_us"]
    return {k: (c.get(k, 0) - b[k]) / b[k] for k in b if b[k] > 1}


def test_eager_vs_graphs_within_10_percent_but_elementwise(runs):
    rel = _eager_vs_graphs(runs)
    assert set(rel) >= {"attention", "moe", "topk", "indexer", "gemm", "memcpy", "norm", "rope", "sampling", "elementwise"}
    # by ownership, median of the 3 windows (issue 30): memcpy's ~1 µs copies +10.3% as well, the same graph-replay recording effect
    assert {k for k, v in rel.items() if abs(v) > 0.10} <= {"elementwise", "memcpy"} and rel["elementwise"] > 0.10, rel


@pytest.mark.xfail(strict=True, reason="elementwise +13.5% under graphs (+11.5% on the previous recording): the same kernels, as many of "
                                       "each (test below), each ~1 us one recorded ~0.12 us longer when graph-replayed: on the H200 "
                                       "that holds with no proxy and no profkit code (benchmarks/gpu_tiny_kernel_timing.py: "
                                       "+13% at 1.26 us, +4% at 2.9 us; the same kernels queued back to back on a stream: +0%; "
                                       "Nsight Compute times the replayed ones no longer, 0.997x: the trace records them longer)")
def test_eager_vs_graphs_within_10_percent(runs):
    for k, v in _eager_vs_graphs(runs).items():
        assert abs(v) <= 0.10, (k, v)


def _ops_per_category(summary: dict) -> dict[str, float]:
    rk = summary["ranks"][0]
    n = len(rk["iterations"])
    out: dict[str, float] = {}
    for k in rk["kernels"]:
        out[k["category"]] = out.get(k["category"], 0) + k["count"] / n
    return out


def test_eager_vs_graphs_same_ops_per_category(runs):
    """Graph mode copies no inputs and pads the context by < 1/16 (profkit.proxy.graphs): per iteration each
    category holds as many GPU ops replayed as launched eagerly, and the kernels list is complete."""
    for w in range(3):
        e, g = runs["all-cuda_graph"][w], runs["all"][w]
        for s in (e, g):
            rk = s["ranks"][0]
            assert sum(k["count"] for k in rk["kernels"]) == sum(i["gpu_kernels"] + sum(i["memcpy"].values()) + i["memset"]
                                                                 for i in rk["iterations"])
        assert _ops_per_category(e) == _ops_per_category(g)


def test_eager_vs_graphs_model_categories(runs):
    e, g = runs["all-cuda_graph"][0]["ranks"][0]["median"]["category_us"], runs["all"][0]["ranks"][0]["median"]["category_us"]
    for k in ("attention", "moe", "topk", "gemm", "norm", "sampling", "rope"):
        assert abs(g[k] - e[k]) <= 0.10 * e[k], (k, e[k], g[k])


def test_public_tracelens_capture_pair_aligns_by_name():
    """The public SGLang MI300X pair: ROCm capture launches carry kernel names; all 544 replayed kernels align."""
    a = analyze_paths([public_trace("tracelens_sglang_qwen3-8b_mi300x_decode_step.json.gz")],
                      captures=[public_trace("tracelens_sglang_qwen3-8b_mi300x_graph_capture_bs32.json.gz")], cache=False)
    g = msgspec.to_builtins(a[0].graph_capture)  # documents.GraphCaptureStats, as summary.json writes it
    assert g["graphs"] == 1 and g["replays_mapped"] == 1 and g["ops_mapped"] == 544 and g["unmapped_us"] == 0


def test_capture_count_mismatch_is_refused():
    from profkit.analysis.graphs import CapturedGraph, GraphCaptures, map_replays

    caps = GraphCaptures(graphs=[CapturedGraph("x", 0, None, "draft", 1, ((False, None, "proxy.moe"),) * 3)])
    rows = [(i, 7, "k", "kernel", 1000) for i in range(4)]
    mapped, stats = map_replays(rows, {7: "draft"}, caps, 0)
    st = asdict(stats)  # graphs.ReplayStats
    assert mapped == {} and st["replays_refused"] == 1
    mapped, stats = map_replays(rows[:3], {7: "draft"}, caps, 0)
    st = asdict(stats)
    assert mapped == {0: "proxy.moe", 1: "proxy.moe", 2: "proxy.moe"} and st["replays_mapped"] == 1


def test_analyze_of_a_windows_run_folder_names_its_windows():
    """`profkit analyze RUN` on a folder `trace --profile-windows 3` wrote: each window on its own, named
    (issue 28: it was refused, exit 3), or the one --window names; `diff` of the same folders works (above)."""
    from typer.testing import CliRunner

    from profkit.cli import app

    r = CliRunner().invoke(app, ["analyze", str(DATA / "all"), "--no-cache"])
    assert r.exit_code == 0, r.output
    text = " ".join(r.output.split())
    assert all(f"── {i + 1} of 3: all/window-{i}" in text for i in range(3)), text[:500]
    r = CliRunner().invoke(app, ["analyze", str(DATA / "all"), "--no-cache", "--window", "2"])
    assert r.exit_code == 0 and "── " not in r.output and str(DATA / "all" / "window-2") in " ".join(r.output.split())


def _drift_us(windows: list[dict]) -> float:
    """Plain: per window, the verify iterations the diff compares (the last one left out), spill(last) - spill(first) over n."""
    worst = 0.0
    for s in windows:
        its = [i for i in s["ranks"][0]["iterations"] if i["kind"] == "verify"][:-1]
        worst = max(worst, abs(its[-1]["spill_us"] - its[0]["spill_us"]) / len(its))
    return worst


def test_a_growing_gpu_backlog_is_measured_and_not_flagged(runs):
    """Without indexer fusion the GPU falls ever further behind the host during a window (spill_us 1.36 -> 2.48 ms
    over window 2's verify iterations): time by the clock misses ~161 µs of each iteration's work there (~194 on the
    previous recording). The diff measures that drift and warns; by ownership (issue 30) attention and moe no longer
    move with it (+42 and +28 µs by the clock), the backlog term carries it; the own effect is far beyond it."""
    d = _diff(runs, "indexer_fusion")
    want = _drift_us(runs["all-indexer_fusion"]) + _drift_us(runs["all"])
    e = d["expected_effect"]
    assert e["backlog_drift_us"] == pytest.approx(want, abs=0.01) and want > 150
    assert any("backlog" in w for w in d["warnings"]) and e["flags"] == []
    # issue 30: by ownership the drift lands in the backlog term, not in attention and moe (+41.9 and +28.1 by the clock)
    dec = d["decomposition"]
    cats = dec["category_us"]
    assert dec["basis"] == "ownership" and abs(cats["attention"]) < 5 and abs(cats["moe"]) < 5 and -cats["indexer"] > want
    assert dec["backlog_us"] > 100


def test_the_first_measured_repeat_is_warm():
    """Recorded with one unmeasured pass of the workload's own shape before the repeats (profkit.capture.run
    _warm_up): the proxy captures its graphs there, so the two measured repeats agree (0.94-1.17 s each, within
    8% of each other; without it the first repeat of every graph run took 2.4-2.8 s against ~1 s)."""
    for d in sorted(DATA.glob("all*")):
        m = json.loads((d / "manifest.json").read_text())
        (pt,) = m["throughput"]
        durs = [r["duration_s"] for r in pt["repeats"]]
        assert len(durs) == 2 and max(durs) / min(durs) < 1.15, (d.name, durs)
        assert pt["warmup"]["duration_s"] > 0


def _cli_diff(monkeypatch, opt: str, *outputs: str):
    """`profkit diff all-<opt> all --opt <opt> --catalog proxy OUTPUTS...` of the run folders, uncached; exit 0."""
    from typer.testing import CliRunner

    from profkit.cli import app

    monkeypatch.setenv("PROFKIT_NO_CACHE", "1")
    r = CliRunner().invoke(app, ["diff", str(DATA / f"all-{opt}"), str(DATA / "all"), "--opt", opt, "--catalog", "proxy", *outputs])
    assert r.exit_code == 0, r.output
    return r


def test_headline_says_how_much_the_profiler_slowed_each_side(tmp_path, monkeypatch):
    """Profiled, every graph run here ran 2.6-3.2x slower than unprofiled (cudaGraphLaunch takes 450-1,300 µs of
    host time per call under the profiler): the headline says so before the host-side terms are read, with the
    slowdowns the manifests measured (median over the windows), and the throughput change is judged."""
    import statistics

    md = tmp_path / "d.md"
    r = _cli_diff(monkeypatch, "indexer_fusion", "--md", str(md))
    slow = []
    for run in ("all-indexer_fusion", "all"):
        oh = json.loads((DATA / run / "manifest.json").read_text())["profiler_overhead"]
        slow.append(statistics.median(w["slowdown"] for w in oh["windows"]))
    want = f"Profiled, the baseline ran {slow[0]:.1f}× and the candidate {slow[1]:.1f}× slower than unprofiled"
    text = md.read_text()
    assert want in text and want in " ".join(r.output.split())
    assert slow[0] > 2 and slow[1] > 2
    # with its spread (max - min of each side's 2 repeats: 979-991 and 1,104-1,130 in the manifests)
    assert "Unprofiled tokens/s per user 985 → 1,117 (+13.4%), beyond noise (the repeats spread 11 and 25)" in text


def test_own_effect_leads_with_categories_phases_and_idle(runs):
    """kernels/proxy.toml says what each optimization owns: categories, the phases it is confined to
    (index_share: draft) and the idle it removes (overlap: sync, launch, iteration_boundary; cuda_graph: launch).
    Each is stated first, expected to shrink; on these runs each that moved beyond the noise shrank."""
    want = {"topk_v2": ["category_us.topk"], "indexer_fusion": ["category_us.indexer"],
            "index_share": ["category_us.indexer", "category_us.topk", "phase_us.draft"],
            "overlap": ["idle_us_by_cause.sync", "idle_us_by_cause.launch", "idle_us_by_cause.iteration_boundary"],
            "cuda_graph": ["idle_us_by_cause.launch"]}
    for opt, keys in want.items():
        ee = _diff(runs, opt)["expected_effect"]
        assert [t["term"] for t in ee["own"]] == keys, opt
        assert ee["ok"] and ee["against"] == [] and ee["flags"] == [], opt
        assert all(t["as_expected"] in (True, None) for t in ee["own"])
    ee = _diff(runs, "index_share")["expected_effect"]
    draft = next(t for t in ee["own"] if t["term"] == "phase_us.draft")
    assert draft["as_expected"] is True and draft["delta_us"] < -ee["backlog_drift_us"]
    (sync, _, _) = _diff(runs, "overlap")["expected_effect"]["own"]
    assert sync["as_expected"] is True


def test_every_report_has_the_change_by_phase_with_its_noise(tmp_path, monkeypatch):
    """index_share: the draft phase -171.0 µs beyond noise, "other" within it; in the terminal, the Markdown
    and the HTML (which had no phase table) alike, each phase with its verdict over the 3 windows."""
    import re

    md, html = tmp_path / "d.md", tmp_path / "d.html"
    r = _cli_diff(monkeypatch, "index_share", "--md", str(md), "--html", str(html))
    # by ownership, the median of the 3 paired windows with the noise beside it (issue 30); verify +7.3 as plain_phases.py counts it
    assert re.search(r"draft\s+1,171\.0\s+1,000\.0\s+-171\.0\s+±2\.7 beyond noise", r.output)
    assert re.search(r"other\s+30\.5\s+35\.5\s+\+4\.2\s+±4\.8 within noise", r.output)
    assert "| draft | 1,171.0 | 1,000.0 | -171.0 | ±2.7 **beyond noise** |" in md.read_text()
    h = html.read_text()
    sec = h[h.index("The same change by phase"):]
    sec = sec[:sec.index("</table>")]
    assert re.search(r">draft<.*?>-171\.0<.*?>±2\.7 beyond noise<", sec, re.S) and re.search(r">other<.*?>\+4\.2<.*?>±4\.8 within noise<", sec, re.S)


def test_index_share_draft_phase_against_a_plain_count(runs):
    """plain_phases.py (stdlib, no profkit code) counts GPU time by phase by ownership, unclipped: the draft
    phase's change agrees with profkit's by-the-clock one within 2% (-171.0 both), and carries >= 80% of its own
    total too (106%: verify +7.3 there, -11.0 by the clock, the candidate's backlog drift being 91 µs)."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, str(DATA / "plain_phases.py"), str(DATA / "all-index_share"), str(DATA / "all")],
                         capture_output=True, text=True, check=True).stdout
    plain = json.loads(out)
    d = _diff(runs, "index_share")["decomposition"]["phase_us"]
    assert plain["delta"]["draft"] == pytest.approx(d["draft"], rel=0.02)
    assert plain["delta"]["draft"] / plain["total"] >= 0.80


def test_eager_vs_graphs_diff_says_replayed_kernels_read_longer(runs):
    """Only the eager-vs-graphs diff warns that replayed kernels are recorded longer (its elementwise +18.1 µs)."""
    for opt in ("topk_v2", "indexer_fusion", "index_share", "overlap", "cuda_graph"):
        warned = any("replays CUDA graphs and the other launches eagerly" in w for w in _diff(runs, opt)["warnings"])
        assert warned is (opt == "cuda_graph"), opt


def test_the_ladder_shows_each_steps_diff_figures(runs):
    """A sweep's ladder over runs of three H200 profile windows each: a run's GPU window is the median over
    its windows and a step's change the median over paired windows of the per-window change, the figures
    the step's own diff shows (DESIGN.md "One statistic, everywhere"; it showed window 0's means, which on
    an unstable CPU sweep read 30,833 µs beside the step's 'baseline's 49,377')."""
    from profkit.attribution import ladder_steps

    order = ["all-topk_v2", "all", "all-overlap"]
    steps = ladder_steps([(r, runs[r][0]) for r in order], windows=[runs[r] for r in order])
    assert [s["windows"] for s in steps] == [3, 3, 3]
    for prev, cur, st in zip(order, order[1:], steps[1:]):
        d = diff_doc(compare_summaries(runs[prev][0], runs[cur][0], catalog=CAT, baseline_repeats=runs[prev], candidate_repeats=runs[cur]))
        g = d["decomposition"]["gpu_window_us"]
        assert st["gpu_window_us"] == pytest.approx(g["candidate"], abs=0.05)
        assert st["wall_delta_vs_previous_us"] == pytest.approx(d["noise"]["metrics"]["wall_us"]["delta"], abs=0.05)
    # and the first run's own figure, the baseline of the first step
    d0 = diff_doc(compare_summaries(runs[order[0]][0], runs[order[1]][0], catalog=CAT, baseline_repeats=runs[order[0]], candidate_repeats=runs[order[1]]))
    assert steps[0]["gpu_window_us"] == pytest.approx(d0["decomposition"]["gpu_window_us"]["baseline"], abs=0.05)
