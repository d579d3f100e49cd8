"""Capture health (issue 31, DESIGN.md "Capture health"): each check on a real H200 trace altered in exactly
that way gets the check's verdict, the unaltered trace gets ok; every fixture and every public trace gets
a verdict (or profkit's one-line refusal) without a crash; --strict exits 5 on a degraded capture."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from profkit.errors import ProfkitError, TraceInputError
from profkit.analysis.summarize import SummarizeOptions, summarize
from support.helpers import load_trace_json, save_trace_json

DATA = Path(__file__).parent / "data"
GRAPHS = next((DATA / "gpu_loo" / "all" / "window-0").glob("*.trace.json.gz"))  # CUDA graphs, plan stream
EAGER = DATA / "gpu" / "eager_decode.pt.trace.json.gz"
TP2 = sorted((DATA / "gpu_tp2").glob("*.trace.json.gz"))
PUBLIC = Path(__file__).resolve().parents[2] / "shared" / "public-traces"
GPU_OPS = ("kernel", "gpu_memcpy", "gpu_memset")


load, save = load_trace_json, save_trace_json


def health_of(*paths: Path) -> dict:
    s = summarize(list(paths), SummarizeOptions(cache=False)).summary
    return s


def checks(summary: dict) -> set[str]:
    return {f["check"] for f in summary["health"]["findings"]}


def markers(doc: dict) -> list[dict]:
    return sorted((e for e in doc["traceEvents"] if e.get("ph") == "X" and e.get("name") == "scheduler.run_batch"
                   and e.get("cat") in ("user_annotation", "cpu_op")), key=lambda e: e["ts"])


def launches_in(doc: dict, lo: float, hi: float, names: tuple[str, ...] | None = None) -> list[dict]:
    return [e for e in doc["traceEvents"] if e.get("ph") == "X" and e.get("cat") in ("cuda_runtime", "cuda_driver")
            and lo <= e["ts"] < hi and "correlation" in (e.get("args") or {}) and (names is None or e["name"] in names)]


def drop_correlations(doc: dict, corr: set[int]) -> int:
    before = len(doc["traceEvents"])
    doc["traceEvents"] = [e for e in doc["traceEvents"] if not (e.get("cat") in GPU_OPS and (e.get("args") or {}).get("correlation") in corr)]
    return before - len(doc["traceEvents"])


@pytest.mark.parametrize("trace", [GRAPHS, EAGER], ids=["graphs", "eager"])
def test_unaltered_real_traces_are_ok(trace, tmp_path):
    # copied alone: no run manifest beside it, so no profiler-overhead figure (the gpu_loo manifests say 2.2-3.2x)
    s = health_of(save(load(trace), tmp_path / "t.trace.json.gz"))
    assert s["health"]["verdict"] == "ok", s["health"]
    assert s["ranks"][0]["capture"]["cut_markers"]["count"] == 0


def test_replay_with_its_kernels_deleted(tmp_path):
    doc = load(GRAPHS)
    m = markers(doc)
    g = launches_in(doc, m[3]["ts"], m[4]["ts"], ("cudaGraphLaunch",))[0]
    assert drop_correlations(doc, {g["args"]["correlation"]}) > 10  # a replay has many kernels
    s = health_of(save(doc, tmp_path / "t.trace.json.gz"))
    assert s["health"]["verdict"] == "degraded" and checks(s) == {"graph_replays_missing"}, s["health"]
    assert s["ranks"][0]["capture"]["graph_replays_missing"] == {"count": 1, "graph_launches": 24, "iterations": [3]}
    assert {"gpu_busy_us", "category_us", "gpu_kernels"} <= set(s["health"]["metrics"])


def test_first_window_device_records_deleted(tmp_path):
    doc = load(EAGER)
    m = markers(doc)
    first = launches_in(doc, m[0]["ts"], m[1]["ts"])
    n = drop_correlations(doc, {e["args"]["correlation"] for e in first[: len(first) // 2]})
    assert n > 0
    s = health_of(save(doc, tmp_path / "t.trace.json.gz"))
    assert s["health"]["verdict"] == "degraded" and checks(s) == {"start_records_missing"}, s["health"]
    got = s["ranks"][0]["capture"]["start_records_missing"]
    assert got["count"] == n and got["missing_later"] == 0


def test_one_ranks_clock_shifted(tmp_path):
    ok = health_of(*[save(load(p), tmp_path / "ok" / p.name) for p in TP2])  # copied without the manifest (11.7x overhead)
    assert ok["health"]["verdict"] == "ok", ok["health"]
    wall = max(r["median"]["wall_us"] for r in ok["ranks"])
    doc = load(TP2[1])
    for e in doc["traceEvents"]:
        if "ts" in e and e.get("ph") in ("X", "i", "s", "f", "b", "e"):
            e["ts"] += 3 * wall  # three iterations later: what a rank whose profiler started late records
    s = health_of(save(load(TP2[0]), tmp_path / "bad" / TP2[0].name), save(doc, tmp_path / "bad" / TP2[1].name))
    assert s["health"]["verdict"] == "degraded" and checks(s) == {"rank_start_skew"}, s["health"]
    assert "cross_rank" in s["health"]["metrics"]


def test_two_ops_overlap_on_one_stream(tmp_path):
    doc = load(EAGER)
    ops = sorted((e for e in doc["traceEvents"] if e.get("cat") == "kernel"), key=lambda e: (e["args"]["stream"], e["ts"]))
    a, b = next((x, y) for x, y in zip(ops, ops[1:]) if x["args"]["stream"] == y["args"]["stream"] and x["dur"] > 5)
    b["ts"] = a["ts"] + a["dur"] / 2  # starts while `a` still runs on the same stream
    s = health_of(save(doc, tmp_path / "t.trace.json.gz"))
    assert "stream_overlap" in checks(s), s["health"]
    assert s["ranks"][0]["capture"]["stream_overlap"]["count"] >= 1
    assert {"gpu_busy_us", "overlap_us"} <= set(s["health"]["metrics"])


def test_gpu_work_deferred_past_the_next_window(tmp_path):
    doc = load(EAGER)
    m = markers(doc)
    corr = {e["args"]["correlation"] for e in launches_in(doc, m[1]["ts"], m[2]["ts"], ("cudaLaunchKernel",))}
    ks = [e for e in doc["traceEvents"] if e.get("cat") == "kernel" and e["args"].get("correlation") in corr]
    k = ks[0]
    same = [e for e in doc["traceEvents"] if e.get("cat") in GPU_OPS and e["args"].get("stream") == k["args"]["stream"]]
    k["ts"] = max(e["ts"] + e["dur"] for e in same) + 5.0  # after every op of its stream: runs in the last window
    s = health_of(save(doc, tmp_path / "t.trace.json.gz"))
    assert checks(s) == {"deferred_work"}, s["health"]
    assert s["ranks"][0]["capture"]["deferred_work"]["iterations"] == [1]


def test_stub_marker_cut_by_the_profilers_stop(tmp_path):
    doc = load(EAGER)
    last = markers(doc)[-1]
    end = max(e["ts"] + e.get("dur", 0) for e in doc["traceEvents"] if e.get("ph") == "X")
    # SGLang 0.5.23's last span of a window: a run_batch with no step[...] inside, cut at the profiler's stop
    doc["traceEvents"].append({**last, "ts": end + 50.0, "dur": 8000.0, "args": {}})
    s = health_of(save(doc, tmp_path / "t.trace.json.gz"))
    cut = s["ranks"][0]["capture"]["cut_markers"]
    assert cut["count"] == 1, cut
    if cut["dropped"]:  # the iteration finder dropped it (issue 27): counted and said, no figure in doubt
        assert s["health"]["verdict"] == "ok" and "1 marker span(s) cut" in __import__("profkit.report.health_text", fromlist=["x"]).health_text(s["health"])
    else:  # kept as an iteration: its figures are the stub's
        assert s["health"]["verdict"] == "degraded" and checks(s) == {"cut_markers"}, s["health"]


def test_profiler_overhead_from_the_manifest(tmp_path):
    trace = save(load(EAGER), tmp_path / "run" / "t.trace.json.gz")
    for slowdown, verdict in ((1.2, "ok"), (2.0, "degraded")):
        (tmp_path / "run" / "manifest.json").write_text(json.dumps({"profiler_overhead": {"slowdown": slowdown}}))
        s = health_of(trace)
        assert s["health"]["verdict"] == verdict, (slowdown, s["health"])
    assert checks(s) == {"profiler_overhead"} and "wall_us" in s["health"]["metrics"]


def test_truncated_gzip_is_unusable(tmp_path):
    raw = GRAPHS.read_bytes()
    bad = tmp_path / "t.trace.json.gz"
    bad.write_bytes(raw[: len(raw) // 2])
    r = subprocess.run([sys.executable, "-m", "profkit", "analyze", str(bad), "--no-cache"], capture_output=True, text=True)
    assert r.returncode == 3, r.stderr
    assert "capture health: unusable" in r.stderr and str(bad) in r.stderr


def test_strict_exits_5_on_a_degraded_capture_and_0_on_ok(tmp_path):
    doc = load(GRAPHS)
    m = markers(doc)
    g = launches_in(doc, m[2]["ts"], m[3]["ts"], ("cudaGraphLaunch",))[0]
    drop_correlations(doc, {g["args"]["correlation"]})
    bad = save(doc, tmp_path / "bad" / "t.trace.json.gz")
    good = save(load(GRAPHS), tmp_path / "good" / "t.trace.json.gz")
    for path, code in ((good, 0), (bad, 5)):
        r = subprocess.run([sys.executable, "-m", "profkit", "analyze", str(path), "--strict", "--no-cache"], capture_output=True, text=True)
        assert r.returncode == code, r.stderr
        first = r.stdout.splitlines()[0]
        assert first.startswith("health: ok" if code == 0 else "capture health degraded: "), first  # in words (issue 40)
    r = subprocess.run([sys.executable, "-m", "profkit", "diff", str(good), str(bad), "--strict", "--md", str(tmp_path / "d.md")],
                       capture_output=True, text=True)
    assert r.returncode == 5, r.stderr
    first = (tmp_path / "d.md").read_text().splitlines()[0]
    assert "graph replays without their kernels recorded" in first and "graph\\_replays" not in first  # words, not field names (issue 40)


def _all_inputs() -> list[Path]:
    out = [p for p in sorted(DATA.rglob("*")) if p.is_file() and p.name.endswith((".json.gz", ".json"))
           and "graph_capture_profile" not in p.parts and not p.name.endswith(("manifest.json", "expected.json", "summary.json"))
           and p.parent.name not in ("v1",) and "expected" not in p.name and "variants" not in p.name]
    return out


def _verdict_or_refusal(path: Path) -> str:
    try:
        s = summarize([path], SummarizeOptions(cache=False)).summary
    except ProfkitError as e:  # profkit's one-line refusal (not a trace, a run of several, truncated ...)
        if isinstance(e, TraceInputError) and "truncat" in str(e).lower() + (e.hint or "").lower():
            assert "capture health: unusable" in str(e), str(e)
        return f"refused ({type(e).__name__})"
    assert s["health"]["verdict"] in ("ok", "degraded", "unusable"), s["health"]
    return s["health"]["verdict"]


def test_every_fixture_gets_a_verdict():
    got = {str(p.relative_to(DATA)): _verdict_or_refusal(p) for p in _all_inputs()}
    assert got["gpu/eager_decode.pt.trace.json.gz"] == "ok"
    assert got["bad/truncated.json.gz"].startswith("refused")
    assert sum(v in ("ok", "degraded", "unusable") for v in got.values()) >= 20, got


@pytest.mark.skipif(not PUBLIC.is_dir(), reason=f"third-party traces not present ({PUBLIC}): they are never committed")
def test_every_public_trace_gets_a_verdict():
    files = [p for p in sorted(PUBLIC.rglob("*")) if p.is_file() and p.name.endswith((".json.gz", ".json", ".sqlite"))]
    assert files
    got = {p.name: _verdict_or_refusal(p) for p in files}
    # the public HTA CUPTI benchmark trace has runtime calls and no device records at all
    assert got["hta_cupti_profiler_benchmark_result_924719_1679055439_trace.json.gz"] == "unusable"
    # a vLLM B200 trace whose overlapping kernels on one stream are programmatic dependent launches: not an artefact
    assert got["tracelens_vllm_gpt-oss-120b_b200_tp8_eager_prefill_step.json.gz"] == "ok"
    # SGLang's graph-capture profile: warm-up captures only, no served step (issue 36)
    assert got["tracelens_sglang_qwen3-8b_mi300x_graph_capture_bs32.json.gz"] == "degraded"
    # vLLM's piecewise graphs: the last piece has 12 of the others' 15 ops, another graph, not an under-recorded replay
    assert got["tracelens_vllm_gpt-oss-20b_mi300x_mixed_piecewise_step.json.gz"] == "ok"


# ------------------------------------------------------------------ issue 36: partial damage

def _replay_ops(doc: dict, corr: int) -> list[dict]:
    return [e for e in doc["traceEvents"] if e.get("cat") in GPU_OPS and (e.get("args") or {}).get("correlation") == corr]


def test_replay_with_most_of_its_kernels_removed(tmp_path):
    """One replay's kernels removed, its copies left (the issue: 120 kernels removed, 10 memsets left, `health: ok`):
    under-recorded against the other replays launched from the same site (`step[VERIFY bs=1]`)."""
    doc = load(GRAPHS)
    m = markers(doc)
    verify = [a for a in doc["traceEvents"] if a.get("cat") == "user_annotation" and a["name"].startswith("step[VERIFY")]
    g = next(g for g in launches_in(doc, m[3]["ts"], m[4]["ts"], ("cudaGraphLaunch",))
             if any(a["ts"] <= g["ts"] and g["ts"] + g["dur"] <= a["ts"] + a["dur"] for a in verify))
    corr = g["args"]["correlation"]
    before = _replay_ops(doc, corr)
    doc["traceEvents"] = [e for e in doc["traceEvents"] if not (e.get("cat") == "kernel" and (e.get("args") or {}).get("correlation") == corr)]
    left = _replay_ops(doc, corr)
    assert 0 < len(left) < len(before) // 2, (len(left), len(before))  # copies stay: graph_replays_missing does not see it
    s = health_of(save(doc, tmp_path / "t.trace.json.gz"))
    assert s["health"]["verdict"] == "degraded" and checks(s) == {"graph_replays_under_recorded"}, s["health"]
    got = s["ranks"][0]["capture"]["graph_replays_under_recorded"]
    assert (got["count"], got["iterations"], got["ops_missing"]) == (1, [3], len(before) - len(left))
    assert got["worst"] == {"ops": len(left), "pattern_ops": len(before), "iteration": 3, "site": "step[VERIFY bs=1]"}
    assert {"gpu_idle_us", "gpu_busy_us", "gpu_kernels"} <= set(s["health"]["metrics"])
    assert s["ranks"][0]["capture"]["graph_replays_missing"]["count"] == 0


def test_op_longer_than_its_window(tmp_path):
    doc = load(EAGER)
    m = markers(doc)
    corr = {e["args"]["correlation"] for e in launches_in(doc, m[2]["ts"], m[3]["ts"], ("cudaLaunchKernel",))}
    k = next(e for e in doc["traceEvents"] if e.get("cat") == "kernel" and e["args"].get("correlation") in corr)
    k["dur"] = 3 * (m[3]["ts"] - m[2]["ts"])  # three times iteration 2's CPU window (its GPU window is shorter)
    s = health_of(save(doc, tmp_path / "t.trace.json.gz"))
    got = s["ranks"][0]["capture"]["impossible_durations"]
    assert got["longer_than_window"] == 1 and got["iterations"] == [2] and got["worst"]["dur_us"] == pytest.approx(k["dur"], abs=0.001)
    assert "window" in got["worst"]["rules"]
    # it also runs over the ops after it on its stream: the overflow rule and stream_overlap say so too
    assert "impossible_durations" in checks(s) and checks(s) <= {"impossible_durations", "stream_overlap"}, s["health"]
    assert s["health"]["verdict"] == "degraded" and {"gpu_busy_us", "gpu_window_us", "category_us"} <= set(s["health"]["metrics"])


def test_dur_that_overflowed_the_next_op_of_its_replay(tmp_path):
    """TraceLens #669: a kernel's `dur` runs past the next op on its stream; inside one graph replay (one
    correlation) no other check sees it."""
    doc = load(GRAPHS)
    m = markers(doc)
    g = launches_in(doc, m[2]["ts"], m[3]["ts"], ("cudaGraphLaunch",))[0]
    ops = sorted(_replay_ops(doc, g["args"]["correlation"]), key=lambda e: e["ts"])
    a, b = ops[10], ops[11]
    assert a["args"]["stream"] == b["args"]["stream"]
    a["dur"] = b["ts"] + b["dur"] - a["ts"] + 1.0  # ends 1 µs after the next op ended
    s = health_of(save(doc, tmp_path / "t.trace.json.gz"))
    assert s["health"]["verdict"] == "degraded" and checks(s) == {"impossible_durations"}, s["health"]
    got = s["ranks"][0]["capture"]["impossible_durations"]
    assert (got["count"], got["overflow"], got["longer_than_window"], got["beyond_name"], got["iterations"]) == (1, 1, 0, 0, [2])


def test_op_far_beyond_every_other_op_of_its_name(tmp_path):
    """The last op on its stream (nothing after it to overrun, its window ends with it) given 200x the longest
    other op of its name."""
    doc = load(EAGER)
    gpu = [e for e in doc["traceEvents"] if e.get("cat") in GPU_OPS]
    last = max(gpu, key=lambda e: e["ts"])
    same = [e for e in gpu if e["name"] == last["name"] and e is not last]
    assert len(same) >= 2
    last["dur"] = max(1000.0, 200 * max(e["dur"] for e in same))
    s = health_of(save(doc, tmp_path / "t.trace.json.gz"))
    assert s["health"]["verdict"] == "degraded" and checks(s) == {"impossible_durations"}, s["health"]
    got = s["ranks"][0]["capture"]["impossible_durations"]
    assert (got["count"], got["beyond_name"], got["overflow"]) == (1, 1, 0) and got["worst"]["rules"] == ["name"]


CAPTURE_PROFILE = DATA / "gpu_spec" / "all" / "graph_capture_profile" / "cuda_graph_capture-Proxyverify_bs1_w256_p1-TP-0.json.gz"


def test_capture_only_trace(tmp_path):
    """A real H200 graph-capture profile (cudaStreamBeginCapture ... EndCapture, two warm-up kernels) inside a
    `ProfilerStep#1` span, as SGLang's own capture profiles are: its one iteration is a capture, no served step."""
    doc = load(CAPTURE_PROFILE)
    xs = [e for e in doc["traceEvents"] if e.get("ph") == "X"]
    lo, hi = min(e["ts"] for e in xs), max(e["ts"] + e.get("dur", 0) for e in xs)
    first = next(e for e in xs if e.get("cat") == "user_annotation")
    doc["traceEvents"].append({"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": first["pid"], "tid": first["tid"],
                               "ts": lo - 1.0, "dur": hi - lo + 2.0, "args": {}})
    s = health_of(save(doc, tmp_path / "t.trace.json.gz"))
    assert [it["kind"] for it in s["ranks"][0]["iterations"]] == ["graph_capture"]
    assert s["health"]["verdict"] == "degraded" and checks(s) == {"capture_only"}, s["health"]
    assert s["ranks"][0]["capture"]["capture_only"] == {"flagged": True, "capture_iterations": 1, "iterations": 1}
    assert {"wall_us", "gpu_busy_us", "gpu_window_us"} <= set(s["health"]["metrics"])
    # the profile as recorded (no marker: the whole trace is one window) is capture-only too
    plain = health_of(save(load(CAPTURE_PROFILE), tmp_path / "plain" / "t.trace.json.gz"))
    assert "capture_only" in checks(plain)


