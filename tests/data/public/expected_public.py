#!/usr/bin/env python3
"""Independent expected values for the public traces (tests/data/public/README.md).

Plain Python, standard library only. It shares no code with profkit and does not import it: every
number is recomputed here from the raw Kineto events, following DESIGN.md "Definitions" as written:

  - GPU op: an "X" event of category kernel / gpu_memcpy / gpu_memset (compared case-insensitively,
    so the 2021 format's Kernel / Memcpy / Memset count too). Device = the event's pid.
  - Launch: the runtime/driver call (cat cuda_runtime / cuda_driver / Runtime) with the same
    args.correlation; the earliest such call if there are several.
  - Iteration marker: the first regex of MARKERS that matches any user_annotation / cpu_op /
    Operator event name; CPU window i = [marker_i.ts, marker_{i+1}.ts), the last ends at its
    marker's end. No marker: the whole trace is one window.
  - Ownership: a GPU op belongs to the iteration whose CPU window holds its launch's start.
  - GPU window: from the first owned op's start (made monotone) to the next owning iteration's
    start; the last one ends at max(its start, its last owned op's end).
  - busy = union of every GPU op of the trace clipped to the window ("by the clock"); owned = union
    of the iteration's own ops, unclipped; spill = owned - (owned inside the window).
  - Outside every iteration: ops launched before the first marker, after the last window's CPU end,
    or with no launch call in the trace.

All interval arithmetic is in integer nanoseconds (round(us * 1000)). Several devices: unions are
taken per device and summed (windows and ownership are over all ops of the trace).

    python3 tests/data/public/expected_public.py [TRACE_OR_DIR ...] [--out FILE]

Without arguments it reads every *.json.gz in ../shared/public-traces (the folder beside the
checkout; the traces are third-party data and never committed) and $PROFKIT_PUBLIC_TRACES, and
writes expected_public.json beside this file. Entries already in that JSON for traces not found this time are kept.
"""

from __future__ import annotations

import bisect
import gzip
import hashlib
import json
import os
import re
import sys
from collections import Counter, defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset", "memcpy", "memset"}
RUNTIME_CATS = {"cuda_runtime", "cuda_driver", "runtime"}
MARKER_CATS = {"user_annotation", "cpu_op", "operator"}
MARKERS = [r"^scheduler\.run_batch$", r"^step\[(DECODE|EXTEND|VERIFY|MIXED)\b", r"^execute_", r"^ProfilerStep#\d+$"]
# Host calls that enqueue device work, CUDA and HIP spellings (counted by their raw names here).
KERNEL_LAUNCH = {
    "cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx",
    "cudaLaunchCooperativeKernel", "cuLaunchCooperativeKernel",
    "hipLaunchKernel", "hipExtLaunchKernel", "hipLaunchKernelExC", "hipModuleLaunchKernel",
    "hipExtModuleLaunchKernel", "hipHccModuleLaunchKernel", "hipLaunchCooperativeKernel",
}
GRAPH_LAUNCH = {"cudaGraphLaunch", "cuGraphLaunch", "hipGraphLaunch"}
ASYNC_COPY_SET = {"cudaMemcpyAsync", "cudaMemsetAsync", "hipMemcpyAsync", "hipMemsetAsync"}
LAUNCH = KERNEL_LAUNCH | GRAPH_LAUNCH | ASYNC_COPY_SET
SUFFIX = re.compile(r"(_v\d+)?(_ptsz|_ptds)?$")


def base_name(name: str) -> str:
    return SUFFIX.sub("", name)


