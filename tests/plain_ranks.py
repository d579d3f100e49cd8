"""Independent per-rank figures of a Kineto file that holds several ranks (plain Python, stdlib only;
it shares no code with profkit).

    python3 tests/plain_ranks.py TRACE [--json OUT.json]

A rank is named the way each merging tool marks it, read here without profkit's rules: SGLang's
profile merger writes every event's pid as "<label> <pid>" (the label is everything up to the first
"] "); TraceLens' TraceFuse writes `args.rank` into every event. Any other file is one rank ("-").

Per rank:
  t0_us        the earliest `ts` of any of its events
  markers      how many events of each iteration marker name pattern (ProfilerStep#N,
               scheduler.run_batch) it has among its CPU events (cpu_op, user_annotation)
  devices      per device (args.device, else the event's pid without its label): kernels, memcpy,
               memset counts and busy_us, the length of the union of their [ts, ts + dur) intervals
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import sys
from collections import defaultdict

GPU = {"kernel": "kernels", "gpu_memcpy": "memcpy", "gpu_memset": "memset"}
MARKERS = {"ProfilerStep": re.compile(r"^ProfilerStep#\d+$"), "scheduler.run_batch": re.compile(r"^scheduler\.run_batch$")}


def load(path: str) -> dict:
    with open(path, "rb") as f:
        raw = f.read()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    doc = json.loads(raw)
    return doc if isinstance(doc, dict) else {"traceEvents": doc}


def rank_of(e: dict) -> tuple[str, str]:
    """(rank name, the pid without its label)."""
    pid = e.get("pid")
    if isinstance(pid, str) and pid.startswith("[") and "] " in pid:
        label, rest = pid.split("] ", 1)
        return label + "]", rest
    args = e.get("args")
    if isinstance(args, dict) and isinstance(args.get("rank"), int):
        return f"rank {args['rank']}", str(args.get("pid_raw", pid))
    return "-", str(pid)


def union_us(iv: list[tuple[float, float]]) -> float:
    total, cur_s, cur_e = 0.0, None, None
    for s, e in sorted(iv):
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        elif e > cur_e:
            cur_e = e
    if cur_e is not None:
        total += cur_e - cur_s
    return total


def figures(path: str) -> dict:
    ranks: dict[str, dict] = {}
    iv: dict[tuple[str, str], list] = defaultdict(list)
    for e in load(path).get("traceEvents", []):
        name, raw_pid = rank_of(e)
        r = ranks.setdefault(name, {"t0_us": None, "markers": {k: 0 for k in MARKERS}, "devices": {}})
        ts = e.get("ts")
        if isinstance(ts, (int, float)) and (r["t0_us"] is None or ts < r["t0_us"]):
            r["t0_us"] = ts
        if e.get("ph") != "X":
            continue
        cat = e.get("cat")
        if cat in ("cpu_op", "user_annotation"):
            for k, rx in MARKERS.items():
                if rx.match(str(e.get("name", ""))):
                    r["markers"][k] += 1
        if cat in GPU and isinstance(ts, (int, float)) and isinstance(e.get("dur"), (int, float)):
            args = e.get("args") or {}
            dev = str(args["device"]) if isinstance(args.get("device"), int) else raw_pid
            d = r["devices"].setdefault(dev, {"kernels": 0, "memcpy": 0, "memset": 0, "busy_us": 0.0})
            d[GPU[cat]] += 1
            iv[(name, dev)].append((ts, ts + e["dur"]))
    for (name, dev), spans in iv.items():
        ranks[name]["devices"][dev]["busy_us"] = round(union_us(spans), 3)
    return ranks


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trace")
    ap.add_argument("--json", help="write the figures here")
    a = ap.parse_args()
    got = figures(a.trace)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(got, f, indent=1)
    for name, r in got.items():
        print(f"{name}: t0_us={r['t0_us']} markers={r['markers']}")
        for dev, d in r["devices"].items():
            print(f"    device {dev}: {d}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
