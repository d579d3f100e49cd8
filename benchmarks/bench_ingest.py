#!/usr/bin/env python3
"""Ingest benchmark: large Kineto traces built by repeating a real recorded trace in time, then
`profkit analyze` on them (parse, analysis, total, peak RSS, events/s), and HTA's load of the
same file in the same run when `holistictraceanalysis` is importable (here, or in the python
given by --hta-python).

    python benchmarks/bench_ingest.py --sizes 250MB,1GB --ranks 8 --json bench.json

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
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
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


# The parse / analysis split, timed from outside: profkit's public functions in a fresh process
# (load_traces picks its decoding jobs as `analyze` does; no cache).
STAGES_SNIPPET = r"""
import json, sys, time
from pathlib import Path
from profkit.analysis import analyze_trace
from profkit.ingest import load_traces
t0 = time.perf_counter()
traces = load_traces([Path(sys.argv[1])], cache=False)
t1 = time.perf_counter()
for t in traces:
    analyze_trace(t)
print(json.dumps({"load_s": t1 - t0, "analysis_s": time.perf_counter() - t1}))
"""


def profkit_stages(path: Path) -> dict:
    """load_s and analysis_s of one uncached file, timed around the public functions."""
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    r = run_child([sys.executable, "-c", STAGES_SNIPPET, str(path)], env)
    try:
        return json.loads(r["stdout"].strip().splitlines()[-1]) if r["rc"] == 0 else {}
    except (IndexError, ValueError):
        return {}


def profkit_analyze(paths: list[Path], extra: list[str], tag: str) -> dict:
    """`python -m profkit analyze` in a fresh process."""
    sfile = Path(tempfile.mkstemp(prefix="profkit-summary-", suffix=".json")[1])
    env = dict(os.environ)
    # as on a user's machine, where pip compiled the bytecode at install: this project's sandbox sets
    # PYTHONDONTWRITEBYTECODE, which makes every run recompile profkit's modules from source
    env.pop("PYTHONDONTWRITEBYTECODE", None)
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
            "python": platform.python_version(), "platform": platform.platform(), "packages": pkgs}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="250MB,1GB", help="raw JSON sizes of single-file traces (comma-separated)")
    ap.add_argument("--ranks", type=int, default=8, help="also analyze this many rank files of --rank-size at once (0: skip)")
    ap.add_argument("--rank-size", default="250MB")
    ap.add_argument("--template", "--templates", dest="templates", default="sglang,dense",
                    help=f"comma-separated, measured side by side: each one of {sorted(TEMPLATES)} or a trace path")
    ap.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "profkit-bench")
    ap.add_argument("--repeat", type=int, default=2, help="time each figure this many times")
    ap.add_argument("--hta-python", default=None, help="a python with holistictraceanalysis installed (default: this one, /tmp/htavenv)")
    ap.add_argument("--no-hta", action="store_true")
    ap.add_argument("--hta-repeat", type=int, default=1, help="HTA loads per file (a dense 250 MB file takes HTA minutes)")
    ap.add_argument("--json", type=Path, default=None, help="write the results here")
    args = ap.parse_args()

    shapes = [t.strip() for t in args.templates.split(",") if t.strip()]
    sizes = [parse_size(s) for s in args.sizes.split(",") if s.strip()]
    for sh in shapes:
        if not TEMPLATES.get(sh, Path(sh)).is_file():
            raise SystemExit(f"{TEMPLATES.get(sh, Path(sh))}: no such trace (the sglang template is third-party: "
                             "put shared/public-traces beside the checkout or set PROFKIT_PUBLIC_TRACES)")
    args.workdir.mkdir(parents=True, exist_ok=True)
    results: dict = {"machine": machine(), "templates": {sh: str(TEMPLATES.get(sh, Path(sh))) for sh in shapes}, "runs": [], "hta": []}
    rows: list[tuple] = []
    hta_py = None if args.no_hta else hta_python(args.hta_python)
    for shape in shapes:
        _measure(args, shape, TEMPLATES.get(shape, Path(shape)), sizes, hta_py, results, rows)
    _report(args, results, rows)


def _measure(args: argparse.Namespace, shape: str, template: Path, sizes: list[int], hta_py: str | None, results: dict,
             rows: list[tuple]) -> None:
    """Every figure of one template (shape): single files of each size, HTA's load at <= 300 MB, rank files."""

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

    def record(label: str, paths: list[Path], info: dict, extra: list[str], clear: bool) -> dict:
        out = None
        for i in range(args.repeat):
            if clear:
                clear_cache(paths)
            load_before = os.getloadavg()[0]
            r = profkit_analyze(paths, extra, label)
            if "--no-cache" in extra and len(paths) == 1:
                r.update(profkit_stages(paths[0]))
            r["loadavg_1min_before"] = load_before
            r.update(run=i + 1, label=label, shape=shape, raw_bytes=info["raw_bytes"], gz_bytes=info["gz_bytes"], events=info["events"],
                     files=len(paths))
            results["runs"].append(r)
            rows.append((label, i + 1, r))
            print(f"{label} run {i + 1}: {r['wall_s']:.2f} s, tree peak {human(r['tree_peak_rss_bytes'])}", file=sys.stderr)
            out = r
        return out

    for size in sizes:
        path, info = file_for(size)
        label = f"{shape} {human(info['raw_bytes'])}"
        record(f"{label} uncached", [path], info, ["--no-cache"], clear=False)
        record(f"{label} first (writes cache)", [path], info, [], clear=True)
        record(f"{label} cached", [path], info, [], clear=False)
        if hta_py and size <= 300 * 10**6:
            for i in range(args.hta_repeat):
                load_before = os.getloadavg()[0]
                h = hta_load(hta_py, path)
                h["loadavg_1min_before"] = load_before
                h.update(run=i + 1, shape=shape, raw_bytes=info["raw_bytes"], events=info["events"])
                results["hta"].append(h)
                print(f"HTA load {label} run {i + 1}: {h.get('load_s', float('nan')):.1f} s", file=sys.stderr)
    if args.ranks:
        size = parse_size(args.rank_size)
        files = [file_for(size, rank=r) for r in range(args.ranks)]
        paths = [p for p, _ in files]
        info = {"raw_bytes": sum(i["raw_bytes"] for _, i in files), "gz_bytes": sum(i["gz_bytes"] for _, i in files),
                "events": sum(i["events"] for _, i in files)}
        each = human(files[0][1]["raw_bytes"])
        record(f"{shape} {args.ranks} ranks x {each} uncached", paths, info, ["--no-cache"], clear=False)
        record(f"{shape} {args.ranks} ranks x {each} first (writes cache)", paths, info, [], clear=True)
        record(f"{shape} {args.ranks} ranks x {each} cached", paths, info, [], clear=False)


