"""Overlap slack and speculative cost per accepted token on the H200 fixtures (issue 31).

slack_us is checked transition by transition against tests/data/plain_slack.py, a stdlib script that
shares no code with profkit, on real traces: eager, CUDA graphs, and the overlap scheduler's plan stream.
The proxy's overlap switch (gpu_loo all-overlap -> all) must show as exposed host time: the baseline's
host is exposed on most transitions, the candidate's on almost none. index_share's diff states the draft
phase's GPU µs per accepted token for both sides."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

from profkit.analysis.summarize import SummarizeOptions, summarize

DATA = Path(__file__).parent / "data"
LOO = DATA / "gpu_loo"
PLAIN = DATA / "plain_slack.py"


def trace_of(run: str, window: int = 0) -> Path:
    return next((LOO / run / f"window-{window}").glob("*.trace.json.gz"))


def events(path: Path) -> list[dict]:
    with gzip.open(path, "rt") as f:
        return json.load(f)["traceEvents"]


REAL = {
    "eager": DATA / "gpu" / "eager_decode.pt.trace.json.gz",
    "eager_plan_stream": trace_of("all-cuda_graph"),  # eager launches, overlap scheduler on
    "graphs_plan_stream": trace_of("all"),  # CUDA graphs and the plan stream
    "graphs_no_overlap": trace_of("all-overlap"),
    "plan_stream": DATA / "gpu_overlap" / "overlap_decode.trace.json.gz",
    "graphs": DATA / "gpu" / "graph_decode.pt.trace.json.gz",
}


@pytest.mark.parametrize("name", list(REAL))
def test_slack_agrees_with_a_plain_script(name):
    path = REAL[name]
    ev = events(path)
    graph_launches = sum(e.get("name") == "cudaGraphLaunch" for e in ev)
    streams = {(e.get("args") or {}).get("stream") for e in ev if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")}
    if name.startswith("eager"):
        assert graph_launches == 0
    if name.startswith("graphs"):
        assert graph_launches > 0
    if "plan_stream" in name:
        assert len(streams) >= 2  # the plan stream's copies beside the compute stream
    plain = json.loads(subprocess.run([sys.executable, str(PLAIN), str(path)], capture_output=True, text=True, check=True).stdout)
    s = summarize([path], SummarizeOptions(cache=False)).summary
    mine = s["ranks"][0]["overlap_slack"]["transitions"]
    assert [(t["from"], t["to"]) for t in mine] == [(t["from"], t["to"]) for t in plain] and len(plain) >= 4
    for a, b in zip(mine, plain):
        assert abs(a["slack_us"] - b["slack_us"]) <= 0.01, (a, b)
        assert a["exposed_host_us"] == max(0.0, -a["slack_us"])
        # what broke the overlap accounts for the exposed time exactly (the uncovered rest included)
        assert abs(sum(x["us"] for x in a["broken_by"]) - a["exposed_host_us"]) < 1e-6


def _slack(run: str, window: int) -> dict:
    return summarize([trace_of(run, window)], SummarizeOptions(cache=False)).summary["ranks"][0]["overlap_slack"]


@pytest.mark.parametrize("window", [0, 1, 2])
def test_the_overlap_switch_shows_as_exposed_host_time(window):
    base, cand = _slack("all-overlap", window), _slack("all", window)
    assert base["exposed_share"] >= 0.7, base  # the host's work is exposed on most transitions without overlap
    assert cand["exposed_share"] <= 0.15, cand  # almost none with it
    assert base["exposed_us_mean"] > 100 > cand["exposed_us_mean"]
    assert base["median_us"] < 0 < cand["median_us"]
    assert base["p1_us"] <= base["p10_us"] <= base["median_us"]
    assert sum(b["us"] for b in base["exposed_us_by_breaker"]) == pytest.approx(base["exposed_us"])


def test_overlap_diff_reports_the_change_in_exposed_host_time(tmp_path):
    r = subprocess.run([sys.executable, "-m", "profkit", "diff", str(LOO / "all-overlap"), str(LOO / "all"), "--json", str(tmp_path / "d.json"),
                        "--md", str(tmp_path / "d.md")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    d = json.loads((tmp_path / "d.json").read_text())
    x = d["overlap_slack"]["delta"]["exposed_us_mean"]
    assert x["delta"] < -100 and x["noise"] == "beyond noise", x
    assert d["overlap_slack"]["baseline"]["exposed_share"]["median"] == 1.0
    assert d["overlap_slack"]["candidate"]["exposed_share"]["median"] == 0.0
    assert "Exposed host time per transition" in r.stdout and "Exposed host time per transition" in (tmp_path / "d.md").read_text()
    assert r.stdout.splitlines()[0].startswith(("health: ", "capture health degraded: "))  # the health line first, in words (issue 40)


def test_index_share_diff_states_draft_gpu_us_per_accepted_token(tmp_path):
    r = subprocess.run([sys.executable, "-m", "profkit", "diff", str(LOO / "all-index_share"), str(LOO / "all"), "--json", str(tmp_path / "d.json"),
                        "--md", str(tmp_path / "d.md")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    sp = json.loads((tmp_path / "d.json").read_text())["speculative"]
    plain = json.loads(subprocess.run([sys.executable, str(LOO / "plain_phases.py"), str(LOO / "all-index_share"), str(LOO / "all")],
                                      capture_output=True, text=True, check=True).stdout)
    for side in ("baseline", "candidate"):
        w0 = sp[side]["windows"][0]
        # the verify iterations' owned GPU time by phase, window 0: as the stdlib script counts it
        for ph in ("draft", "verify", "draft_extend"):
            assert w0["owned_phase_us"][ph] == pytest.approx(plain[side][ph], abs=0.01)
        # these fixtures predate the per-window accept length: the unprofiled passes' is used, and said
        assert w0["accept_source"] == "unprofiled passes" and w0["accept_length"] == pytest.approx(256 / 85)
        assert w0["phase_us_per_accepted_token"]["draft"] == pytest.approx(w0["owned_phase_us"]["draft"] / w0["accept_length"])
    d = sp["delta"]["phase_us_per_accepted_token"]["draft"]
    assert d == pytest.approx(-56.8, abs=0.5)  # -171.0 µs per verify iteration over 3.01 accepted tokens
    md = (tmp_path / "d.md").read_text()
    assert "draft GPU µs per accepted token 388.8 → 332.0 (-56.8)" in md
    assert "accept length from unprofiled passes" in md


def test_window_accept_length_from_the_manifest_is_preferred(tmp_path):
    """A run recorded by this capture (the manifest's per-window accept record) is priced by its own window."""
    from profkit.analysis.spec import spec_cost

    s = summarize([trace_of("all", 1)], SummarizeOptions(cache=False)).summary
    m = json.loads((LOO / "all" / "manifest.json").read_text())
    for i, w in enumerate(m["profiler_overhead"]["windows"]):
        w["accept"] = {"accept_length": 2.5 + i / 10, "server_accept_length": 2.6, "completion_tokens": 256, "spec_verify_ct": 102, "requests": 1}
    c = msgspec.to_builtins(spec_cost(s, m, 1))  # documents.SpecCost, read as summary.json writes it
    assert c["accept_source"] == "window" and c["accept_length"] == 2.6
    assert c["gpu_us_per_accepted_token"] == pytest.approx(sum(c["owned_phase_us"].values()) / 2.6)
    assert c["wall_us_per_accepted_token"] == pytest.approx(c["wall_us"] / 2.6)


def test_docs_examples_print_what_the_doc_shows():
    """docs/capture-health.md: each `profkit diff ...` example prints the line the doc quotes under it."""
    doc = (Path(__file__).resolve().parent.parent / "docs" / "capture-health.md").read_text()
    blocks = [ln[4:] for ln in doc.splitlines() if ln.startswith("    ")]
    pairs = [(cmd, next(b for b in blocks[i + 1:] if not b.startswith("profkit "))) for i, cmd in enumerate(blocks)
             if cmd.startswith("profkit diff ")]
    assert len(pairs) == 2
    root = Path(__file__).resolve().parent.parent
    for cmd, line in pairs:
        r = subprocess.run([sys.executable, "-m", "profkit", *cmd.split()[1:]], capture_output=True, text=True, cwd=root)
        assert r.returncode == 0, r.stderr
        assert " ".join(line.split()) in " ".join(r.stdout.split()), (cmd, line)  # the terminal wraps at its width
        assert r.stdout.splitlines()[0].startswith(("health: ", "capture health degraded: "))  # the health line first, in words (issue 40)


VLLM_METRICS = """# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 120.0
vllm:spec_decode_num_drafts_total{engine="1",model_name="m"} 80.0
# HELP vllm:spec_decode_num_drafts_created Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_created gauge
vllm:spec_decode_num_drafts_created{engine="0",model_name="m"} 1.7e+09
# TYPE vllm:spec_decode_num_draft_tokens_total counter
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 360.0
vllm:spec_decode_num_draft_tokens_total{engine="1",model_name="m"} 240.0
# TYPE vllm:spec_decode_num_accepted_tokens_total counter
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 200.0
vllm:spec_decode_num_accepted_tokens_total{engine="1",model_name="m"} 100.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="0"} 110.0
"""


def test_vllm_window_accept_length_from_its_spec_counters():
    """vLLM has no per-request verify count: the capture reads its spec_decode counters (Prometheus /metrics,
    summed over engines, `_created` and per-position series left out) before and after the window; the window's
    accepted length is 1 + accepted drafts / drafts (vLLM's own 'Mean acceptance length')."""
    from profkit.capture.vllm import parse_spec_counters, window_accept

    before = parse_spec_counters(VLLM_METRICS)
    assert before == {"drafts": 200.0, "draft_tokens": 600.0, "accepted": 300.0}
    after = {"drafts": 240.0, "draft_tokens": 720.0, "accepted": 390.0}
    got = window_accept(before, after)
    assert got["accept_length"] == pytest.approx(1 + 90 / 40) and got["spec_verify_ct"] == 40 and got["draft_tokens"] == 120
    assert window_accept(before, before) is None  # no verify step inside the window
    assert parse_spec_counters("# HELP vllm:num_requests_running x\nvllm:num_requests_running 1\n") is None  # not speculative


def test_sync_finder_finds_the_latest_sync_overlapping_a_gap():
    """broken_by's lookup of the sync behind a piece of exposed time: same API, same thread (any, without
    one), overlapping the gap; of several, the one that starts last."""
    import polars as pl

    from profkit.analysis.slack import SyncFinder

    syncs = pl.DataFrame({"api": ["cudaStreamSynchronize", "cudaStreamSynchronize", "cudaMemcpyAsync", "cudaStreamSynchronize"],
                          "kind": ["sync", "sync", "sync_copy", "sync"], "direction": [None, None, "d2h", None],
                          "trigger": ["a", "b", "c", "d"], "ts_ns": [0, 50, 60, 70], "end_ns": [200, 90, 100, 80], "tid": ["1", "1", "1", "2"]})
    find = SyncFinder(syncs)
    assert find.latest("cudaStreamSynchronize", "1", 100, 300) == ("sync", None, "a")  # the one still running at 100
    assert find.latest("cudaStreamSynchronize", "1", 60, 300) == ("sync", None, "b")  # both overlap: the later start
    assert find.latest("cudaStreamSynchronize", None, 60, 300) == ("sync", None, "d")  # any thread
    assert find.latest("cudaStreamSynchronize", "2", 80, 300) is None  # ended as the gap began
    assert find.latest("cudaMemcpyAsync", "1", 0, 61) == ("sync_copy", "d2h", "c")
    assert find.latest("cudaMemcpyAsync", "1", 0, 60) is None  # starts as the gap ends
