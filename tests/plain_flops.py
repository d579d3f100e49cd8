"""A plain count of GEMM work per iteration from a Kineto trace's raw events (stdlib only; shares no code with profkit).

    python3 tests/plain_flops.py TRACE [--marker REGEX] [--captures DIR]      # prints JSON

Issue 41's second opinion. For each iteration (a CPU `user_annotation` span whose name matches
--marker; default `scheduler.run_batch`, `decode_step` or `prefill`), the GEMMs that ran in it, each
counted once, with

    flops = 2·M·N·K (times the batch of a bmm/baddbmm/batched matmul),
    bytes = both operands + the result, each at its dtype's size (a bias or `self` added in is not counted),

from the `Input Dims` / `Input type` that `record_shapes=True` writes on each CPU op.

Which op: a GEMM is counted at the op that launched its kernel: among the CPU ops `aten::mm`,
`aten::addmm`, `aten::bmm`, `aten::baddbmm`, `aten::linear`, `aten::matmul`, `aten::_scaled_mm` (and the
in-place `aten::addmm_`, `aten::baddbmm_`), one that is the innermost CPU op (by time nesting on the
launching thread) around a kernel launch call (`cudaLaunchKernel`, `cudaLaunchKernelExC`, `cuLaunchKernel`,
`cuLaunchKernelEx`, their HIP names) whose correlation id has a GPU kernel record. So `aten::linear ->
aten::matmul -> aten::mm -> cudaLaunchKernel` counts once, at `aten::mm`, with `aten::mm`'s own shapes; a copy
kernel that `aten::matmul` launches through `aten::contiguous -> aten::copy_` makes no GEMM; a GEMM op
that launched nothing on the GPU (a CPU tensor) counts nothing. An op belongs to the iteration whose
span holds its start.

Graph replays (a `cudaGraphLaunch` in an iteration, with --captures DIR: the folder of profiled graph
captures, `cuda_graph_capture-*.json.gz`): the GEMMs of the graph are those of its profiled capture,
counted the same way but over the launch calls made between `cudaStreamBeginCapture` and
`cudaStreamEndCapture` (a captured launch has no kernel record: nothing ran). Which capture a replay
ran: the capture whose label (`cuda_graph_capture[<step> ...]`) names the step of the innermost span
around the replay's launch (`draft`, `draft_extend`, `step[VERIFY ...]` -> verify, `step[DECODE ...]` ->
decode) and which captured as many launches (kernels, copies and memsets) as the replay ran GPU ops. When
several captures match and their GEMM work differs the replay is `ambiguous` (counted nothing; the
output says how many).
"""

from __future__ import annotations

import argparse
import bisect
import glob
import gzip
import json
import math
import os
import re
import sys
from collections import Counter, defaultdict

GEMM_OPS = {"aten::mm", "aten::addmm", "aten::addmm_", "aten::bmm", "aten::baddbmm", "aten::baddbmm_", "aten::linear",
            "aten::matmul", "aten::_scaled_mm"}
KERNEL_LAUNCHES = {"cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx", "cudaLaunchCooperativeKernel",
                   "hipLaunchKernel", "hipExtLaunchKernel", "hipModuleLaunchKernel", "hipExtModuleLaunchKernel"}
ALL_LAUNCHES = KERNEL_LAUNCHES | {"cudaMemcpyAsync", "cudaMemsetAsync", "hipMemcpyAsync", "hipMemsetAsync"}
GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
# bytes per element, by the type name Kineto writes (c10's C++ names)
DTYPE_BYTES = {"float": 4, "double": 8, "c10::Half": 2, "c10::BFloat16": 2, "c10::Float8_e4m3fn": 1, "c10::Float8_e5m2": 1,
               "c10::Float8_e4m3fnuz": 1, "c10::Float8_e5m2fnuz": 1, "c10::Float8_e8m0fnu": 1, "c10::Float4_e2m1fn_x2": 1,
               "signed char": 1, "unsigned char": 1, "bool": 1, "short int": 2, "int": 4, "long int": 8,
               "c10::complex<float>": 8, "c10::complex<double>": 16}
# torch ScalarType codes (c10/core/ScalarType.h) for _scaled_mm's out_dtype, as `Concrete Inputs` writes them
SCALAR_TYPE_BYTES = {0: 1, 1: 1, 2: 2, 3: 4, 4: 8, 5: 2, 6: 4, 7: 8, 11: 1, 15: 2, 23: 1, 24: 1, 25: 1, 26: 1}
DEFAULT_MARKER = r"^(scheduler\.run_batch|decode_step|prefill)$"
STEPS = [("draft_extend", r"^draft_extend\b"), ("draft", r"^draft\b"), ("verify", r"^step\[VERIFY\b"), ("decode", r"^step\[DECODE\b")]


