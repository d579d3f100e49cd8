#!/usr/bin/env python3
"""Nsight Systems ingest speed per event, beside the Kineto reader's (issues 29 and 39: the nsys
reader at the Kineto reader's CPU per event), and a cached re-open of each.

    python benchmarks/bench_nsys.py [--copies 20] [--reps 5] [--json out.json]

The nsys side: a large export built by repeating a real one in time (../shared/public-traces/nsys/
h100_2gpu_1s.sqlite, third-party, read where it lies: every activity, runtime, synchronization and
NVTX row copied N times, each copy shifted by the capture's span and its correlation ids offset so
links stay unique), written to --workdir and reused. The Kineto side: real Kineto traces of about
as many events (tests/data/gpu_proxy/baseline.trace.json.gz repeated in time by bench_ingest.py's builder).

Uncached: both read into the same tables (profkit.ingest.load_traces, cache off, jobs=1) in this
process, alternating nsys and Kineto --reps times after a warm-up; the medians of CPU time (the
process's, all threads) and wall time; events = GPU ops + runtime calls + CPU spans of every rank.

Cached re-open, on copies of both in a folder of their own (their caches beside them): the tables
cache (load_traces with the cache on, after one load that writes it), and the whole process of
`python -m profkit analyze FILE --json OUT` run a second time (the stored summary; the first run
writes the caches), each alternating nsys and Kineto --reps times; the medians. The second run's
JSON is checked to be the first's bytes. It asserts nothing about time.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # this checkout's profkit, not an installed one
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


def kineto_trace(events: int, workdir: Path) -> Path:
    """A Kineto trace of about `events` events (the dense template: ~300 bytes of JSON an event)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from bench_ingest import assemble, build_body  # the Kineto builder of the ingest benchmark

    target = events * 300
    kin = workdir / f"kineto_{target >> 20}MB.trace.json.gz"
    if not kin.exists():
        assemble(build_body(KINETO, target, workdir / f"kineto_{target >> 20}MB.body.gz"), kin)
    return kin


def load(path: Path, cache: bool) -> dict:
    """One load_traces of `path`: CPU and wall seconds, ranks, events."""
    from profkit.ingest import load_traces

    t0, c0 = time.perf_counter(), time.process_time()
    traces = load_traces([path], cache=cache, jobs=1)
    dt, cpu = time.perf_counter() - t0, time.process_time() - c0
    return {"seconds": dt, "cpu_seconds": cpu, "ranks": len(traces), "events": sum(t.gpu_ops.height + t.calls.height + t.cpu.height for t in traces)}


def analyze(path: Path, out: Path) -> dict:
    """`python -m profkit analyze path --json out` in a process of its own (the cache on): its wall
    and CPU seconds (user + system, the child's)."""
    env = {k: v for k, v in os.environ.items() if k != "PROFKIT_NO_CACHE"}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "profkit", "analyze", str(path), "--json", str(out)], cwd=ROOT, env=env, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    dt = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {"seconds": dt, "cpu_seconds": (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)}


