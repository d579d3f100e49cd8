"""End-to-end smoke check of the proxy server as a user would run it (stdlib client only).

    python -m profkit.proxy.smoke [--device cuda] [--out DIR] [-- extra server flags]

Starts `python -m profkit.proxy.server` on a free port, waits for /health, sends a 2-turn
conversation (turn 2 = turn-1 prompt + output + new tokens), profiles 5 run_batch steps while
requests run, checks the trace file, then SIGTERMs the server. Exit 0 when all checks pass.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request

from profkit.http import free_port


def _http(url, body=None, timeout=300):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method="GET" if body is None else "POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return r.status, r.read().decode()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m profkit.proxy.smoke")
    p.add_argument("--device", default="auto")
    p.add_argument("--out", default="/tmp/profkit-proxy-smoke")
    p.add_argument("--prompt-len", type=int, default=1000)
    p.add_argument("server_args", nargs="*")
    a = p.parse_args(argv)
    port = free_port()
    os.makedirs(a.out, exist_ok=True)
    log = open(os.path.join(a.out, "server.log"), "w")
    cmd = [sys.executable, "-m", "profkit.proxy.server", "--port", str(port), "--device",
           a.device] + a.server_args
    print("+", " ".join(cmd), flush=True)
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    ok = True
    try:
        t0 = time.time()
        while True:
            if proc.poll() is not None:
                print("server exited", proc.returncode)
                return 1
            try:
                if _http(base + "/health", timeout=2)[0] == 200:
                    break
            except OSError:
                pass
            time.sleep(0.5)
        print(f"healthy after {time.time() - t0:.1f}s")
        info = json.loads(_http(base + "/server_info")[1])
        print("device", info["device_name"], "switches", info["switches"])
        vocab = info["model"]["vocab_size"]
        p1 = [(7 * i + 3) % vocab for i in range(a.prompt_len)]
        r1 = json.loads(_http(base + "/generate", {"input_ids": p1, "sampling_params": {
            "max_new_tokens": 64, "ignore_eos": True}})[1])
        p2 = p1 + r1["output_ids"] + [1, 2, 3, 4, 5]
        r2 = json.loads(_http(base + "/generate", {"input_ids": p2, "sampling_params": {
            "max_new_tokens": 64}})[1])
        m1, m2 = r1["meta_info"], r2["meta_info"]
        print("turn1", {k: m1[k] for k in ("prompt_tokens", "completion_tokens", "cached_tokens",
                                           "spec_verify_ct", "e2e_latency") if k in m1})
        print("turn2", {k: m2[k] for k in ("prompt_tokens", "completion_tokens", "cached_tokens",
                                           "spec_verify_ct", "e2e_latency") if k in m2})
        ok &= m2["cached_tokens"] >= (len(p1) // 16) * 16
        res = []
        ths = [threading.Thread(target=lambda i=i: res.append(_http(base + "/generate", {
            "input_ids": p2 + [i], "sampling_params": {"max_new_tokens": 200}}))) for i in range(4)]
        for t in ths:
            t.start()
        time.sleep(0.5)
        pid = f"smoke{int(time.time())}"
        print(_http(base + "/start_profile", {"output_dir": a.out, "num_steps": 5,
                                              "profile_id": pid, "with_stack": False,
                                              "record_shapes": False})[1].strip())
        path = os.path.join(a.out, f"{pid}-TP-0.trace.json.gz")
        while not os.path.exists(path) and time.time() - t0 < 600:
            time.sleep(0.2)
        for t in ths:
            t.join()
        ev = json.load(gzip.open(path))["traceEvents"]
        names = [e["name"] for e in ev if e.get("cat") == "user_annotation"]
        n_rb = names.count("scheduler.run_batch")
        kern = sum(e.get("cat") == "kernel" for e in ev)
        print(f"trace {path}: {n_rb} run_batch, {kern} kernels, steps "
              f"{sorted(set(n for n in names if n.startswith('step[')))}")
        ok &= n_rb == 5
        info = json.loads(_http(base + "/server_info")[1])
        print("internal_states", info["internal_states"])
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
            print("server exited", proc.returncode, "after SIGTERM")
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            print("server killed (no exit within 20s of SIGTERM)")
            ok = False
    print("SMOKE", "OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
