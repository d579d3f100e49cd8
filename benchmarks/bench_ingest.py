#!/usr/bin/env python3
"""Ingest benchmark: large Kineto traces built by repeating a real recorded trace in time, then
`profkit analyze` on them (total, peak RSS, events/s), each uncached run beside its floor (ISA-L
decompressing the same file alone) and the steps of `analyze` timed one by one, HTA's load of the
same file in the same run when `holistictraceanalysis` is importable (here, or in the python given by
--hta-python), and issue 39's targets with the figures measured, met or not.

    python benchmarks/bench_ingest.py --json bench.json      # dense and sglang, 250MB and 1GB
    python benchmarks/bench_ingest.py --sizes 1GB --templates dense --modes uncached --repeat 1 --no-hta

Building: the template's events are copied N times, each copy shifted in time by the template's
span (plus a small gap) and with every link id (correlation, External id, flow id, Python id)
offset so links stay unique; metadata ('M') events are kept once. The file is written gzipped, as
SGLang writes its traces, to --workdir and reused when it exists. It asserts nothing about time.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # this checkout's profkit (machine() reads its scanner), as its children run it
# third-party traces are never committed: read beside the checkout (tests/data/public/README.md)
PUBLIC = Path(os.environ.get("PROFKIT_PUBLIC_TRACES") or ROOT.parent / "shared" / "public-traces")
TEMPLATES = {
    # real SGLang trace with Python stacks (AMD MI300X, TraceLens' public fixture)
    "sglang": PUBLIC / "tracelens_sglang_qwen3-8b_mi300x_extend_step.json.gz",
    # real H200 eager decode with host syncs, recorded for profkit (Kineto's own pretty layout)
    "eager_sync": ROOT / "tests/data/gpu/eager_sync.pt.trace.json.gz",
    # kernel-dense: the proxy engine's eager decode on the H200 (the study's "before" shape: ~1,400
    # kernels and as many launch gaps per iteration, every launch leaving a bubble)
    "dense": ROOT / "tests/data/gpu_proxy/baseline.trace.json.gz",
}
ID_ARGS = ("correlation", "External id", "Python id", "Python parent id", "Record function id", "Ev Idx")


def parse_size(s: str) -> int:
    m = re.fullmatch(r"\s*([\d.]+)\s*([kKmMgG]?)[bB]?\s*", s)
    if not m:
        raise SystemExit(f"bad size {s!r} (e.g. 250MB, 1GB)")
    mult = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9}[m.group(2).lower()]
    return int(float(m.group(1)) * mult)


def human(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}" if unit == "GB" else f"{n:.0f} {unit}"
        n /= 1000
    return str(n)


def _gzip_compress(data: bytes) -> bytes:
    try:  # ISA-L writes the same gzip format, much faster
        from isal import igzip

        return igzip.compress(data, compresslevel=2)
    except ImportError:
        return gzip.compress(data, compresslevel=1)


def _dumps():
    try:
        import orjson

        return lambda obj: orjson.dumps(obj)
    except ImportError:
        enc = json.JSONEncoder(separators=(",", ":"))
        return lambda obj: enc.encode(obj).encode()


def build_body(template: Path, target_bytes: int, out: Path) -> dict:
    """The events of `template` repeated in time until `target_bytes` of JSON, written as one gzip
    member (`out`): `ev,ev,...,ev` without brackets. Returns the facts, cached beside it."""
    info_path = out.with_name(out.name + ".info.json")
    if out.exists() and info_path.exists():
        return json.loads(info_path.read_text())
    t_start = time.perf_counter()
    doc = json.loads(gzip.open(template).read())
    events = doc.pop("traceEvents")
    meta_events = [e for e in events if e.get("ph") == "M"]
    body = [e for e in events if e.get("ph") != "M"]
    ts_ns = [round(e["ts"] * 1000) for e in body if isinstance(e.get("ts"), (int, float))]
    ends = [round((e["ts"] + e.get("dur", 0)) * 1000) for e in body if isinstance(e.get("ts"), (int, float))]
    span_ns = max(ends) - min(ts_ns) + 50_000  # copies 50 µs apart
    max_id: dict[str, int] = {k: 0 for k in ID_ARGS}
    max_flow = 0
    for e in body:
        a = e.get("args") or {}
        for k in ID_ARGS:
            v = a.get(k)
            if isinstance(v, int) and not isinstance(v, bool) and v > max_id[k]:
                max_id[k] = v
        if isinstance(e.get("id"), int):
            max_flow = max(max_flow, e["id"])
    id_step = {k: v + 1 for k, v in max_id.items()}
    flow_step = max_flow + 1
    dumps = _dumps()
    parts: list[bytes] = [dumps(e) for e in meta_events]  # metadata events once
    written = sum(len(x) + 1 for x in parts)
    n_events = len(parts)
    copies = 0
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".part")
    with open(tmp, "wb") as f:
        while written < target_bytes:
            k = copies
            for e in body:
                e2 = dict(e)
                if isinstance(e.get("ts"), (int, float)):
                    e2["ts"] = (round(e["ts"] * 1000) + k * span_ns) / 1000  # exact ns, printed as Kineto does
                if isinstance(e.get("id"), int):
                    e2["id"] = e["id"] + k * flow_step
                a = e.get("args")
                if a:
                    a2 = dict(a)
                    for key in ID_ARGS:
                        v = a.get(key)
                        if isinstance(v, int) and not isinstance(v, bool) and v >= 0:
                            a2[key] = v + k * id_step[key]
                    e2["args"] = a2
                b = dumps(e2)
                parts.append(b)
                written += len(b) + 1
            n_events += len(body)
            copies += 1
            if len(parts) > 200_000 or written >= target_bytes:
                blob = b",".join(parts)
                f.write(_gzip_compress((b"," if f.tell() else b"") + blob))
                parts = []
    tmp.replace(out)
    info = {"body": str(out), "raw_body_bytes": written - 1, "events": n_events, "copies": copies, "template": str(template),
            "head": {k: v for k, v in doc.items()}, "build_s": time.perf_counter() - t_start}
    info_path.write_text(json.dumps(info))
    return info


def assemble(body_info: dict, out: Path, *, rank: int | None = None) -> dict:
    """A trace file: a gzip member with the document's head (distributedInfo.rank = rank), the
    body's members, and a member closing the array and the document (gzip readers concatenate)."""
    head_doc = dict(body_info["head"])
    if rank is not None:
        head_doc["distributedInfo"] = {"backend": "nccl", "rank": rank, "world_size": 8}
    tail_keys = {k: head_doc.pop(k) for k in ("traceName", "displayTimeUnit") if k in head_doc}
    head = json.dumps(head_doc)[:-1].encode() + b', "traceEvents": ['
    tail = b"]" + (b", " + json.dumps(tail_keys)[1:].encode() if tail_keys else b"}")
    tmp = out.with_name(out.name + ".part")
    with open(tmp, "wb") as f:
        f.write(_gzip_compress(head))
        with open(body_info["body"], "rb") as b:
            shutil.copyfileobj(b, f, 16 << 20)
        f.write(_gzip_compress(tail))
    tmp.replace(out)
    return {"path": str(out), "raw_bytes": len(head) + body_info["raw_body_bytes"] + len(tail), "gz_bytes": out.stat().st_size,
            "events": body_info["events"], "copies": body_info["copies"], "template": body_info["template"]}


