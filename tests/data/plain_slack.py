"""A plain second opinion on overlap slack (stdlib only, shares no code with profkit).

    python3 tests/data/plain_slack.py TRACE.json.gz      # prints JSON: [{"from", "to", "slack_us"}, ...]

DESIGN.md "Overlap slack", from the raw events: iterations are the `scheduler.run_batch` spans (a
window runs from one span's start to the next one's; the last ends at its span's end). A GPU op
(kernel, gpu_memcpy, gpu_memset) belongs to the iteration whose window holds the start of its launch
call (the cuda_runtime/cuda_driver event with the same correlation id; replayed kernels share their
cudaGraphLaunch's). For consecutive iterations N, N+1 that both own ops: slack = the latest end of
N's ops - the start of the launch call of N+1's earliest-starting op (ties: the earliest launch).
Times are integer ns: round(µs * 1000), as the trace's microsecond floats carry nanoseconds.
"""
import gzip
import json
import sys
from decimal import Decimal


def ns(us):
    # the µs float's shortest repr, in decimal: exact to the ns the profiler wrote
    return int((Decimal(repr(us)) * 1000).to_integral_value())


def slack(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        events = json.load(f)["traceEvents"]
    xs = [e for e in events if e.get("ph") == "X" and "ts" in e]
    marks = sorted(ns(e["ts"]) for e in xs if e.get("name") == "scheduler.run_batch" and e.get("cat") in ("user_annotation", "cpu_op"))
    last = max((ns(e["ts"]) + ns(e.get("dur", 0)) for e in xs if e.get("name") == "scheduler.run_batch"
                and e.get("cat") in ("user_annotation", "cpu_op") and ns(e["ts"]) == marks[-1]), default=None)
    windows = [(a, marks[i + 1] if i + 1 < len(marks) else last) for i, a in enumerate(marks)]
    launch = {}
    for e in sorted(xs, key=lambda e: e["ts"]):
        c = (e.get("args") or {}).get("correlation")
        if e.get("cat") in ("cuda_runtime", "cuda_driver") and c is not None and c not in launch:
            launch[c] = ns(e["ts"])
    owned = {}
    for e in xs:
        if e.get("cat") not in ("kernel", "gpu_memcpy", "gpu_memset"):
            continue
        t = launch.get((e.get("args") or {}).get("correlation"))
        if t is None:
            continue
        for i, (a, b) in enumerate(windows):
            if a <= t < b:
                start = ns(e["ts"])
                owned.setdefault(i, []).append((start, start + ns(e.get("dur", 0)), t))
                break
    out = []
    for i in sorted(owned):
        if i + 1 in owned:
            end_n = max(o[1] for o in owned[i])
            first = min(owned[i + 1], key=lambda o: (o[0], o[2]))
            out.append({"from": i, "to": i + 1, "slack_us": (end_n - first[2]) / 1000.0})
    return out


if __name__ == "__main__":
    print(json.dumps(slack(sys.argv[1])))
