"""Are graph-replayed kernels measured longer than the same kernels launched eagerly? (issue 19)

    python benchmarks/gpu_replay_durations.py [OUT.json]      # on a CUDA machine

The proxy engine at its GPU size, one request of ~8K context, 8 decode iterations profiled in each of
four configurations: every switch on (graphs), the same without cuda_graph (eager), and both without
overlap (no plan stream: nothing runs beside the graph). For every kernel name present in all four,
the mean CUPTI duration per configuration; printed: the median graph/eager ratio for kernels under
2 µs and over 2 µs, with and without overlap. Reads the trace with plain json. Asserts nothing.
"""

from __future__ import annotations

import gzip
import json
import statistics
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

import torch

from profkit.proxy.config import CUDA_SIZE, SWITCHES, ProxyConfig, parse_opts
from profkit.proxy.scheduler import Req, Scheduler


def record(opts: str, out: Path) -> dict[str, list[float]]:
    cfg = ProxyConfig(size=CUDA_SIZE, switches=parse_opts(opts), speculative_num_steps=5, device="cuda")
    s = Scheduler(cfg)
    with torch.inference_mode():
        s.waiting.append(Req([(j * 7) % 30000 for j in range(8000)], 400))
        while not s.running or any(not r.seq_len for r in s.prefilling + list(s.waiting)):
            s.loop_once()
        for _ in range(6):  # warm-up: both plan parities captured, allocator settled
            s.loop_once()
        s.start_profile({"output_dir": str(out), "num_steps": 8, "activities": ["CPU", "GPU"],
                         "with_stack": False, "record_shapes": False, "profile_id": "p"})
        for _ in range(8):
            s.loop_once()
    torch.cuda.synchronize()
    ev = json.load(gzip.open(out / "p-TP-0.trace.json.gz"))["traceEvents"]
    d: dict[str, list[float]] = defaultdict(list)
    for e in ev:
        if e.get("cat") == "kernel":
            d[e["name"]].append(float(e["dur"]))
    return d


def main() -> None:
    others = [x for x in SWITCHES]
    configs = {
        "graphs": ",".join(others),
        "eager": ",".join(x for x in others if x != "cuda_graph"),
        "graphs, no overlap": ",".join(x for x in others if x != "overlap"),
        "eager, no overlap": ",".join(x for x in others if x not in ("overlap", "cuda_graph")),
    }
    got = {}
    for name, opts in configs.items():
        with tempfile.TemporaryDirectory() as tmp:
            got[name] = record(opts, Path(tmp))
    names = set.intersection(*(set(v) for v in got.values()))
    mean = {c: {n: statistics.fmean(got[c][n]) for n in names} for c in got}
    res = {}
    for tag, g, e in (("overlap on", "graphs", "eager"), ("overlap off", "graphs, no overlap", "eager, no overlap")):
        for lo, hi, label in ((0, 2, "< 2 us"), (2, 1e9, ">= 2 us")):
            rs = [mean[g][n] / mean[e][n] for n in names if lo <= mean[e][n] < hi]
            res[f"{tag}, {label}"] = {"kernels": len(rs), "median_ratio": statistics.median(rs) if rs else None}
            print(f"{tag:12s} kernels {label:8s}: {len(rs):4d} names, graph/eager mean duration median ratio "
                  f"{statistics.median(rs) if rs else float('nan'):.3f}")
    if len(sys.argv) > 1:
        Path(sys.argv[1]).write_text(json.dumps({"results": res, "means": mean}, indent=1))


if __name__ == "__main__":
    main()