class TreeSampler:
    """Peak summed RSS of a process and its descendants, sampled every 20 ms (psutil)."""

    def __init__(self, pid: int) -> None:
        import psutil

        self.proc = psutil.Process(pid)
        self.peak = 0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self) -> None:
        import psutil

        while not self._stop.is_set():
            try:
                procs = [self.proc] + self.proc.children(recursive=True)
                total = 0
                for p in procs:
                    try:
                        total += p.memory_info().rss
                    except psutil.Error:
                        pass
                self.peak = max(self.peak, total)
            except psutil.Error:
                pass
            self._stop.wait(0.02)

    def stop(self) -> int:
        self._stop.set()
        self._t.join()
        return self.peak


def run_child(cmd: list[str], env: dict | None = None) -> dict:
    """Run cmd; wall time, exit code, its peak RSS (getrusage of that child via wait4, which
    includes the workers it waited for) and the peak summed RSS of its process tree (sampled)."""
    t0 = time.perf_counter()
    with tempfile.TemporaryFile() as so, tempfile.TemporaryFile() as se:
        p = subprocess.Popen(cmd, stdout=so, stderr=se, env=env)
        sampler = TreeSampler(p.pid)
        _, status, ru = os.wait4(p.pid, 0)
        wall = time.perf_counter() - t0
        tree = sampler.stop()
        p.returncode = os.waitstatus_to_exitcode(status)
        so.seek(0)
        se.seek(0)
        out, err = so.read(), se.read()
    return {"rc": p.returncode, "wall_s": wall, "maxrss_bytes": ru.ru_maxrss * 1024, "tree_peak_rss_bytes": tree,
            "stdout": out.decode(errors="replace"), "stderr": err.decode(errors="replace")}


