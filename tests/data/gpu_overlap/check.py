#!/usr/bin/env python3
"""Independent checker for the traces in this folder (stdlib only: gzip + json; no profkit code).

    python3 tests/data/gpu_overlap/check.py [TRACE ...] [--write expected.json] [--assert]

Without TRACE arguments it reads every *.trace.json.gz beside this file. For each trace, per
`scheduler.run_batch` iteration, with DESIGN.md's definitions:

* CPU window i = [marker_i start, marker_{i+1} start); the last one ends at its marker's end.
* A GPU op (Kineto cat kernel / gpu_memcpy / gpu_memset) is *owned* by the window in which its
  launch call (cuda_runtime / cuda_driver event with the same correlation) starts.
* GPU window i = [first owned op start of i, first owned op start of i+1); the last one ends at its
  last owned op's end.
* busy  = length of the union of ALL GPU ops of the device, clipped to the GPU window.
* owned = length of the union of the iteration's own ops, unclipped.
* spill = the part of `owned` outside the GPU window.
* busy share = busy / GPU window.

Gaps: every gap of at least 2 us in the device's busy union whose start lies in an iteration's GPU
window. For each gap, the exclusive time of each CPU op (cat cpu_op, on the thread that launched
GPU work) inside the gap: an op's interval minus its child cpu_ops' intervals, intersected with
the gap. Summed per op name over all gaps (`idle_us_by_op`) and, per op name, the number of gaps in
which it has exclusive time (`gaps_by_op`).

Times are converted once to integer nanoseconds (Kineto writes microsecond floats).
"""

from __future__ import annotations

import argparse
import bisect
import collections
import glob
import gzip
import json
import os
import sys

MARKER = "scheduler.run_batch"
GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
LAUNCH_CATS = ("cuda_runtime", "cuda_driver")
MIN_GAP_NS = 2000
HERE = os.path.dirname(os.path.abspath(__file__))


def ns(x) -> int:
    return int(round(float(x) * 1000.0))


def union(ivs):
    """Sorted, merged list of [s, e) intervals."""
    out = []
    for s, e in sorted(ivs):
        if e <= s:
            continue
        if out and s <= out[-1][1]:
            if e > out[-1][1]:
                out[-1][1] = e
        else:
            out.append([s, e])
    return out


def length(ivs) -> int:
    return sum(e - s for s, e in ivs)


def clip(ivs, a: int, b: int):
    return [[max(s, a), min(e, b)] for s, e in ivs if min(e, b) > max(s, a)]


def us(x_ns: int) -> float:
    return round(x_ns / 1000.0, 3)


