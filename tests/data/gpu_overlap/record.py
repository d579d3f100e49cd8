#!/usr/bin/env python3
"""Record the traces of tests/data/gpu_overlap on a CUDA machine.

    PYTHONUNBUFFERED=1 python3 tests/data/gpu_overlap/record.py --out OUTDIR [--only NAME,...]

  overlap_decode        profkit's proxy engine (profkit.proxy, in process: the same Scheduler the
                        server runs) on CUDA with every switch on (overlap, CUDA graphs, ...), one
                        request in decode; the scheduler's own profiler window (as /start_profile)
                        over 8 run_batch iterations, trimmed to the last 6 (the first two pay the
                        profiler's start). Several model sizes are tried (--proxy-variants); the
                        first one whose trace passes check.py's overlap checks is kept, every
                        variant's figures go to proxy_variants.json.
  overlap_construction  torch only: per iteration a plan-stream H2D copy (pinned -> device) of the
                        NEXT step's metadata, the main stream's wait for THIS step's plan event
                        (recorded one iteration earlier), 8 bf16 GEMMs and a tiny metadata-consuming
                        kernel on the main stream, a non_blocking D2H of the result + an event; then
                        process_batch_result of the PREVIOUS step (cudaEventSynchronize on its
                        copy). The CPU runs one step ahead and the GPU stays ~98% busy.
  eager_long_gap        torch only, with_stack=True: per step 50 small `aten::mul` kernels, one
                        `.item()` (D2H + sync, from a user-code frame), one CPU `torch.sort` of
                        ~5 ms while the GPU idles, 50 more `aten::mul`; 6 iterations.

The construction fixtures import no profkit code; every trace is re-read by check.py (stdlib only)
before the script ends, and the script exits 1 when a check fails. `--device cpu` is a dry run of
the code paths (tiny shapes, no streams); it writes nothing tests should use.
"""

from __future__ import annotations

import argparse
import datetime
import gzip
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time

import torch
from torch.profiler import ProfilerActivity, profile, record_function, schedule

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))  # the checkout (for profkit.proxy)
sys.path.insert(0, HERE)
import check  # noqa: E402  (stdlib-only checker beside this file)

MARKER = "scheduler.run_batch"


def log(*a):
    print(*a, flush=True)


def activities(dev):
    return [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev == "cuda" else [])


def sync(dev):
    if dev == "cuda":
        torch.cuda.synchronize()


# --------------------------------------------------------------------------- overlap_construction

def overlap_construction(out: str, dev: str, iters: int = 8, warm: int = 5) -> str:
    n = 4096 if dev == "cuda" else 64
    m = 2 * n  # 8192 x 4096 x 4096 bf16: ~0.33 ms per GEMM on an H200
    dt = torch.bfloat16 if dev == "cuda" else torch.float32
    g = torch.Generator().manual_seed(7)
    W = [(torch.randn(n, n, generator=g) / n ** 0.5).to(dev, dt) for _ in range(8)]
    xs = [torch.randn(m, n, generator=g).to(dev, dt), torch.empty(m, n, device=dev, dtype=dt)]
    M = 64  # int64 metadata words per step (seq lens / positions stand-in)
    pin = dev == "cuda"
    host_meta = [torch.zeros(M, dtype=torch.int64, pin_memory=pin) for _ in range(3)]
    dev_meta = [torch.zeros(M, dtype=torch.int64, device=dev) for _ in range(3)]
    tok = torch.zeros(M, dtype=torch.int64, device=dev)
    host_out = [torch.zeros(M, dtype=torch.int64, pin_memory=pin) for _ in range(3)]
    plan_stream = torch.cuda.Stream() if dev == "cuda" else None
    plan_ev: dict[int, object] = {}
    state = {"pending": None, "consumed": []}

    def plan(step):  # the metadata of `step`, on the plan stream
        hm = host_meta[step % 3]
        hm.copy_(torch.arange(M, dtype=torch.int64) + step)  # host-side bookkeeping
        if plan_stream is None:
            dev_meta[step % 3].copy_(hm)
            plan_ev[step] = None
            return
        with torch.cuda.stream(plan_stream):
            dev_meta[step % 3].copy_(hm, non_blocking=True)
            ev = torch.cuda.Event()
            ev.record(plan_stream)
        plan_ev[step] = ev

    def step_body(step):
        with record_function(MARKER):
            with record_function("plan"):
                plan(step + 1)  # the NEXT step's metadata, while this one's forward is queued
            ev = plan_ev.pop(step)
            if ev is not None:
                torch.cuda.current_stream().wait_event(ev)  # device-side dependency, no host sync
            with record_function("step[DECODE bs=1]"):
                for j in range(8):
                    torch.mm(xs[j % 2], W[j], out=xs[(j + 1) % 2])
                tok.add_(dev_meta[step % 3])
            with record_function("copy_result_to_cpu"):
                h = host_out[step % 3]
                h.copy_(tok, non_blocking=pin)
                done = None
                if dev == "cuda":
                    done = torch.cuda.Event()
                    done.record()
        with record_function("scheduler.process_batch_result"):
            prev, state["pending"] = state["pending"], (step, h, done)
            if prev is not None:
                s, hh, e = prev
                if e is not None:
                    e.synchronize()  # the previous step's copy: already finished, or nearly
                state["consumed"].append((s, int(hh[0])))

    plan(0)
    for i in range(warm):
        step_body(i)
    sync(dev)
    path = os.path.join(out, "overlap_construction.trace.json.gz")
    with profile(activities=activities(dev), schedule=schedule(wait=0, warmup=2, active=iters),
                 on_trace_ready=lambda p: p.export_chrome_trace(path)) as prof:
        for i in range(warm, warm + 2 + iters):
            step_body(i)
            prof.step()
    sync(dev)
    return path