# The floor (issue 39): ISA-L's decompression of the same .gz file alone, in a fresh process, on one
# thread, streaming into one 16 MiB buffer (nothing kept), timed from open to EOF.
FLOOR_SNIPPET = r"""
import json, sys, time
from isal import igzip
buf = bytearray(16 << 20)
n = 0
t0 = time.perf_counter()
with igzip.open(sys.argv[1], "rb") as f:
    while True:
        k = f.readinto(buf)
        if not k:
            break
        n += k
print(json.dumps({"inflate_s": time.perf_counter() - t0, "raw_bytes": n}))
"""


def inflate_floor(path: Path) -> dict:
    """The floor: inflate_s (inside the process), the process's wall and peak RSS."""
    r = run_child([sys.executable, "-c", FLOOR_SNIPPET, str(path)])
    out: dict = {"rc": r["rc"], "wall_s": r["wall_s"], "tree_peak_rss_bytes": r["tree_peak_rss_bytes"]}
    try:
        out.update(json.loads(r["stdout"].strip().splitlines()[-1]))
    except (IndexError, ValueError):
        out["error"] = r["stderr"][-1000:]
        print(f"[floor] {path}: failed rc={r['rc']}:\n{r['stderr'][-2000:]}", file=sys.stderr)
    return out


# Where the time goes, timed from outside: `analyze`'s steps one after the other in a fresh process, each
# through profkit's public functions (profkit itself carries no timing hook). In `analyze` they overlap:
# the decode starts before polars and the analysis are imported. (b) profkit's CLI imported; (b2) the
# analysis stack (polars, numpy with one OpenBLAS thread as `analyze` imports it, ingest, analysis);
# (c) load_traces, no cache (inflate + scan + table building); (d) analyze_trace per rank, with the
# catalog `analyze` would choose; (e) build_summary (with the health section), summary.json written and
# the terminal table rendered.
STAGES_SNIPPET = r"""
import json, os, sys, tempfile, time
from pathlib import Path
t0 = time.perf_counter()
import profkit.cli  # noqa: F401
t1 = time.perf_counter()
import numpy, polars  # noqa: F401  (OPENBLAS_NUM_THREADS=1 set by the caller, as `analyze` imports numpy)
from profkit.analysis import analyze_trace
from profkit.analysis.catalog import choose_catalog
from profkit.analysis.summary import build_summary
from profkit.ingest import load_traces
from profkit.store import json_text, write_bytes_atomic
t2 = time.perf_counter()
path = Path(sys.argv[1])
traces = load_traces([path], cache=False)
t3 = time.perf_counter()
catalog = choose_catalog(None, [path]).catalog
analyses = [analyze_trace(t, catalog=catalog) for t in traces]
t4 = time.perf_counter()
summary = build_summary(analyses)
if len(analyses) > 1:
    from profkit.analysis.ranks import cross_rank
    summary["cross_rank"] = cross_rank(analyses)
try:  # summary.json's health section, as summarize adds it (a private helper: skipped if it moved)
    from profkit.analysis.summarize import _health_and_spec
    _health_and_spec(summary, [a.path for a in analyses])
except (ImportError, AttributeError, TypeError):
    pass
out = Path(tempfile.mkstemp(prefix="profkit-stages-", suffix=".json")[1])
write_bytes_atomic(out, json_text(summary).encode())
import io
from rich.console import Console
from profkit.report import Report
from profkit.report.terminal import TerminalRenderer
TerminalRenderer(Console(file=io.StringIO(), width=120), top=10).show(Report(runs=[("", summary)]))
t5 = time.perf_counter()
out.unlink()
print(json.dumps({"import_cli_s": t1 - t0, "import_analysis_s": t2 - t1, "load_s": t3 - t2,
                  "analysis_s": t4 - t3, "summary_out_s": t5 - t4}))
sys.stdout.flush()
os._exit(0)  # as `analyze` leaves: no teardown of the tables
"""


