#!/usr/bin/env python3
"""Nsight Systems ingest speed per event, beside the Kineto reader's (issue 29: the nsys reader
stays within the Kineto reader's speed per event).

    python benchmarks/bench_nsys.py [--copies 20] [--json out.json]

The nsys side: a large export built by repeating a real one in time (../shared/public-traces/nsys/
h100_2gpu_1s.sqlite, third-party, read where it lies: every activity, runtime, synchronization and
NVTX row copied N times, each copy shifted by the capture's span and its correlation ids offset so
links stay unique), written to --workdir and reused. The Kineto side: real Kineto traces of about
as many events (tests/data/gpu_proxy/baseline.trace.json.gz repeated in time by bench_ingest.py's builder). Both are read uncached into the
same tables (profkit.ingest.load_traces); events = GPU ops + runtime calls + CPU spans of every
rank. It asserts nothing about time.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NSYS = ROOT.parent / "shared" / "public-traces" / "nsys" / "h100_2gpu_1s.sqlite"
KINETO = ROOT / "tests" / "data" / "gpu_proxy" / "baseline.trace.json.gz"
SHIFTED = ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET", "CUPTI_ACTIVITY_KIND_RUNTIME",
           "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION", "NVTX_EVENTS")


def build_export(src: Path, copies: int, out: Path) -> Path:
    """`src` with its rows repeated `copies` times in time (see the module doc)."""
    if out.exists():
        return out
    tmp = out.with_suffix(".tmp")
    shutil.copyfile(src, tmp)
    con = sqlite3.connect(tmp)
    lo, hi = con.execute('SELECT MIN(start), MAX("end") FROM CUPTI_ACTIVITY_KIND_RUNTIME').fetchone()
    clo, chi = con.execute("SELECT MIN(correlationId), MAX(correlationId) FROM CUPTI_ACTIVITY_KIND_RUNTIME").fetchone()
    span, cspan = hi - lo + 1_000_000, chi - min(clo, 0) + 1
    for t in SHIFTED:
        cols = [r[1] for r in con.execute(f'PRAGMA table_info("{t}")')]
        base = con.execute(f'SELECT MAX(rowid) FROM "{t}"').fetchone()[0] or 0
        for k in range(1, copies):
            sel = ", ".join(f'"{c}" + {k * span}' if c in ("start", "end") else f'"{c}" + {k * cspan}' if c == "correlationId" else f'"{c}"'
                            for c in cols)
            con.execute(f'INSERT INTO "{t}" ({", ".join(repr(c).replace(chr(39), chr(34)) for c in cols)}) SELECT {sel} FROM "{t}" WHERE rowid <= {base}')
    con.commit()
    con.close()
    tmp.rename(out)
    return out


def timed_load(path: Path) -> dict:
    from profkit.ingest import load_traces

    t0 = time.perf_counter()
    traces = load_traces([path], cache=False, jobs=1)
    dt = time.perf_counter() - t0
    n = sum(t.gpu_ops.height + t.calls.height + t.cpu.height for t in traces)
    return {"file": str(path), "bytes": path.stat().st_size, "ranks": len(traces), "events": n, "seconds": dt, "us_per_event": 1e6 * dt / n}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--copies", type=int, default=20)
    ap.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "profkit-bench-nsys")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    if not NSYS.is_file():
        print(f"skipped: {NSYS} is not there (third-party nsys exports, ../shared/public-traces/nsys)", file=sys.stderr)
        return 0
    a.workdir.mkdir(parents=True, exist_ok=True)
    os.environ["PROFKIT_NO_CACHE"] = "1"
    big = build_export(NSYS, a.copies, a.workdir / f"h100_2gpu_x{a.copies}.sqlite")
    rows = {"nsys_small": timed_load(NSYS), "nsys": timed_load(big)}
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from bench_ingest import assemble, build_body  # the Kineto builder of the ingest benchmark

    # about as many Kineto events as the export holds (the dense template: ~300 bytes of JSON an event)
    target = rows["nsys"]["events"] * 300
    kin = a.workdir / f"kineto_{target >> 20}MB.trace.json.gz"
    if not kin.exists():
        assemble(build_body(KINETO, target, a.workdir / f"kineto_{target >> 20}MB.body.gz"), kin)
    rows["kineto"] = timed_load(kin)
    rows["host"] = {"python": platform.python_version(), "cpus": os.cpu_count(), "platform": platform.platform()}
    for k in ("nsys_small", "nsys", "kineto"):
        r = rows[k]
        print(f"{k:>10}: {r['events']:>9,} events in {r['seconds']:.2f} s = {r['us_per_event']:.2f} µs/event ({r['ranks']} ranks, {r['bytes'] / 1e6:.1f} MB)")
    if a.json:
        a.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