# --------------------------------------------------------------------------- eager_long_gap

def _sort_input(dev: str):
    """A CPU tensor whose torch.sort takes ~5 ms on this host (calibrated)."""
    n = 1 << 16
    g = torch.Generator().manual_seed(3)
    for _ in range(6):
        x = torch.rand(n, generator=g)
        ts = []
        for _ in range(5):
            t = time.perf_counter()
            torch.sort(x)
            ts.append(time.perf_counter() - t)
        ms = statistics.median(ts) * 1e3
        if 4.0 <= ms <= 7.0 or dev != "cuda":
            break
        n = max(1 << 12, int(n * 5.0 / max(ms, 1e-3)))
    log(f"eager_long_gap: CPU sort of {n} floats takes {ms:.2f} ms (median of 5)")
    return torch.rand(n, generator=g), ms


def eager_long_gap(out: str, dev: str, iters: int = 6, warm: int = 3) -> tuple[str, dict]:
    torch.set_num_threads(1)  # the host op runs on the launching thread alone
    a = torch.rand(4096, device=dev)
    b = torch.rand(4096, device=dev)
    c = torch.empty_like(a)
    acc = torch.zeros(1, device=dev)
    big, sort_ms = _sort_input(dev)

    def read_back():  # user code: the sync's Python frame
        return acc.item()

    def step_body():
        with record_function(MARKER):
            with record_function("step[DECODE bs=1]"):
                for _ in range(50):
                    torch.mul(a, b, out=c)
                acc.add_(c[:1])
                v = read_back()
                torch.sort(big)  # ~5 ms on the host, the GPU has nothing queued
                for _ in range(50):
                    torch.mul(a, b, out=c)
        return v

    for _ in range(warm):
        step_body()
    sync(dev)
    path = os.path.join(out, "eager_long_gap.trace.json.gz")
    with profile(activities=activities(dev), schedule=schedule(wait=0, warmup=2, active=iters),
                 with_stack=True, record_shapes=False,
                 on_trace_ready=lambda p: p.export_chrome_trace(path)) as prof:
        for _ in range(2 + iters):
            step_body()
            prof.step()
    sync(dev)
    return path, {"sort_elements": big.numel(), "sort_ms_unprofiled": round(sort_ms, 3),
                  "mul_elements": a.numel()}


# --------------------------------------------------------------------------- overlap_decode (proxy)

def trim_from(src: str, dst: str, first: int) -> dict:
    """Drop the first `first` run_batch iterations: keep metadata, every event starting at or after
    the first kept marker, and the GPU ops still running at that cut (real device work launched
    earlier: outside every kept iteration), with the flows whose both ends are kept."""
    doc = json.loads(gzip.open(src).read())
    ev = doc["traceEvents"]
    marks = sorted(e["ts"] for e in ev if e.get("name") == MARKER and e.get("cat") == "user_annotation")
    cut = marks[first]
    ops = ("kernel", "gpu_memcpy", "gpu_memset")
    out, kept_launch = [], set()
    for e in ev:
        if e.get("ph") == "M":
            out.append(e)
        elif e.get("cat") == "ac2g":
            continue
        elif e.get("ts", 0) >= cut or (e.get("cat") in ops and e["ts"] + e.get("dur", 0) > cut):
            out.append(e)
            if e.get("cat") in ("cuda_runtime", "cuda_driver") and e["ts"] >= cut:
                c = e.get("args", {}).get("correlation")
                if c is not None:
                    kept_launch.add(c)
    out += [e for e in ev if e.get("cat") == "ac2g" and e.get("id") in kept_launch]
    doc["traceEvents"] = out
    with gzip.open(dst, "wt", compresslevel=9) as f:
        json.dump(doc, f, separators=(",", ":"))
    return {"iterations_in": len(marks), "dropped_first": first, "events_in": len(ev), "events_out": len(out)}