def profkit_env() -> dict:
    """The environment of profkit's processes: this checkout's profkit first on the path, whatever the
    current folder (another checkout may be the one installed), and bytecode written as on a user's
    machine, where pip compiled it at install (this project's sandbox sets PYTHONDONTWRITEBYTECODE,
    which makes every run recompile profkit's modules from source)."""
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    return env


def profkit_stages(path: Path) -> dict:
    """The steps of `analyze` on one uncached file, one after the other in a fresh process (STAGES_SNIPPET):
    their times, the process's wall (`stages_wall_s`) and `rest_s`, what the steps leave of it
    (interpreter start-up, the snippet's own imports, exit)."""
    env = profkit_env()
    env["OPENBLAS_NUM_THREADS"] = "1"
    r = run_child([sys.executable, "-c", STAGES_SNIPPET, str(path)], env)
    try:
        got = json.loads(r["stdout"].strip().splitlines()[-1]) if r["rc"] == 0 else {}
    except (IndexError, ValueError):
        got = {}
    if not got:
        print(f"[stages] {path}: failed rc={r['rc']}:\n{r['stderr'][-2000:]}", file=sys.stderr)
        return {}
    steps = ("import_cli_s", "import_analysis_s", "load_s", "analysis_s", "summary_out_s")
    got["stages_wall_s"] = r["wall_s"]
    got["rest_s"] = r["wall_s"] - sum(got[k] for k in steps)
    got["stages_peak_rss_bytes"] = r["tree_peak_rss_bytes"]
    return got


def profkit_analyze(paths: list[Path], extra: list[str], tag: str) -> dict:
    """`python -m profkit analyze` in a fresh process."""
    sfile = Path(tempfile.mkstemp(prefix="profkit-summary-", suffix=".json")[1])
    env = profkit_env()
    cmd = [sys.executable, "-m", "profkit", "analyze", *map(str, paths), "--json", str(sfile), *extra]
    r = run_child(cmd, env)
    sfile.unlink(missing_ok=True)
    if r["rc"] != 0:
        print(f"[{tag}] profkit analyze failed rc={r['rc']}:\n{r['stderr'][-2000:]}", file=sys.stderr)
    r.pop("stdout")
    r["stderr"] = r["stderr"][-500:]
    r["tag"] = tag
    return r


HTA_SNIPPET = r"""
import sys, time, shutil, tempfile, os, json, logging
logging.disable(logging.WARNING)
src = sys.argv[1]
d = tempfile.mkdtemp(prefix="hta-bench-")
os.symlink(os.path.abspath(src), os.path.join(d, "rank-0.json.gz"))
t0 = time.perf_counter()
from hta.trace_analysis import TraceAnalysis
t1 = time.perf_counter()
ta = TraceAnalysis(trace_dir=d)
t2 = time.perf_counter()
print(json.dumps({"import_s": t1 - t0, "load_s": t2 - t1}))
shutil.rmtree(d)
"""


def hta_python(arg: str | None) -> str | None:
    cands = [arg] if arg else [sys.executable, "/tmp/htavenv/bin/python"]
    for py in cands:
        if py and Path(py).exists():
            r = subprocess.run([py, "-c", "import hta.trace_analysis"], capture_output=True)
            if r.returncode == 0:
                return py
    return None


def hta_load(py: str, path: Path) -> dict:
    r = run_child([py, "-c", HTA_SNIPPET, str(path)])
    out: dict = {"rc": r["rc"], "wall_s": r["wall_s"], "tree_peak_rss_bytes": r["tree_peak_rss_bytes"]}
    try:
        out.update(json.loads(r["stdout"].strip().splitlines()[-1]))
    except (ValueError, IndexError):
        out["error"] = r["stderr"][-1000:]
    return out


