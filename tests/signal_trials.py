"""Signal trials (issue 25): `profkit trace` on the proxy (two TP ranks) or on the SGLang replica (two
TP ranks, schedulers, a detokenizer and a helper in a session of its own), interrupted by SIGINT or
SIGTERM at a seeded random moment inside a chosen stage; then the processes left behind are counted by
their command line and the manifests are checked. Used by tests/test_faults.py (a few trials) and
benchmarks/signal_trials.py (200 trials, with busy processes beside them).

A trial waits, on the manifest file, for its stage to begin, then waits a seeded random fraction of
that stage's usual length (many points inside each stage, not only its start) and sends the signal.
A stage shorter than the delay on a given host puts the signal in a later stage: the manifest says
where it landed, and that is what the trial reports.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from processes import HANG_S, processes

ROOT = Path(__file__).resolve().parent.parent
REPLICA = Path(__file__).resolve().parent / "sglang_replica"
SMALL = ["--isl", "32", "--turns", "2", "--turn-tokens", "8", "--output-tokens", "12", "--num-steps", "3", "--profile-windows", "1",
         "--health-timeout", "600", "--profile-timeout", "600"]  # guards against a hang, not speed bounds
# the stages a signal is sent in (the moment inside each: a seeded fraction of its length, measured by `calibrate`)
STAGES = ("server_start", "warmup", "workload", "capture", "server_stop")
TARGETS = ("proxy", "sglang")
SIGNALS = (signal.SIGINT, signal.SIGTERM)


@dataclass
class Trial:
    target: str
    sig: int
    stage: str
    fraction: float  # of the stage's length (calibrate) after its start
    seed: int
    delay_s: float = 0.0
    returncode: int | None = None
    landed: str | None = None  # the stage the manifest says the run was interrupted in
    left: list[str] = field(default_factory=list)  # command lines of the processes left behind
    problems: list[str] = field(default_factory=list)  # manifest checks that failed
    manifests: list[dict] = field(default_factory=list)
    wall_s: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.left and not self.problems


def plan(seed: int, n: int) -> list[Trial]:
    """n trials: every 10 consecutive ones cover each (target, stage) pair once (2 and 5 are
    coprime), the signal alternates every two; each has its own seeded delay inside its stage."""
    rng = random.Random(seed)
    return [Trial(TARGETS[i % 2], SIGNALS[(i // 2) % 2], STAGES[i % len(STAGES)], round(rng.random(), 4), seed=seed) for i in range(n)]


def calibrate(target: str, tmp: Path) -> dict[str, float]:
    """How long each stage of an uninterrupted run's first side lasts on this host now (s), read
    from the manifest as it changes; the trials put their signal a seeded fraction into it."""
    tmp.mkdir(parents=True, exist_ok=True)
    p = subprocess.Popen(argv(tmp, target), cwd=tmp, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    seen: dict[str, float] = {}
    try:
        while p.poll() is None:
            ms = read_manifests(tmp)
            if ms and ms[0]["stage"] not in seen:
                seen[ms[0]["stage"]] = time.monotonic()
            if ms and ms[0]["status"] != "running":  # the first side has ended: all its stages are seen
                break
            time.sleep(0.01)
    finally:
        if p.poll() is None:
            p.send_signal(signal.SIGINT)
        p.communicate(timeout=HANG_S)
    order = sorted(seen, key=seen.get)
    return {st: round(seen[nxt] - seen[st], 3) for st, nxt in zip(order, order[1:])}


def replica_python(folder: Path) -> Path:
    w = folder / "replica-bin" / "python"
    w.parent.mkdir(parents=True, exist_ok=True)
    w.write_text(f'#!/bin/sh\nPYTHONPATH="{REPLICA}${{PYTHONPATH:+:$PYTHONPATH}}" exec "{sys.executable}" "$@"\n')
    w.chmod(0o755)
    return w


def read_manifests(tmp: Path) -> list[dict]:
    out = []
    for p in sorted((tmp / "traces").glob("*/manifest.json")):
        try:
            out.append(json.loads(p.read_text()))
        except (OSError, ValueError):  # being replaced (atomic rename): read again next time
            continue
    return sorted(out, key=lambda m: m["started_at"] + m["run_id"])


def argv(tmp: Path, target: str) -> list[str]:
    """`trace` as a user runs it: profkit picks each server's port, and on the proxy runs both sides
    side by side (alternating, its default); the SGLang target runs them one after the other."""
    common = ["--opt", "topk_v2", *SMALL, "--traces-dir", str(tmp / "traces"), "--reports-dir", str(tmp / "reports")]
    if target == "proxy":
        return [sys.executable, "-m", "profkit", "trace", *common, "--extra-server-args", "--tp 2 --skip-server-warmup"]
    return [sys.executable, "-m", "profkit", "trace", "--target", "sglang", "--preset", "glm52-nvfp4-tp4",
            "--server-python", str(replica_python(tmp)), *common]


def ports(manifests: list[dict]) -> set[str]:
    """The port of each run's server, from the command its manifest records (written before the spawn)."""
    out = set()
    for m in manifests:
        a = [str(x) for x in m.get("argv") or []]
        if "--port" in a and a.index("--port") + 1 < len(a):
            out.add(a[a.index("--port") + 1])
    return out


