"""The proxy engine with --tp 2 (CPU, gloo) as a real server process: two scheduler processes in
lockstep, the same tokens as one rank, streaming, one trace per rank that profkit's cross-rank
analysis aligns (equal collective counts; a rank slowed on purpose is the straggler), and no
process left behind after SIGTERM or when the server is killed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from factories import http as _http
from processes import free_port, HANG_S, gone, wait_until

from support import ROOT

torch = pytest.importorskip("torch")
psutil = pytest.importorskip("psutil")

from profkit.workloads.driver import _generate  # noqa: E402

PAGE = 16
LAYERS, STEPS = 2, 5  # CPU defaults: 2 layers, 5 speculative steps
# per all-reduce on rank 1: 100 ms, ten times a CFS time slice on a loaded host, so no load makes
# rank 0 the later one (it was 10 ms, which a busy 2-core host's scheduling delays can exceed)
DELAY_S = 0.1
# all-reduces per forward: one after attention, one after the MoE of every layer (MTP layer too)
PER_ITERATION = {"extend": 2 * LAYERS + 2, "verify": 2 * (STEPS - 1) + 2 * LAYERS + 2}


class Server:
    def __init__(self, tmp: Path, env_extra: dict | None = None, tp: int = 2, device="cpu"):
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log = tmp / f"server-{self.port}.log"
        self.fh = open(self.log, "w")
        env = {k: v for k, v in os.environ.items() if k != "PROFKIT_PROXY_RANK_DELAY"}
        env.update({"PYTHONPATH": str(ROOT), **(env_extra or {})})
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "profkit.proxy.server", "--tp", str(tp), "--port", str(self.port),
             "--device", device], cwd=ROOT, stdout=self.fh, stderr=subprocess.STDOUT,
            start_new_session=True, env=env)

    def wait_healthy(self):
        def healthy() -> bool:
            try:
                return _http(self.base + "/health", timeout=2)[0] == 200
            except OSError:
                return False

        try:
            wait_until(healthy, "the server's /health", proc=self.proc)
        except AssertionError as e:
            self.kill()
            pytest.fail(f"{e}:\n{self.log.read_text()[-4000:]}")
        return self

    def tree(self) -> list[psutil.Process]:
        try:
            p = psutil.Process(self.proc.pid)
            return [p] + p.children(recursive=True)
        except psutil.NoSuchProcess:
            return []

    def kill(self):
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait()
        self.fh.close()


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    """Two TP=2 servers, the second with rank 1 delayed; both killed at the end, whatever failed."""
    tmp = tmp_path_factory.mktemp("tp")
    a = Server(tmp)
    b = Server(tmp, {"PROFKIT_PROXY_RANK_DELAY": f"1:{DELAY_S}"})
    try:
        yield a.wait_healthy(), b.wait_healthy()
    finally:
        a.kill()
        b.kill()


@pytest.fixture(scope="module")
def tp1_reference():
    """The same requests through one rank, in this process (no HTTP)."""
    from profkit.proxy import config as C
    from profkit.proxy.scheduler import Req, Scheduler
    from profkit.proxy.server import build_parser

    cfg = C.config_from_args(build_parser().parse_args(["--device", "cpu"]), False)
    torch.set_num_threads(1)
    sched = Scheduler(cfg)
    sched.start()

    def run(ids, n):
        r = Req(ids, n)
        sched.submit(r)
        assert r.finished.wait(HANG_S) and not r.error
        return r.output_ids

    yield run
    sched.shutdown()


def test_two_turns_streamed_match_one_rank(servers, tp1_reference):
    srv, _ = servers
    prompt1 = [(7 * i + 3) % 1000 for i in range(150)]
    out1, m1, ttft1 = _generate(srv.base, prompt1, 24, HANG_S)
    assert len(out1) == 24 and m1["completion_tokens"] == 24 and m1["prompt_tokens"] == 150
    assert ttft1 is not None and 0 < ttft1 < m1["e2e_latency"] + 1
    assert m1["spec_verify_ct"] >= 1 and m1["finish_reason"]["type"] == "length"
    prompt2 = prompt1 + out1 + [11, 12, 13, 14, 15]
    out2, m2, _ = _generate(srv.base, prompt2, 16, HANG_S)
    assert len(out2) == 16
    assert m2["cached_tokens"] >= ((len(prompt1) + len(out1) - 1) // PAGE) * PAGE  # prefix reuse
    # greedy, fp32, same seed: TP=2 gives TP=1's tokens
    assert out1 == tp1_reference(prompt1, 24)
    assert out2 == tp1_reference(prompt2, 16)


def test_stream_format(servers):
    srv, _ = servers
    import json

    req = urllib.request.Request(srv.base + "/generate", data=json.dumps({
        "input_ids": list(range(1, 40)), "sampling_params": {"max_new_tokens": 10},
        "stream": True}).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=HANG_S) as r:
        assert r.headers["Content-Type"].startswith("text/event-stream")
        raw = r.read().decode()
    events = [e for e in raw.split("\n\n") if e]
    assert all(e.startswith("data: ") for e in events) and events[-1] == "data: [DONE]"
    chunks = [json.loads(e[6:]) for e in events[:-1]]
    steps, final = chunks[:-1], chunks[-1]
    assert len(steps) >= 2 and all(c["output_ids"] for c in steps)
    done = 0
    for c in steps:  # incremental ids, completion_tokens so far
        done += len(c["output_ids"])
        assert c["meta_info"]["completion_tokens"] == done
    assert done == 10 and final["output_ids"] == []
    fm = final["meta_info"]
    assert fm["completion_tokens"] == 10 and fm["prompt_tokens"] == 39
    for k in ("cached_tokens", "spec_verify_ct", "e2e_latency", "finish_reason"):
        assert k in fm


STEPS_PROFILED = 5


def _profile(srv: Server, out: Path, pid: str, steps: int = STEPS_PROFILED) -> list[Path]:
    """A profile window over the first `steps` iterations of two clients' requests (not
    streamed: fewer HTTP wake-ups on rank 0 while it is measured)."""
    errors = []

    def client(seed):
        code, text = _http(srv.base + "/generate", {"input_ids": [(seed * 31 + i) % 1000
                                                                   for i in range(40)],
                                                     "sampling_params": {"max_new_tokens": 32}},
                           timeout=HANG_S)
        if code != 200:  # pragma: no cover
            errors.append(text)

    code, text = _http(srv.base + "/start_profile", {
        "output_dir": str(out), "num_steps": steps, "profile_id": pid, "with_stack": False,
        "record_shapes": False})
    assert code == 200, text
    threads = [threading.Thread(target=client, args=(s,)) for s in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(HANG_S)
    assert not errors
    files = [out / f"{pid}-TP-{r}.trace.json.gz" for r in (0, 1)]
    wait_until(lambda: all(f.exists() for f in files), f"the trace files in {out}", proc=srv.proc)
    assert sorted(p.name for p in out.iterdir()) == [f.name for f in files]  # no temp files left
    return files


def _cross(files):
    pytest.importorskip("polars")  # the GPU box records without the analysis packages
    from profkit.analysis import analyze_trace
    from profkit.analysis.ranks import cross_rank
    from profkit.analysis.catalog import load_catalog
    from profkit.ingest import load_traces

    cat = load_catalog("proxy")
    analyses = [analyze_trace(t, catalog=cat) for t in load_traces(files)]
    return analyses, cross_rank(analyses)


@pytest.fixture(scope="module")
def plain_profile(servers, tmp_path_factory):
    return _cross(_profile(servers[0], tmp_path_factory.mktemp("plain"), "tp"))


@pytest.fixture(scope="module")
def slow_profile(servers, tmp_path_factory):
    return _cross(_profile(servers[1], tmp_path_factory.mktemp("slow"), "slow"))


def test_profile_window_two_ranks_aligned(plain_profile):
    analyses, x = plain_profile
    n = STEPS_PROFILED
    assert [a.rank for a in analyses] == [0, 1]
    assert all(a.device_timeline == "cpu" for a in analyses)
    assert analyses[0].iterations.height == analyses[1].iterations.height == n
    assert x["aligned_iterations"] == n and x["warnings"] == []
    # decode steps (verify) in the window; not necessarily last: on a loaded host the second client's request can
    # arrive after the first's decode began, and its extend step then ends the 5-step window (a CI run, 2026-12-07)
    assert "verify" in [it["kind"] for it in x["iterations"]]
    for it in x["iterations"]:
        assert it["collectives"]["0"] == it["collectives"]["1"] == PER_ITERATION[it["kind"]], it
    for a in analyses:  # the all-reduce is one comm op, whichever range (attention / moe) holds it
        comm = a.ops.filter(a.ops["category"] == "comm")
        assert set(comm["name"].to_list()) == {"proxy::all_reduce"}
        assert set(comm["annotation"].to_list()) <= {"proxy.attention", "proxy.moe"}


def test_delayed_rank_is_the_straggler(plain_profile, slow_profile):
    _, x0 = plain_profile
    _, x1 = slow_profile
    assert x1["warnings"] == []
    its = x1["iterations"]
    assert all(it["straggler_rank"] == 1 for it in its), [it["comm_wait_us"] for it in its]
    s = {r["rank"]: r for r in x1["stragglers"]}
    assert s[1]["times_straggler"] == len(its) and s[0]["times_straggler"] == 0

    def wait_per_collective(x, rank):  # µs rank `rank` waited per all-reduce
        return (sum(it["comm_wait_us"][str(rank)] for it in x["iterations"])
                / sum(it["collectives"][str(rank)] for it in x["iterations"]))

    # the delay shows up as waiting on the other rank: rank 0 waits longer per all-reduce than the
    # delayed rank 1, and longer than it did without the delay (no bound on how long: that is speed)
    assert wait_per_collective(x1, 0) > wait_per_collective(x1, 1)
    assert wait_per_collective(x1, 0) > wait_per_collective(x0, 0)


def test_sigterm_stops_every_rank(servers):
    srv, _ = servers
    tree = srv.tree()
    assert len(tree) == 2  # the server (rank 0) and rank 1
    srv.proc.send_signal(signal.SIGTERM)
    srv.proc.wait(HANG_S)
    assert gone(tree) == []  # no orphans; how fast is a benchmark's business
    assert srv.proc.returncode == 0, srv.log.read_text()[-3000:]


def test_killed_server_takes_its_ranks_along(servers):
    _, srv = servers
    tree = srv.tree()
    assert len(tree) == 2
    os.kill(srv.proc.pid, signal.SIGKILL)  # the server only: rank 1 must notice by itself
    srv.proc.wait(HANG_S)
    assert gone(tree) == []


@pytest.mark.gpu
def test_tp2_on_two_gpus_nccl(tmp_path):
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two CUDA GPUs")
    import gzip
    import json

    srv = Server(tmp_path, device="cuda").wait_healthy()
    try:
        out, _, _ = _generate(srv.base, list(range(1, 200)), 32, HANG_S)
        assert len(out) == 32
        files = _profile(srv, tmp_path / "p", "g", steps=8)
        nccl = []
        for f in files:  # without polars: count the NCCL kernels of each rank's window
            ev = json.load(gzip.open(f))["traceEvents"]
            names = [e["name"] for e in ev if e.get("ph") == "X" and e.get("cat") == "kernel"]
            nccl.append(sum("nccl" in n.lower() for n in names))
            assert sum(e.get("name") == "scheduler.run_batch" for e in ev
                       if e.get("cat") == "user_annotation") == 8
        assert nccl[0] == nccl[1] > 0, nccl
        try:
            analyses, x = _cross(files)
        except pytest.skip.Exception:
            analyses = None
        if analyses is not None:
            assert x["aligned_iterations"] == 8
            for it in x["iterations"]:
                assert it["collectives"]["0"] == it["collectives"]["1"] > 0
        tree = srv.tree()
        srv.proc.send_signal(signal.SIGTERM)
        srv.proc.wait(HANG_S)
        assert gone(tree) == []
    finally:
        srv.kill()
