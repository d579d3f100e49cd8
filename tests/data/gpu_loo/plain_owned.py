"""A plain second opinion on kernel time by ownership per category (stdlib only, shares no code with profkit).

    python3 tests/data/gpu_loo/plain_owned.py RUN_FOLDER [WINDOW]    # prints JSON

For one profile window of a proxy run recorded with CUDA graphs (window-<WINDOW>/, default 0, and the
run's graph_capture_profile/), the GPU time each iteration owns, by category, summed over the
iterations a diff compares: an op belongs to the iteration whose `scheduler.run_batch` span holds the
start of its launch call (same correlation id; every op replayed from a graph shares its
cudaGraphLaunch's), durations whole (unclipped). Compared iterations: those that own verify-phase
work (a `step[VERIFY ...]` span around a launch), the window's last iteration left out.

Category of an op launched eagerly: the innermost `proxy.*` range around its launch on the launching
thread, else its name. Of a replayed op: the k-th op of a replay (by start) is the k-th launch
captured between cudaStreamBeginCapture and cudaStreamEndCapture in a capture profile of the same
step (`cuda_graph_capture[<step> ...]`, the replay's enclosing draft / step[VERIFY] / draft_extend
span) with as many launches; the category comes from the replayed op's own name and that launch's
innermost proxy.* range, as for an eager op. The rules
below are written from kernels/proxy.toml's documentation, not read from it.
"""
import glob
import gzip
import json
import re
import sys
from collections import defaultdict

GPU = ("kernel", "gpu_memcpy", "gpu_memset")
LAUNCH_NAMES = {"cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx", "cudaMemcpyAsync",
                "cudaMemsetAsync"}
COPY_LAUNCHES = {"cudaMemcpyAsync", "cudaMemsetAsync"}
RANGES = [("topk", r"^proxy\.indexer\.topk"), ("indexer", r"^proxy\.indexer"), ("attention", r"^proxy\.attention"),
          ("moe", r"^proxy\.moe"), ("gemm", r"^proxy\.(qkv_proj|lm_head|proj)"), ("sampling", r"^proxy\.sampl")]
NAMES = [("topk", r"\btopk_v2_"), ("indexer", r"\bindexer_[kq]_fused_"),
         ("topk", r"(?i)radixsort|radix_sort|bitonicsort|sbtopk|mbtopk|gathertopk|fill_reverse_indices|sort_postprocess")]
FALLBACK = [("memcpy", r"^(Memcpy|Memset)\b|direct_copy_kernel|CatArrayBatchedCopy|\bcopy_kernel\b"),
            ("sampling", r"(?i)sampl|argmax|softmax|multinomial"),
            ("rope", r"(?i)\b(sin|cos)_kernel_cuda|pow_tensor_(tensor|scalar)_kernel"),
            ("norm", r"(?i)rms_?norm|layer_?norm|norm_kernel"),
            ("gemm", r"(?i)nvjet|xmma_gemm|gemm|gemv|cutlass|cublas|^cijk_|matmul|splitkreduce|triton_tem_"),
            ("reduce", r"(?i)\breduce_kernel|reduction|devicereduce|devicescan|cumsum|cumprod|logsumexp|scan_impl|\bscan|_scan_"),
            ("elementwise", r"(?i)elementwise|index_?kernel|indexselect|index_select|indexing|gather|scatter|fill|arange|act_and_mul|"
                            r"silu|gelu|activation|masked|where_kernel|embedding|_to_copy|nonzero|clamp|unrolled")]


def category(is_copy, name, rng):
    """The proxy catalog's order: copies (top-k's own inside proxy.indexer.topk), owned kernel names, ranges, names."""
    if is_copy:
        return "topk" if rng and re.search(RANGES[0][1], rng) else "memcpy"
    for cat, rx in NAMES:
        if name and re.search(rx, name):
            return cat
    for cat, rx in RANGES:
        if rng and re.search(rx, rng):
            return cat
    for cat, rx in FALLBACK:
        if name and re.search(rx, name):
            return cat
    return "other"


def events(path):
    return [e for e in json.load(gzip.open(path))["traceEvents"] if e.get("ph") == "X"]


