"""Exact answers on a hand-built trace whose every number is fixed by construction (times in µs)."""

from __future__ import annotations

import polars as pl
import pytest

from factories import TraceBuilder
from factories import synthetic_trace as build
from profkit.analysis import analyze_trace
from profkit.analysis.summary import build_summary
from profkit.analysis.catalog import load_catalog
from profkit.ingest import load_trace

US = 1000


@pytest.fixture
def analysis(tmp_path):
    trace = load_trace(build().write(tmp_path / "t.pt.trace.json.gz"))
    return analyze_trace(trace, catalog=load_catalog("generic"))


def col(a, name):
    return a.iterations[name].to_list()


def test_windows_busy_idle_exact(analysis):
    assert col(analysis, "wall_ns") == [200 * US, 200 * US, 100 * US]
    assert col(analysis, "gpu_window_ns") == [195 * US, 205 * US, 20 * US]
    assert col(analysis, "gpu_busy_ns") == [40 * US, 35 * US, 20 * US]
    assert col(analysis, "gpu_idle_ns") == [155 * US, 170 * US, 0]
    # x_late (it1's, stream 8) runs at 445-460, past it1's window [215, 420) and past the last
    # window's end (440): by the clock it is in no window, so no overlap anywhere; it is it1's spill
    assert col(analysis, "overlap_ns") == [0, 0, 0]
    assert col(analysis, "owned_gpu_ns") == [40 * US, 50 * US, 20 * US]
    assert col(analysis, "spill_ns") == [0, 15 * US, 0]


def test_category_time_is_every_op_inside_the_window(analysis):
    """Counted by hand from build(): it0 k1 10 + k2 20 + k3 10; it1 k4 15 + DtoH 5 + k5 5 + k6 10
    (x_late runs past every window); it2 g1 10 + g2 10. (busy, idle and overlap are pinned above.)"""
    cats = analysis.categories.group_by("iteration").agg(pl.col("dur_ns").sum()).sort("iteration")
    assert cats["dur_ns"].to_list() == [40 * US, 35 * US, 20 * US]
    assert (analysis.iterations["bubble_ns"] <= analysis.iterations["gpu_idle_ns"]).all()


def test_ownership_follows_launch_not_clock(analysis):
    late = analysis.ops.filter(pl.col("name") == "x_late")
    assert late["iteration"].to_list() == [1]
    graph = analysis.ops.filter(pl.col("name").is_in(["g1", "g2"]))
    assert graph["iteration"].to_list() == [2, 2]
    assert graph["launch_api"].to_list() == ["cudaGraphLaunch"] * 2


def test_counts(analysis):
    assert col(analysis, "gpu_kernels") == [3, 4, 2]
    assert col(analysis, "kernel_launches") == [3, 4, 0]
    assert col(analysis, "graph_launches") == [0, 0, 1]
    assert col(analysis, "memcpy_d2h") == [0, 1, 0]
    assert col(analysis, "syncs") == [0, 1, 0]
    assert col(analysis, "sync_copies") == [0, 1, 0]
    assert col(analysis, "kind") == ["decode"] * 3
    assert col(analysis, "batch_size") == [1, 2, 3]


