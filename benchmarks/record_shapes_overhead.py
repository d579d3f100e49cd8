"""What `--record-shapes` costs the proxy: the run folders of a paired A/B of `profkit trace`, summarized (issue 41).

    python benchmarks/record_shapes_overhead.py WITH_DIR WITHOUT_DIR [--json OUT]

WITH_DIR / WITHOUT_DIR: the --traces-dir of the runs made with and without --record-shapes (same
workload, alternated A B A B so load drift lands on both). For each run folder (both sides of each
`profkit trace`: baseline and candidate): the manifest's `profiler_overhead.slowdown` (unprofiled over
profiled tokens/s per user, the server's own clock), the trace's size on disk and its event counts.
Prints the medians per side and their ratio. Stdlib only; asserts nothing about time.
"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
from pathlib import Path


def runs(d: Path) -> list[dict]:
    out = []
    for m in sorted(d.glob("*/manifest.json")):
        man = json.loads(m.read_text())
        traces = sorted(m.parent.glob("*.trace.json.gz"))
        ev = json.load(gzip.open(traces[0]))["traceEvents"] if traces else []
        out.append({"run": m.parent.name, "record_shapes": man.get("profile", {}).get("record_shapes"),
                    "slowdown": (man.get("profiler_overhead") or {}).get("slowdown"),
                    "trace_bytes": sum(t.stat().st_size for t in traces), "events": len(ev),
                    "cpu_ops": sum(1 for e in ev if e.get("cat") == "cpu_op"),
                    "cpu_op_us": round(sum(e.get("dur", 0) for e in ev if e.get("cat") == "cpu_op"), 1)})
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("with_dir", type=Path)
    ap.add_argument("without_dir", type=Path)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    sides = {"with --record-shapes": runs(a.with_dir), "without": runs(a.without_dir)}
    med: dict[tuple[str, str], float] = {}
    for name, rs in sides.items():
        for k in ("slowdown", "trace_bytes", "events", "cpu_ops"):
            vals = [r[k] for r in rs if r[k] is not None]
            med[(name, k)] = statistics.median(vals) if vals else float("nan")
        sl = [r["slowdown"] for r in rs if r["slowdown"] is not None]
        print(f"{name}: {len(rs)} run folders; median profiler slowdown {med[(name, 'slowdown')]:.2f}x "
              f"(range {min(sl):.2f}-{max(sl):.2f}; {len(rs) - len(sl)} without one), trace {med[(name, 'trace_bytes')]:,.0f} bytes gz, "
              f"{med[(name, 'events')]:,.0f} events, {med[(name, 'cpu_ops')]:,.0f} cpu_ops")
    for name, rs in sides.items():
        for r in rs:
            sd = "-" if r["slowdown"] is None else f"{r['slowdown']:.2f}x"
            print(f"  {name:22s} {r['run']:50s} slowdown {sd:>9s} trace {r['trace_bytes']:>9,} B {r['events']:>7,} events {r['cpu_ops']:>7,} cpu_ops")
    w, wo = "with --record-shapes", "without"
    print(f"ratio with/without: slowdown {med[(w, 'slowdown')] / med[(wo, 'slowdown')]:.3f}, trace bytes {med[(w, 'trace_bytes')] / med[(wo, 'trace_bytes')]:.3f}")
    if a.json:
        a.json.write_text(json.dumps({"runs": sides}, indent=1))


if __name__ == "__main__":
    main()