def _report(args: argparse.Namespace, results: dict, rows: list[tuple]) -> None:
    """The table (every run), then per shape: HTA's ratio and how the time grows with the size."""
    if args.json:  # before the table: a formatting slip must not lose the measurements
        args.json.write_text(json.dumps(results, indent=1))
    # table
    hdr = f"{'case':<34} {'run':>3} {'raw':>9} {'events':>10} {'parse s':>8} {'analysis s':>10} {'total s':>8} {'peak RSS (tree)':>15} {'maxrss':>9} {'Mev/s':>6} {'load':>5}"
    lines = [hdr, "-" * len(hdr)]
    for label, i, r in rows:
        ev_s = r["events"] / r["wall_s"] / 1e6 if r["wall_s"] else 0
        lines.append(
            f"{label:<34} {i:>3} {human(r['raw_bytes']):>9} {r['events']:>10,} {_f(r.get('load_s')):>8} "
            f"{_f(r.get('analysis_s')):>10} {r['wall_s']:>8.2f} {human(r['tree_peak_rss_bytes']):>15} "
            f"{human(r['maxrss_bytes']):>9} {ev_s:>6.2f} {r.get('loadavg_1min_before', float('nan')):>5.1f}"
        )
    for h in results["hta"]:
        lines.append(f"HTA 0.5.0 TraceAnalysis load, {h['shape']} {human(h['raw_bytes']):>9}, run {h['run']}: load {h.get('load_s', float('nan')):.1f} s, "
                     f"process {h['wall_s']:.1f} s, peak RSS {human(h['tree_peak_rss_bytes'])}, load {h.get('loadavg_1min_before', float('nan')):.1f}")
    results["per_shape"] = {}
    for shape in results["templates"]:
        mine = [r for r in results["runs"] if r.get("shape") == shape and r["files"] == 1 and r["label"].endswith("uncached")]
        got: dict = {}
        hta = [h for h in results["hta"] if h.get("shape") == shape]
        if hta:
            ref = [r for r in mine if r["raw_bytes"] == hta[0]["raw_bytes"]]
            if ref:
                got["hta_ratio"] = min(h.get("load_s", float("nan")) for h in hta) / min(r["wall_s"] for r in ref)
                lines.append(f"{shape}: HTA load / profkit analyze end to end (uncached, same file, best of each): {got['hta_ratio']:.1f}x")
        by_size = sorted({r["raw_bytes"] for r in mine})
        if len(by_size) >= 2:
            small, big = by_size[0], by_size[-1]
            t_small = min(r["wall_s"] for r in mine if r["raw_bytes"] == small)
            t_big = min(r["wall_s"] for r in mine if r["raw_bytes"] == big)
            got["growth"] = {"sizes": [small, big], "time_ratio": t_big / t_small, "size_ratio": big / small}
            lines.append(f"{shape}: uncached {human(big)} / {human(small)} time ratio {t_big / t_small:.2f} "
                         f"(size ratio {big / small:.2f}; best of each)")
        results["per_shape"][shape] = got
    m = results["machine"]
    lines.insert(0, f"machine: {m['cpu']}, {m['cores']} cores, {m['memory_gb']} GiB, Python {m['python']}, {m['packages']}")
    text = "\n".join(lines)
    print(text)
    results["table"] = text
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
