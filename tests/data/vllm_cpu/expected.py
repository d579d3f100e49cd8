"""Expected values for the vllm_cpu fixtures, from the raw events, with the standard library only (no
profkit code): python3 expected.py TRACE.pt.trace.json.gz [...] > expected.json

Per trace: the worker's step spans (user annotations `execute_context_<c>(<t>)_generation_<g>(<t>)`, in
time order), each step's kind read from its numbers (prefill: no generation request; mixed: both;
verify: generation requests carrying more tokens than one each; decode: one token each; empty:
none), and the time of the outermost CPU ops on the step spans' thread inside each step's window
([span start, next span start), the last ending at its span's end), by op name, in integer ns.
Times are Kineto's µs converted once to integer ns (round(ts * 1000), round(dur * 1000)), as DESIGN.md says.
"""

import gzip
import json
import re
import sys

SPAN = re.compile(r"^execute_context_(\d+)\((\d+)\)_generation_(\d+)\((\d+)\)$")


def kind(c: int, g: int, gt: int) -> str:
    if c == 0 and g == 0:
        return "empty"
    if c == 0:
        return "verify" if gt > g else "decode"
    return "extend" if g == 0 else "mixed"


def one(path: str) -> dict:
    with gzip.open(path, "rt") as f:
        events = json.load(f)["traceEvents"]
    ns = lambda us: int(round(float(us) * 1000))  # noqa: E731
    steps = sorted((e for e in events if e.get("cat") == "user_annotation" and SPAN.match(e.get("name", ""))),
                   key=lambda e: ns(e["ts"]))
    tids = {e["tid"] for e in steps}
    ops = sorted(((ns(e["ts"]), ns(e["ts"]) + ns(e["dur"]), e["name"]) for e in events
                  if e.get("cat") == "cpu_op" and e.get("tid") in tids), key=lambda o: (o[0], -o[1]))
    outer, reach = [], None
    for a, b, name in ops:
        if reach is None or a >= reach:
            outer.append((a, b, name))
        reach = b if reach is None else max(reach, b)
    starts = [ns(e["ts"]) for e in steps]
    ends = starts[1:] + [starts[-1] + ns(steps[-1]["dur"])]
    out = []
    for e, s, t in zip(steps, starts, ends):
        c, ct, g, gt = (int(x) for x in SPAN.match(e["name"]).groups())
        by_name: dict[str, int] = {}
        for a, b, name in outer:
            d = min(b, t) - max(a, s)
            if d > 0:
                by_name[name] = by_name.get(name, 0) + d
        out.append({"name": e["name"], "kind": kind(c, g, gt), "batch_size": c + g, "window_ns": t - s,
                    "op_ns": sum(by_name.values()), "op_ns_by_name": dict(sorted(by_name.items()))})
    return {"steps": len(steps), "kinds": [s["kind"] for s in out], "iterations": out}


if __name__ == "__main__":
    json.dump({p.rsplit("/", 1)[-1]: one(p) for p in sys.argv[1:]}, sys.stdout, indent=1, sort_keys=True)
    print()
