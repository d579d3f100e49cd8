"""`profkit trace` / `profkit sweep` against the real proxy server process over HTTP, and the faults:
a server that fails to start, a busy port, a server killed mid-run, SIGINT/SIGTERM to profkit.
Every case checks the exit code, the kept manifest and that no server process is left behind."""

from __future__ import annotations

import json
import re
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from processes import HANG_S, SMALL, assert_no_leftovers, free_port, manifests, profkit, wait_stage

pytest.importorskip("torch")


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
    out, err = p.communicate(timeout=HANG_S)
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
        # each profile window's accepted length, from the server's own counts (the proxy simulates 3.0 per verify
        # round; a request's last round is cut to its remaining tokens, so a little less)
        for w in m["profiler_overhead"].get("windows") or [m["profiler_overhead"]]:
            acc = w["accept"]
            assert acc["spec_verify_ct"] > 0 and acc["requests"] >= 1, acc
            assert 2.5 < acc["accept_length"] <= 3.0 and acc["accept_length"] < acc["server_accept_length"], acc
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
    out, err = p.communicate(timeout=HANG_S)
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
    out, err = p.communicate(timeout=HANG_S)
    assert p.returncode == 4
    assert "exited before it became healthy" in err
    assert "--no-such-flag" in err  # the log's tail is shown
    (m,) = manifests(tmp_path)
    assert (m["status"], m["stage"]) == ("failed", "server_start")
    assert "Traceback" not in err.split("last lines of")[0]


def test_free_ports_lie_below_the_ephemeral_range_and_never_repeat():
    """The ports profkit (and the tests) give servers: not from the range every outgoing connection takes
    its local port from (a busy run lost one to a client between the pick and the server's bind), free when
    picked, and never the same twice in a process (two sides' servers may both not have bound yet)."""
    from profkit.http import PORT_FLOOR

    rng = Path("/proc/sys/net/ipv4/ip_local_port_range")
    if not rng.exists():
        pytest.skip("no /proc/sys/net/ipv4/ip_local_port_range (not Linux)")
    low = int(rng.read_text().split()[0])
    ports = [free_port() for _ in range(300)]
    assert len(set(ports)) == len(ports)
    assert all(PORT_FLOOR <= p < low for p in ports), (low, sorted(ports)[:3], sorted(ports)[-3:])
    with socket.socket() as s:  # free: a server can bind it
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", ports[-1]))


def test_busy_port(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        p = profkit(tmp_path, "trace", "--opt", "topk_v2", *SMALL, port=port)
        out, err = p.communicate(timeout=HANG_S)
    assert p.returncode == 4
    assert "already in use" in err
    (m,) = manifests(tmp_path)
    assert m["status"] == "failed"


def test_server_killed_mid_run(tmp_path):
    port = free_port()
    p = profkit(tmp_path, "trace", "--opt", "topk_v2", *SMALL[:6], "--turns", "40", "--no-warmup", port=port)
    m = wait_stage(tmp_path, "workload", p)
    os.kill(m["server_pid"], signal.SIGKILL)
    out, err = p.communicate(timeout=HANG_S)
    assert p.returncode == 4, err
    assert "died" in err or "failed" in err
    (m,) = manifests(tmp_path)
    assert m["status"] == "failed" and m["stage"] == "workload"
    assert_no_leftovers(port)


def test_server_killed_then_ctrl_c(tmp_path):
    """The server dies and a Ctrl-C follows at once, landing while profkit records the failure or stops
    what is left: either way the run's manifest is finished (failed, or interrupted) and names how the
    server ended; nothing is left running."""
    port = free_port()
    p = profkit(tmp_path, "trace", "--opt", "topk_v2", *SMALL[:6], "--turns", "40", "--no-warmup", port=port)
    m = wait_stage(tmp_path, "workload", p)
    os.kill(m["server_pid"], signal.SIGKILL)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=HANG_S)
    assert p.returncode in (4, 130), err
    (m,) = manifests(tmp_path)
    assert m["status"] in ("failed", "interrupted") and m["stage"] == "workload", m
    assert m["server_exit"]["pid"] == m["server_pid"], m
    assert_no_leftovers(port)