def _f(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def machine() -> dict:
    import psutil

    cpu = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    pkgs = {}
    for mod in ("polars", "numpy", "msgspec", "pyarrow", "isal", "zlib_ng"):
        try:
            m = __import__(mod)
            pkgs[mod] = getattr(m, "__version__", "?")
        except ImportError:
            pkgs[mod] = None
    from profkit.ingest.scan import lib

    pkgs["C scanner"] = "built" if lib() is not None else "absent (msgspec decodes)"
    return {"cpu": cpu, "cores": os.cpu_count(), "memory_gb": round(psutil.virtual_memory().total / 2**30, 1),
            "python": platform.python_version(), "platform": platform.platform(), "packages": pkgs, "profkit": _profkit_commit(),
            "loadavg_1min_start": os.getloadavg()[0]}


def _profkit_commit() -> str:
    """The checkout's commit, "+changes" when profkit/ differs from it (several people change the code)."""
    try:
        head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--", "profkit"], capture_output=True, text=True).stdout.strip()
    except OSError:
        return "?"
    return (head or "?") + (" +changes" if dirty else "")


MODES = ("uncached", "first", "cached")
# issue 39's "Done when": (what, shape, requested size, bound); `floor`: end to end / the floor <= bound,
# `hta`: HTA's load / profkit end to end >= bound, `rss`: peak RSS of the profkit process tree <= bound bytes
TARGETS = (("floor", "dense", 10**9, 2.5), ("floor", "sglang", 10**9, 3.5), ("hta", "dense", 250 * 10**6, 25.0),
           ("hta", "sglang", 250 * 10**6, 25.0), ("rss", "dense", 10**9, 10**9), ("rss", "sglang", 10**9, 10**9))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="250MB,1GB", help="raw JSON sizes of single-file traces (comma-separated)")
    ap.add_argument("--ranks", type=int, default=0, help="also analyze this many rank files of --rank-size at once (0: skip)")
    ap.add_argument("--rank-size", default="250MB")
    ap.add_argument("--template", "--templates", dest="templates", default="dense,sglang",
                    help=f"comma-separated, measured side by side: each one of {sorted(TEMPLATES)} or a trace path")
    ap.add_argument("--modes", default=",".join(MODES),
                    help="comma-separated: uncached (--no-cache, with the floor and the stages beside each run), "
                         "first (writes the cache), cached")
    ap.add_argument("--no-stages", action="store_true", help="skip the stage breakdown beside each uncached run")
    ap.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "profkit-bench")
    ap.add_argument("--repeat", type=int, default=3, help="time each figure this many times (the floor and ratios: best of them)")
    ap.add_argument("--hta-python", default=None, help="a python with holistictraceanalysis installed (default: this one, /tmp/htavenv)")
    ap.add_argument("--no-hta", action="store_true")
    ap.add_argument("--hta-repeat", type=int, default=1, help="HTA loads per file (a dense 250 MB file takes HTA ~18 s)")
    ap.add_argument("--json", type=Path, default=None, help="write the results here")
    args = ap.parse_args()

    shapes = [t.strip() for t in args.templates.split(",") if t.strip()]
    sizes = [parse_size(s) for s in args.sizes.split(",") if s.strip()]
    args.modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not set(args.modes) <= set(MODES):
        raise SystemExit(f"--modes {','.join(args.modes)}: each one of {','.join(MODES)}")
    for sh in shapes:
        if not TEMPLATES.get(sh, Path(sh)).is_file():
            raise SystemExit(f"{TEMPLATES.get(sh, Path(sh))}: no such trace (the sglang template is third-party: "
                             "put shared/public-traces beside the checkout or set PROFKIT_PUBLIC_TRACES)")
    args.workdir.mkdir(parents=True, exist_ok=True)
    results: dict = {"machine": machine(), "argv": sys.argv[1:], "templates": {sh: str(TEMPLATES.get(sh, Path(sh))) for sh in shapes},
                     "cases": [], "runs": [], "floors": [], "hta": []}
    rows: list[tuple] = []
    hta_py = None if args.no_hta else hta_python(args.hta_python)
    if not args.no_hta and hta_py is None:
        print("HTA: no python with holistictraceanalysis found (--hta-python, or /tmp/htavenv): HTA not measured", file=sys.stderr)
    for shape in shapes:
        _measure(args, shape, TEMPLATES.get(shape, Path(shape)), sizes, hta_py, results, rows)
    _report(args, results, rows)