def left_behind(port_set: set[str], server_pids: set[int]) -> list[psutil.Process]:
    """What runs on these ports may have started, found by command line: the proxy server and the
    replica (their command lines carry the port), the replica's helper (it carries the port too),
    proxy rank workers (they carry --parent-pid), and any process (the replica's schedulers and
    detokenizer) whose parent is one of the runs' servers."""

    def match(cmd: list[str]) -> bool:
        if port_set & set(cmd) and any(("profkit.proxy.server" in c or "sglang.launch_server" in c or "sglang-replica-jit-helper" in c) for c in cmd):
            return True
        if any("profkit.proxy.rank_worker" in c for c in cmd) and "--parent-pid" in cmd:
            i = cmd.index("--parent-pid")
            return i + 1 < len(cmd) and cmd[i + 1].isdigit() and int(cmd[i + 1]) in server_pids
        return False

    found = processes(match)
    for proc in psutil.process_iter():
        try:
            if proc.ppid() in server_pids and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except psutil.Error:
            continue
    alive = []
    for proc in {q.pid: q for q in found}.values():
        try:
            if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                alive.append(proc)
        except psutil.Error:
            continue
    return alive


def wait_for(cond, proc: subprocess.Popen, timeout_s: float, what: str) -> None:
    """Poll `cond` (a file read) until true; stop early when profkit has exited."""
    deadline = time.monotonic() + timeout_s
    while not cond():
        if proc.poll() is not None:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen within {timeout_s:.0f} s")
        time.sleep(0.02)


def run(trial: Trial, tmp: Path, lengths: dict[str, float]) -> Trial:
    """One trial; `lengths`: calibrate()'s stage lengths for its target."""
    trial.delay_s = round(trial.fraction * lengths.get(trial.stage, 1.0), 3)
    tmp.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    p = subprocess.Popen(argv(tmp, trial.target), cwd=tmp, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env={**os.environ, "COLUMNS": "200"})
    try:
        wait_for(lambda: any(m["stage"] == trial.stage for m in read_manifests(tmp)), p, HANG_S, f"stage {trial.stage}")
        time.sleep(trial.delay_s)  # the seeded moment inside the stage: what the trial varies, not a wait for something
        if p.poll() is None:
            p.send_signal(trial.sig)
        out, err = p.communicate(timeout=HANG_S)
    finally:
        if p.poll() is None:  # the trial itself failed: stop profkit the way a user would, so it stops its server
            p.send_signal(signal.SIGTERM)
            try:
                p.communicate(timeout=120)  # it is a failure already (a hang): not another HANG_S of CI
            except subprocess.TimeoutExpired:
                p.kill()
                p.communicate()
    trial.returncode = p.returncode
    trial.wall_s = time.monotonic() - t0
    ms = read_manifests(tmp)
    trial.manifests = ms
    pids = {m["server_pid"] for m in ms if isinstance(m.get("server_pid"), int)}
    # profkit returns after the tree is gone: what is found now was left behind (a SIGKILLed
    # process not yet reaped is a zombie, which left_behind does not count)
    left = left_behind(ports(ms), pids)
    trial.left = [" ".join(q.cmdline())[:200] for q in left if _cmd(q)]
    for q in left:  # never leave them to the next trial
        try:
            q.kill()
        except psutil.Error:
            pass
    check(trial, tmp, err)
    return trial


def _cmd(q: psutil.Process) -> bool:
    try:
        q.cmdline()
        return True
    except psutil.Error:
        return False


def check(trial: Trial, tmp: Path, err: str) -> None:
    bad = trial.problems
    if trial.returncode not in (0, 130):
        bad.append(f"exit {trial.returncode}: {err.strip().splitlines()[-1:] if err.strip() else ''}")
    interrupted = [m for m in trial.manifests if m["status"] == "interrupted"]
    if trial.returncode == 130 and not interrupted and any(m["status"] != "ok" for m in trial.manifests):
        # the signal may land outside every run (after one run finished and before the next one's
        # manifest exists, or while the diff is rendered): then each run that exists finished "ok"
        bad.append("exit 130, no manifest says interrupted, and one did not finish ok")
    for m in trial.manifests:
        if m["status"] == "running":
            bad.append(f"{m['run_id']}: manifest still says running")
    for m in interrupted:
        if m.get("error", "").startswith("interrupted during"):  # the run the signal reached (its neighbour was stopped for it)
            trial.landed = m["stage"]
        log = tmp / "traces" / m["run_id"] / "server.log"
        spawned = log.exists() and len(log.read_text(errors="replace").splitlines()) > 1  # more than profkit's own header line
        if "server_pid" not in m:
            if spawned:
                bad.append(f"{m['run_id']}: the server wrote to its log but the manifest has no server_pid")
            continue
        ex = m.get("server_exit") or {}
        if not isinstance(m["server_pid"], int) or ex.get("pid") != m["server_pid"] or not ex.get("how"):
            bad.append(f"{m['run_id']}: server_pid {m.get('server_pid')!r}, server_exit {ex!r}")
        if m.get("leftover_pids"):
            bad.append(f"{m['run_id']}: leftover_pids {m['leftover_pids']}")