def test_bubble_causes(analysis):
    got = [(r["iteration"], r["start_ns"] // US, r["dur_ns"] // US, r["cause"]) for r in analysis.bubbles.iter_rows(named=True)]
    assert got == [
        (0, 50, 35, "launch"),
        (0, 95, 120, "iteration_boundary"),
        (1, 230, 5, "gpu_wait"),
        (1, 240, 25, "sync"),
        (1, 270, 20, "gpu_wait"),
        (1, 300, 120, "iteration_boundary"),
    ]
    sync_bubble = analysis.bubbles.filter(pl.col("cause") == "sync").row(0, named=True)
    assert "cudaMemcpyAsync" in sync_bubble["cpu_ops"] or "aten::_local_scalar_dense" in sync_bubble["cpu_ops"]


def test_min_bubble_threshold(tmp_path):
    trace = load_trace(build().write(tmp_path / "t.json"))
    a = analyze_trace(trace, min_bubble_us=10.0, catalog=load_catalog("generic"))
    assert sorted(a.bubbles["dur_ns"].to_list()) == [20 * US, 25 * US, 35 * US, 120 * US, 120 * US]


def test_sync_direction_and_trigger(analysis):
    rows = analysis.syncs.select("api", "kind", "direction", "trigger", "blocked_ns").rows()
    assert rows == [
        ("cudaMemcpyAsync", "sync_copy", "d2h", "aten::_local_scalar_dense", 25 * US),
        ("cudaStreamSynchronize", "sync", "d2h", "aten::_local_scalar_dense", 1 * US),
    ]


def test_summary_json_fields(analysis):
    s = build_summary([analysis])
    assert s["schema_version"] == 3
    r = s["ranks"][0]
    it1 = r["iterations"][1]
    assert it1["bubble_us_by_cause"] == {"sync": 25.0, "launch": 0.0, "iteration_boundary": 120.0, "gpu_wait": 25.0}
    assert it1["launch_calls"] == {"cudaLaunchKernel": 4, "cudaMemcpyAsync": 1}
    assert it1["memcpy"] == {"h2d": 0, "d2h": 1, "d2d": 0, "other": 0}
    for it in r["iterations"]:
        assert it["gpu_window_us"] == pytest.approx(it["gpu_busy_us"] + it["gpu_idle_us"], abs=5e-4)
    assert r["median"]["gpu_kernels"] == 3
    assert {k["name"] for k in r["kernels"]} == {"k1", "k2", "k3", "k4", "k5", "k6", "x_late", "g1", "g2", "Memcpy DtoH (Device -> Pageable)"}
    assert [x["trigger"] for x in r["syncs"]] == ["aten::_local_scalar_dense"] * 2
    assert r["warnings"] == []
    # schema v2: phase by the launch's enclosing step[...] span, time by the clock; it1's late kernel is its spill
    assert [i["phase_us"] for i in r["iterations"]] == [{"decode": 40.0}, {"decode": 35.0}, {"decode": 20.0}]
    assert [i["spill_us"] for i in r["iterations"]] == [0.0, 15.0, 0.0]
    assert r["outside_iterations"] == {"gpu_ops": 0, "gpu_us": 0.0, "before_first": 0, "after_last": 0, "no_launch_in_trace": 0,
                                       "device_busy_us": 110.0, "gpu_kernels": 0, "memcpy": {"h2d": 0, "d2h": 0, "d2d": 0, "other": 0},
                                       "memset": 0, "launch_calls": 0, "syncs": 0, "sync_copies": 0}
    assert r["device_records"] == "present" and r["syncs_total"] == 2 and r["bubbles_total"] == len(r["bubbles"])


def test_hip_names_count_as_cuda_twins(tmp_path):
    b = TraceBuilder()
    b.cpu("scheduler.run_batch", 0, 100 * US)
    b.kernel("a", 1 * US, 5 * US, 2 * US, api="hipLaunchKernel")
    b.kernel("b", 2 * US, 8 * US, 2 * US, api="hipExtModuleLaunchKernel")
    corr = b.call("hipGraphLaunch", 3 * US, 1 * US)
    b.op("c", 12 * US, 2 * US, corr)
    b.call("hipStreamSynchronize", 20 * US, 2 * US)
    a = analyze_trace(load_trace(b.write(tmp_path / "rocm.json")), catalog=load_catalog("generic"))
    assert col(a, "kernel_launches") == [2]
    assert col(a, "graph_launches") == [1]
    assert col(a, "syncs") == [1]
    assert col(a, "gpu_kernels") == [3]


def test_marker_fallbacks(tmp_path):
    b = TraceBuilder()
    b.cpu("ProfilerStep#3", 0, 50 * US)
    b.cpu("ProfilerStep#4", 50 * US, 50 * US)
    b.kernel("a", 1 * US, 5 * US, 2 * US)
    b.kernel("b", 51 * US, 55 * US, 2 * US)
    a = analyze_trace(load_trace(b.write(tmp_path / "p.json")), catalog=load_catalog("generic"))
    assert a.marker == r"^ProfilerStep#\d+$"
    assert col(a, "gpu_kernels") == [1, 1]
    assert a.warnings == []

    b = TraceBuilder()
    b.kernel("a", 1 * US, 5 * US, 2 * US)
    a = analyze_trace(load_trace(b.write(tmp_path / "none.json")), catalog=load_catalog("generic"))
    assert col(a, "gpu_kernels") == [1]
    assert any("whole trace" in w for w in a.warnings)


def test_marker_that_matches_nothing_is_exit_1(tmp_path):
    from profkit.errors import NothingToAnalyze

    trace = load_trace(build().write(tmp_path / "t.json"))
    with pytest.raises(NothingToAnalyze) as e:
        analyze_trace(trace, marker="^nope$")
    assert e.value.exit_code == 1


def test_user_marker(tmp_path):
    trace = load_trace(build().write(tmp_path / "t.json"))
    a = analyze_trace(trace, marker=r"^step\[", catalog=load_catalog("generic"))
    assert a.iterations.height == 3
    # step spans start 1 µs later: the windows shift but ownership is unchanged
    assert col(a, "gpu_kernels") == [3, 4, 2]


def test_schema_variants_warn_not_crash(tmp_path):
    b = build()
    for ev in b.events[:5]:
        ev["ts"] = str(ev["ts"])
    for ev in b.events:
        if "correlation" in ev.get("args", {}):
            ev["args"]["correlation"] = float(ev["args"]["correlation"])
    trace = load_trace(b.write(tmp_path / "v.json"))
    assert any("non-standard types" in w for w in trace.warnings)
    a = analyze_trace(trace, catalog=load_catalog("generic"))
    assert col(a, "gpu_kernels") == [3, 4, 2]


def test_rank_from_distributed_info_then_name_then_order(tmp_path):
    from profkit.ingest import load_traces

    b = build()
    b.extra["distributedInfo"] = {"rank": 5, "world_size": 8}
    p1 = b.write(tmp_path / "a.json")
    p2 = build().write(tmp_path / "run-TP-3.trace.json.gz")
    p3 = build().write(tmp_path / "zzz.json")
    ts = load_traces([p1, p2, p3])
    assert sorted(t.rank for t in ts) == [2, 3, 5]


def test_cpu_only_trace(tmp_path):
    b = TraceBuilder()
    b.cpu("scheduler.run_batch", 0, 10 * US)
    b.cpu("aten::mm", 1 * US, 5 * US, cat="cpu_op")
    b.cpu("scheduler.run_batch", 20 * US, 10 * US)
    b.cpu("aten::relu", 2 * US, 1 * US, cat="cpu_op")  # nested: not a top-level op
    a = analyze_trace(load_trace(b.write(tmp_path / "cpu.json")), catalog=load_catalog("generic"))
    assert a.device_timeline == "cpu"
    assert col(a, "gpu_kernels") == [1, 0]  # the outermost aten op stands in for a device op
    assert col(a, "gpu_window_ns") == [5 * US, 0]
    assert col(a, "gpu_busy_ns") == [5 * US, 0]
    assert col(a, "kernel_launches") == [0, 0]
    assert col(a, "wall_ns") == [20 * US, 10 * US]
    assert any("CPU-only" in w for w in a.warnings)


def test_another_accelerators_device_is_named_not_called_a_gpu(tmp_path):
    # an MTIA trace (as in HTA's test data): device ops and runtime calls in their own categories
    b = TraceBuilder()
    b.cpu("ProfilerStep#1", 0, 100 * US)
    b.cpu("aten::mm", 10 * US, 20 * US, cat="cpu_op")
    b.op("pe_exe", 40 * US, 10 * US, 7, cat="mtia_ccp_events")
    b.op("launch", 12 * US, 2 * US, 7, cat="mtia_runtime")
    a = analyze_trace(load_trace(b.write(tmp_path / "t.pt.trace.json.gz")), catalog=load_catalog("generic"))
    assert sum("MTIA accelerator" in w and "mtia_ccp_events" in w for w in a.warnings) == 1, a.warnings
    assert a.device_timeline == "cpu"
    # the tiered decoder (damaged or odd files) says the same
    from profkit.ingest.decode import decode_events, read_bytes
    from profkit.ingest.tables import events_frame, split_tables

    path = tmp_path / "t.pt.trace.json.gz"
    events, _, warnings = decode_events(path, read_bytes(path))
    split_tables(events_frame(events, warnings)[0], warnings)
    assert sum("MTIA accelerator" in w for w in warnings) == 1


def test_launch_calls_without_device_records_are_missing_records_not_a_cpu_run(tmp_path):
    # the CUPTI range profiler's traces (HTA's cupti_profiler data): launches, no kernel records
    b = TraceBuilder()
    for i in range(3):
        b.cpu("ProfilerStep#%d" % i, i * 100 * US, 90 * US)
        b.cpu("aten::mm", (i * 100 + 5) * US, 30 * US, cat="cpu_op")
        b.call("cudaLaunchKernel", (i * 100 + 10) * US, 5 * US)
    a = analyze_trace(load_trace(b.write(tmp_path / "t.pt.trace.json.gz")), catalog=load_catalog("generic"))
    assert a.device_records == "missing" and a.device_timeline == "gpu"
    assert sum("device records are missing" in w for w in a.warnings) == 1
    assert not any("CPU-only" in w for w in a.warnings)
    assert a.iterations["kernel_launches"].to_list() == [1, 1, 1]
    assert a.iterations["gpu_busy_ns"].to_list() == [0, 0, 0]