def _measure(args: argparse.Namespace, shape: str, template: Path, sizes: list[int], hta_py: str | None, results: dict,
             rows: list[tuple]) -> None:
    """Every figure of one template (shape): single files of each size (each uncached run with the floor
    before it and the stages after it), HTA's load at <= 300 MB, rank files."""

    def file_for(size: int, rank: int | None = None) -> tuple[Path, dict]:
        stem = f"{Path(template).name.split('.')[0]}-{size // 10**6}MB"
        body = build_body(template, size, args.workdir / f"{stem}.body.gz")
        name = stem + (f"-TP-{rank}" if rank is not None else "") + ".trace.json.gz"
        path = args.workdir / name
        info = assemble(body, path, rank=rank)
        print(f"{path}: {human(info['raw_bytes'])} raw, {human(info['gz_bytes'])} gz, {info['events']:,} events "
              f"(body built in {body['build_s']:.1f} s)", file=sys.stderr)
        return path, info

    def clear_cache(paths: list[Path]) -> None:
        for p in paths:
            shutil.rmtree(p.with_name(p.name + ".profkit-cache"), ignore_errors=True)

    def record(mode: str, label: str, paths: list[Path], info: dict, size: int) -> None:
        extra = ["--no-cache"] if mode == "uncached" else []
        single = len(paths) == 1
        for i in range(args.repeat):
            if mode == "first":
                clear_cache(paths)
            load_before = os.getloadavg()[0]
            floor = None
            if mode == "uncached" and single:  # the floor just before, the stages just after: paired
                floor = inflate_floor(paths[0])
                floor.update(run=i + 1, shape=shape, size_arg=size, raw_bytes=info["raw_bytes"], loadavg_1min_before=load_before)
                results["floors"].append(floor)
            r = profkit_analyze(paths, extra, label)
            if mode == "uncached" and single and not args.no_stages:
                r.update(profkit_stages(paths[0]))
            if floor and floor.get("inflate_s"):
                r["floor_s"] = floor["inflate_s"]
                r["x_floor"] = r["wall_s"] / floor["inflate_s"]
            r["loadavg_1min_before"] = load_before
            r.update(run=i + 1, label=label, mode=mode, shape=shape, size_arg=size, raw_bytes=info["raw_bytes"], gz_bytes=info["gz_bytes"],
                     events=info["events"], files=len(paths))
            results["runs"].append(r)
            rows.append((label, i + 1, r))
            fl = f", floor {floor['inflate_s']:.2f} s" if floor and floor.get("inflate_s") else ""
            print(f"{label} run {i + 1}: {r['wall_s']:.2f} s{fl}, tree peak {human(r['tree_peak_rss_bytes'])}, load {load_before:.1f}",
                  file=sys.stderr)

    labels = {"uncached": "uncached", "first": "first (writes cache)", "cached": "cached"}
    for size in sizes:
        path, info = file_for(size)
        label = f"{shape} {human(info['raw_bytes'])}"
        results["cases"].append({"shape": shape, "size_arg": size, "label": label, "path": str(path), "raw_bytes": info["raw_bytes"],
                                 "gz_bytes": info["gz_bytes"], "events": info["events"], "loadavg_1min_start": os.getloadavg()[0]})
        for mode in args.modes:
            record(mode, f"{label} {labels[mode]}", [path], info, size)
        if hta_py and size <= 300 * 10**6:
            for i in range(args.hta_repeat):
                load_before = os.getloadavg()[0]
                h = hta_load(hta_py, path)
                h["loadavg_1min_before"] = load_before
                h.update(run=i + 1, shape=shape, size_arg=size, raw_bytes=info["raw_bytes"], events=info["events"])
                results["hta"].append(h)
                print(f"HTA load {label} run {i + 1}: {h.get('load_s', float('nan')):.1f} s", file=sys.stderr)
    if args.ranks:
        size = parse_size(args.rank_size)
        files = [file_for(size, rank=r) for r in range(args.ranks)]
        paths = [p for p, _ in files]
        info = {"raw_bytes": sum(i["raw_bytes"] for _, i in files), "gz_bytes": sum(i["gz_bytes"] for _, i in files),
                "events": sum(i["events"] for _, i in files)}
        each = human(files[0][1]["raw_bytes"])
        for mode in args.modes:
            record(mode, f"{shape} {args.ranks} ranks x {each} {labels[mode]}", paths, info, 0)