def load(path: str) -> list[dict]:
    with gzip.open(path) if path.endswith(".gz") else open(path, "rb") as f:
        return [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]


def prod(xs) -> int:
    return math.prod(int(x) for x in xs)


def work(op: dict) -> tuple[int, int, str] | None:
    """(flops, bytes, shape text) of one GEMM op from its Input Dims / Input type; None without shapes."""
    a = op.get("args", {})
    dims, types = a.get("Input Dims"), a.get("Input type")
    if not dims or not types:
        return None
    name = op["name"]
    size = [DTYPE_BYTES.get(t, 0) if t else 0 for t in types]

    def operands(i, j):
        return dims[i], dims[j], size[i], size[j]

    if name in ("aten::mm", "aten::_scaled_mm"):
        x, w, sx, sw = operands(0, 1)
        m, k, n, batch = x[0], x[1], w[1], 1
        so = sx
        if name == "aten::_scaled_mm":
            conc = a.get("Concrete Inputs") or []
            code = conc[6] if len(conc) > 6 else ""
            so = SCALAR_TYPE_BYTES.get(int(code), sx) if str(code).lstrip("-").isdigit() else sx
    elif name in ("aten::addmm", "aten::addmm_"):
        x, w, sx, sw = operands(1, 2)
        m, k, n, batch, so = x[0], x[1], w[1], 1, sx
    elif name == "aten::bmm":
        x, w, sx, sw = operands(0, 1)
        batch, m, k, n, so = x[0], x[1], x[2], w[2], sx
    elif name in ("aten::baddbmm", "aten::baddbmm_"):
        x, w, sx, sw = operands(1, 2)
        batch, m, k, n, so = x[0], x[1], x[2], w[2], sx
    elif name == "aten::linear":
        x, w, sx, sw = operands(0, 1)
        batch, m, k, n, so = 1, prod(x[:-1]), x[-1], w[0], sx
    elif name == "aten::matmul":
        x, w, sx, sw = operands(0, 1)
        xa = [1] + list(x) if len(x) == 1 else list(x)
        wa = list(w) + [1] if len(w) == 1 else list(w)
        lead_x, lead_w = xa[:-2], wa[:-2]
        n_lead = max(len(lead_x), len(lead_w))
        lead_x, lead_w = [1] * (n_lead - len(lead_x)) + lead_x, [1] * (n_lead - len(lead_w)) + lead_w
        batch = prod(max(p, q) for p, q in zip(lead_x, lead_w))
        m, k, n, so = xa[-2], xa[-1], wa[-1], sx
    else:
        return None
    flops = 2 * batch * m * n * k
    nbytes = prod(x) * sx + prod(w) * sw + batch * m * n * so
    return flops, nbytes, f"{name}{[list(d) for d in dims if d]}{[t for t in types if t]}"


def gemm_ops_by_launch(xs: list[dict], launches: list[dict]) -> dict[int, dict]:
    """id(GEMM op) -> op, for each given launch call whose innermost CPU op (time nesting, same thread) is a GEMM op."""
    by_tid = defaultdict(list)
    for e in launches:
        by_tid[(e["pid"], e["tid"])].append(e)
    starts = {}
    for k, v in by_tid.items():
        v.sort(key=lambda e: e["ts"])
        starts[k] = [e["ts"] for e in v]
    owner: dict[int, dict] = {}  # id(launch) -> innermost CPU op so far
    for op in xs:
        if op.get("cat") != "cpu_op":
            continue
        key = (op["pid"], op["tid"])
        if key not in by_tid:
            continue
        lo, hi = op["ts"], op["ts"] + op.get("dur", 0)
        ts = starts[key]
        for i in range(bisect.bisect_left(ts, lo), bisect.bisect_right(ts, hi)):
            launch = by_tid[key][i]
            if launch["ts"] + launch.get("dur", 0) > hi:
                continue
            cur = owner.get(id(launch))
            if cur is None or (op["ts"], -op.get("dur", 0)) > (cur["ts"], -cur.get("dur", 0)):
                owner[id(launch)] = op
    return {id(op): op for op in owner.values() if op["name"] in GEMM_OPS}


def capture_work(path: str) -> tuple[str | None, int, list[tuple[int, int, str]], int]:
    """(step, launches captured, [(flops, bytes, shape)] of its GEMMs, GEMM ops without shapes) of one capture profile."""
    xs = load(path)
    label = next((e["name"] for e in xs if e.get("cat") == "user_annotation" and e["name"].startswith("cuda_graph_capture[")), None)
    begin = min((e["ts"] for e in xs if e["name"] == "cudaStreamBeginCapture"), default=None)
    end = max((e["ts"] for e in xs if e["name"] == "cudaStreamEndCapture"), default=None)
    if label is None or begin is None or end is None:
        return None, 0, [], 0
    m = re.match(r"cuda_graph_capture\[(\w+)", label)
    if m is None:
        return None, 0, [], 0
    step = m.group(1)
    captured = [e for e in xs if e.get("cat") in ("cuda_runtime", "cuda_driver") and e["name"] in ALL_LAUNCHES and begin <= e["ts"] <= end]
    kernels = [e for e in captured if e["name"] in KERNEL_LAUNCHES]
    ops = gemm_ops_by_launch(xs, kernels)
    ws = [work(op) for op in sorted(ops.values(), key=lambda e: e["ts"])]
    return step, len(captured), [w for w in ws if w], sum(1 for w in ws if w is None)


