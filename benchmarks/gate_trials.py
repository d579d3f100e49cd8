"""Issue 37's acceptance trials for `profkit gate` on the proxy (CPU): every step is a `profkit`
command line, run as a subprocess and logged with its exit code, its decision line and the load
average around it.

1. `profkit calibrate --sessions 3` (the A/A calibration: three alternating pairs one after another, so
   each metric has an MDE within a pair and one across sessions; session 1's A side is saved as the stored
   baseline "main"); its policy.toml (each threshold at the larger MDE) is used by every later gate.
2. topk_v2: `profkit trace --opt topk_v2` five times (one beside busy processes); each gives
   `gate ALL_ON TOPK_OFF` (expected: regression, owned topk) and `gate TOPK_OFF ALL_ON` (expected: pass).
3. A/A: `profkit calibrate --sessions 1` again N times (the first ones beside busy processes): each gives
   two runs of the same configuration, each gated against the stored baseline (`gate --baseline main`),
   and the pair gated against each other (`gate A B`); expected: no "regression" (a run recorded beside
   the busy processes against the quiet stored baseline: inconclusive, the machine's load differs).
4. injected host delay: `profkit trace --fault host_delay_us=D` for delays below and above the smallest
   delay the calibrated gate can detect: the least, over the rows a host delay per decode step moves (the
   step window; ITL, times the tokens per step; the iteration-boundary idle, where the busy-wait lands),
   of the row's threshold in µs (the policy's, at the calibrated MDE), 3 runs each; `gate BASELINE FAULTED`.

    python benchmarks/gate_trials.py --out /tmp/v-gate/trials --json benchmarks/results/gate_trials.json

Busy processes are `python -c 'while 1: pass'`, started and killed (by pid) by this script. The
machine is shared (other users' load shows in the load averages logged): no run is "quiet".
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

PROFKIT = [sys.executable, "-m", "profkit"]
SMALL = ["--turns", "3", "--num-steps", "10", "--repeat", "3", "--profile-windows", "3"]  # --num-steps: --steps


class Trials:
    def __init__(self, out: Path, json_path: Path) -> None:
        self.out, self.json_path = out, json_path
        self.doc: dict[str, Any] = {"started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "cpus": os.cpu_count(), "steps": [],
                                    "note": os.environ.get("GATE_TRIALS_NOTE", "load averages logged per step")}
        self.busy: list[subprocess.Popen[bytes]] = []

    def save(self) -> None:
        self.json_path.parent.mkdir(parents=True, exist_ok=True)
        self.json_path.write_text(json.dumps(self.doc, indent=1))

    def run(self, group: str, argv: list[str], **extra: Any) -> dict[str, Any]:
        t0, l0 = time.time(), os.getloadavg()
        p = subprocess.run(argv, capture_output=True, text=True)
        step = {"group": group, "command": shlex.join(["profkit", *argv[3:]]) if argv[:3] == PROFKIT else shlex.join(argv),
                "rc": p.returncode, "seconds": round(time.time() - t0, 1), "load_before": [round(x, 2) for x in l0],
                "load_after": [round(x, 2) for x in os.getloadavg()], "busy": len(self.busy),
                "first_line": (p.stdout.splitlines() or [""])[0], **extra}
        if p.returncode not in (0, 5):
            step["stderr_tail"] = p.stderr[-1500:]
        self.doc["steps"].append(step)
        self.save()
        print(f"[{group}] rc={p.returncode} {step['seconds']}s load={step['load_before'][0]} busy={step['busy']}: {step['first_line']}", flush=True)
        return step

    def start_busy(self, n: int) -> None:
        self.busy = [subprocess.Popen([sys.executable, "-c", "while 1: pass"]) for _ in range(n)]

    def stop_busy(self) -> None:
        for p in self.busy:
            p.kill()
            p.wait()
        self.busy = []


def runs(reports: Path, suffix: str) -> Path:
    found = sorted(p for p in reports.iterdir() if p.is_dir() and p.name.endswith(suffix))
    if not found:
        raise SystemExit(f"no run folder *{suffix} in {reports}")
    return found[-1]


def gate_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def fields(s: dict[str, Any], doc: dict[str, Any]) -> None:
    """A gate step's figures from its gate.json (the decision, what regressed, the rows its group's table shows)."""
    rows = {r["metric"]: r for r in doc["rows"]}
    w, i_ = rows.get("gpu_window_us", {}), rows.get("throughput.itl_ms_p50", {})
    s.update(decision=doc["decision"], regressions=doc["regressions"], other_cpus=_load(doc), pairing=doc.get("pairing"),
             too_noisy=sum(r["verdict"] == "too noisy" for r in doc["rows"] if r["gated"]))
    if s["group"].startswith("topk"):
        s.update(owned_term=doc["owned_term"], headline=doc["headline"])
    elif s["group"].startswith("aa"):
        s.update(mde_pct=w.get("mde_pct"), window_change_pct=w.get("change_pct"))
    else:
        s.update(window_change_us=w.get("change"), window_verdict=w.get("verdict"), itl_change_pct=i_.get("change_pct"),
                 itl_verdict=i_.get("verdict"))


def regate(path: Path) -> None:
    """Every gate of an earlier pass judged again by this profkit (same recordings, same calibration and policy)."""
    doc = json.loads(path.read_text())
    for s in doc["steps"]:
        if not s["command"].startswith("profkit gate "):
            continue
        argv = shlex.split(s["command"])[1:]
        p = subprocess.run([*PROFKIT, *argv], capture_output=True, text=True)
        s.update(rc=p.returncode, first_line=(p.stdout.splitlines() or [""])[0])
        fields(s, gate_json(Path(argv[argv.index("--json") + 1])))
        print(f"[{s['group']}] rc={p.returncode}: {s['first_line']}", flush=True)
    doc["regated"] = time.strftime("%Y-%m-%dT%H:%M:%S%z") + ": every gate judged again by the profkit of this commit"
    path.write_text(json.dumps(doc, indent=1))


def _load(doc: dict[str, Any]) -> str:
    """The sides' other processes' CPU use as the gate read it: 'baseline/candidate' CPUs."""
    hl = doc.get("host_load") or {}
    b, c = hl.get("baseline_other_cpus"), hl.get("candidate_other_cpus")
    return "?" if b is None or c is None else f"{b:.2f}/{c:.2f}"


def _here(step: dict[str, Any]) -> None:
    """A delay gate's own view of the delay: over the MDE as that gate applied it (the MDE is a share of the
    calibration's window; the gate applies it to this baseline's window, which the machine's load moves)."""
    args = shlex.split(step["command"])
    if "--json" not in args:
        return
    path = Path(args[args.index("--json") + 1])
    if not path.is_file():
        return
    rows = {r["metric"]: r for r in json.loads(path.read_text())["rows"]}
    w = rows.get("gpu_window_us")
    if w and w.get("mde_pct") and w.get("baseline"):
        step["window_baseline_us"] = round(w["baseline"])
        step["delay_over_mde_here"] = round(step["delay_us"] / (w["mde_pct"] / 100 * w["baseline"]), 2)
    # the busy-wait idles the device before the step's forward: idle at the iteration boundary, whose baseline is small
    b = rows.get("idle_us_by_cause.iteration_boundary")
    if b and b.get("mde_pct") and b.get("baseline"):
        step["delay_over_boundary_idle_mde_here"] = round(step["delay_us"] / (b["mde_pct"] / 100 * b["baseline"]), 2)
        step["boundary_idle_verdict"] = b["verdict"]