def analyze(path: str) -> dict:
    with gzip.open(path, "rt") as f:
        doc = json.load(f)
    ev = [e for e in doc["traceEvents"] if e.get("ph") == "X" and "ts" in e]
    marks = sorted((e for e in ev if e.get("cat") == "user_annotation" and e.get("name") == MARKER),
                   key=lambda e: ns(e["ts"]))
    if not marks:
        raise SystemExit(f"{path}: no {MARKER} marker")
    starts = [ns(m["ts"]) for m in marks]
    ends = starts[1:] + [starts[-1] + ns(marks[-1]["dur"])]
    n = len(marks)

    def window_of(t: int):
        i = bisect.bisect_right(starts, t) - 1
        if i < 0 or t >= ends[i]:
            return None
        return i

    launch = {}
    for e in ev:
        if e.get("cat") in LAUNCH_CATS:
            c = e.get("args", {}).get("correlation")
            if c is not None and (c not in launch or e["cat"] == "cuda_runtime"):
                launch[c] = e
    gpu = [e for e in ev if e.get("cat") in GPU_CATS]
    devices = collections.Counter(e.get("pid") for e in gpu)
    dev = devices.most_common(1)[0][0] if devices else None  # None: a CPU-only trace (dry run)
    gpu = sorted((e for e in gpu if e.get("pid") == dev), key=lambda e: ns(e["ts"]))
    all_ivs = union([ns(e["ts"]), ns(e["ts"]) + ns(e["dur"])] for e in gpu)

    owned = [[] for _ in range(n)]
    launch_tids = collections.Counter()
    outside = 0
    for e in gpu:
        r = launch.get(e.get("args", {}).get("correlation"))
        i = window_of(ns(r["ts"])) if r is not None else None
        if i is None:
            outside += 1
            continue
        owned[i].append(e)
        launch_tids[(r.get("pid"), r.get("tid"))] += 1

    firsts = [min((ns(e["ts"]) for e in o), default=None) for o in owned]
    its = []
    for i in range(n):
        o = owned[i]
        row = {"index": i, "step": None, "cpu_wall_us": us(ends[i] - starts[i]), "owned_ops": len(o)}
        if not o:
            its.append(row)
            continue
        g0 = firsts[i]
        nxt = next((firsts[j] for j in range(i + 1, n) if firsts[j] is not None), None)
        g1 = nxt if nxt is not None else max(ns(e["ts"]) + ns(e["dur"]) for e in o)
        own_ivs = union([ns(e["ts"]), ns(e["ts"]) + ns(e["dur"])] for e in o)
        own = length(own_ivs)
        inside = length(clip(own_ivs, g0, g1))
        busy = length(clip(all_ivs, g0, g1))
        streams = collections.Counter(e.get("tid") for e in o)
        row.update({
            "gpu_window_us": us(g1 - g0), "gpu_busy_us": us(busy), "gpu_idle_us": us(g1 - g0 - busy),
            "busy_share": round(busy / (g1 - g0), 4) if g1 > g0 else None,
            "owned_gpu_us": us(own), "spill_us": us(own - inside),
            "owned_last_end_after_next_first_start_us": (
                us(max(ns(e["ts"]) + ns(e["dur"]) for e in o) - nxt) if nxt is not None else None),
            "streams": {str(k): v for k, v in sorted(streams.items(), key=lambda kv: str(kv[0]))},
            "_win": (g0, g1),
        })
        its.append(row)
    for m, row in zip(marks, its):
        t0, t1 = ns(m["ts"]), ns(m["ts"]) + ns(m["dur"])
        steps = [e["name"] for e in ev if e.get("cat") == "user_annotation" and e["name"].startswith("step[")
                 and t0 <= ns(e["ts"]) < t1 and e.get("tid") == m.get("tid")]
        row["step"] = steps[0] if steps else None

    # ------------------------------------------------ gaps and the CPU ops inside them
    tid = launch_tids.most_common(1)[0][0] if launch_tids else None
    ops = sorted((e for e in ev if e.get("cat") == "cpu_op" and (e.get("pid"), e.get("tid")) == tid),
                 key=lambda e: (ns(e["ts"]), -ns(e["dur"])))
    # exclusive intervals: each op's interval minus its direct children's (a stack walk)
    excl = []  # (start, end, name)
    stack = []  # [name, end, cursor]

    def pop_until(t):
        while stack and stack[-1][1] <= t:
            name, end, cur = stack.pop()
            if end > cur:
                excl.append((cur, end, name))
            if stack:
                stack[-1][2] = max(stack[-1][2], end)

    for e in ops:
        s, t = ns(e["ts"]), ns(e["ts"]) + ns(e["dur"])
        pop_until(s)
        if stack:
            top = stack[-1]
            if s > top[2]:
                excl.append((top[2], s, top[0]))
            top[2] = max(top[2], s)
            t = min(t, top[1])  # a child never outlives its parent (clock rounding)
        stack.append([e["name"], t, s])
    pop_until(float("inf"))
    excl.sort()
    ex_starts = [x[0] for x in excl]

    wins = [r["_win"] for r in its if "_win" in r]
    wstarts = [w[0] for w in wins]
    gaps = []
    for a, b in zip(all_ivs, all_ivs[1:]):
        g0, g1 = a[1], b[0]
        if g1 - g0 < MIN_GAP_NS:
            continue
        k = bisect.bisect_right(wstarts, g0) - 1
        if k < 0 or g0 >= wins[k][1]:
            continue
        gaps.append((g0, g1))
    idle = collections.Counter()
    count = collections.Counter()
    for g0, g1 in gaps:
        per = collections.Counter()
        j = max(0, bisect.bisect_left(ex_starts, g0) - 1)
        # exclusive intervals are disjoint and sorted: walk back while they may still overlap
        while j > 0 and excl[j - 1][1] > g0:
            j -= 1
        while j < len(excl) and excl[j][0] < g1:
            s, e, name = excl[j]
            ov = min(e, g1) - max(s, g0)
            if ov > 0:
                per[name] += ov
            j += 1
        for name, v in per.items():
            idle[name] += v
            count[name] += 1
    gap_total = sum(g1 - g0 for g0, g1 in gaps)
    for r in its:
        r.pop("_win", None)
    shares = [r["busy_share"] for r in its if r.get("busy_share") is not None]
    spills = [r["spill_us"] for r in its if "spill_us" in r]
    return {
        "file": os.path.basename(path),
        "bytes": os.path.getsize(path),
        "device_pid": dev,
        "iterations": n,
        "gpu_ops": len(gpu),
        "gpu_ops_outside_iterations": outside,
        "per_iteration": its,
        "busy_share_min": min(shares) if shares else None,
        "spill_us_min": min(spills) if spills else None,
        "gaps_ge_2us": len(gaps),
        "gap_us_total": us(gap_total),
        "longest_gap_us": us(max((g1 - g0 for g0, g1 in gaps), default=0)),
        "top_ops_by_idle_us": [[k, us(v)] for k, v in idle.most_common(8)],
        "top_ops_by_gap_count": [[k, v] for k, v in sorted(count.items(), key=lambda kv: (-kv[1], kv[0]))[:8]],
    }


