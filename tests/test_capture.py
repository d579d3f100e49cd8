"""`profkit trace` / `profkit sweep` against the real proxy server process over HTTP, and the faults:
a server that fails to start, a busy port, a server killed mid-run, SIGINT/SIGTERM to profkit.
Every case checks the exit code, the kept manifest and that no server process is left behind."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from processes import processes

pytest.importorskip("torch")

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


def test_trace_alternates_the_sides_on_the_proxy(tmp_path):
    """Issue 30: on the proxy the baseline's and the candidate's servers run side by side and their unprofiled
    repeats and profile windows alternate (A B A B), so load drift lands on both; the manifests and the
    report say so. Order read from what the runs wrote: each window's trace file, in time."""
    p = profkit(tmp_path, "trace", "--opt", "topk_v2", *SMALL, "--repeat", "2", "--profile-windows", "2")
    out, err = p.communicate(timeout=600)
    assert p.returncode == 0, err
    ms = manifests(tmp_path)
    assert [m["status"] for m in ms] == ["ok", "ok"] and {m["capture_order"] for m in ms} == {"alternating"}
    runs = {m["optimizations"]["topk_v2"]: tmp_path / "traces" / m["run_id"] for m in ms}
    files = [(f.stat().st_mtime_ns, side, w) for side, run in runs.items() for w in (0, 1) for f in (run / f"window-{w}").glob("*.json.gz")]
    assert [(side, w) for _, side, w in sorted(files)] == [(False, 0), (True, 0), (False, 1), (True, 1)]
    # the two repeats of each side alternate too: the candidate's first one ended before the baseline's second began
    reps = {side: m["throughput"][0]["repeats"] for side, m in ((m["optimizations"]["topk_v2"], m) for m in ms)}
    assert len(reps[False]) == len(reps[True]) == 2
    group = next(d for d in (tmp_path / "reports").iterdir() if (d / "report.md").exists())
    assert "alternating (A B A B)" in (group / "report.md").read_text()


def test_trace_end_to_end(tmp_path):
    port = free_port()
    p = profkit(tmp_path, "trace", "--opt", "topk_v2", *SMALL, port=port)
    out, err = p.communicate(timeout=400)
    assert p.returncode == 0, err
    ms = manifests(tmp_path)
    assert [m["status"] for m in ms] == ["ok", "ok"]
    assert [m["optimizations"]["topk_v2"] for m in ms] == [False, True]  # baseline, then candidate
    for m in ms:
        assert m["trace_files"] and m["throughput"][0]["tokens_per_s"]["median"] > 0
        assert m["leftover_pids"] == []
        assert m["throughput"][0]["cache_hit_rate"]["median"] > 0.5
        # one unmeasured pass of the point's own shape before its repeats (its wall time kept beside them)
        assert m["throughput"][0]["warmup"]["duration_s"] > 0 and m["throughput"][0]["warmup"]["tokens_per_s"] > 0
        run = tmp_path / "traces" / m["run_id"]
        assert (run / "server.log").exists()
        assert (run / m["trace_files"][0]).stat().st_size > 0
    group = next(d for d in (tmp_path / "reports").iterdir() if (d / "diff.json").exists())
    diff = json.loads((group / "diff.json").read_text())
    assert diff["decomposition"]["residual_us"] == 0
    before = json.loads((group / "before.json").read_text())
    r = before["ranks"][0]
    assert r["marker"] == r"^scheduler\.run_batch$" and len(r["iterations"]) >= 3
    assert before["run"]["optimizations"]["topk_v2"] is False
    assert_no_leftovers(port)
    # profkit diff reproduces the attribution from the two runs' report folders (every profile window's summary:
    # the decomposition is the median over the windows, issue 30)
    rb, rc = (tmp_path / "reports" / m["run_id"] for m in ms)
    d = subprocess.run([sys.executable, "-m", "profkit", "diff", str(rb), str(rc), "--opt", "topk_v2",
                        "--json", str(tmp_path / "again.json")], capture_output=True, text=True)
    if "No such command" not in d.stderr:
        assert d.returncode == 0, d.stderr
        again = json.loads((tmp_path / "again.json").read_text())
        assert again["decomposition"] == diff["decomposition"]
        assert again["throughput"] == diff["throughput"] and diff["throughput"]["baseline"]["tokens_per_s"]["median"] > 0


def test_sweep_three_optimizations(tmp_path):
    port = free_port()
    p = profkit(tmp_path, "sweep", "--opts", "topk_v2,indexer_fusion,moe_deferred_finalize", *SMALL[:8], "--num-steps", "5", "--no-warmup", port=port)
    out, err = p.communicate(timeout=600)
    assert p.returncode == 0, err
    doc = json.loads(next((tmp_path / "reports").glob("*sweep*/sweep.json")).read_text())
    assert doc["status"] == "ok"
    assert [r["label"] for r in doc["runs"]] == ["baseline", "+topk_v2", "+indexer_fusion", "+moe_deferred_finalize", "all"]
    assert [a["optimization"] for a in doc["attribution"]] == ["topk_v2", "indexer_fusion", "moe_deferred_finalize", None]
    for a in doc["attribution"]:
        assert a["decomposition"]["residual_us"] == 0
    assert set(doc["pareto"]) == {r["label"] for r in doc["runs"]}
    assert "attribution" in out
    # --no-warmup: the repeats are measured from the first pass, and no run's point says it was warmed
    assert all("warmup" not in m["throughput"][0] for m in manifests(tmp_path))
    assert_no_leftovers(port)


def test_server_that_fails_to_start(tmp_path):
    p = profkit(tmp_path, "trace", "--opt", "topk_v2", "--extra-server-args", "--no-such-flag 1", *SMALL)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 4
    assert "exited before it became healthy" in err
    assert "--no-such-flag" in err  # the log's tail is shown
    (m,) = manifests(tmp_path)
    assert (m["status"], m["stage"]) == ("failed", "server_start")
    assert "Traceback" not in err.split("last lines of")[0]


def test_busy_port(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        p = profkit(tmp_path, "trace", "--opt", "topk_v2", *SMALL, port=port)
        out, err = p.communicate(timeout=60)
    assert p.returncode == 4
    assert "already in use" in err
    (m,) = manifests(tmp_path)
    assert m["status"] == "failed"


def test_server_killed_mid_run(tmp_path):
    port = free_port()
    p = profkit(tmp_path, "trace", "--opt", "topk_v2", *SMALL[:6], "--turns", "40", "--no-warmup", port=port)
    m = wait_stage(tmp_path, "workload", p)
    os.kill(m["server_pid"], signal.SIGKILL)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 4, err
    assert "died" in err or "failed" in err
    (m,) = manifests(tmp_path)
    assert m["status"] == "failed" and m["stage"] == "workload"
    assert_no_leftovers(port)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_interrupt_keeps_manifest_and_stops_server(tmp_path, sig):
    port = free_port()
    p = profkit(tmp_path, "trace", "--opt", "topk_v2", *SMALL[:6], "--turns", "40", "--no-warmup", port=port)
    wait_stage(tmp_path, "workload", p)
    p.send_signal(sig)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 130, err
    (m,) = manifests(tmp_path)
    assert m["status"] == "interrupted"
    assert "workload" in m["error"]
    assert_no_leftovers(port)
