"""Kernel benchmark for the proxy engine's TopK-V2 and fused indexer prologue (issue 8).

Reproduces the study's kernel figures on the GPU at hand:

* top-k latency at the verify shape (7 score rows = batch 1 x (6 draft tokens + 1), k = 2048) at
  8K, 32K, 80K, 256K and 1M positions: sort-then-slice V1 (+ page-table gather), torch.topk
  (plain), TopK-V2 in Triton (the sample plan, fused translation) and TopK-V2 in CUDA C++
  (csrc/topk_v2.cu, clusters + DSMEM, fused translation; planned cluster size, plus a sweep of
  the cluster sizes), and the bandwidth floor (one read of the scores; torch.amax as a real one-pass
  read); each plain (triton.testing.do_bench, median, L2 flushed between calls) and CUDA-graph
  replayed (a graph of REP calls over 4 rotating score buffers, median of the replays / REP);
* indexer prologue: kernels per call (torch.profiler) and latency, unfused (the proxy's 12-step
  chain) vs fused (wk_weights_proj GEMM + wq_b GEMM + the two fused Triton kernels).

Correctness is checked first (exact top-k sets against a stable sort; fused indexer outputs
against the torch reference). Prints a compact table last; writes JSON + markdown under --out.

    python benchmarks/bench_kernels.py --out /tmp/bench [--tune]
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import sys
import time

import torch
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from profkit.proxy.kernels import indexer as IX  # noqa: E402
from profkit.proxy.kernels import topk as TK  # noqa: E402

ROWS, K = 7, 2048
SIZES = [("8K", 8192), ("32K", 32768), ("80K", 81920), ("256K", 262144), ("1M", 1 << 20)]
STUDY = {"torch.topk": {"80K": (75.5, 63.0), "1M": (157.0, 145.0)},
         "V1 sort": {"80K": (115.0, None), "1M": (711.0, None)}}
TARGET = {"80K": 20.0, "1M": 40.0}
PAGE = 64
REP = 10
# (name, stash entries, sample float4s per thread, flags): the CUDA kernel's streamed-chunk
# variants (flags: topk_cuda.WARP_APPEND = 1, L2_PREFETCH = 2; 0 = per-score branch)
CUDA_VARIANTS = [("stash 4/4, per-score (old)", 8192, 4, 0), ("warp appends", 8192, 4, 1),
                 ("L2 prefetch", 8192, 4, 2), ("warp appends+prefetch", 8192, 4, 3),
                 ("warp+prefetch, sample 2/4", 8192, 2, 3), ("warp appends, sample 2/4", 8192, 2, 1),
                 ("no stash, prefetch", 0, 4, 2), ("no stash (re-read)", 0, 4, 0)]


def log(*a):
    print(*a, flush=True)


SMOKE = os.environ.get("BENCH_SMOKE") == "1"  # CPU dry run of this script (TRITON_INTERPRET=1)
DEV = "cpu" if SMOKE else "cuda"
if SMOKE:
    SIZES = [("8K", 3000), ("1M", 9000)]
    K = 300


def _smoke_time(fn):
    t = time.perf_counter()
    fn()
    return (time.perf_counter() - t) * 1e6


def bench_plain(fn):
    if SMOKE:
        return _smoke_time(fn)
    import triton

    return float(triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")) * 1e3


def bench_graph(make_call, bufs, rep=REP, iters=20):
    """make_call(buf) -> callable; graph of `rep` calls over rotating buffers; us per call."""
    calls = [make_call(bufs[i % len(bufs)]) for i in range(rep)]
    if SMOKE:
        return _smoke_time(calls[0])
    for c in calls[: len(bufs)]:
        c()
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for c in calls[: len(bufs)]:
            c()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for c in calls:
            c()
    g.replay()
    torch.cuda.synchronize()
    ts = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b) * 1e3 / rep)
    ts.sort()
    return ts[len(ts) // 2]


def sets_equal_gpu(scores, idx, k):
    """Exact set check against a stable descending sort, on the GPU (random data: no ties)."""
    ref = torch.sort(scores, dim=1, descending=True, stable=True).indices[:, :k]
    return bool(torch.equal(ref.sort(1).values, idx.long().sort(1).values))


def v1_sort(scores, k, pt):
    order = torch.sort(scores, dim=1, descending=True).indices[:, :k]
    return torch.gather(pt.expand(scores.shape[0], -1), 1, order // PAGE) * PAGE + order % PAGE


# ----------------------------------------------------------------------------------------------


def cuda_v2_ok():
    if SMOKE:
        return False
    from profkit.proxy.kernels import topk_cuda

    why = topk_cuda.unavailable_reason()
    if why:
        log(f"CUDA TopK-V2 unavailable: {why}")
    return why is None


def topk_section(args, results):
    dev = DEV
    g = torch.Generator(device=dev).manual_seed(0)
    have_cuda = cuda_v2_ok()
    results["topk_v2_backend"] = TK.backend(dev)
    configs = [dict(path="sample")]  # the Triton default (the sample plan)
    if args.tune:
        for smp, block, nw, prog in [(4096, 4096, 8, 264), (8192, 4096, 8, 264),
                                     (None, 4096, 8, 132), (None, 4096, 8, 528),
                                     (None, 2048, 4, 528), (None, 8192, 8, 264)]:
            configs.append(dict(path="sample", sample=smp, block=block, num_warps=nw,
                                programs=prog))
        configs.append(dict(path="sample", block_r=4096, select_warps=8))
        # (the histogram plan and the radix-round search, measured slower, are gone: RESULTS_kernels.md)
    rows_out = []
    sizes = [(nm, n) for nm, n in SIZES if not args.sizes or nm in args.sizes.split(",")]
    for name, n in sizes:
        bufs = [torch.randn(ROWS, n, device=dev, generator=g) for _ in range(4)]
        npages = (n + PAGE - 1) // PAGE
        pt = torch.randperm(max(npages * 4, 1 << 16), device=dev, generator=g)[:npages]
        pt = pt.int().view(1, -1)
        rec = {"size": name, "n": n}
        dup = torch.randint(-50, 50, (ROWS, n), device=dev, generator=g).float()

        def check(**kw):
            # exact sets on random rows (and tie-heavy integer rows) + the fused translation
            idx, slots = TK.topk_v2(bufs[0], K, pt, PAGE, **kw)
            ok = sets_equal_gpu(bufs[0], idx, K)
            want = pt[0].long()[idx.long() // PAGE] * PAGE + idx.long() % PAGE
            ok = ok and bool(torch.equal(slots.long(), want))
            di, _ = TK.topk_v2(dup, K, pt, PAGE, **kw)
            return ok and sets_equal_gpu(dup, di, K)

        ok_t = True if args.cuda_only else check(path="sample")
        ok_c = check(path="cuda") if have_cuda else None
        rec["correct"] = ok_t and ok_c is not False
        rec["correct_triton"], rec["correct_cuda"] = ok_t, ok_c
        # baselines
        if args.cuda_only:
            configs_here = []
        else:
            configs_here = configs
            rec["torch.topk"] = (bench_plain(lambda: torch.topk(bufs[0], K)),
                                 bench_graph(lambda b: (lambda: torch.topk(b, K)), bufs))
        if not args.cuda_only and (n <= 262144 or not args.quick):
            rec["V1 sort"] = (bench_plain(lambda: v1_sort(bufs[0], K, pt)),
                              bench_graph(lambda b: (lambda: v1_sort(b, K, pt)), bufs))
        tune = []
        best = None
        for cfg in configs_here:
            try:
                fn = (lambda b, cfg=cfg: (lambda: TK.topk_v2(b, K, pt, PAGE, **cfg)))
                ci, _ = fn(bufs[1])()
                cok = sets_equal_gpu(bufs[1], ci, K)
                p = bench_plain(fn(bufs[0]))
                gr = bench_graph(fn, bufs)
            except Exception as e:  # keep going: report the failure
                tune.append({"cfg": cfg, "error": repr(e)[:300]})
                log(f"  {name} cfg {cfg} FAILED {e!r}"[:400])
                continue
            tune.append({"cfg": cfg, "plain_us": p, "graph_us": gr, "correct": cok})
            log(f"  {name} triton {cfg}: plain {p:.1f} us graph {gr:.1f} us ok={cok}")
            if cfg == dict(path="sample"):
                rec["V2 triton"] = (p, gr)
            if cok and (best is None or gr < best[1]):
                best = (p, gr, cfg)
        rec["V2 triton best"] = best
        rec["tune"] = tune
        if have_cuda:
            from profkit.proxy.kernels import topk_cuda

            rec["cuda_plan_cluster"] = topk_cuda.plan(ROWS, n)
            fn = (lambda b: (lambda: TK.topk_v2(b, K, pt, PAGE, path="cuda")))
            rec["V2 cuda"] = (bench_plain(fn(bufs[0])), bench_graph(fn, bufs))
            sweep = {}
            for c in (1, 2, 4, 8, 16):
                try:
                    fc = (lambda b, c=c: (lambda: TK.topk_v2(b, K, pt, PAGE, path="cuda",
                                                             cluster=c)))
                    ci, _ = fc(bufs[1])()
                    cok = sets_equal_gpu(bufs[1], ci, K)
                    sweep[c] = (bench_graph(fc, bufs), cok)
                except Exception as e:
                    sweep[c] = (float("nan"), repr(e)[:200])
            rec["cuda_clusters_graph_us"] = sweep
            if args.cuda_variants:
                # the streamed chunks' variants (topk_cuda.STASH / SAMPLE4), planned cluster size
                var = {}
                for vname, st, s4, fl in CUDA_VARIANTS:
                    try:
                        fv = (lambda b, st=st, s4=s4, fl=fl: (lambda: topk_cuda.topk_v2_cuda(
                            b, K, pt, PAGE, stash=st, sample4=s4, flags=fl)))
                        vi, vs = fv(bufs[1])()
                        vok = sets_equal_gpu(bufs[1], vi, K) and bool(torch.equal(
                            vs.long(), pt[0].long()[vi.long() // PAGE] * PAGE + vi.long() % PAGE))
                        di, _ = topk_cuda.topk_v2_cuda(dup, K, pt, PAGE, stash=st, sample4=s4,
                                                       flags=fl)
                        vok = vok and sets_equal_gpu(dup, di, K)
                        var[vname] = (bench_plain(fv(bufs[0])), bench_graph(fv, bufs), vok)
                    except Exception as e:
                        var[vname] = (float("nan"), float("nan"), repr(e)[:200])
                    log(f"  {name} cuda variant {vname}: {var[vname]}")
                rec["cuda_variants"] = var
            log(f"  {name} cuda: {rec['V2 cuda']} plan C={rec['cuda_plan_cluster']} sweep {sweep}")
        rec["amax_read_graph_us"] = bench_graph(lambda b: (lambda: torch.amax(b, dim=1)), bufs)
        rec["read_once_us"] = ROWS * n * 4 / args.bw * 1e6
        log(f"{name}: {json.dumps({k: v for k, v in rec.items() if k != 'tune'}, default=str)}")
        rows_out.append(rec)
        bufs = dup = None  # the GPU buffers go before the next size's
    results["topk"] = rows_out


def indexer_section(args, results):
    dev, dt = DEV, (torch.float32 if SMOKE else torch.bfloat16)
    T, Hd, H, D, R, QL = (7, 256, 4, 32, 16, 64) if SMOKE else (7, 6144, 32, 128, 64, 2048)
    g = torch.Generator(device=dev).manual_seed(1)

    def w(*s, fan_in):
        return (torch.randn(*s, device=dev, generator=g) * fan_in ** -0.5).to(dt)

    wk, wp = w(D, Hd, fan_in=Hd), w(H, Hd, fan_in=Hd)
    from profkit.proxy import ops

    wd = {"n_heads": H, "head_dim": D, "hadamard": ops.hadamard_matrix(D).to(dev, dt),
          "wq_b": w(H * D, QL, fan_in=QL), "wk": wk, "weights_proj": wp,
          "wk_weights_proj": torch.cat([wk, wp], 0).contiguous(),
          "k_norm_w": torch.ones(D, device=dev, dtype=dt),
          "k_norm_b": torch.zeros(D, device=dev, dtype=dt), "gate_scale": (H * D) ** -0.5}
    x = torch.randn(T, Hd, device=dev, generator=g).to(dt)
    q_lat = torch.randn(T, QL, device=dev, generator=g).to(dt)
    ang = torch.rand(T, R // 2, device=dev, generator=g) * 6
    cos, sin = ang.cos().to(dt), ang.sin().to(dt)
    cache = torch.zeros(4096, D + 4, device=dev, dtype=torch.uint8)
    slots = torch.randperm(4096, device=dev, generator=g)[:T]

    def fused():
        kw = F.linear(x, wd["wk_weights_proj"])
        IX.indexer_k_fused(kw[:, :D], wd["k_norm_w"], wd["k_norm_b"], cos, sin, cache, slots)
        q = F.linear(q_lat, wd["wq_b"]).view(T, H, D)
        return IX.indexer_q_fused(q, cos, sin, kw[:, D:], wd["gate_scale"])

    cos32, sin32 = cos.float(), sin.float()  # torch.complex (proxy's fused torch path) needs fp32

    def unfused():
        return ops.indexer_prologue_unfused(wd, x, q_lat, cos, sin, cache, slots)

    def torch_fused():
        return ops.indexer_prologue_fused(wd, x, q_lat, cos32, sin32, cache, slots)

    # correctness of the fused kernels against the torch reference chain
    kw = F.linear(x, wd["wk_weights_proj"])
    c1, c2 = cache.clone(), cache.clone()
    IX.indexer_k_fused(kw[:, :D], wd["k_norm_w"], wd["k_norm_b"], cos, sin, c1, slots)
    IX.indexer_k_reference(kw[:, :D], wd["k_norm_w"], wd["k_norm_b"], cos, sin, c2, slots)
    q = F.linear(q_lat, wd["wq_b"]).view(T, H, D)
    qa, ga = IX.indexer_q_fused(q, cos, sin, kw[:, D:], wd["gate_scale"])
    qr, gr = IX.indexer_q_reference(q, cos, sin, kw[:, D:], wd["gate_scale"])
    kb_eq = float((c1 == c2).float().mean())
    q_step = float(((qa.float() - qr.float()).abs() / qr.float().abs().clamp(min=2 ** -6)).max())
    ind = {"k_bytes_equal_frac": kb_eq, "q_max_rel_diff": q_step,
           "gate_max_rel": float(((ga - gr).abs() / gr.abs().clamp(min=1e-12)).max())}

    def count_kernels(fn):
        if SMOKE:
            fn()
            return 0, []
        fn()
        torch.cuda.synchronize()
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
        names = [e.name for e in prof.events() if e.device_type.name == "CUDA"
                 and "memcpy" not in e.name.lower() and "memset" not in e.name.lower()]
        return len(names), names

    for name, fn in (("unfused", unfused), ("torch fused", torch_fused), ("fused", fused)):
        try:
            nk, names = count_kernels(fn)
            p = bench_plain(fn)
            gr_ = bench_graph(lambda _b, fn=fn: fn, [None])
        except Exception as e:
            log(f"indexer {name} FAILED {e!r}"[:400])
            ind[name] = {"kernels": -1, "names": [], "plain_us": float("nan"),
                         "graph_us": float("nan"), "error": repr(e)[:300]}
            continue
        ind[name] = {"kernels": nk, "names": names, "plain_us": p, "graph_us": gr_}
        log(f"indexer {name}: {nk} kernels, plain {p:.1f} us, graph {gr_:.1f} us: {names}"[:900])
    results["indexer"] = ind


def table(results):
    out = []
    out.append(f"TopK (7 rows, k={K}, page size {PAGE}, translation fused): us, plain / "
               f"graph-replayed; topk_v2 backend: {results.get('topk_v2_backend')}")
    hdr = f"{'size':>5} | {'V1 sort':>15} | {'torch.topk':>15} | {'V2 Triton':>15} | " \
          f"{'V2 CUDA':>15} | {'read':>5} | {'amax':>5} | target | ok"
    out.append(hdr)
    out.append("-" * len(hdr))

    def f(v):
        return "-" if not v else f"{v[0]:6.1f} / {v[1]:6.1f}"

    for r in results.get("topk", []):
        tgt = TARGET.get(r["size"])
        out.append(f"{r['size']:>5} | {f(r.get('V1 sort')):>15} | {f(r.get('torch.topk')):>15} | "
                   f"{f(r.get('V2 triton')):>15} | {f(r.get('V2 cuda')):>15} | "
                   f"{r['read_once_us']:5.1f} | {r.get('amax_read_graph_us', float('nan')):5.1f} | "
                   f"{('<=' + str(tgt)) if tgt else '-':>6} | "
                   f"{r['correct']}")
    for r in results.get("topk", []):
        sw = r.get("cuda_clusters_graph_us")
        if sw:
            out.append(f"  {r['size']}: CUDA cluster size (graph us, exact): planned C="
                       f"{r.get('cuda_plan_cluster')}; " + ", ".join(
                           f"C={c} {v[0]:.1f}{'' if v[1] is True else ' (' + str(v[1]) + ')'}"
                           for c, v in sw.items()))
        for vname, v in (r.get("cuda_variants") or {}).items():
            out.append(f"  {r['size']}: CUDA variant {vname:<26} {v[0]:6.1f} / {v[1]:6.1f} us "
                       f"exact={v[2]}")
        if r.get("V2 triton best") and len(r.get("tune", [])) > 1:
            out.append(f"  {r['size']}: Triton best cfg {r['V2 triton best'][2]} "
                       f"{r['V2 triton best'][1]:.1f} us graph")
    ind = results.get("indexer")
    if ind:
        out.append("Indexer prologue (T=7, hidden 6144, 32 heads x 128, rope 64, bf16): "
                   "kernels, us plain / graph")
        for name in ("unfused", "torch fused", "fused"):
            v = ind[name]
            out.append(f"  {name:>12}: {v['kernels']:3d} kernels  {v['plain_us']:7.1f} / "
                       f"{v['graph_us']:6.1f}")
        out.append(f"  check: k bytes equal {ind['k_bytes_equal_frac']:.4f}, q max rel diff "
                   f"{ind['q_max_rel_diff']:.4f}, gate max rel {ind['gate_max_rel']:.2e}")
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "bench_out"))
    ap.add_argument("--tune", action="store_true", help="also time the launch-plan variants")
    ap.add_argument("--quick", action="store_true", help="skip V1 at 1M")
    ap.add_argument("--bw", type=float, default=4.3e12, help="read bandwidth for the floor, B/s")
    ap.add_argument("--skip-indexer", action="store_true")
    ap.add_argument("--skip-topk", action="store_true")
    ap.add_argument("--sizes", default="", help="comma-separated subset of 8K,32K,80K,256K,1M")
    ap.add_argument("--cuda-only", action="store_true",
                    help="TopK: only the CUDA kernel (no V1, torch.topk, Triton)")
    ap.add_argument("--cuda-variants", action="store_true",
                    help="also time the CUDA kernel's streamed-chunk variants (CUDA_VARIANTS)")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    import triton

    results = {"date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
               "gpu": "cpu-smoke" if SMOKE else torch.cuda.get_device_name(), "torch": torch.__version__,
               "triton": triton.__version__}
    log(json.dumps(results))
    t0 = time.time()
    if not args.skip_topk:
        topk_section(args, results)
    if not args.skip_indexer:
        try:
            indexer_section(args, results)
        except Exception as e:
            import traceback

            traceback.print_exc()
            results["indexer_error"] = repr(e)
    results["wall_s"] = time.time() - t0
    tab = table(results)
    with open(os.path.join(args.out, "bench_kernels.json"), "w") as fh:
        json.dump(results, fh, indent=1, default=str)
    with open(os.path.join(args.out, "table.txt"), "w") as fh:
        fh.write(f"{results['date']} {results['gpu']} torch {results['torch']} triton "
                 f"{results['triton']}\n{tab}\n")
    log("\n" + f"{results['date']} {results['gpu']}\n" + tab)


if __name__ == "__main__":
    main()
