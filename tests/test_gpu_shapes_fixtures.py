"""Issue 41's H200 fixtures recorded with shapes (tests/data/gpu_shapes/README.md) and the plain GEMM count over them.

`tests/plain_flops.py` (stdlib, no profkit code) counts GEMM FLOPs and bytes per iteration from the raw
`Input Dims` / `Input type`. Here its figures are checked against what the Hugging Face model must do,
computed from the model's config alone (not from the trace, not from the recorder): every decode step
of `generate()` runs each nn.Linear once on one new token per sequence, plus the rotary embedding's
one float32 bmm. The proxy fixtures (eager, and CUDA graphs with profiled captures) must give the same
width-independent GEMMs from the eager ops and from the captures.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent
DATA = HERE / "data" / "gpu_shapes"
PLAIN = HERE / "plain_flops.py"

# The model of tests/data/gpu_shapes/README.md (record_hf.py's CONFIG), written out again here.
HIDDEN, INTER, LAYERS, HEADS, KV_HEADS, VOCAB = 2048, 5632, 12, 16, 4, 32000
HEAD_DIM = HIDDEN // HEADS
BF16, FP32 = 2, 4
LINEARS = [(HIDDEN, HIDDEN), (HIDDEN, KV_HEADS * HEAD_DIM), (HIDDEN, KV_HEADS * HEAD_DIM), (HIDDEN, HIDDEN),  # q k v o (in, out)
           (HIDDEN, INTER), (HIDDEN, INTER), (INTER, HIDDEN)]  # gate up down
LM_HEAD = (HIDDEN, VOCAB)
LINEAR_PARAMS = LAYERS * sum(i * o for i, o in LINEARS) + LM_HEAD[0] * LM_HEAD[1]
LINEAR_PARAM_BYTES = 1_213_202_432  # the README's figure
PROMPT = 32


def plain(trace: Path, captures: Path | None = None) -> dict:
    cmd = [sys.executable, str(PLAIN), str(trace)] + (["--captures", str(captures)] if captures else [])
    return json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)


def gemm(m: int, k: int, n: int, size: int, batch: int = 1) -> tuple[int, int]:
    """(flops, bytes) of [batch, m, k] x [batch, k, n] -> [batch, m, n], every operand at `size` bytes."""
    return 2 * batch * m * n * k, batch * (m * k + k * n + m * n) * size


def expected_step(batch: int, tokens: int) -> tuple[int, int, int]:
    """(gemms, flops, bytes) of one forward of `tokens` new tokens per sequence: the linears on every token, lm_head on
    the last one only (generate() keeps one position's logits), the rotary embedding's float32 bmm
    [batch, head_dim/2, 1] x [batch, 1, tokens]."""
    parts = [gemm(batch * tokens, i, o, BF16) for i, o in LINEARS] * LAYERS
    parts.append(gemm(batch, LM_HEAD[0], LM_HEAD[1], BF16))
    parts.append(gemm(HEAD_DIM // 2, 1, tokens, FP32, batch=batch))
    return len(parts), sum(f for f, _ in parts), sum(b for _, b in parts)


def test_config_figures():
    assert LINEAR_PARAMS * BF16 == LINEAR_PARAM_BYTES
    meta = json.loads((DATA / "hf_llama12.meta.json").read_text())
    c = meta["config"]
    assert (c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"], c["num_attention_heads"], c["num_key_value_heads"],
            c["vocab_size"], c["tie_word_embeddings"]) == (HIDDEN, INTER, LAYERS, HEADS, KV_HEADS, VOCAB, False)
    # the module's own tensors at record time (sum of p.numel() * p.element_size() over its 85 nn.Linear)
    assert meta["linear_param_bytes_measured"] == LINEAR_PARAM_BYTES and meta["nn_linear_modules"] == LAYERS * 7 + 1
    assert meta["prompt_tokens"] == PROMPT


@pytest.mark.parametrize("batch", [1, 8])
def test_hf_decode_step_gemm_work(batch):
    its = plain(DATA / f"hf_llama12_bs{batch}.pt.trace.json.gz")["iterations"]
    assert [r["name"] for r in its] == ["prefill"] + ["decode_step"] * 5
    n, flops, nbytes = expected_step(batch, 1)
    assert n == 86
    for r in its[1:]:
        assert (r["gemms"], r["flops"], r["bytes"], r["no_shapes"]) == (n, flops, nbytes, 0)
        # the figures: FLOPs = 2 * linear params * batch within 0.5%; bytes = weights + activations within 1%
        assert abs(r["flops"] - 2 * LINEAR_PARAMS * batch) <= 0.005 * r["flops"]
        assert 0 < r["bytes"] - LINEAR_PARAM_BYTES <= 0.01 * LINEAR_PARAM_BYTES
    # each GEMM once, at aten::mm (not again at the aten::matmul and aten::linear around it)
    mm = sum(v for k, v in its[1]["shapes"].items() if k.startswith("aten::mm["))
    assert mm == LAYERS * 7 + 1 and not any(k.startswith(("aten::linear", "aten::matmul")) for k in its[1]["shapes"])


@pytest.mark.parametrize("batch", [1, 8])
def test_hf_prefill_gemm_work(batch):
    r = plain(DATA / f"hf_llama12_bs{batch}.pt.trace.json.gz")["iterations"][0]
    assert (r["gemms"], r["flops"], r["bytes"]) == expected_step(batch, PROMPT)


def test_proxy_eager_and_graph_replays_give_the_same_gemms():
    eager = plain(next((DATA / "proxy_eager").glob("*.trace.json.gz")))
    graphs = plain(next((DATA / "proxy_graphs").glob("*.trace.json.gz")), DATA / "proxy_graphs" / "graph_capture_profile")
    assert len(eager["iterations"]) == len(graphs["iterations"]) == 6
    assert eager["gemm_ops_outside_iterations"] == graphs["gemm_ops_outside_iterations"] == 0
    for e, g in zip(eager["iterations"], graphs["iterations"]):
        assert e["graph_replays"] == 0 and e["gemms"] == 143
        # every GEMM of a graph iteration comes from its replays' captures, none unmatched
        assert g["graph_replays"] == 3 and g["ambiguous_replays"] == 0 and g["replayed_gemms"] == g["gemms"] == 143
        assert e["no_shapes"] == g["no_shapes"] == 0
        # the projections (mm / addmm_) do not depend on the context width: identical shapes, eager and captured
        proj = lambda r: {k: v for k, v in r["shapes"].items() if k.startswith(("aten::mm[", "aten::addmm_["))}
        assert proj(e) == proj(g) and sum(proj(e).values()) == 86
    # attention's bmm shapes follow the context: eager 207 positions (grows by one an iteration), the graphs their 256 bucket
    bmm = lambda r: sum(v for k, v in r["shapes"].items() if k.startswith("aten::bmm["))
    assert {bmm(r) for r in eager["iterations"] + graphs["iterations"]} == {57}
    assert graphs["iterations"][0]["flops"] == graphs["iterations"][-1]["flops"]
    assert eager["iterations"][0]["flops"] < eager["iterations"][-1]["flops"] < graphs["iterations"][0]["flops"]
