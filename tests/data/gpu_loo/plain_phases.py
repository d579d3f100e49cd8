"""A plain second opinion on the change by phase (stdlib only, shares no code with profkit).

    python3 tests/data/gpu_loo/plain_phases.py BASELINE_RUN CANDIDATE_RUN    # prints JSON

Per verify iteration of window 0, GPU op time by phase by ownership: an op belongs to the iteration
whose scheduler.run_batch span holds the start of its launch call (same correlation id; a replayed
kernel shares its cudaGraphLaunch's), and its phase is the span around that launch on the launching
thread (draft_extend, draft, step[VERIFY ...], else other), as DESIGN.md "Phase" defines it.
Durations unclipped (profkit clips at the GPU windows: the two differ by each iteration's spill);
verify iterations are those that own verify-phase work; the last one is left out, as the diff does.
"""
import glob
import gzip
import json
import re
import statistics
import sys
from collections import defaultdict

RULES = [("draft_extend", r"^(draft_extend|spec\.draft_extend)\b"), ("draft", r"^(draft\b|step\[DRAFT)"),
         ("verify", r"^step\[(VERIFY|TARGET_VERIFY)\b")]

def per_iteration(path):
    ev = json.load(gzip.open(path))["traceEvents"]
    xs = [e for e in ev if e.get("ph") == "X"]
    # the host's spans only: Kineto also copies each annotation onto the GPU timeline (cat gpu_user_annotation),
    # and those copies are not iterations
    its = sorted((e for e in xs if e["name"] == "scheduler.run_batch" and e.get("cat") == "user_annotation"), key=lambda e: e["ts"])
    spans = [e for e in xs if e.get("cat") == "user_annotation"]
    launches = {e["args"]["correlation"]: e for e in xs if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})}
    out = [defaultdict(float) for _ in its]
    for e in xs:
        if e.get("cat") not in ("kernel", "gpu_memcpy", "gpu_memset"):
            continue
        l = launches.get(e["args"].get("correlation"))
        if l is None:
            continue
        i = next((k for k, it in enumerate(its) if it["ts"] <= l["ts"] < (its[k + 1]["ts"] if k + 1 < len(its) else it["ts"] + it["dur"])), None)
        if i is None:
            continue
        ph = "other"
        for name, rx in RULES:
            if any(re.search(rx, s["name"]) and s["tid"] == l["tid"] and s["ts"] <= l["ts"] <= s["ts"] + s["dur"] for s in spans):
                ph = name
                break
        out[i][ph] += e["dur"]
    v = [o for o in out if o.get("verify")][:-1]  # verify iterations: those that own verify-phase work
    return v

def run_means(run):
    first = per_iteration(glob.glob(f"{run}/window-0/*.json.gz")[0])  # the diff's decomposition: window 0
    return {p: statistics.mean(it.get(p, 0.0) for it in first) for p in ("draft", "verify", "draft_extend", "other")}

if __name__ == "__main__":
    b, c = run_means(sys.argv[1]), run_means(sys.argv[2])
    d = {p: c[p] - b[p] for p in b}
    print(json.dumps({"baseline": b, "candidate": c, "delta": d, "total": sum(d.values())}))