def _best(xs: list[float]) -> float | None:
    return min(xs) if xs else None


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def _report(args: argparse.Namespace, results: dict, rows: list[tuple]) -> None:
    """The runs' table, the stage table, per shape the floor, HTA and growth ratios, then the targets."""
    if args.json:  # before the tables: a formatting slip must not lose the measurements
        args.json.write_text(json.dumps(results, indent=1))
    m = results["machine"]
    lines = [f"machine: {m['cpu']}, {m['cores']} cores, {m['memory_gb']} GiB, Python {m['python']}, {m['packages']}, "
             f"profkit {m['profkit']}, load {m['loadavg_1min_start']:.1f} at the start"]
    lines += ["load: the 1-minute load average as each case and run started"]
    lines += [f"{c['label']}: {c['events']:,} events, {human(c['gz_bytes'])} gzipped, load {c['loadavg_1min_start']:.1f} at the case's start"
              for c in results["cases"]]
    # every run
    hdr = (f"{'case':<34} {'run':>3} {'raw':>9} {'events':>10} {'floor s':>7} {'total s':>8} {'x floor':>7} "
           f"{'peak RSS (tree)':>15} {'maxrss':>9} {'Mev/s':>6} {'load':>5}")
    lines += ["", hdr, "-" * len(hdr)]
    for label, i, r in rows:
        ev_s = r["events"] / r["wall_s"] / 1e6 if r["wall_s"] else 0
        x = f"{r['x_floor']:.2f}" if r.get("x_floor") else "-"
        lines.append(
            f"{label:<34} {i:>3} {human(r['raw_bytes']):>9} {r['events']:>10,} {_f(r.get('floor_s')):>7} {r['wall_s']:>8.2f} {x:>7} "
            f"{human(r['tree_peak_rss_bytes']):>15} {human(r['maxrss_bytes']):>9} {ev_s:>6.2f} {r.get('loadavg_1min_before', float('nan')):>5.1f}"
        )
    # the stages
    staged = [(label, i, r) for label, i, r in rows if "load_s" in r]
    if staged:
        lines += ["", "where the time goes (s): (a) the floor, in its own process; (b)-(e) `analyze`'s steps one after the other in one "
                  "fresh process (in `analyze` the decode overlaps the imports); rest = that process's wall - (b..e): start-up, exit"]
        hdr = (f"{'case':<22} {'run':>3} {'(a)floor':>8} {'(b)cli':>6} {'(b2)pl+an':>9} {'(c)load':>7} {'c-a':>5} {'(d)analyze':>10} "
               f"{'(e)summ+out':>11} {'rest':>5} {'steps wall':>10} {'analyze':>7} {'-floor':>6}")
        lines += [hdr, "-" * len(hdr)]
        for label, i, r in staged:
            a = r.get("floor_s")
            lines.append(
                f"{label.removesuffix(' uncached'):<22} {i:>3} {_f(a):>8} {_f(r['import_cli_s']):>6} {_f(r['import_analysis_s']):>9} "
                f"{_f(r['load_s']):>7} {_f(r['load_s'] - a if a else None):>5} {_f(r['analysis_s']):>10} {_f(r['summary_out_s']):>11} "
                f"{_f(r['rest_s']):>5} {_f(r['stages_wall_s']):>10} {_f(r['wall_s']):>7} {_f(r['wall_s'] - a if a else None):>6}"
            )
    for h in results["hta"]:
        lines.append(f"HTA 0.5.0 TraceAnalysis load, {h['shape']} {human(h['raw_bytes']):>9}, run {h['run']}: load {h.get('load_s', float('nan')):.1f} s, "
                     f"process {h['wall_s']:.1f} s, peak RSS {human(h['tree_peak_rss_bytes'])}, load {h.get('loadavg_1min_before', float('nan')):.1f}"
                     + (f", FAILED: {h['error'][-300:]}" if "error" in h else ""))
    lines.append("")
    results["per_shape"] = {}
    for shape in results["templates"]:
        mine = [r for r in results["runs"] if r.get("shape") == shape and r["files"] == 1 and r["mode"] == "uncached" and r["rc"] == 0]
        got: dict = {"by_size": {}}
        for size in sorted({r["size_arg"] for r in mine}):
            at = [r for r in mine if r["size_arg"] == size]
            floors = [f["inflate_s"] for f in results["floors"] if f["shape"] == shape and f["size_arg"] == size and f.get("inflate_s")]
            e2e = _best([r["wall_s"] for r in at])
            fl = _best(floors)
            d = {"raw_bytes": at[0]["raw_bytes"], "end_to_end_best_s": e2e, "floor_best_s": fl,
                 "x_floor_best": e2e / fl if e2e and fl else None, "x_floor_paired_median": _median([r["x_floor"] for r in at if r.get("x_floor")]),
                 "peak_rss_tree_max_bytes": max(r["tree_peak_rss_bytes"] for r in at)}
            hta = [h["load_s"] for h in results["hta"] if h["shape"] == shape and h["size_arg"] == size and "load_s" in h]
            if hta and e2e:
                d["hta_load_best_s"] = min(hta)
                d["hta_ratio"] = min(hta) / e2e
            got["by_size"][size] = d
            line = f"{shape} {human(d['raw_bytes'])}: uncached end to end {_f(e2e)} s, floor {_f(fl)} s (best of each)"
            if d["x_floor_best"]:
                line += f": {d['x_floor_best']:.2f}x the floor (paired runs' median {d['x_floor_paired_median']:.2f}x)"
            if "hta_ratio" in d:
                line += f"; HTA load {d['hta_load_best_s']:.1f} s = {d['hta_ratio']:.1f}x profkit"
            lines.append(line)
        by_size = sorted(got["by_size"])
        if len(by_size) >= 2:
            small, big = got["by_size"][by_size[0]], got["by_size"][by_size[-1]]
            got["growth"] = {"sizes": [small["raw_bytes"], big["raw_bytes"]], "time_ratio": big["end_to_end_best_s"] / small["end_to_end_best_s"],
                             "size_ratio": big["raw_bytes"] / small["raw_bytes"]}
            lines.append(f"{shape}: uncached {human(big['raw_bytes'])} / {human(small['raw_bytes'])} time ratio {got['growth']['time_ratio']:.2f} "
                         f"(size ratio {got['growth']['size_ratio']:.2f}; best of each)")
        results["per_shape"][shape] = got
    lines += ["", *_targets(results)]
    text = "\n".join(lines)
    print(text)
    results["table"] = text
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