def paired(reps: int, runs: dict[str, Callable[[], dict]]) -> dict[str, dict]:
    """Each of `runs` `reps` times, alternating (the order reversed every other round), after a
    warm-up round: per run its median CPU and wall seconds and every round's figures."""
    for fn in runs.values():
        fn()
    rounds: dict[str, list[dict]] = {k: [] for k in runs}
    for i in range(reps):
        for k in (list(runs) if i % 2 == 0 else list(runs)[::-1]):
            rounds[k].append(runs[k]())
    out = {}
    for k, rs in rounds.items():
        row: dict[str, Any] = {"seconds": statistics.median(r["seconds"] for r in rs), "cpu_seconds": statistics.median(r["cpu_seconds"] for r in rs)}
        row |= {x: rs[0][x] for x in ("ranks", "events") if x in rs[0]}
        row["rounds"] = [(round(r["cpu_seconds"], 4), round(r["seconds"], 4)) for r in rs]
        out[k] = row
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--copies", type=int, default=20)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "profkit-bench-nsys")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    if not NSYS.is_file():
        print(f"skipped: {NSYS} is not there (third-party nsys exports, ../shared/public-traces/nsys)", file=sys.stderr)
        return 0
    a.workdir.mkdir(parents=True, exist_ok=True)
    load_before = os.getloadavg()
    big = build_export(NSYS, a.copies, a.workdir / f"h100_2gpu_x{a.copies}.sqlite")
    kin = kineto_trace(load(big, cache=False)["events"], a.workdir)

    # uncached, in this process
    rows: dict[str, Any] = paired(a.reps, {"nsys": lambda: load(big, cache=False), "kineto": lambda: load(kin, cache=False),
                                           "nsys_small": lambda: load(NSYS, cache=False)})
    for k, p in (("nsys", big), ("kineto", kin), ("nsys_small", NSYS)):
        r = rows[k]
        r |= {"file": str(p), "bytes": p.stat().st_size, "us_per_event": 1e6 * r["seconds"] / r["events"],
              "cpu_us_per_event": 1e6 * r["cpu_seconds"] / r["events"]}

    # cached re-open, on copies in a folder of their own
    with tempfile.TemporaryDirectory(prefix="bench-nsys-cache-", dir=a.workdir) as d:
        from profkit.ingest import cache as pcache

        copies = {"nsys": Path(d) / big.name, "kineto": Path(d) / kin.name}
        for p, src in zip(copies.values(), (big, kin)):
            shutil.copyfile(src, p)
        for p in copies.values():
            load(p, cache=True)  # writes the tables cache
        pcache.wait_pending()
        tables = paired(a.reps, {k: (lambda p=p: load(p, cache=True)) for k, p in copies.items()})
        first = {k: analyze(p, Path(d) / f"{k}-first.json") for k, p in copies.items()}  # tables from the cache; writes the summary
        again = paired(a.reps, {k: (lambda k=k, p=p: analyze(p, Path(d) / f"{k}-again.json")) for k, p in copies.items()})
        same = {k: (Path(d) / f"{k}-first.json").read_bytes() == (Path(d) / f"{k}-again.json").read_bytes() for k in copies}
    rows["cached"] = {"tables_load_traces": tables, "analyze_first": first, "analyze_again": again, "analyze_json_identical": same}
    load_after = os.getloadavg()
    rows["host"] = {"python": platform.python_version(), "cpus": os.cpu_count(), "platform": platform.platform(),
                    "loadavg_before": load_before, "loadavg_after": load_after, "reps": a.reps}

    for k in ("nsys", "kineto", "nsys_small"):
        r = rows[k]
        print(f"{k:>10}: {r['events']:>9,} events, {r['ranks']} ranks, {r['bytes'] / 1e6:.1f} MB: CPU {r['cpu_seconds']:.3f} s "
              f"({r['cpu_us_per_event']:.2f} µs/event), wall {r['seconds']:.3f} s ({r['us_per_event']:.2f} µs/event)")
    print(f"nsys CPU per event / Kineto's: {rows['nsys']['cpu_us_per_event'] / rows['kineto']['cpu_us_per_event']:.2f}")
    for k in ("nsys", "kineto"):
        t, g = tables[k], again[k]
        print(f"{k:>10} cached: tables (load_traces) {t['seconds']:.3f} s wall, {t['cpu_seconds']:.3f} s CPU; "
              f"`profkit analyze` again {g['seconds']:.3f} s wall, {g['cpu_seconds']:.3f} s CPU (first {first[k]['seconds']:.2f} s); "
              f"JSON identical: {same[k]}")
    print(f"load average {load_before[0]:.1f} before, {load_after[0]:.1f} after ({os.cpu_count()} CPUs); medians of {a.reps} alternating rounds")
    if a.json:
        a.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