def innermost(spans, tid, ts, pattern=r"^proxy\."):
    best = None
    for s in spans:
        if s["tid"] == tid and s["ts"] <= ts <= s["ts"] + s["dur"] and re.search(pattern, s["name"]):
            if best is None or s["ts"] >= best["ts"]:
                best = s
    return best["name"] if best else None


def captures(run):
    """(step, number of launches) -> [(is_copy, innermost proxy.* range) of each captured launch, in capture order]."""
    out = {}
    for f in sorted(glob.glob(f"{run}/graph_capture_profile/*.json.gz")):
        xs = events(f)
        spans = [e for e in xs if e.get("cat") == "user_annotation"]
        label = next((s["name"] for s in spans if s["name"].startswith("cuda_graph_capture[")), None)
        begin = min((e["ts"] for e in xs if e["name"] == "cudaStreamBeginCapture"), default=None)
        end = max((e["ts"] for e in xs if e["name"] == "cudaStreamEndCapture"), default=None)
        if label is None or begin is None or end is None:
            continue
        step = re.match(r"cuda_graph_capture\[(\w+)", label).group(1)
        ls = sorted((e for e in xs if e.get("cat") in ("cuda_runtime", "cuda_driver") and e["name"] in LAUNCH_NAMES
                     and begin <= e["ts"] <= end), key=lambda e: e["ts"])
        cats = [(e["name"] in COPY_LAUNCHES, innermost(spans, e["tid"], e["ts"])) for e in ls]
        key = (step, len(cats))
        if key in out and out[key] != cats:
            raise SystemExit(f"{f}: two captures of {key} with different ranges")
        out[key] = cats
    return out


STEP_OF = [("draft_extend", r"^draft_extend\b"), ("draft", r"^draft\b"), ("verify", r"^step\[VERIFY\b")]


def window(run, w=0):
    caps = captures(run)
    (path,) = glob.glob(f"{run}/window-{w}/*.json.gz")
    xs = events(path)
    its = sorted((e for e in xs if e["name"] == "scheduler.run_batch" and e.get("cat") == "user_annotation"), key=lambda e: e["ts"])
    spans = [e for e in xs if e.get("cat") == "user_annotation"]
    launches = {e["args"]["correlation"]: e for e in xs
                if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})}
    ops = defaultdict(list)  # correlation -> its GPU ops
    for e in xs:
        if e.get("cat") in GPU and e["args"].get("correlation") in launches:
            ops[e["args"]["correlation"]].append(e)

    def owner(ts):
        for k, it in enumerate(its):
            end = its[k + 1]["ts"] if k + 1 < len(its) else it["ts"] + it["dur"]
            if it["ts"] <= ts < end:
                return k
        return None

    per = [defaultdict(float) for _ in its]
    verify = [False] * len(its)
    unmapped = 0.0
    for corr, gops in ops.items():
        launch = launches[corr]
        i = owner(launch["ts"])
        if i is None:
            continue
        step = next((s for s, rx in STEP_OF if innermost(spans, launch["tid"], launch["ts"], rx)), None)
        if step == "verify":
            verify[i] = True
        if launch["name"] == "cudaGraphLaunch":
            gops = sorted(gops, key=lambda e: e["ts"])
            captured = caps.get((step, len(gops)))
            if captured is None:  # no capture of this step with as many launches: the name alone
                unmapped += sum(e["dur"] for e in gops)
                captured = [(e.get("cat") != "kernel", None) for e in gops]
            for e, (_, rng) in zip(gops, captured):  # the replayed op's own name, its captured launch's range
                per[i][category(e.get("cat") != "kernel", e["name"], rng)] += e["dur"]
        else:
            rng = innermost(spans, launch["tid"], launch["ts"])
            for e in gops:
                per[i][category(e.get("cat") != "kernel", e["name"], rng)] += e["dur"]
    keep = [k for k in range(len(its) - 1) if verify[k]]  # the last iteration left out, as a diff does
    total = defaultdict(float)
    for k in keep:
        for c, v in per[k].items():
            total[c] += v
    return {"iterations": keep, "owned_category_us": dict(sorted(total.items())), "unmapped_replay_us": unmapped}


if __name__ == "__main__":
    print(json.dumps(window(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 0)))