def checks(res: dict) -> list[str]:
    """The properties each fixture was recorded to show; returns the failures."""
    bad = []
    name = res["file"]
    its = [r for r in res["per_iteration"] if r.get("gpu_window_us")]
    if name.startswith("overlap_"):
        for r in its:
            if r["busy_share"] < 0.95:
                bad.append(f"{name} it{r['index']}: busy share {r['busy_share']} < 0.95")
        for r in its[:-1]:  # the last iteration has no next one to spill into
            if not r["spill_us"] > 0:
                bad.append(f"{name} it{r['index']}: spill {r['spill_us']} is not > 0")
    if name.startswith("eager_long_gap"):
        top_idle = res["top_ops_by_idle_us"][0][0] if res["top_ops_by_idle_us"] else None
        top_cnt = res["top_ops_by_gap_count"][0][0] if res["top_ops_by_gap_count"] else None
        if top_idle == top_cnt:
            bad.append(f"{name}: the same op ({top_idle}) ranks first by idle time and by gap count")
        if not (top_idle or "").startswith("aten::sort"):
            bad.append(f"{name}: top op by idle time is {top_idle}, not the host-side aten::sort")
        if top_cnt != "aten::mul":
            bad.append(f"{name}: top op by gap count is {top_cnt}, not aten::mul")
        if res["gaps_ge_2us"] < 50:
            bad.append(f"{name}: only {res['gaps_ge_2us']} gaps >= 2 us")
    return bad


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("traces", nargs="*")
    p.add_argument("--write", help="write the results as JSON here")
    p.add_argument("--assert", dest="strict", action="store_true", help="exit 1 when a check fails")
    a = p.parse_args(argv)
    paths = a.traces or sorted(glob.glob(os.path.join(HERE, "*.trace.json.gz")))
    out, failed = {}, []
    for path in paths:
        res = analyze(path)
        bad = checks(res)
        res["checks_failed"] = bad
        failed += bad
        out[res["file"]] = res
        print(f"== {res['file']} ({res['bytes']} B): {res['iterations']} iterations, {res['gpu_ops']} GPU ops "
              f"({res['gpu_ops_outside_iterations']} outside)")
        for r in res["per_iteration"]:
            if r.get("gpu_window_us") is None:
                print(f"   it{r['index']}: no owned GPU ops")
                continue
            print(f"   it{r['index']} {r['step']}: cpu {r['cpu_wall_us']} us, gpu window {r['gpu_window_us']} us, "
                  f"busy {r['gpu_busy_us']} ({100 * r['busy_share']:.1f}%), owned {r['owned_gpu_us']}, "
                  f"spill {r['spill_us']}")
        print(f"   gaps>=2us {res['gaps_ge_2us']} ({res['gap_us_total']} us, longest {res['longest_gap_us']} us)")
        print(f"   top ops by idle us: {res['top_ops_by_idle_us'][:4]}")
        print(f"   top ops by gap count: {res['top_ops_by_gap_count'][:4]}")
        for b in bad:
            print(f"   CHECK FAILED: {b}")
    if a.write:
        with open(a.write, "w") as f:
            json.dump({"checker": "tests/data/gpu_overlap/check.py", "min_gap_us": MIN_GAP_NS / 1000,
                       "traces": out}, f, indent=1)
            f.write("\n")
    if failed:
        print(f"{len(failed)} check(s) failed")
    return 1 if (failed and a.strict) else 0


if __name__ == "__main__":
    sys.exit(main())