def count(trace: str, marker: str = DEFAULT_MARKER, captures: str | None = None) -> dict:
    xs = load(trace)
    its = sorted((e for e in xs if e.get("cat") == "user_annotation" and re.search(marker, e["name"])), key=lambda e: e["ts"])
    spans = [e for e in xs if e.get("cat") == "user_annotation"]
    kernel_corr = {e["args"]["correlation"] for e in xs if e.get("cat") == "kernel" and "correlation" in e.get("args", {})}
    gpu_ops = Counter(e["args"]["correlation"] for e in xs if e.get("cat") in GPU_CATS and "correlation" in e.get("args", {}))
    launches = [e for e in xs if e.get("cat") in ("cuda_runtime", "cuda_driver") and e["name"] in KERNEL_LAUNCHES
                and e.get("args", {}).get("correlation") in kernel_corr]
    ops = gemm_ops_by_launch(xs, launches)
    starts = [it["ts"] for it in its]

    def iteration(ts):
        i = bisect.bisect_right(starts, ts) - 1
        return i if i >= 0 and ts <= its[i]["ts"] + its[i]["dur"] else None

    rows = [{"name": it["name"], "ts": it["ts"], "gemms": 0, "flops": 0, "bytes": 0, "replayed_gemms": 0, "graph_replays": 0,
             "ambiguous_replays": 0, "no_shapes": 0, "shapes": Counter()} for it in its]
    outside = 0
    for op in ops.values():
        i = iteration(op["ts"])
        if i is None:
            outside += 1
            continue
        w = work(op)
        if w is None:
            rows[i]["no_shapes"] += 1
            continue
        rows[i]["gemms"] += 1
        rows[i]["flops"] += w[0]
        rows[i]["bytes"] += w[1]
        rows[i]["shapes"][w[2]] += 1
    graphs: defaultdict[tuple[str | None, int], list] = defaultdict(list)  # (step, launches) -> [(flops, bytes, gemms, shapes, no_shapes)]
    if captures:
        for f in sorted(glob.glob(os.path.join(captures, "*.json.gz"))):
            step, n, ws, bad = capture_work(f)
            if step is not None:
                graphs[(step, n)].append((sum(w[0] for w in ws), sum(w[1] for w in ws), len(ws), Counter(w[2] for w in ws), bad))
    for g in (e for e in xs if e.get("cat") == "cuda_runtime" and e["name"] in ("cudaGraphLaunch", "hipGraphLaunch")):
        i = iteration(g["ts"])
        if i is None:
            continue
        rows[i]["graph_replays"] += 1
        around = [s for s in spans if s["tid"] == g["tid"] and s["ts"] <= g["ts"] <= s["ts"] + s["dur"]]
        around.sort(key=lambda s: s["ts"])
        step = None
        for s in reversed(around):
            step = next((name for name, rx in STEPS if re.search(rx, s["name"])), None)
            if step:
                break
        cands = {(c[0], c[1], c[2], tuple(sorted(c[3].items())), c[4]) for c in graphs.get((step, gpu_ops[g["args"]["correlation"]]), [])}
        if len(cands) != 1:
            rows[i]["ambiguous_replays"] += 1
            continue
        fl, by, n, shapes, bad = cands.pop()
        rows[i]["flops"] += fl
        rows[i]["bytes"] += by
        rows[i]["gemms"] += n
        rows[i]["replayed_gemms"] += n
        rows[i]["no_shapes"] += bad
        rows[i]["shapes"].update(dict(shapes))
    for r in rows:
        r["shapes"] = dict(sorted(r["shapes"].items()))
    return {"trace": os.path.basename(trace), "marker": marker, "iterations": rows, "gemm_ops_outside_iterations": outside,
            "capture_graphs": len(graphs)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace")
    ap.add_argument("--marker", default=DEFAULT_MARKER)
    ap.add_argument("--captures", help="folder of profiled graph captures (cuda_graph_capture-*.json.gz)")
    a = ap.parse_args()
    try:
        out = count(a.trace, a.marker, a.captures)
    except (OSError, ValueError, KeyError) as e:
        sys.exit(f"{a.trace}: cannot read it as a Kineto trace ({e})")
    json.dump(out, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