@pytest.mark.skipif(not PUBLIC.is_dir(), reason=f"third-party traces not present ({PUBLIC}): they are never committed")
def test_public_sglang_capture_trace_is_capture_only():
    s = health_of(PUBLIC / "tracelens_sglang_qwen3-8b_mi300x_graph_capture_bs32.json.gz")
    assert s["health"]["verdict"] == "degraded" and checks(s) == {"capture_only"}, s["health"]


def test_stream_checks_in_ingest_order_and_in_any_other():
    """The stream checks take the ops by start time, as ingest leaves them, without sorting them; in any other
    order they sort them: the same facts either way (two streams, a graph replay's three ops, an overlap, an
    overflow, an op far beyond its name)."""
    import polars as pl

    from profkit.analysis.health import _impossible, _stream_overlap

    # (stream, correlation, ts, end, name): stream 7 eager, stream 8 one replay (correlation 10) then eager ops
    rows = [(7, 1, 0, 1_000, "a"), (8, 10, 0, 500, "g"), (8, 10, 500, 800, "g"), (8, 10, 800, 900, "g"), (7, 2, 1_000, 2_000, "b"),
            (7, 3, 1_500, 2_500, "b"), (8, 11, 1_000, 1_010, "k"), (8, 12, 2_000, 2_010, "k"), (7, 4, 3_000, 9_000, "c"),
            (7, 5, 3_500, 4_000, "c"), (8, 13, 4_000, 5_004_000, "k")]
    ops = pl.DataFrame([{"name": n, "ts_ns": t, "dur_ns": e - t, "end_ns": e, "device": 0, "stream": s, "correlation": c,
                         "iteration": 0, "launch_api": "cudaLaunchKernel"} for s, c, t, e, n in rows])
    win = pl.DataFrame({"iteration": [0], "cpu_start_ns": [0], "cpu_end_ns": [10**10], "kind": ["decode"]})
    windows = pl.DataFrame({"iteration": [0], "gpu_start_ns": [0], "gpu_end_ns": [5_004_000]})
    no_capture = pl.Series([], dtype=pl.Int64).implode()
    overlap, odd = _stream_overlap(ops), _impossible(ops, win, windows, no_capture)
    assert (overlap.count, overlap.streams) == (2, [7])  # correlation 3 over 2, 5 over 4
    assert (odd.overflow, odd.beyond_name, odd.count) == (1, 1, 2) and odd.worst is not None and odd.worst.name == "k"
    for other in (ops.reverse(), ops.sort("stream", "ts_ns", descending=True), ops.sample(fraction=1.0, shuffle=True, seed=3)):
        assert _stream_overlap(other) == overlap
        assert _impossible(other, win, windows, no_capture) == odd