def summary(doc: dict[str, Any]) -> str:
    """The trials as tables (the TXT beside the JSON)."""
    steps = doc["steps"]
    for s in steps:
        if s["group"] == "delay-gate":
            _here(s)
    out = [f"gate trials, {doc['started']} to {doc.get('ended', '(running)')}; {doc['cpus']} CPUs; {doc['note']}", ""]
    c = doc.get("calibration")
    if c:
        if "window_limit_us" in c:  # this version's calibration (several sessions; the delay's rows at their gate lines)
            out.append(f"calibration: step window {c['window_us']:,.0f} us, MDE {c['window_mde_pct']:.1f}% paired, "
                       f"{c.get('window_stored_mde_pct') or 0:.1f}% across sessions (gate line {c['window_limit_us']:,.0f} us); ITL {c['itl_ms']:.2f} ms, "
                       f"MDE {c['itl_mde_pct']:.1f}% paired, {c.get('itl_stored_mde_pct') or 0:.1f}% across sessions (gate line = "
                       f"{c['itl_mde_as_step_delay_us']:,.0f} us per step at accept length {c['accept_length']:.2f}); iteration-boundary idle "
                       f"{c['boundary_idle_us']:,.0f} us (gate line {c['boundary_idle_limit_us']:,.0f} us); smallest detectable host delay "
                       f"{c['detectable_delay_us']:,.0f} us per step")
        else:
            out.append(f"calibration: step window {c['window_us']:,.0f} us, MDE {c['window_mde_pct']:.1f}% ({c['window_mde_us']:,.0f} us); "
                       f"ITL {c['itl_ms']:.2f} ms, MDE {c['itl_mde_pct']:.1f}% (= {c['itl_mde_as_step_delay_us']:,.0f} us per step at accept "
                       f"length {c['accept_length']:.2f}); smallest detectable host delay {c['detectable_delay_us']:,.0f} us per step")
        out.append("policy: " + c["policy"] + " (each threshold at its metric's MDE, the larger of paired and across sessions, at least 2%)")
        out.append("")
    for s in steps:
        if s["group"] in ("calibrate", "baseline"):
            out.append(f"{s['group']}: rc {s['rc']}, load {s['load_before'][0]:.1f}: {s['command']}")
    out.append("")

    def table(title: str, groups: tuple[str, ...], cols: list[str]) -> None:
        rows = [s for s in steps if s["group"] in groups]
        if not rows:
            out.append(f"{title}: not run")
            return
        out.append(title)
        for s in rows:
            extra = "  ".join(f"{k}={s.get(k)!s}" for k in cols if k in s)
            out.append(f"  [{s['group']}] rc={s['rc']} load={s['load_before'][0]:.1f} busy={s['busy']} {extra}")
            out.append(f"      {s['first_line']}")
        out.append("")

    table("topk_v2 removed (candidate) vs all on (baseline), and the reverse", ("topk-regression", "topk-reverse"),
          ["decision", "owned_term", "under_load", "other_cpus", "too_noisy"])
    table("injected host delay (gate BASELINE FAULTED)", ("delay-gate",),
          ["delay_us", "delay_over_detectable", "window_baseline_us", "delay_over_mde_here", "delay_over_boundary_idle_mde_here", "decision",
           "regressions", "window_change_us", "window_verdict", "boundary_idle_verdict", "itl_change_pct", "itl_verdict", "other_cpus", "too_noisy"])
    table("A/A: the same configuration against the stored baseline, and pairwise", ("aa-stored", "aa-paired"),
          ["decision", "regressions", "mde_pct", "window_change_pct", "under_load", "pairing", "other_cpus", "too_noisy"])
    counts: dict[str, dict[str, int]] = {}
    for s in steps:
        if "decision" in s:
            counts.setdefault(s["group"], {}).setdefault(s["decision"], 0)
            counts[s["group"]][s["decision"]] += 1
    out.append("decisions by group: " + json.dumps(counts))
    return "\n".join(out) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("/tmp/v-gate/trials"))
    ap.add_argument("--json", type=Path, default=Path("benchmarks/results/gate_trials.json"))
    ap.add_argument("--aa", type=int, default=10, help="A/A recordings (two gated runs each)")
    ap.add_argument("--aa-busy", type=int, default=3, help="of which beside the busy processes (the first ones)")
    ap.add_argument("--topk", type=int, default=5)
    ap.add_argument("--delay-runs", type=int, default=3)
    ap.add_argument("--delay-factors", default="0.25,0.5,2,4", help="host delays as multiples of the smallest detectable one")
    ap.add_argument("--busy", type=int, default=2)
    ap.add_argument("--sessions", type=int, default=3, help="the calibration's A/A sessions")
    ap.add_argument("--parts", default="topk,aa,delay", help="which trials after the calibration (comma-separated: topk, aa, delay)")
    ap.add_argument("--reuse", action="store_true", help="use the calibration and stored baseline already in --out (a later pass)")
    ap.add_argument("--steps", type=int, default=10, help="--num-steps of every recording (iterations per profile window)")
    ap.add_argument("--summarize", type=Path, help="only write the TXT tables of an earlier run's JSON (beside it)")
    ap.add_argument("--regate", type=Path, help="judge every gate of an earlier run's JSON again (its recordings kept), then --summarize it")
    a = ap.parse_args()
    if a.regate:
        regate(a.regate)
        a.summarize = a.regate
    if a.summarize:
        a.summarize.with_suffix(".txt").write_text(summary(json.loads(a.summarize.read_text())))
        return 0
    SMALL[SMALL.index("--num-steps") + 1] = str(a.steps)
    t = Trials(a.out, a.json)
    t.doc["recording"] = " ".join(SMALL)
    out = a.out
    out.mkdir(parents=True, exist_ok=True)
    cal = out / "calibration.json"
    bdir = out / "baselines"
    try:
        # 1. calibration and the stored baseline
        rep = out / "cal" / "reports"
        for attempt in range(0 if a.reuse else 3):  # a calibration whose A/A windows disagree (unstable: no MDE) is recorded again
            t.run("calibrate", [*PROFKIT, "calibrate", *SMALL, "--sessions", str(a.sessions), "--traces-dir", str(out / "cal" / "traces"),
                                "--reports-dir", str(rep), "-o", str(cal)], attempt=attempt)
            if json.loads(cal.read_text()).get("judged", True):
                break
        if not a.reuse:
            t.run("baseline", [*PROFKIT, "baseline", "save", str(runs(rep, "-calibrate-a")), "--name", "main", "--dir", str(bdir)])
        c = json.loads(cal.read_text())
        win, itl = c["metrics"]["gpu_window_us"], c["metrics"]["throughput.itl_ms_p50"]
        # the policy calibrate suggests (policy.toml beside calibration.json): every threshold at its metric's MDE
        policy = cal.with_name("policy.toml")
        # the smallest host delay per decode step the gate can see: through the step window (its MDE in µs), or through
        # ITL (its MDE in ms, times the tokens a step yields: the manifest's accept length)
        man = json.loads((out / "cal" / "traces" / runs(rep, "-calibrate-a").name / "manifest.json").read_text())
        accept = man["throughput"][0]["accept_length"]["median"]
        import tomllib

        thr = {k: v["threshold_pct"] for k, v in tomllib.loads(policy.read_text()).get("metric", {}).items()}
        bnd = c["metrics"]["idle_us_by_cause.iteration_boundary"]

        def limit_us(key: str, m: dict[str, Any], scale: float = 1.0) -> float:  # the gate's line for the row: its threshold, at least its MDE
            pct = max(thr.get(key, 2.0), m["mde_pct"] or 0.0, m.get("stored_mde_pct") or 0.0)
            return pct / 100 * m["baseline"] * scale

        itl_step_us = limit_us("throughput.itl_ms_p50", itl, 1000 * accept)
        detectable = min(limit_us("gpu_window_us", win), itl_step_us, limit_us("idle_us_by_cause.iteration_boundary", bnd))
        t.doc["calibration"] = {"window_us": win["baseline"], "window_mde_pct": win["mde_pct"], "window_mde_us": win["mde_abs"],
                                "window_stored_mde_pct": win.get("stored_mde_pct"),
                                "itl_ms": itl["baseline"], "itl_mde_pct": itl["mde_pct"], "itl_stored_mde_pct": itl.get("stored_mde_pct"),
                                "accept_length": accept, "boundary_idle_us": bnd["baseline"], "boundary_idle_limit_us": limit_us(
                                    "idle_us_by_cause.iteration_boundary", bnd), "window_limit_us": limit_us("gpu_window_us", win),
                                "itl_mde_as_step_delay_us": itl_step_us, "detectable_delay_us": detectable, "policy": str(policy),
                                "metrics": {k: {"mde_pct": m["mde_pct"], "stored_mde_pct": m.get("stored_mde_pct"), "aa_spread_pct": m["aa_spread_pct"]}
                                            for k, m in c["metrics"].items()}}
        t.save()
        g = ["--calibration", str(cal), "--policy", str(policy)]

        # 2. topk_v2 removed (candidate) against all on (baseline), and the reverse
        for i in range(a.topk if "topk" in a.parts else 0):
            under = i == a.topk - 1
            if under:
                t.start_busy(a.busy)
            rep = out / f"topk{i}" / "reports"
            t.run("topk-trace", [*PROFKIT, "trace", "--opt", "topk_v2", *SMALL, "--traces-dir", str(out / f"topk{i}" / "traces"), "--reports-dir", str(rep)])
            t.stop_busy()
            on, off = runs(rep, "-after"), runs(rep, "-before")
            j = out / f"topk{i}-gate.json"
            s = t.run("topk-regression", [*PROFKIT, "gate", str(on), str(off), *g, "--json", str(j), "--md", str(out / f"topk{i}.md")], under_load=under)
            fields(s, gate_json(j))
            j2 = out / f"topk{i}-reverse.json"
            s2 = t.run("topk-reverse", [*PROFKIT, "gate", str(off), str(on), *g, "--json", str(j2)], under_load=under)
            fields(s2, gate_json(j2))
            t.save()

        # 3. A/A: the same configuration recorded again, gated against the stored baseline and pairwise
        pfx = time.strftime("%H%M-") if a.reuse else ""  # a later pass beside an earlier one's folders
        for i in range(a.aa if "aa" in a.parts else 0):
            under = i < a.aa_busy  # the loaded ones first: a pass cut short still has them
            if under:
                t.start_busy(a.busy)
            rep = out / f"aa{pfx}{i}" / "reports"
            t.run("aa-record", [*PROFKIT, "calibrate", *SMALL, "--sessions", "1", "--traces-dir", str(out / f"aa{pfx}{i}" / "traces"), "--reports-dir", str(rep),
                                "-o", str(out / f"aa{pfx}{i}" / "calibration.json")])
            t.stop_busy()
            ra, rb = runs(rep, "-calibrate-a"), runs(rep, "-calibrate-b")
            for side, run in (("a", ra), ("b", rb)):
                j = out / f"aa{pfx}{i}{side}-stored.json"
                s = t.run("aa-stored", [*PROFKIT, "gate", "--baseline", "main", "--dir", str(bdir), str(run), *g, "--json", str(j)], under_load=under)
                fields(s, gate_json(j))
            j = out / f"aa{pfx}{i}-paired.json"
            s = t.run("aa-paired", [*PROFKIT, "gate", str(ra), str(rb), *g, "--json", str(j)], under_load=under)
            fields(s, gate_json(j))
            t.save()
        # 4. injected host delay, below and above the calibrated MDE of the step window
        delays = sorted({round(detectable * float(f)) for f in a.delay_factors.split(",")}) if "delay" in a.parts else []
        t.doc["delays_us"] = delays
        for d in delays:
            for r in range(a.delay_runs):
                rep = out / f"delay{d}-{r}" / "reports"
                t.run("delay-trace", [*PROFKIT, "trace", "--fault", f"host_delay_us={d}", *SMALL, "--traces-dir", str(out / f"delay{d}-{r}" / "traces"),
                                      "--reports-dir", str(rep)])
                j = out / f"delay{d}-{r}.json"
                s = t.run("delay-gate", [*PROFKIT, "gate", str(runs(rep, "-before")), str(runs(rep, "-after")), *g, "--json", str(j)],
                          delay_us=d, delay_over_detectable=d / detectable)
                fields(s, gate_json(j))
                t.save()

    finally:
        t.stop_busy()
        t.doc["ended"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        t.save()
        a.json.with_suffix(".txt").write_text(summary(t.doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