# a server that streams one chunk, closes the connection, and exits 1 s later: the order a killed server's
# end is seen in on a loaded host (its sockets close before the kernel makes it a zombie that poll() sees)
_DYING = r"""
import http.server, os, socket, sys, time
class H(http.server.BaseHTTPRequestHandler):
    def log_message(self, *a): pass
    def do_GET(self):
        self.send_response(200); self.send_header("Content-Length", "0"); self.end_headers()
    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200); self.send_header("Content-Type", "text/event-stream"); self.end_headers()
        self.wfile.write(b'data: {"output_ids": [1], "meta_info": {}}\n\n'); self.wfile.flush()
        self.connection.shutdown(socket.SHUT_RDWR); self.connection.close()
        time.sleep(1.0)
        os._exit(3)
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


def test_a_stream_cut_by_a_dying_server_says_it_died(tmp_path):
    """The workload's stream breaks before the server is seen exiting: profkit waits for the exit (the
    moment it comes) and says the server died, with its exit code, not that it 'stopped answering'."""
    from profkit.capture.run import _check_transport
    from profkit.capture.server import Server
    from profkit.errors import TargetError
    from profkit.targets.spec import LaunchSpec
    from profkit.workloads.agentic import Workload
    from profkit.workloads.driver import drive

    port = free_port()
    spec = LaunchSpec(target="proxy", argv=[sys.executable, "-c", _DYING, str(port)], env={}, host="127.0.0.1", port=port,
                      world_size=1, teardown_s=5)
    server = Server(spec, tmp_path / "server.log")
    try:
        server.start()
        server.wait_healthy(HANG_S)
        res = drive(spec.base_url, Workload(isl=4, turns=1, turn_tokens=0, output_tokens=8), concurrency=1, timeout_s=HANG_S)
        assert res.errors or res.failed, res
        with pytest.raises(TargetError) as e:
            _check_transport(res, server, "workload")
        assert "died during the workload (exit code 3)" in str(e.value), e.value
    finally:
        server.stop()
    assert_no_leftovers(port)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP], ids=["SIGINT", "SIGTERM", "SIGHUP"])  # SIGHUP: the terminal closed
def test_interrupt_keeps_manifest_and_stops_server(tmp_path, sig):
    port = free_port()
    p = profkit(tmp_path, "trace", "--opt", "topk_v2", *SMALL[:6], "--turns", "40", "--no-warmup", port=port)
    wait_stage(tmp_path, "workload", p)
    p.send_signal(sig)
    out, err = p.communicate(timeout=HANG_S)
    assert p.returncode == 130, err
    (m,) = manifests(tmp_path)
    assert m["status"] == "interrupted"
    assert "workload" in m["error"]
    assert_no_leftovers(port)


def test_progress_as_it_happens_and_every_folder_readable(tmp_path):
    """Piped (not a TTY, as under `| tee`): one line per step, each arriving while the run goes on,
    naming the run, the repeat and the profile window; the "done" lines carry whole paths. Then every
    folder the run wrote reads back: analyze (each window, or --window i), report, export-perfetto."""
    port = free_port()
    p = profkit(tmp_path, "trace", "--opt", "topk_v2", *SMALL, "--profile-windows", "2", "--repeat", "2", port=port)
    early: list[str] = []
    for line in p.stderr:  # lines as they come: the process is still running when the first window's line arrives
        early.append(line.rstrip("\n"))
        if "run 2/2" in line and "profile window 1/2" in line:
            assert p.poll() is None
            break
    rest_out, rest_err = p.communicate(timeout=400)
    assert p.returncode == 0, rest_err
    lines = early + rest_err.splitlines()
    for want in ("run 1/2 baseline: workload isl=64 concurrency=1 repeat 2/2", "run 1/2 baseline: profile window 2/2 of 6 iterations",
                 "run 1/2 baseline: analyzing profile window 2/2", "run 2/2 candidate (topk_v2): profile window 1/2"):
        assert any(want in x for x in lines), (want, lines)
    assert all(re.match(r"\[\d+:\d\d:\d\d\] ", x) for x in lines if x.startswith("[") and "run " in x)
    done = [x for x in lines if ": done; traces " in x]
    assert len(done) == 2
    for x in done:  # the paths whole, and there
        trace_dir, summary = re.search(r"traces (\S+), summary (\S+)$", x).groups()
        assert (tmp_path / trace_dir / "manifest.json").is_file() and (tmp_path / summary).is_file()
    run = tmp_path / re.search(r"traces (\S+),", done[0]).group(1)
    assert sorted(d.name for d in run.iterdir() if d.is_dir() and d.name.startswith("window-")) == ["window-0", "window-1"]

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "profkit", *args], capture_output=True, text=True, cwd=tmp_path,
                              env={**os.environ, "COLUMNS": "80"})

    a = cli("analyze", str(run))
    assert a.returncode == 0, a.stderr
    assert "── 1 of 2: " in a.stdout and "── 2 of 2: " in a.stdout and "window-1" in a.stdout
    assert "skipped manifest.json, server.log (not traces)" in a.stderr
    one = cli("analyze", str(run), "--window", "1")
    assert one.returncode == 0 and "── " not in one.stdout and "window-1" in one.stdout
    bad = cli("analyze", str(run), "--window", "7")
    assert bad.returncode == 3 and "no profile window 7 (it has window-0/, window-1/)" in bad.stderr
    stored = cli("analyze", str(tmp_path / summary_dir(done[0])))  # reports/<run>/: the stored summaries of each window
    assert stored.returncode == 0 and "stored summary" in stored.stdout
    group = next(d for d in (tmp_path / "reports").iterdir() if (d / "diff.json").exists())
    for args in (("report", str(run), "--window", "1", "-o", "w1.html"), ("report", str(group), "-o", "g.html")):
        r = cli(*args)
        assert r.returncode == 0, r.stderr
    e = cli("export-perfetto", str(run), "-o", "x.perfetto-trace")
    assert e.returncode == 0, e.stderr
    assert (tmp_path / "x.window-0.perfetto-trace").stat().st_size > 0 and (tmp_path / "x.window-1.perfetto-trace").stat().st_size > 0
    assert_no_leftovers(port)


def summary_dir(done_line: str) -> str:
    return str(Path(re.search(r"summary (\S+)$", done_line).group(1)).parent)