def _targets(results: dict) -> list[str]:
    """Issue 39's targets: the figure measured in this run, met or not (or not measured)."""
    out = ["targets (issue 39)", "-" * 18]
    results["targets"] = []
    for what, shape, size, bound in TARGETS:
        d = results.get("per_shape", {}).get(shape, {}).get("by_size", {}).get(size)
        first = [r["tree_peak_rss_bytes"] for r in results["runs"] if r["shape"] == shape and r["size_arg"] == size and r["mode"] == "first"
                 and r["files"] == 1]
        if what == "floor":
            name = f"{shape} {human(size)}: end to end <= {bound}x the floor"
            value = d and d.get("x_floor_best")
            shown = value and f"{value:.2f}x ({d['end_to_end_best_s']:.2f} s / {d['floor_best_s']:.2f} s, best of each)"
            met = value is not None and value <= bound
        elif what == "hta":
            name = f"{shape} {human(size)}: HTA's load / profkit end to end >= {bound:.0f}x"
            value = d and d.get("hta_ratio")
            shown = value and f"{value:.1f}x ({d['hta_load_best_s']:.1f} s / {d['end_to_end_best_s']:.2f} s)"
            met = value is not None and value >= bound
        else:
            name = f"{shape} {human(size)}: peak RSS (tree) <= {human(bound)}"
            value = d and d.get("peak_rss_tree_max_bytes")
            shown = value and (f"{human(value)} (largest uncached run)"
                               + (f"; writing the cache {human(max(first))}" if first else ""))
            met = value is not None and value <= bound
        state = "not measured" if not value else "met" if met else "NOT MET"
        results["targets"].append({"target": name, "value": value or None, "met": bool(met) if value else None})
        out.append(f"{name:<54} {shown or '-':<58} {state}")
    return out


if __name__ == "__main__":
    main()
