"""Test helpers for the processes a test starts: find them by command line (what a test checks is left
behind), wait on an event they produce (never on a fixed sleep or a speed threshold), and end every
one of them in a fixture's teardown even when the test fails (conftest's `_end_started`)."""

from __future__ import annotations

import gzip
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

import psutil

from profkit.http import free_port  # noqa: F401  (the tests' ports: below the ephemeral range, never one twice)

# how long a wait may last before the test is declared hung: not a speed bound (a loaded machine
# can be ten times slower than a quiet one), only what keeps a hang from running forever
HANG_S = 900.0


def processes(match: Callable[[list[str]], bool]) -> list[psutil.Process]:
    out = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            cmd = p.info["cmdline"] or []
        except psutil.Error:
            continue
        if match(cmd):
            out.append(p)
    return out


def wait_until(cond: Callable[[], Any], what: str, *, proc: subprocess.Popen | None = None, poll_s: float = 0.05) -> Any:
    """Poll `cond` until it returns something true and return that; fail at once when `proc` exits
    first (with its output), and after HANG_S (a hang, not slowness)."""
    deadline = time.monotonic() + HANG_S
    while True:
        got = cond()
        if got:
            return got
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"{what}: the process exited first (exit {proc.returncode})")
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not after {HANG_S:.0f} s (hung)")
        time.sleep(poll_s)


def gone(procs: list[psutil.Process]) -> list[psutil.Process]:
    """Wait for these processes to end (a killed process is reaped soon, whatever the load); the
    ones still alive after HANG_S."""
    return psutil.wait_procs(procs, timeout=HANG_S)[1]


_started: list[Callable[[], None]] = []


def started(proc: subprocess.Popen) -> subprocess.Popen:
    """Register a process this test started: conftest's teardown ends it if it still runs (SIGTERM
    first: profkit then tears its server down; SIGKILL if it does not end)."""

    def end() -> None:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(HANG_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    _started.append(end)
    return proc


def on_teardown(fn: Callable[[], None]) -> None:
    """Register any other clean-up (a Server's stop) for the end of the current test."""
    _started.append(fn)


def end_started() -> None:
    while _started:
        fn = _started.pop()
        try:
            fn()
        except Exception:  # one clean-up failing must not keep the others from running
            pass


def run_to_end(argv: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
    """subprocess.run for a command that may start servers (`profkit trace`, `sweep`): registered with
    `started`, so a failing or hung test still ends it by SIGTERM (profkit then stops its server;
    subprocess.run's own timeout would SIGKILL profkit and orphan the server)."""
    p = started(subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw))
    try:
        out, err = p.communicate(timeout=HANG_S)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"{argv[:4]}: still running after {HANG_S:.0f} s (hung)") from None
    return subprocess.CompletedProcess(argv, p.returncode, out, err)


# --- profkit run as a process (test_capture, test_faults, test_sglang_replica) -----------------------

SMALL = ["--isl", "64", "--turns", "3", "--turn-tokens", "16", "--output-tokens", "24", "--num-steps", "6"]


def servers_on(port: int) -> list[psutil.Process]:
    return processes(lambda cmd: "profkit.proxy.server" in cmd and str(port) in cmd)


def profkit(tmp: Path, *args: str, port: int | None = None, **kw) -> subprocess.Popen:
    argv = [sys.executable, "-m", "profkit", *args, "--traces-dir", str(tmp / "traces"), "--reports-dir", str(tmp / "reports")]
    if port:
        argv += ["--port", str(port)]
    return started(subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp, **kw))


def manifests(tmp: Path) -> list[dict]:
    return sorted((json.loads(p.read_text()) for p in (tmp / "traces").glob("*/manifest.json")), key=lambda m: m["started_at"] + m["run_id"])


def wait_stage(tmp: Path, stage: str, proc: subprocess.Popen) -> dict:
    """The manifest, once a run reaches `stage` (a file written by profkit: no sleep, no speed bound)."""
    return wait_until(lambda: next((m for m in manifests(tmp) if m["stage"] == stage), None), f"stage {stage}", proc=proc)


def assert_no_leftovers(port: int) -> None:
    """profkit returns once its server's tree is gone: a killed process is only waited to be reaped."""
    assert gone(servers_on(port)) == []


# --- the SGLang replica (tests/sglang_replica) ---------------------------------------------------------

REPLICA = Path(__file__).resolve().parent / "sglang_replica"


def replica_procs(port: int) -> list[psutil.Process]:
    """The replica's processes for this port: its main, and the helper started in a session of its own."""
    return processes(lambda cmd: str(port) in cmd and ("sglang.launch_server" in cmd or "sglang-replica-jit-helper" in cmd))


def assert_nothing_left(port: int, pids: list[int] = ()) -> None:
    """profkit returns once the tree is gone: a killed process is only waited to be reaped."""
    procs = replica_procs(port)
    for pid in pids:
        try:
            procs.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            pass
    assert gone(procs) == []


SPEC = "--speculative-algorithm EAGLE --speculative-num-steps 3 --speculative-eagle-topk 1 --speculative-num-draft-tokens 4"


def start_replica(tmp_path: Path, replica_python: Path, env: dict[str, str], tp: int = 2):
    """A replica server started the way profkit composes it (every switch on, EAGLE), healthy, and
    stopped at the test's teardown even when the test fails."""
    from profkit.capture.server import Server
    from profkit.targets import sglang as sg

    spec = sg.compose({n: True for n in sg.registry(sg.TARGET)}, preset=None, model_path="replica-model",
                      extra_args=["--tp", str(tp), *SPEC.split()], server_python=str(replica_python), port=free_port(),
                      caps=sg.gpu_compute_capabilities())  # as profkit composes at run time: no cutedsl without Blackwell
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        server = Server(spec, tmp_path / "server.log")
        on_teardown(server.stop)  # stopped after the test even when it fails (stop is idempotent)
        server.start()
        server.wait_healthy(HANG_S)
    finally:
        for k, v in old.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
    return spec, server


def complete_trace(path: Path) -> dict:
    with gzip.open(path) as f:
        return json.loads(f.read())
