"""The proxy engine as a real server process over real HTTP (CPU)."""

import gzip
import json
import os
import signal
import subprocess
import sys
import threading

import pytest

from factories import http as _http
from processes import free_port, HANG_S, wait_until

pytest.importorskip("torch")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGE = 16


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    port = free_port()
    log = tmp_path_factory.mktemp("proxy") / "server.log"
    fh = open(log, "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "profkit.proxy.server", "--port", str(port), "--device", "cpu"],
        cwd=ROOT, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True,
        env={**os.environ, "PYTHONPATH": ROOT})
    base = f"http://127.0.0.1:{port}"

    def healthy() -> bool:
        try:
            return _http(base + "/health", timeout=2)[0] == 200
        except OSError:
            return False

    try:
        try:
            wait_until(healthy, "the server's /health", proc=proc)
        except AssertionError as e:
            pytest.fail(f"{e}:\n{log.read_text()}")
        yield base, proc, log
    finally:  # killed whatever failed
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        fh.close()


def _generate(base, ids, n):
    code, text = _http(base + "/generate", {"input_ids": ids, "sampling_params": {
        "max_new_tokens": n, "ignore_eos": True}, "unknown_key": 1})
    assert code == 200, text
    return json.loads(text)


def test_server_info(server):
    base, _, log = server
    code, text = _http(base + "/get_server_info")
    assert code == 200
    info = json.loads(text)
    assert info["switches"]["cuda_graph"] == "n/a on cpu"
    assert info["switches"]["topk_v2"] == "on" and info["device"] == "cpu"
    assert "avg_spec_accept_length" in info["internal_states"][0]
    assert json.loads(_http(base + "/server_info")[1])["torch_version"]
    assert "The server is fired up and ready to roll!" in log.read_text()
    assert "not applicable" in log.read_text()


def test_bad_requests(server):
    base, _, _ = server
    assert _http(base + "/generate", {"text": "hi"})[0] == 400
    assert _http(base + "/generate", {"input_ids": [1, 10 ** 9]})[0] == 400
    code, text = _http(base + "/stop_profile", {})
    assert code == 500 and "not in progress" in text


def test_two_turn_conversation_reuses_prefix(server):
    base, _, _ = server
    prompt1 = [(7 * i + 3) % 1000 for i in range(150)]
    r1 = _generate(base, prompt1, 24)
    out1 = r1["output_ids"]
    m1 = r1["meta_info"]
    assert len(out1) == 24 and m1["completion_tokens"] == 24 and m1["prompt_tokens"] == 150
    assert m1["spec_verify_ct"] >= 1 and m1["e2e_latency"] > 0
    prompt2 = prompt1 + out1 + [11, 12, 13, 14, 15]
    m2 = _generate(base, prompt2, 16)["meta_info"]
    assert m2["cached_tokens"] >= (len(prompt1) // PAGE) * PAGE
    assert m2["cached_tokens"] >= ((len(prompt1) + len(out1) - 1) // PAGE) * PAGE


def test_profile_while_serving(server, tmp_path):
    base, _, _ = server
    results = []

    def client(seed):
        ids = [(seed * 31 + i) % 1000 for i in range(40)]
        results.append(_generate(base, ids, 64))

    threads = [threading.Thread(target=client, args=(s,)) for s in range(3)]
    for t in threads:
        t.start()
    code, text = _http(base + "/start_profile", {
        "output_dir": str(tmp_path), "num_steps": 5, "activities": ["CPU", "GPU"],
        "with_stack": False, "record_shapes": False, "profile_id": "t"})
    assert code == 200 and text == "Start profiling.\n"
    assert _http(base + "/start_profile", {"output_dir": str(tmp_path)})[0] == 500
    path = tmp_path / "t-TP-0.trace.json.gz"
    wait_until(path.exists, f"{path}", proc=server[1])
    for t in threads:
        t.join(HANG_S)
    assert len(results) == 3
    assert path.exists(), os.listdir(tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == ["t-TP-0.trace.json.gz"]
    trace = json.load(gzip.open(path))
    names = [e["name"] for e in trace["traceEvents"]
             if e.get("ph") == "X" and e.get("cat") == "user_annotation"]
    assert names.count("scheduler.run_batch") == 5
    assert any(n.startswith("step[") for n in names)


def test_manual_profile_stop(server, tmp_path):
    base, _, _ = server
    code, _ = _http(base + "/start_profile", {"output_dir": str(tmp_path), "profile_id": "m",
                                              "with_stack": False, "record_shapes": False})
    assert code == 200
    _generate(base, list(range(20)), 8)
    code, text = _http(base + "/stop_profile", {})
    assert code == 200, text
    assert (tmp_path / "m-TP-0.trace.json.gz").exists()


def test_sigterm_exits(server):
    _, proc, log = server
    proc.send_signal(signal.SIGTERM)
    proc.wait(HANG_S)  # it exits (how soon is a benchmark's business)
    assert proc.returncode == 0, log.read_text()[-2000:]
    with pytest.raises(ProcessLookupError):
        os.kill(proc.pid, 0)