def overlap_decode_variant(tmp: str, dev: str, name: str, extra: list[str], isl: int, bs: int,
                           steps: int = 8, drop: int = 2, opts: str = "all",
                           profile_it: bool = True) -> tuple[str | None, dict]:
    if ROOT not in sys.path:
        sys.path.insert(1, ROOT)
    from profkit.proxy import config as C
    from profkit.proxy.scheduler import Req, Scheduler
    from profkit.proxy.server import build_parser

    argv = ["--device", dev, "--opts", opts] + extra
    cfg = C.config_from_args(build_parser().parse_args(argv), torch.cuda.is_available())
    torch.manual_seed(cfg.seed)
    t0 = time.perf_counter()
    s = Scheduler(cfg)
    V = cfg.size.vocab_size
    with torch.inference_mode():
        reqs = [Req([(i * 7919 + j * 31 + 1) % V for j in range(isl)], 600) for i in range(bs)]
        s.waiting.extend(reqs)
        while s.waiting or s.prefilling:
            s.loop_once()
        for _ in range(8):  # decode warm-up: CUDA-graph capture of this width bucket
            s.loop_once()
        sync(dev)
        t = time.perf_counter()
        for _ in range(10):
            s.loop_once()
        sync(dev)
        unprof_us = (time.perf_counter() - t) / 10 * 1e6
        if not profile_it:
            s.pending = None
            del s
            torch.cuda.empty_cache() if dev == "cuda" else None
            return None, {"opts": opts, "argv": argv, "unprofiled_us_per_iteration": round(unprof_us, 1)}
        pid = f"overlap_decode-{name}"
        s.start_profile({"output_dir": tmp, "num_steps": steps, "activities": ["CPU", "GPU"],
                         "with_stack": False, "record_shapes": False, "profile_id": pid})
        for _ in range(steps + 2):
            s.loop_once()
            if s.prof_req is None:
                break
        s.pending = None  # the last step's tokens are not needed
        sync(dev)
    raw = os.path.join(tmp, f"{pid}-TP-0.trace.json.gz")
    path = os.path.join(tmp, f"{pid}.trace.json.gz")
    tr = trim_from(raw, path, drop)
    info = {"argv": ["python -m profkit.proxy.server"] + argv, "isl": isl, "batch": bs,
            "profiled_steps": steps, "trim": tr, "unprofiled_us_per_iteration": round(unprof_us, 1),
            "seq_len_at_end": [r.seq_len for r in reqs], "plans": s.plans, "plans_ahead": s.plans_ahead,
            "raw_bytes": os.path.getsize(raw), "elapsed_s": round(time.perf_counter() - t0, 1),
            "switches": cfg.switch_states(), "size": cfg.size.__dict__}
    del s
    if dev == "cuda":
        torch.cuda.empty_cache()
    return path, info


PROXY_VARIANTS = {
    # name: (extra server args, isl, batch)
    "default": ([], 8000, 1),
    "moe2048": (["--moe-inter-size", "2048"], 8000, 1),
    "l8": (["--num-layers", "8"], 8000, 1),
    "l8-moe2048": (["--num-layers", "8", "--moe-inter-size", "2048"], 8000, 1),
    # the study's regime: ~80K-token context at batch 1
    "ctx80k": ([], 80000, 1),
    "ctx80k-moe2048": (["--moe-inter-size", "2048"], 80000, 1),
    "ctx80k-e256": (["--num-experts", "256", "--moe-inter-size", "2048"], 80000, 1),
    "ctx80k-e256-i4096": (["--num-experts", "256", "--moe-inter-size", "4096"], 80000, 1),
}


# --------------------------------------------------------------------------- main

