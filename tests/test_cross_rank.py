"""Cross-rank analysis on synthetic rank pairs whose straggler and clock offset are fixed by construction."""

from __future__ import annotations

from factories import TraceBuilder
from profkit.analysis import analyze_trace
from profkit.analysis.ranks import cross_rank
from profkit.analysis.catalog import load_catalog
from profkit.ingest import load_trace

US = 1000
CAT = load_catalog("generic")


def rank_trace(tmp_path, rank: int, *, delay_us: int, clock_us: int, iterations: int = 4):
    """Per iteration: a 50 µs kernel (+delay on this rank), then an all-reduce that ends when the
    slowest rank arrives (true time), all shifted by this rank's clock offset."""
    b = TraceBuilder(pid=100 + rank, tid=100 + rank, device=rank)
    b.extra["distributedInfo"] = {"rank": rank, "world_size": 2}
    c = clock_us * US
    for i in range(iterations):
        t0 = i * 1000 * US
        b.cpu("scheduler.run_batch", c + t0, 900 * US)
        b.cpu("step[DECODE bs=8]", c + t0 + 1 * US, 800 * US)
        b.kernel("gemm_kernel", c + t0 + 5 * US, c + t0 + 10 * US, (50 + delay_us) * US)
        arrive = t0 + 10 * US + (50 + delay_us) * US
        done = t0 + 10 * US + (50 + 30) * US + 20 * US  # the slowest rank (delay 30) arrives, then 20 µs of transfer
        b.kernel("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", c + t0 + 6 * US, c + arrive, done - arrive)
    return b.write(tmp_path / f"run-TP-{rank}.trace.json.gz")


def test_straggler_and_clock_offset(tmp_path):
    a0 = analyze_trace(load_trace(rank_trace(tmp_path, 0, delay_us=0, clock_us=0)), catalog=CAT)
    a1 = analyze_trace(load_trace(rank_trace(tmp_path, 1, delay_us=30, clock_us=5000)), catalog=CAT)
    x = cross_rank([a0, a1])
    assert x["clock_offsets_us"] == {"0": 0.0, "1": 5000.0}
    assert x["aligned_iterations"] == 4
    assert x["warnings"] == []
    for it in x["iterations"]:
        assert it["straggler_rank"] == 1
        assert it["collectives"] == {"0": 1, "1": 1}
        assert it["comm_wait_us"] == {"0": 30.0, "1": 0.0}  # rank 0 waits 30 µs for rank 1
        assert it["gpu_start_skew_us"] == 0.0  # both ranks start the iteration together once clocks align
    s = {r["rank"]: r for r in x["stragglers"]}
    assert s[1]["times_straggler"] == 4 and s[1]["mean_wait_caused_us"] == 30.0
    assert s[0]["times_straggler"] == 0 and s[0]["mean_comm_wait_us"] == 30.0


def test_mismatched_shapes_warn(tmp_path):
    a0 = analyze_trace(load_trace(rank_trace(tmp_path, 0, delay_us=0, clock_us=0)), catalog=CAT)
    a1 = analyze_trace(load_trace(rank_trace(tmp_path, 1, delay_us=30, clock_us=0, iterations=3)), catalog=CAT)
    x = cross_rank([a0, a1])
    assert x["aligned_iterations"] == 3
    assert any("aligning the first 3" in w for w in x["warnings"])
