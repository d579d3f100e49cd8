"""Do graph-replayed kernels run longer, or are they only recorded longer? (issue 19; with ncu)

    bash: for m in eager graph; do ncu --csv --profile-from-start off --graph-profiling node --clock-control none \
            --cache-control none --metrics gpu__time_duration.sum python benchmarks/gpu_tiny_kernel_timing.py ... ; done
    (benchmarks/gpu_tiny_kernel_ncu.sh runs it)

The 40 kernels of gpu_tiny_kernel_timing.py (4,096 floats), warmed up, then inside one
cudaProfilerStart/Stop range: launched eagerly (MODE=eager) or replayed from a graph (MODE=graph),
REPS times. Nsight Compute measures each kernel on its own (`gpu__time_duration.sum`, clocks and
caches left as they are), so what a kernel takes does not depend on a tracer timestamping it.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from gpu_tiny_kernel_timing import kernels  # noqa: E402

REPS = int(os.environ.get("REPS", "5"))


def main() -> None:
    fs = kernels(4096)

    def seq():
        for f in fs:
            f()

    for _ in range(10):
        seq()
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        seq()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        seq()
    torch.cuda.synchronize()
    run = g.replay if os.environ.get("MODE") == "graph" else seq
    torch.cuda.profiler.start()
    for _ in range(REPS):
        run()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()


if __name__ == "__main__":
    main()
