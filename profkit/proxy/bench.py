"""Per-switch effect table of the proxy engine on the device at hand (no HTTP, in-process).

    python -m profkit.proxy.bench [--device cuda] [--batch 1] [--prompt-len 2000] [--steps 8]

For each switch X it records NUM decode iterations with the profiler for `all` and `all - X`
(plus `none`), and prints per-iteration medians counted with plain json: wall of run_batch, CPU
ops, kernels, launches, syncs, and the switch's own marker (aten::item, aten::sort inside
proxy.indexer.topk, prologue ops, top-k ranges inside draft, adds inside proxy.moe). Unprofiled
decode time per iteration is measured too. This is a self-check of the engine, not profkit's
analysis (which lives in profkit.analysis).
"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
import tempfile
import time

from .config import CPU_SIZE, CUDA_SIZE, SWITCHES, ProxyConfig, parse_opts

SYNC_APIS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize",
             "cudaMemcpy")
LAUNCH_APIS = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx")


def _inside(e, r):
    return r["ts"] <= e["ts"] and e["ts"] + e.get("dur", 0) <= r["ts"] + r["dur"]


def window_metrics(trace) -> list[dict]:
    ev = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    cpu = [e for e in ev if e.get("cat") in ("cpu_op", "user_annotation", "cuda_runtime",
                                                "cuda_driver")]
    kernels = [e for e in ev if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    rbs = sorted((e for e in cpu if e["name"] == "scheduler.run_batch"), key=lambda e: e["ts"])
    out = []
    for w in rbs:
        inner = [e for e in cpu if e is not w and _inside(e, w) and e.get("tid") == w.get("tid")]
        names = [e["name"] for e in inner]
        steps = [n for n in names if n.startswith("step[")]
        corr = {e.get("args", {}).get("correlation") for e in inner if e.get("cat") in
                ("cuda_runtime", "cuda_driver")}

        def within(name, rname):
            rs = [e for e in inner if e["name"] == rname]
            return sum(e["name"] == name and any(_inside(e, r) for r in rs) for e in inner)

        def ops_in(rname):
            rs = [e for e in inner if e["name"] == rname]
            return sum(e.get("cat") == "cpu_op" and any(_inside(e, r) for r in rs) for e in inner)

        out.append({
            "steps": steps,
            "wall_us": w["dur"],
            "cpu_ops": sum(e.get("cat") == "cpu_op" for e in inner),
            "kernels": sum(k.get("args", {}).get("correlation") in corr for k in kernels),
            "launches": sum(n in LAUNCH_APIS for n in names),
            "graph_launches": names.count("cudaGraphLaunch"),
            "syncs": sum(n in SYNC_APIS for n in names),
            "item": names.count("aten::item") + names.count("aten::_local_scalar_dense"),
            "sort_in_topk": within("aten::sort", "proxy.indexer.topk"),
            "prologue_ops": ops_in("proxy.indexer.prologue"),
            "prologues": names.count("proxy.indexer.prologue"),
            "topk_in_draft": within("proxy.indexer.topk", "draft"),
            "add_in_moe": within("aten::add", "proxy.moe"),
            "moe": names.count("proxy.moe"),
        })
    return out


def record(opts: str, args, out_dir: str) -> tuple[list[dict], float]:
    import torch

    from .scheduler import Req, Scheduler

    on_cuda = args.device.startswith("cuda")
    size = CUDA_SIZE if on_cuda else CPU_SIZE
    n_iter = args.steps
    max_new = (args.spec_steps + 1) * (args.warmup + 2 * n_iter + 4)
    cfg = ProxyConfig(size=size, device=args.device,
                      dtype="bfloat16" if on_cuda else "float32",
                      switches=parse_opts(opts), speculative_num_steps=args.spec_steps,
                      num_pages=(args.prompt_len + max_new + 64) * args.batch // 16 + 64,
                      chunked_prefill_size=1024 if on_cuda else 512)
    s = Scheduler(cfg)
    with torch.inference_mode():
        for i in range(args.batch):
            s.waiting.append(Req([(i * 13 + j) % size.vocab_size
                                  for j in range(args.prompt_len)], max_new))
        while s.waiting or s.prefilling:
            s.loop_once()
        for _ in range(args.warmup):
            s.loop_once()
        if on_cuda:
            torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(n_iter):
            s.loop_once()
        if on_cuda:
            torch.cuda.synchronize()
        unprof = (time.perf_counter() - t) / n_iter * 1e6
        pid = f"{opts.replace(',', '+')}-{time.time_ns()}"
        s.start_profile({"output_dir": out_dir, "num_steps": n_iter,
                         "activities": ["CPU", "GPU"], "with_stack": False,
                         "record_shapes": False, "profile_id": pid})
        for _ in range(n_iter + 1):
            s.loop_once()
            if s.prof_req is None:
                break
    s.pending = None
    trace = json.load(gzip.open(f"{out_dir}/{pid}-TP-0.trace.json.gz"))
    ws = [w for w in window_metrics(trace)
          if any(x.startswith(("step[VERIFY", "step[DECODE")) for x in w["steps"])]
    del s
    if on_cuda:
        torch.cuda.empty_cache()
    return ws, unprof


KEYS = ("wall_us", "cpu_ops", "kernels", "launches", "graph_launches", "syncs", "item",
        "sort_in_topk", "prologue_ops", "topk_in_draft", "add_in_moe")


def med(ws, k):
    return statistics.median(w[k] for w in ws) if ws else float("nan")


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m profkit.proxy.bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--prompt-len", type=int, default=300)
    p.add_argument("--spec-steps", type=int, default=5)
    p.add_argument("--steps", type=int, default=6, help="profiled decode iterations")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--switches", default=",".join(SWITCHES))
    p.add_argument("--json", default=None, help="also write the table as JSON here")
    args = p.parse_args(argv)
    import torch

    if not args.device.startswith("cuda"):
        torch.set_num_threads(1)
    rows = []
    with tempfile.TemporaryDirectory() as d:
        configs = [("all", "all"), ("none", "none")]
        for sw in args.switches.split(","):
            configs.append((f"all-{sw}", ",".join(x for x in SWITCHES if x != sw) or "none"))
        for label, opts in configs:
            ws, unprof = record(opts, args, d)
            row = {"config": label, "unprofiled_us": unprof, "iterations": len(ws)}
            row.update({k: med(ws, k) for k in KEYS})
            rows.append(row)
            print(json.dumps(row), flush=True)
    hdr = ["config", "unprofiled_us"] + list(KEYS)
    print("\n| " + " | ".join(hdr) + " |")
    print("|" + "---|" * len(hdr))
    for r in rows:
        print("| " + " | ".join(r["config"] if h == "config" else f"{r[h]:.0f}" for h in hdr)
              + " |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": args.device, "args": vars(args), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
