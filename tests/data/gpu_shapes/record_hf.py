"""Record Hugging Face transformers' own generate() decode of a small random Llama with shapes (issue 41).

    python3 tests/data/gpu_shapes/record_hf.py --out DIR [--batches 1,8] [--new-tokens 6]     # on the GPU machine

For each batch size: a LlamaForCausalLM built from CONFIG below (random weights, HF's own init, seed
0; nothing downloaded), bf16 on cuda:0, greedy generate() of --new-tokens tokens after a prompt of
PROMPT random token ids per sequence (all the same length: no padding). One unprofiled generate() of
the same shape first (cuBLAS handles, allocator), then one under torch.profiler (CPU + CUDA,
record_shapes=True, no stacks). Each forward call of the model is wrapped, through forward hooks, in
a `record_function` span: `prefill` for the first (the prompt), `decode_step` for each later one
(one new token per sequence). Writes DIR/hf_llama12_bs<B>.pt.trace.json.gz and DIR/hf_llama12.meta.json
(the config, the linear layers' parameter bytes from the config and from the module's own tensors,
versions, device). torch and transformers only; nothing of profkit.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch

CONFIG = dict(vocab_size=32000, hidden_size=2048, intermediate_size=5632, num_hidden_layers=12, num_attention_heads=16,
              num_key_value_heads=4, max_position_embeddings=2048, tie_word_embeddings=False, rms_norm_eps=1e-5,
              attention_bias=False, mlp_bias=False)
PROMPT = 32


def linear_params_from_config(c: dict) -> dict:
    """Weights of every nn.Linear of LlamaForCausalLM, from the config alone: (in, out) per module."""
    h, i, hd = c["hidden_size"], c["intermediate_size"], c["hidden_size"] // c["num_attention_heads"]
    kv = c["num_key_value_heads"] * hd
    per_layer = {"q_proj": (h, h), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (h, h),
                 "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h)}
    params = c["num_hidden_layers"] * sum(a * b for a, b in per_layer.values()) + h * c["vocab_size"]
    return {"per_layer": per_layer, "lm_head": (h, c["vocab_size"]), "params": params, "bytes_bf16": 2 * params}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--new-tokens", type=int, default=6)
    ap.add_argument("--device", default="cuda:0", help="cpu: a dry run of the code paths (with --layers 1), nothing tests use")
    ap.add_argument("--layers", type=int, default=CONFIG["num_hidden_layers"])
    a = ap.parse_args()
    CONFIG["num_hidden_layers"] = a.layers
    os.makedirs(a.out, exist_ok=True)
    import transformers
    from torch.profiler import ProfilerActivity, profile, record_function
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(**CONFIG)
    t0 = time.time()
    with torch.device(a.device):
        model = LlamaForCausalLM(cfg)
    model = model.to(torch.bfloat16).eval()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    lin = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    measured = sum(p.numel() * p.element_size() for m in lin for p in m.parameters())
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    expect = linear_params_from_config(CONFIG)
    print(f"model built in {time.time() - t0:.1f}s: {len(lin)} nn.Linear, linear bytes {measured:,} (config: {expect['bytes_bf16']:,}),"
          f" all parameters {total:,} bytes", flush=True)
    assert measured == expect["bytes_bf16"], (measured, expect)

    sync = torch.cuda.synchronize if a.device.startswith("cuda") else (lambda: None)
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if a.device.startswith("cuda") else [])
    stack: list = []

    def pre(mod, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        rf = record_function("prefill" if ids is not None and ids.shape[1] > 1 else "decode_step")
        rf.__enter__()
        stack.append(rf)

    def post(mod, args, kwargs, out):
        stack.pop().__exit__(None, None, None)

    model.register_forward_pre_hook(pre, with_kwargs=True)
    model.register_forward_hook(post, with_kwargs=True)
    meta = {"config": CONFIG, "prompt_tokens": PROMPT, "new_tokens": a.new_tokens, "nn_linear_modules": len(lin),
            "linear_param_bytes_measured": measured, "linear_param_bytes_from_config": expect["bytes_bf16"],
            "all_param_bytes": total, "torch": torch.__version__, "transformers": transformers.__version__,
            "device": torch.cuda.get_device_name(0) if a.device.startswith("cuda") else a.device, "runs": {}}
    for b in [int(x) for x in a.batches.split(",")]:
        g = torch.Generator(device="cpu").manual_seed(b)
        ids = torch.randint(1, CONFIG["vocab_size"], (b, PROMPT), generator=g).to(a.device)
        mask = torch.ones_like(ids)
        kw = dict(max_new_tokens=a.new_tokens, min_new_tokens=a.new_tokens, do_sample=False, use_cache=True)
        with torch.no_grad():
            model.generate(ids, attention_mask=mask, **kw)  # warm-up, unprofiled
            sync()
            with profile(activities=acts, record_shapes=True) as prof:
                t = time.perf_counter()
                out = model.generate(ids, attention_mask=mask, **kw)
                sync()
                dt = time.perf_counter() - t
        path = os.path.join(a.out, f"hf_llama12_bs{b}.pt.trace.json.gz")
        prof.export_chrome_trace(path)
        meta["runs"][f"bs{b}"] = {"file": os.path.basename(path), "batch": b, "out_shape": list(out.shape), "profiled_generate_s": round(dt, 4)}
        print(f"bs={b}: generate {tuple(out.shape)} in {dt * 1e3:.1f} ms profiled -> {path} ({os.path.getsize(path):,} bytes)", flush=True)
    with open(os.path.join(a.out, "hf_llama12.meta.json"), "w") as f:
        json.dump(meta, f, indent=1)


if __name__ == "__main__":
    main()
