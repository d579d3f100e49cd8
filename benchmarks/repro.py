"""Does the same leave-one-out give the same answer? (issue 30)

Runs (or reads) the same `profkit sweep --mode leave-one-out` K times and prints, per optimization,
its own term's change (median, min, max over the K recordings), that term's share of the
kernel-time change (categories by ownership), and each recording's verdict: the headline's first
line, whether it was judged, flags.

    # read recordings made elsewhere (e.g. benchmarks/gpu_repro.sh on an H200): each a folder of run
    # folders <stamp>-all, <stamp>-all-<opt> with window-<i>/ traces
    python benchmarks/repro.py read /work/h200/rec-1 /work/h200/rec-2 /work/h200/rec-3 --json out.json

    # record K sweeps here (the proxy on this machine's CPU), the --loaded-th one beside two busy
    # processes that burn both cores, then read them
    python benchmarks/repro.py run --k 5 --opts topk_v2,indexer_fusion,index_share --loaded 5 --out /tmp/repro --json out.json

Own terms: the catalog's (kernels/proxy.toml) categories, phases and idle causes of each
optimization. For the issue's "Done when": topk_v2 -> topk, indexer_fusion -> indexer,
index_share -> the draft phase, overlap -> its idle causes (summed).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# the term whose share of the change the issue asks for, per optimization
HEADLINE_TERM = {"topk_v2": ("category_us", "topk"), "indexer_fusion": ("category_us", "indexer"),
                 "index_share": ("phase_us", "draft"), "overlap": ("idle", None), "cuda_graph": ("idle", None)}


def run_folders(rec: Path) -> dict[str, Path]:
    """{'all': path, 'all-topk_v2': path, ...} of one recording (run folders named <stamp>-...-all[-<opt>])."""
    out: dict[str, Path] = {}
    for d in sorted(p for p in rec.iterdir() if p.is_dir() and (p / "manifest.json").is_file()):
        name = d.name
        i = name.rfind("-all")
        if i >= 0:
            out[name[i + 1:]] = d
    return out


def windows(run: Path, catalog: Any) -> list[dict[str, Any]]:
    from profkit.analysis.parallel import analyze_runs
    from profkit.analysis.summary import build_summary

    caps = sorted((run / "graph_capture_profile").glob("*.json.gz"))
    ws = sorted(run.glob("window-*"), key=lambda p: int(p.name.split("-")[1]))
    manifest = json.loads((run / "manifest.json").read_text())
    out = []
    for w in ws:
        analyses = [a for r in analyze_runs([w], catalog=catalog, captures=caps or None, cache=False) for a in r.analyses]
        s = build_summary(analyses)
        s["manifest"] = manifest
        out.append(s)
    return out


def own_figure(diff: dict[str, Any], opt: str) -> dict[str, Any]:
    """The optimization's own term (the issue's), its change, noise, share of the kernel-time change."""
    dec = diff["decomposition"]
    kernel = sum(dec["category_us"].values())
    group, key = HEADLINE_TERM.get(opt, ("category_us", None))
    ee = diff.get("expected_effect") or {}
    if group == "idle":
        keys = ee.get("idle") or []
        delta = sum(dec["idle_us_by_cause"][k] for k in keys)
        spread = None
        whole = dec["gpu_window_us"]["delta"]
        name = " + ".join(f"{k} idle" for k in keys)
        share = delta / whole if whole else None  # of the GPU window change: an idle term has no kernel time
        share_of = "GPU window change"
    else:
        delta = dec[group][key]
        spread = dec["spread_us"][group].get(key)
        name = key if group == "category_us" else f"{key} phase"
        share = delta / kernel if kernel else None
        share_of = "kernel-time change (by ownership)"
    return {"term": name, "delta_us": delta, "spread_us": spread, "kernel_delta_us": kernel,
            "window_delta_us": dec["gpu_window_us"]["delta"], "backlog_us": dec.get("backlog_us"), "share": share, "share_of": share_of}


def verdict(diff: dict[str, Any]) -> dict[str, Any]:
    from profkit.documents import diff_of
    from profkit.report.views import headline_lines

    ee = diff.get("expected_effect") or {}
    lines = headline_lines(diff_of(diff))
    return {"headline": lines[0], "bullets": lines[1:], "judged": bool(ee.get("judged")), "ok": ee.get("ok"),
            "flags": list(ee.get("flags") or []), "against": list(ee.get("against") or []),
            "own": [{"term": t["term"], "delta_us": t["delta_us"], "spread_us": t["spread_us"], "as_expected": t["as_expected"]}
                    for t in ee.get("own") or []],
            "identity_residual_us": diff["decomposition"]["residual_us"], "basis": diff["decomposition"].get("basis")}


def read(recs: list[Path], catalog_name: str = "proxy", reuse: bool = False) -> dict[str, Any]:
    from profkit.attribution.diff import compare_summaries
    from profkit.analysis.catalog import load_catalog

    cat = load_catalog(catalog_name)
    per_opt: dict[str, list[dict[str, Any]]] = {}
    for rec in recs:
        cached = rec / "repro_rows.json"  # one recording's rows, kept beside it (`read` again is then instant)
        if cached.is_file() and reuse:
            for opt, row in json.loads(cached.read_text()).items():
                per_opt.setdefault(opt, []).append(row)
            continue
        rows_here: dict[str, dict[str, Any]] = {}
        runs = run_folders(rec)
        if "all" not in runs:
            print(f"{rec}: no run folder ending in -all; skipped", file=sys.stderr)
            continue
        cand = windows(runs["all"], cat)
        for name, path in runs.items():
            if name == "all":
                continue
            opt = name.removeprefix("all-")
            base = windows(path, cat)
            d = compare_summaries(base[0], cand[0], opt=opt, catalog=cat, baseline_repeats=base, candidate_repeats=cand,
                                  labels=(f"{rec.name}/{name}", f"{rec.name}/all"))
            row = {"recording": str(rec), **own_figure(d, opt), **verdict(d),
                   "order": ((d.get("manifests") or {}).get("candidate") or {}).get("capture_order")}
            per_opt.setdefault(opt, []).append(row)
            rows_here[opt] = row
        if reuse:
            try:
                cached.write_text(json.dumps(rows_here, default=str))
            except OSError:
                pass
    out: dict[str, Any] = {}
    for opt, rows in sorted(per_opt.items()):
        ds = [r["delta_us"] for r in rows]
        shares = [r["share"] for r in rows if r["share"] is not None]
        med = statistics.median(ds)
        out[opt] = {
            "term": rows[0]["term"], "recordings": len(rows),
            "delta_us": {"median": med, "min": min(ds), "max": max(ds), "spread": max(ds) - min(ds)},
            "share": {"median": statistics.median(shares) if shares else None, "min": min(shares, default=None),
                      "max": max(shares, default=None), "of": rows[0]["share_of"]},
            "spread_below_median": (max(ds) - min(ds)) < abs(med),
            "runs": rows,
        }
    return out


def show(res: dict[str, Any]) -> None:
    for opt, r in res.items():
        d, s = r["delta_us"], r["share"]
        share = (f"share of the {s['of']} median {100 * s['median']:.0f}% (min {100 * s['min']:.0f}%, max {100 * s['max']:.0f}%)"
                 if s["median"] is not None else "no share")
        print(f"{opt}: own term {r['term']} over {r['recordings']} recordings: median {d['median']:+,.1f} µs "
              f"(min {d['min']:+,.1f}, max {d['max']:+,.1f}, spread {d['spread']:,.1f} "
              f"{'<' if r['spread_below_median'] else '>='} |median|); {share}")
        for i, run in enumerate(r["runs"], 1):
            flags = f"; FLAGS: {' | '.join(run['flags'] + run['against'])}" if run["flags"] or run["against"] else "; no flag"
            print(f"  run {i}: {run['term']} {run['delta_us']:+,.1f} µs"
                  + (f" (±{run['spread_us']:,.1f})" if run["spread_us"] is not None else "")
                  + (f" = {100 * run['share']:.0f}% of the {run['share_of']} ({run['kernel_delta_us'] if run['share_of'].startswith('kernel') else run['window_delta_us']:+,.1f})"
                     if run["share"] is not None else "")
                  + f"; judged: {run['judged']}{flags}")
            print(f"         headline: {run['headline']}")


BUSY = "while True: pass"


def record(k: int, opts: str, out: Path, loaded: int | None, extra: list[str]) -> list[Path]:
    """K sweeps of the proxy here, each into out/rec-<i>; the loaded-th beside two busy processes."""
    recs = []
    for i in range(1, k + 1):
        rec = out / f"rec-{i}"
        if rec.is_dir() and any(rec.iterdir()):
            recs.append(rec)  # already recorded: resume
            continue
        busy = [subprocess.Popen([sys.executable, "-c", BUSY]) for _ in range(2)] if loaded == i else []
        try:
            t0 = time.time()
            cmd = [sys.executable, "-m", "profkit", "sweep", "--opts", opts, "--mode", "leave-one-out", "--capture-only",
                   "--traces-dir", str(rec), "--reports-dir", str(out / f"reports-{i}"), *extra]
            print(f"[{time.strftime('%H:%M:%S')}] recording {i}/{k}{' under load (2 busy processes)' if busy else ''}: {' '.join(cmd)}",
                  flush=True)
            subprocess.run(cmd, check=True, stdout=open(out / f"log-{i}.txt", "w"), stderr=subprocess.STDOUT,
                           env={**os.environ, "PYTHONUNBUFFERED": "1"})
            print(f"[{time.strftime('%H:%M:%S')}] recording {i} took {time.time() - t0:,.0f} s", flush=True)
        finally:
            for p in busy:
                p.kill()
                p.wait()
        recs.append(rec)
    return recs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("read")
    r.add_argument("recordings", nargs="+", type=Path)
    r.add_argument("--json", type=Path)
    r.add_argument("--reuse", action="store_true", help="keep each recording's rows in <recording>/repro_rows.json and reuse them")
    w = sub.add_parser("run")
    w.add_argument("--k", type=int, default=5)
    w.add_argument("--opts", default="topk_v2,indexer_fusion,index_share")
    w.add_argument("--loaded", type=int, default=None, help="which recording (1..K) runs beside two busy processes")
    w.add_argument("--out", type=Path, required=True)
    w.add_argument("--json", type=Path)
    w.add_argument("extra", nargs="*", help="more sweep options, after --")
    a = ap.parse_args()
    if a.cmd == "run":
        a.out.mkdir(parents=True, exist_ok=True)
        recs = record(a.k, a.opts, a.out, a.loaded, a.extra)
    else:
        recs = a.recordings
    res = read(recs, reuse=getattr(a, "reuse", False) or a.cmd == "run")
    show(res)
    if a.json:
        a.json.write_text(json.dumps({"recordings": [str(p) for p in recs], "results": res}, indent=1, default=str) + "\n")


if __name__ == "__main__":
    main()