def is_num(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def ns(us) -> int:
    return round(us * 1000)


def merge(iv):
    """Sorted, disjoint [s, e) intervals covering iv."""
    out = []
    for s, e in sorted(iv):
        if out and s <= out[-1][1]:
            if e > out[-1][1]:
                out[-1][1] = e
        else:
            out.append([s, e])
    return out


def total(merged) -> int:
    return sum(e - s for s, e in merged)


def clip(merged, starts, a: int, b: int) -> int:
    """Length of merged ∩ [a, b); starts = [s for s, _ in merged]."""
    if b <= a or not merged:
        return 0
    i = max(bisect.bisect_right(starts, a) - 1, 0)
    n = 0
    while i < len(merged) and merged[i][0] < b:
        s, e = merged[i]
        lo, hi = max(s, a), min(e, b)
        if hi > lo:
            n += hi - lo
        i += 1
    return n


class Union:
    """Per-device merged unions of a set of ops, with clipping."""

    def __init__(self, ops):
        per = defaultdict(list)
        for o in ops:
            per[o["dev"]].append((o["s"], o["e"]))
        self.m = {d: merge(v) for d, v in per.items()}
        self.st = {d: [s for s, _ in m] for d, m in self.m.items()}

    def length(self) -> int:
        return sum(total(m) for m in self.m.values())

    def within(self, a: int, b: int) -> int:
        return sum(clip(m, self.st[d], a, b) for d, m in self.m.items())

    def by_device(self) -> dict:
        return {d: total(m) for d, m in sorted(self.m.items())}


def load(path: Path):
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    d = json.loads(raw)
    ev = d.get("traceEvents", []) if isinstance(d, dict) else d
    return raw, [e for e in ev if isinstance(e, dict)]


def corr(e):
    a = e.get("args") or {}
    c = a.get("correlation", a.get("correlation id"))
    if is_num(c):
        return int(c)
    if isinstance(c, str) and c.strip().lstrip("-").isdigit():
        return int(c)
    return None


def analyze(path: Path) -> dict:
    raw, ev = load(path)
    fbytes = path.read_bytes()
    tss = [e["ts"] for e in ev if is_num(e.get("ts"))]
    t0_us = min(tss) if tss else 0.0
    t0 = ns(t0_us)

    def rel(x: int) -> float:
        return round((x - t0) / 1000.0, 3)

    cats = Counter(e.get("cat") if isinstance(e.get("cat"), str) else ("<meta>" if e.get("ph") == "M" else "<none>") for e in ev)
    device_label = {}
    for e in ev:
        if e.get("ph") == "M" and e.get("name") in ("process_labels", "process_name"):
            lab = str((e.get("args") or {}).get("labels") or (e.get("args") or {}).get("name") or "")
            if re.match(r"^(GPU|MTIA|HPU|XPU|TPU|NPU)\b", lab):
                device_label[e.get("pid")] = lab

    ops, calls, marks = [], [], []
    first_call = {}
    other_dev = Counter()
    other_ops = defaultdict(list)  # accelerator events that are not GPU ops by DESIGN.md (e.g. MTIA's mtia_ccp_events)
    acc_calls = set()  # correlations of other runtimes' calls (e.g. mtia_runtime), for the note only
    for e in ev:
        cat = e.get("cat")
        if not isinstance(cat, str) or e.get("ph") != "X" or not is_num(e.get("ts")):
            continue
        lc = cat.lower()
        s = ns(e["ts"])
        d = e.get("dur")
        e_ns = s + max(ns(d) if is_num(d) else 0, 0)
        if lc in GPU_CATS:
            kind = "kernel" if lc == "kernel" else ("memcpy" if "memcpy" in lc else "memset")
            ops.append({"dev": str(e.get("pid")), "kind": kind, "s": s, "e": e_ns, "corr": corr(e)})
        elif lc in RUNTIME_CATS:
            name = e.get("name", "")
            c = corr(e)
            calls.append((s, name))
            if c is not None and (c not in first_call or s < first_call[c]):
                first_call[c] = s
        elif lc in MARKER_CATS:
            marks.append((s, e_ns, e.get("name", "")))
        elif e.get("pid") in device_label and lc not in ("gpu_user_annotation", "python_function") and not lc.endswith("runtime"):
            other_dev[cat] += 1
            other_ops[cat].append({"dev": str(e.get("pid")), "s": s, "e": e_ns, "corr": corr(e)})
        if lc.endswith("_runtime") and lc not in RUNTIME_CATS and corr(e) is not None:
            acc_calls.add(corr(e))

    # iteration markers
    marker = None
    mk = []
    for rx in MARKERS:
        r = re.compile(rx)
        hits = sorted({(s, e, n) for s, e, n in marks if r.search(n)})
        if hits:
            marker, mk = rx, []
            for h in hits:  # the same span recorded twice (cpu_op and user_annotation) is one marker
                if not any(h[0] == m[0] and h[2] == m[2] for m in mk):
                    mk.append(h)
            break
    if mk:
        cpu = [(mk[i][0], mk[i + 1][0] if i + 1 < len(mk) else mk[i][1]) for i in range(len(mk))]
        names = [m[2] for m in mk]
    else:
        lo = min((s for s, _, _ in marks), default=None)
        lo = min([x for x in [lo] + [s for s, _ in calls] + [o["s"] for o in ops] if x is not None], default=t0)
        ends = [o["e"] for o in ops] + [s for s, _ in calls] + [e for _, e, _ in marks]
        cpu = [(lo, max(ends, default=lo) + 1)]
        names = ["<whole trace>"]
    starts = [a for a, _ in cpu]
    first_cpu, last_cpu_end = cpu[0][0], cpu[-1][1]

    def owner(ts: int):
        if ts < first_cpu:
            return "before_first"
        if ts >= last_cpu_end:
            return "after_last"
        i = bisect.bisect_right(starts, ts) - 1
        if ts < cpu[i][1]:
            return i
        return "after_last"  # only possible past the last window (windows tile up to it)

    outside = []
    owned = defaultdict(list)
    why = Counter()
    for o in ops:
        lt = first_call.get(o["corr"]) if o["corr"] is not None else None
        w = "no_launch_in_trace" if lt is None else owner(lt)
        if isinstance(w, int):
            owned[w].append(o)
        else:
            why[w] += 1
            outside.append(o)

    # launches by CPU window
    launches_total = Counter(n for _, n in calls if n in LAUNCH)
    other_launch = Counter(n for _, n in calls if "Launch" in n and n not in LAUNCH and base_name(n) not in LAUNCH)
    launches_suffixed = Counter(n for _, n in calls if n not in LAUNCH and base_name(n) in LAUNCH)
    per_it_launch = defaultdict(Counter)
    for s, n in calls:
        b = base_name(n)
        if b in LAUNCH:
            w = owner(s)
            if isinstance(w, int):
                per_it_launch[w][b] += 1

    allu = Union(ops)
    # GPU windows
    gstart = {}
    prev = None
    for i in range(len(cpu)):
        if owned[i]:
            st = min(o["s"] for o in owned[i])
            if prev is not None:
                st = max(st, prev)
            gstart[i] = prev = st
    its_with = sorted(gstart)
    gend = {}
    for k, i in enumerate(its_with):
        if k + 1 < len(its_with):
            gend[i] = gstart[its_with[k + 1]]
        else:
            gend[i] = max(gstart[i], max(o["e"] for o in owned[i]))

    iters = []
    busy_sum = 0
    for i, (a, b) in enumerate(cpu):
        rec = {"index": i, "name": names[i], "cpu_start_us": rel(a), "cpu_end_us": rel(b), "wall_us": round((b - a) / 1000.0, 3)}
        lc = per_it_launch.get(i, Counter())
        rec["launch_calls"] = dict(sorted(lc.items()))
        rec["kernel_launches"] = sum(v for k, v in lc.items() if k in KERNEL_LAUNCH)
        rec["graph_launches"] = sum(v for k, v in lc.items() if k in GRAPH_LAUNCH)
        ow = owned.get(i, [])
        rec["owned_kernels"] = sum(1 for o in ow if o["kind"] == "kernel")
        rec["owned_memcpy"] = sum(1 for o in ow if o["kind"] == "memcpy")
        rec["owned_memset"] = sum(1 for o in ow if o["kind"] == "memset")
        if i in gstart:
            gs, ge = gstart[i], gend[i]
            busy = allu.within(gs, ge)
            ou = Union(ow)
            own = ou.length()
            inside = ou.within(gs, ge)
            busy_sum += busy
            rec.update({
                "gpu_start_us": rel(gs), "gpu_end_us": rel(ge), "gpu_window_us": round((ge - gs) / 1000.0, 3),
                "busy_us": round(busy / 1000.0, 3), "idle_us": round((ge - gs - busy) / 1000.0, 3),
                "owned_us": round(own / 1000.0, 3), "spill_us": round((own - inside) / 1000.0, 3),
            })
        else:
            rec.update({"gpu_start_us": None, "gpu_end_us": None, "gpu_window_us": None, "busy_us": None,
                        "idle_us": None, "owned_us": None, "spill_us": None})
        iters.append(rec)

    whole = allu.length()
    if its_with:
        span_a, span_b = gstart[its_with[0]], gend[its_with[-1]]
        dev_in = allu.within(span_a, span_b)
    else:
        span_a = span_b = None
        dev_in = 0
    assert dev_in == busy_sum, (path.name, dev_in, busy_sum)  # the GPU windows tile the device timeline
    out_len = Union(outside).length()
    n_launch = sum(1 for _, n in calls if base_name(n) in KERNEL_LAUNCH | GRAPH_LAUNCH)
    devs = sorted({o["dev"] for o in ops})
    per_dev = {}
    for dv in devs:
        oo = [o for o in ops if o["dev"] == dv]
        per_dev[dv] = {
            "label": device_label.get(int(dv) if dv.lstrip("-").isdigit() else dv),
            "kernels": sum(1 for o in oo if o["kind"] == "kernel"),
            "gpu_memcpy": sum(1 for o in oo if o["kind"] == "memcpy"),
            "gpu_memset": sum(1 for o in oo if o["kind"] == "memset"),
            "busy_us": round(allu.by_device().get(dv, 0) / 1000.0, 3),
            "span_us": round((max(o["e"] for o in oo) - min(o["s"] for o in oo)) / 1000.0, 3),
        }
    return {
        "file": path.name,
        "bytes": len(fbytes),
        "sha256": hashlib.sha256(fbytes).hexdigest(),
        "uncompressed_bytes": len(raw),
        "events": len(ev),
        "events_by_cat": dict(cats.most_common()),
        "t0_us": t0_us,
        "devices": per_dev,
        "several_devices": len(devs) > 1,
        "other_device_event_cats": dict(other_dev.most_common()),
        # Not GPU ops under DESIGN.md (not counted anywhere else here): device-side events of other
        # categories on a device's pid, e.g. MTIA's mtia_ccp_events (HTA counts those as kernels).
        "other_device_ops": {
            c: {"events": len(v), "union_us": round(Union(v).length() / 1000.0, 3),
                "with_correlation": sum(1 for o in v if o["corr"] is not None),
                "with_runtime_call": sum(1 for o in v if o["corr"] in acc_calls or o["corr"] in first_call)}
            for c, v in sorted(other_ops.items())
        },
        "kernels": sum(1 for o in ops if o["kind"] == "kernel"),
        "gpu_memcpy": sum(1 for o in ops if o["kind"] == "memcpy"),
        "gpu_memset": sum(1 for o in ops if o["kind"] == "memset"),
        "launch_calls": dict(sorted(launches_total.items())),
        "launch_calls_suffixed": dict(sorted(launches_suffixed.items())),
        "other_launch_names": dict(sorted(other_launch.items())),
        "kernels_without_launch_call": sum(1 for o in ops if o["kind"] == "kernel" and first_call.get(o["corr"]) is None),
        "launches_without_gpu_ops": n_launch > 0 and not ops,
        "cpu_only": n_launch == 0 and not ops,
        "busy_whole_trace_us": round(whole / 1000.0, 3),
        "marker": marker,
        "iterations_n": len(cpu),
        "iterations": iters,
        "busy_sum_us": round(busy_sum / 1000.0, 3),
        "device_union_in_gpu_windows_us": round(dev_in / 1000.0, 3),
        "gpu_windows_span_us": [rel(span_a), rel(span_b)] if span_a is not None else None,
        "owned_sum_us": round(sum(r["owned_us"] or 0 for r in iters), 3),
        "spill_sum_us": round(sum(r["spill_us"] or 0 for r in iters), 3),
        "outside_iterations": {
            "gpu_ops": len(outside),
            "gpu_us": round(out_len / 1000.0, 3),
            "before_first": why["before_first"],
            "after_last": why["after_last"],
            "no_launch_in_trace": why["no_launch_in_trace"],
            "share_of_busy": round(out_len / whole, 6) if whole else 0.0,
        },
    }


def main(argv: list[str]) -> int:
    out = HERE / "expected_public.json"
    args = []
    it = iter(argv)
    for a in it:
        if a == "--out":
            out = Path(next(it))
        else:
            args.append(Path(a))
    if not args:
        args = [HERE.parents[3] / "shared" / "public-traces"]
        if os.environ.get("PROFKIT_PUBLIC_TRACES"):
            args.append(Path(os.environ["PROFKIT_PUBLIC_TRACES"]))
    files = {}
    for a in args:
        for p in (sorted(a.glob("*.json.gz")) if a.is_dir() else [a]):
            files.setdefault(p.name, p)
    result = json.loads(out.read_text()) if out.exists() else {}
    traces = result.get("traces", {})
    for name, p in sorted(files.items()):
        traces[name] = analyze(p)
        t = traces[name]
        print(f"{name}: kernels={t['kernels']} iters={t['iterations_n']} busy_sum={t['busy_sum_us']} "
              f"whole={t['busy_whole_trace_us']} outside={t['outside_iterations']['gpu_us']} "
              f"({100 * t['outside_iterations']['share_of_busy']:.1f}%) spill={t['spill_sum_us']}")
    result = {
        "generated_by": "tests/data/public/expected_public.py (stdlib only, independent of profkit)",
        "units": "microseconds; *_start_us/*_end_us relative to the trace's t0_us (absolute, earliest numeric ts)",
        "markers": MARKERS,
        "traces": dict(sorted(traces.items())),
    }
    out.write_text(json.dumps(result, indent=1, sort_keys=False) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
