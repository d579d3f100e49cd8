"""Test helpers for tests that run profkit and servers as processes: the live processes whose command line
matches (what a test checks is left behind), profkit started as a process, its manifests."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import psutil


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


SMALL = ["--isl", "64", "--turns", "3", "--turn-tokens", "16", "--output-tokens", "24", "--num-steps", "6"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def servers_on(port: int) -> list[psutil.Process]:
    return processes(lambda cmd: "profkit.proxy.server" in cmd and str(port) in cmd)


def profkit(tmp: Path, *args: str, port: int | None = None, **kw) -> subprocess.Popen:
    argv = [sys.executable, "-m", "profkit", *args, "--traces-dir", str(tmp / "traces"), "--reports-dir", str(tmp / "reports")]
    if port:
        argv += ["--port", str(port)]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp, **kw)


def manifests(tmp: Path) -> list[dict]:
    return sorted((json.loads(p.read_text()) for p in (tmp / "traces").glob("*/manifest.json")), key=lambda m: m["started_at"] + m["run_id"])


def wait_stage(tmp: Path, stage: str, proc: subprocess.Popen, timeout: float = 120) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for m in manifests(tmp):
            if m["stage"] == stage:
                return m
        if proc.poll() is not None:
            raise AssertionError(f"profkit exited early: {proc.communicate()}")
        time.sleep(0.1)
    raise AssertionError(f"never reached stage {stage}")


def assert_no_leftovers(port: int) -> None:
    deadline = time.monotonic() + 10
    while servers_on(port) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert servers_on(port) == []
