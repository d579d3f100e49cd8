"""Why a tiny kernel measures longer graph-replayed than launched eagerly (issue 19), without the proxy.

    python benchmarks/gpu_tiny_kernel_timing.py [OUT.json]      # on a CUDA machine

One fixed sequence of 40 small ATen kernels (fills, negations, products, sums, absolute values and
index gathers on 4,096-element tensors, then on 1M-element ones, every output preallocated, so the sequence can be captured), run
five ways, each 200 times under torch.profiler (CPU + CUDA activities, as profkit's captures):

  eager idle     each kernel launched to an idle GPU (the host waits 30 µs after each launch):
                 what the proxy's eager mode is, launch-bound
  eager queued   a 1 ms device sleep, then the 40 launches: they queue behind it and run back to back
  graph          the sequence captured once, replayed after a synchronize (GPU idle before the graph)
  graph queued   the replay queued behind a 1 ms device sleep
  graph in graph the sleep and the sequence captured together (no host call between)

Read back with plain json: per kernel position, the median CUPTI duration in each mode; printed: the
mean over positions of mode/eager-idle, and the sequence's span (first start to last end) per kernel.

The two back-to-back modes are also timed without the profiler (CUDA events; 200 kernels minus 40,
queued behind a sleep, over 160): what one more kernel costs, duration and gap, when nobody traces,
next to the profiled span per kernel. Asserts nothing.
"""

from __future__ import annotations

import gzip
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

SIZES = (4096, 1 << 20)  # floats per tensor: ~1 µs kernels, and ~5-10 µs ones
REPS = 200
SLEEP_CYCLES = 2_000_000  # ~1 ms at ~2 GHz


def kernels(n: int) -> list:
    """The 40 launches, one closure each (every output preallocated)."""
    d = "cuda"
    x, y = torch.randn(n, device=d), torch.randn(n, device=d)
    idx = torch.randint(0, n, (n // 4,), device=d)
    o = [torch.empty(n, device=d) for _ in range(7)]
    g = torch.empty(n // 4, device=d)
    fs = []
    for i in range(5):
        fs += [
            lambda v=1.0 + i: o[0].fill_(v),
            lambda: torch.neg(x, out=o[1]),
            lambda: torch.mul(x, y, out=o[2]),
            lambda: torch.add(o[2], o[1], out=o[3]),
            lambda: torch.index_select(o[3], 0, idx, out=g),
            lambda: torch.abs(o[3], out=o[4]),
            lambda: torch.mul(o[4], 0.5, out=o[5]),
            lambda: torch.sub(o[5], x, out=o[6]),
        ]
    return fs


def spin(us: float) -> None:
    t = time.perf_counter() + us * 1e-6
    while time.perf_counter() < t:
        pass


def durations(trace: Path) -> tuple[list[list[float]], list[float]]:
    """Per sequence of 40 kernels (in start order), their CUPTI durations; and the sequence's span (first start to last end) / 40."""
    ev = json.load(gzip.open(trace) if trace.suffix == ".gz" else open(trace))["traceEvents"]
    ks = sorted((e for e in ev if e.get("cat") == "kernel" and float(e["dur"]) < 100), key=lambda e: e["ts"])
    seqs, spacing = [], []
    for i in range(0, len(ks) - len(ks) % 40, 40):
        s = ks[i:i + 40]
        seqs.append([float(e["dur"]) for e in s])
        spacing.append((s[-1]["ts"] + s[-1]["dur"] - s[0]["ts"]) / 40)
    return seqs, spacing


def profiled(run, tmp: Path, name: str):
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as p:
        for _ in range(REPS):
            run()
        torch.cuda.synchronize()
    out = tmp / f"{name}.json"
    p.export_chrome_trace(str(out))
    return durations(out)


def measure(n: int) -> dict:
    fs = kernels(n)

    def seq2():
        for f in fs:
            f()

    def eager_idle():  # one kernel at a time to an idle GPU
        for f in fs:
            f()
            spin(30)
        torch.cuda.synchronize()

    def eager_queued():
        torch.cuda._sleep(SLEEP_CYCLES)
        seq2()
        torch.cuda.synchronize()

    for _ in range(10):
        seq2()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            seq2()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    with torch.cuda.graph(graph):
        seq2()
    both = torch.cuda.CUDAGraph()
    with torch.cuda.graph(both):
        torch.cuda._sleep(SLEEP_CYCLES)
        seq2()
    torch.cuda.synchronize()

    def graph_idle():
        graph.replay()
        torch.cuda.synchronize()

    def graph_queued():
        torch.cuda._sleep(SLEEP_CYCLES)
        graph.replay()
        torch.cuda.synchronize()

    def graph_in_graph():
        both.replay()
        torch.cuda.synchronize()

    modes = {"eager idle": eager_idle, "eager queued": eager_queued, "graph": graph_idle,
             "graph queued": graph_queued, "graph in graph": graph_in_graph}
    res: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        for name, run in modes.items():
            for _ in range(5):
                run()
            seqs, spacing = profiled(run, tmp, name.replace(" ", "_"))
            per_pos = [statistics.median(col) for col in zip(*seqs)]
            res[name] = {"sequences": len(seqs), "median_dur_by_position": per_pos,
                         "median_span_per_kernel_us": statistics.median(spacing)}

    # without the profiler: what one more kernel costs (dur + gap), from sequences of 40 and 200 (the 40 five
    # times), queued behind a device sleep long enough for the host to enqueue them all; CUDA events around them
    def timed(run_seq, reps: int = REPS) -> float:
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        ts = []
        for _ in range(reps):
            torch.cuda._sleep(4 * SLEEP_CYCLES)
            a.record()
            run_seq()
            b.record()
            torch.cuda.synchronize()
            ts.append(a.elapsed_time(b) * 1000.0)
        return statistics.median(ts)

    def seq5():
        for _ in range(5):
            seq2()

    graph5 = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph5):
        seq5()
    torch.cuda.synchronize()
    unprofiled = {"eager queued": (timed(seq5) - timed(seq2)) / 160, "graph queued": (timed(graph5.replay) - timed(graph.replay)) / 160}

    base = res["eager idle"]["median_dur_by_position"]
    table = {}
    for name, r in res.items():
        rel = [a / b for a, b in zip(r["median_dur_by_position"], base)]
        table[name] = {"mean_dur_us": statistics.mean(r["median_dur_by_position"]),
                       "ratio_to_eager_idle": statistics.mean(rel),
                       "span_per_kernel_us": r["median_span_per_kernel_us"]}
    print(f"tensors of {n:,} floats")
    print(f"{'mode':16} {'mean dur us':>12} {'/eager idle':>12} {'span/kernel us':>15}")
    for name, r in table.items():
        print(f"{name:16} {r['mean_dur_us']:12.3f} {r['ratio_to_eager_idle']:12.3f} {r['span_per_kernel_us']:15.3f}")
    print("no profiler, one more kernel (dur + gap, us; 200 vs 40 queued behind a sleep):",
          {k: round(v, 3) for k, v in unprofiled.items()})
    return {"elements": n, "modes": res, "table": table, "unprofiled_us_per_kernel": unprofiled}


def main() -> None:
    out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "cuda": torch.version.cuda,
           "kernels_per_sequence": 40, "reps": REPS, "sizes": [measure(n) for n in SIZES]}
    if len(sys.argv) > 1:
        Path(sys.argv[1]).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