def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--device", default="cuda")
    p.add_argument("--only", default="overlap_decode,overlap_construction,eager_long_gap")
    p.add_argument("--compare-off", action="store_true",
                   help="also time the chosen proxy variant unprofiled with overlap off and on")
    p.add_argument("--compare-variant", default=None, help="the variant --compare-off times (default: the chosen one)")
    p.add_argument("--proxy-variants", default="ctx80k-e256-i4096",
                   help="tried in this order; the first that passes the checks is kept")
    a = p.parse_args(argv)
    os.makedirs(a.out, exist_ok=True)
    only = a.only.split(",")
    meta = {"recorded_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "torch": torch.__version__, "cuda": torch.version.cuda, "python": platform.python_version(),
            "device_name": torch.cuda.get_device_name() if a.device == "cuda" else "cpu",
            "host": platform.platform(), "fixtures": {}}
    log(json.dumps({k: v for k, v in meta.items() if k != "fixtures"}))
    failed = []

    def report(path, extra=None):
        res = check.analyze(path)
        bad = check.checks(res)
        failed.extend(bad)
        log(f"== {res['file']}: {res['bytes']} B, {res['iterations']} iterations, busy share min "
            f"{res['busy_share_min']}, spill min {res['spill_us_min']} us; "
            f"by idle {res['top_ops_by_idle_us'][:3]}; by count {res['top_ops_by_gap_count'][:3]}")
        for r in res["per_iteration"]:
            log(f"   it{r['index']}: cpu {r['cpu_wall_us']} gpu {r.get('gpu_window_us')} busy "
                f"{r.get('busy_share')} spill {r.get('spill_us')} streams {r.get('streams')}")
        for b in bad:
            log("   CHECK FAILED:", b)
        meta["fixtures"][res["file"]] = {"bytes": res["bytes"], "checks_failed": bad, **(extra or {})}
        return bad

    if "overlap_construction" in only:
        path = overlap_construction(a.out, a.device)
        report(path, {"construction": "8 bf16 8192x4096x4096 GEMMs per step, plan-stream H2D of 64 int64"})
    if "eager_long_gap" in only:
        path, info = eager_long_gap(a.out, a.device)
        report(path, info)
    if "overlap_decode" in only:
        variants = {}
        chosen = None
        with tempfile.TemporaryDirectory() as tmp:
            for name in a.proxy_variants.split(","):
                extra, isl, bs = PROXY_VARIANTS[name]
                if a.device != "cuda":
                    extra, isl = [], 300
                try:
                    path, info = overlap_decode_variant(tmp, a.device, name, extra, isl, bs)
                except Exception as ex:  # a variant that cannot run (memory, ...) is reported
                    log(f"variant {name} failed: {ex!r}")
                    variants[name] = {"error": repr(ex)}
                    continue
                res = check.analyze(path)
                bad = check.checks(res)
                variants[name] = {**info, "bytes": res["bytes"], "busy_share_min": res["busy_share_min"],
                                  "spill_us_min": res["spill_us_min"], "checks_failed": bad,
                                  "per_iteration": res["per_iteration"]}
                log(f"variant {name}: {res['bytes']} B, busy min {res['busy_share_min']}, spill min "
                    f"{res['spill_us_min']}, unprofiled {info['unprofiled_us_per_iteration']} us/it, "
                    f"failed {bad}")
                os.makedirs(os.path.join(a.out, "variants"), exist_ok=True)
                shutil.copy(path, os.path.join(a.out, "variants", f"{name}.trace.json.gz"))
                if chosen is None and not bad:
                    chosen = name
                    dst = os.path.join(a.out, "overlap_decode.trace.json.gz")
                    shutil.copy(path, dst)
                    report(dst, {"variant": name, **info})
                    break
            if a.compare_off:
                cmp_name = a.compare_variant or chosen
                extra, isl, bs = PROXY_VARIANTS[cmp_name]
                if a.device != "cuda":
                    extra, isl = [], 300
                no_ov = ",".join(x for x in ("cuda_graph", "topk_v2", "indexer_fusion", "index_share",
                                             "moe_deferred_finalize"))
                for opts in (no_ov, "all"):
                    _, info = overlap_decode_variant(tmp, a.device, cmp_name, extra, isl, bs, opts=opts,
                                                     profile_it=False)
                    info["variant"] = cmp_name
                    variants.setdefault("unprofiled_compare", []).append(info)
                    log(f"unprofiled {cmp_name} opts={opts}: {info['unprofiled_us_per_iteration']} us/it")
        with open(os.path.join(a.out, "proxy_variants.json"), "w") as f:
            json.dump(variants, f, indent=1)
        if chosen is None:
            failed.append("overlap_decode: no variant passed")
    with open(os.path.join(a.out, "record_meta.json"), "w") as f:
        json.dump(meta, f, indent=1)
    log("SELF-CHECK", "PASSED" if not failed else f"FAILED: {failed}")
    return 1 if failed and a.device == "cuda" else 0


if __name__ == "__main__":
    sys.exit(main())
