"""Fused DSA indexer prologue kernels (the study's "indexer prologue fusion").

The prologue after fusion is 4 kernels: the ``wk_weights_proj`` GEMM (``wk`` and ``weights_proj``
fused into one projection whose output splits into the key activations and the raw head gates),
the ``wq_b`` GEMM, and the two elementwise tails below, one Triton kernel each:

``indexer_k_fused(k, norm_w, norm_b, cos, sin, cache, out_slots, eps=1e-5) -> None``
    k side: LayerNorm + RoPE + FP8 (e4m3) quantize + store into the paged indexer key cache.

    * ``k``: [T, D] float (bf16/fp16/fp32; may be a column slice of the fused GEMM output, last
      dim contiguous); ``norm_w``/``norm_b``: [D];
    * ``cos``/``sin``: [T, R/2] float: interleaved RoPE on the first R dims (pairs (2i, 2i+1));
    * ``cache``: uint8 [slots, D + 4] (row-contiguous): row ``s`` holds D fp8 bytes then the fp32
      per-row scale's 4 bytes (little endian) - the proxy's indexer cache layout;
    * ``out_slots``: int [T], the cache row of each token.
    * scale = max(amax(rope(LN(k))), 1e-6) / 448; stored value = fp8(rope(LN(k)) / scale).

``indexer_q_fused(q, cos, sin, gate_raw, gate_scale) -> (q_fp8 [T, H, D], gate fp32 [T, H])``
    q side: RoPE + FP8 quantize (per token and head) + head-gate scaling.

    * ``q``: [T, H, D] float (last dim contiguous); ``gate_raw``: [T, H] float (may be a column
      slice of the fused GEMM output); ``gate_scale``: python float.
    * scale[t,h] = max(amax(rope(q[t,h])), 1e-6) / 448; q_fp8 = fp8(rope(q) / scale);
      gate = gate_raw * scale * gate_scale (so the index score is
      sum_h gate[t,h] * relu(q_fp8[t,h] . k_fp8[l]) * k_scale[l]).

The torch references (``indexer_k_reference`` / ``indexer_q_reference``) run the same math as the
unfused chain of separate ops (LayerNorm, RoPE, amax, divide, cast, two index_copy stores; RoPE,
amax, divide, cast, two gate multiplies). No Hadamard transform: the fused path drops it, as in
the study (an orthonormal transform applied to both q and k preserves their inner products).
On CPU (no Triton) the public functions run the references.

Tolerances (tests): the fused kernels compute in fp32; quantized values are within one FP8 (e4m3)
step of the reference's; scales within 1e-6 relative; dequantized q.k inner products within 8%
relative (of the norm of the products; e4m3's 3 mantissa bits give ~5%) of the fp32 unquantized
ones, and no worse than the unfused chain's error (+10%).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ._triton import HAVE_TRITON, use_triton

FP8_MAX = 448.0
FP8 = torch.float8_e4m3fn


# ----------------------------------------------------------------------------------------------
# torch references (the unfused chain, one op after another)
# ----------------------------------------------------------------------------------------------


def rope_interleaved(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Interleaved RoPE on the first 2*cos.shape[-1] dims of x (fp32 math)."""
    r = cos.shape[-1] * 2
    x = x.float()
    xr, xp = x[..., :r], x[..., r:]
    x1, x2 = xr[..., 0::2], xr[..., 1::2]
    c, s = cos.float(), sin.float()
    o1 = x1 * c - x2 * s
    o2 = x2 * c + x1 * s
    return torch.cat([torch.stack([o1, o2], -1).flatten(-2), xp], -1)


def quantize_fp8_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row (last dim) FP8 e4m3 quantization: (q fp8, scale fp32 [..., 1])."""
    amax = x.float().abs().amax(-1, keepdim=True)
    scale = amax.clamp(min=1e-6) * (1.0 / FP8_MAX)
    q = (x.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    return q, scale


def indexer_k_reference(k, norm_w, norm_b, cos, sin, cache, out_slots, eps: float = 1e-5):
    """Unfused k side: LayerNorm, RoPE, quantize, then the two cache stores (bytes, scale)."""
    d = k.shape[-1]
    y = F.layer_norm(k.float(), (d,), norm_w.float(), norm_b.float(), eps)
    y = rope_interleaved(y, cos, sin)
    kq, scale = quantize_fp8_rows(y)
    slots = out_slots.to(torch.int64)
    cache[:, :d].index_copy_(0, slots, kq.view(torch.uint8))
    cache[:, d:d + 4].index_copy_(0, slots, scale.float().contiguous().view(torch.uint8))


def indexer_q_reference(q, cos, sin, gate_raw, gate_scale: float):
    """Unfused q side: RoPE, quantize, head-gate scaling."""
    y = rope_interleaved(q, cos.unsqueeze(-2), sin.unsqueeze(-2))
    qq, scale = quantize_fp8_rows(y)
    gate = gate_raw.float() * scale.squeeze(-1)
    gate = gate * gate_scale
    return qq, gate


# ----------------------------------------------------------------------------------------------
# Triton kernels
# ----------------------------------------------------------------------------------------------

if HAVE_TRITON:
    import triton
    import triton.language as tl

    @triton.jit
    def _rope_pairs(y, yp, offs, cos_row, sin_row, R2):
        """y: values at offs, yp: values at offs ^ 1 (the pair partner); interleaved RoPE."""
        i = offs // 2
        rm = i < R2
        c = tl.load(cos_row + i, mask=rm, other=1.0).to(tl.float32)
        s = tl.load(sin_row + i, mask=rm, other=0.0).to(tl.float32)
        sign = tl.where((offs % 2) == 0, -1.0, 1.0)
        return y * c + sign * yp * s

    @triton.jit
    def indexer_k_fused_kernel(k_ptr, stride_k, w_ptr, b_ptr, cos_ptr, sin_ptr, stride_cs,
                               cache_ptr, stride_cache, slots_ptr, D, R2, eps,
                               BLOCK_D: tl.constexpr):
        """One program per token: LayerNorm + RoPE + FP8 quant + paged cache store."""
        t = tl.program_id(0)
        offs = tl.arange(0, BLOCK_D)
        m = offs < D
        pofs = offs ^ 1
        krow = k_ptr + t.to(tl.int64) * stride_k
        x = tl.load(krow + offs, mask=m, other=0.0).to(tl.float32)
        xp = tl.load(krow + pofs, mask=m, other=0.0).to(tl.float32)
        mean = tl.sum(x, 0) / D
        xc = tl.where(m, x - mean, 0.0)
        var = tl.sum(xc * xc, 0) / D
        rstd = 1.0 / tl.sqrt(var + eps)
        w = tl.load(w_ptr + offs, mask=m, other=0.0).to(tl.float32)
        b = tl.load(b_ptr + offs, mask=m, other=0.0).to(tl.float32)
        wp = tl.load(w_ptr + pofs, mask=m, other=0.0).to(tl.float32)
        bp = tl.load(b_ptr + pofs, mask=m, other=0.0).to(tl.float32)
        y = (x - mean) * rstd * w + b
        yp = (xp - mean) * rstd * wp + bp
        o = _rope_pairs(y, yp, offs, cos_ptr + t.to(tl.int64) * stride_cs,
                        sin_ptr + t.to(tl.int64) * stride_cs, R2)
        o = tl.where(m, o, 0.0)
        scale = tl.maximum(tl.max(tl.abs(o), 0), 1e-6) * (1.0 / 448.0)
        q8 = (o / scale).to(tl.float8e4nv)
        slot = tl.load(slots_ptr + t).to(tl.int64)
        crow = cache_ptr + slot * stride_cache
        tl.store(crow + offs, q8.to(tl.uint8, bitcast=True), mask=m)
        sb = scale.to(tl.int32, bitcast=True)
        j = tl.arange(0, 4)
        tl.store(crow + D + j, ((sb >> (j * 8)) & 0xFF).to(tl.uint8))

    @triton.jit
    def indexer_q_fused_kernel(q_ptr, stride_qt, stride_qh, cos_ptr, sin_ptr, stride_cs,
                               g_ptr, stride_gt, stride_gh, gate_scale, out_ptr, gout_ptr,
                               H, D, R2, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr):
        """One program per token: RoPE + FP8 quant per head + head-gate scaling."""
        t = tl.program_id(0)
        h = tl.arange(0, BLOCK_H)[:, None]
        d = tl.arange(0, BLOCK_D)[None, :]
        m = (h < H) & (d < D)
        qrow = q_ptr + t.to(tl.int64) * stride_qt
        x = tl.load(qrow + h * stride_qh + d, mask=m, other=0.0).to(tl.float32)
        xp = tl.load(qrow + h * stride_qh + (d ^ 1), mask=m, other=0.0).to(tl.float32)
        o = _rope_pairs(x, xp, d, cos_ptr + t.to(tl.int64) * stride_cs,
                        sin_ptr + t.to(tl.int64) * stride_cs, R2)
        o = tl.where(m, o, 0.0)
        scale = tl.maximum(tl.max(tl.abs(o), 1), 1e-6) * (1.0 / 448.0)  # [BLOCK_H]
        q8 = (o / scale[:, None]).to(tl.float8e4nv)
        tl.store(out_ptr + t.to(tl.int64) * H * D + h * D + d, q8, mask=m)
        hv = tl.arange(0, BLOCK_H)
        hm = hv < H
        g = tl.load(g_ptr + t.to(tl.int64) * stride_gt + hv * stride_gh, mask=hm,
                    other=0.0).to(tl.float32)
        tl.store(gout_ptr + t.to(tl.int64) * H + hv, g * (scale * gate_scale), mask=hm)


def _pow2(x: int) -> int:
    return 1 << max(x - 1, 0).bit_length()


def indexer_k_fused(k, norm_w, norm_b, cos, sin, cache, out_slots, eps: float = 1e-5) -> None:
    """Fused k side (see the module doc). One Triton launch on CUDA; the reference on CPU."""
    if not use_triton(k):
        return indexer_k_reference(k, norm_w, norm_b, cos, sin, cache, out_slots, eps)
    T, D = k.shape
    if k.stride(1) != 1:
        k = k.contiguous()
    if cache.dtype != torch.uint8 or cache.shape[1] < D + 4 or cache.stride(1) != 1:
        raise ValueError("cache must be uint8 [slots, >= D + 4], row-contiguous")
    cos = cos if cos.stride(-1) == 1 else cos.contiguous()
    sin = sin if sin.stride(-1) == 1 else sin.contiguous()
    if sin.stride(0) != cos.stride(0):
        cos, sin = cos.contiguous(), sin.contiguous()
    if T == 0:
        return None
    indexer_k_fused_kernel[(T,)](
        k, k.stride(0), norm_w, norm_b, cos, sin, cos.stride(0), cache, cache.stride(0),
        out_slots, D, cos.shape[-1], eps, BLOCK_D=_pow2(D), num_warps=1 if D <= 128 else 2)
    return None


def indexer_q_fused(q, cos, sin, gate_raw, gate_scale: float):
    """Fused q side (see the module doc). One Triton launch on CUDA; the reference on CPU."""
    if not use_triton(q):
        return indexer_q_reference(q, cos, sin, gate_raw, gate_scale)
    T, H, D = q.shape
    if q.stride(2) != 1:
        q = q.contiguous()
    cos = cos if cos.stride(-1) == 1 else cos.contiguous()
    sin = sin if sin.stride(-1) == 1 else sin.contiguous()
    if sin.stride(0) != cos.stride(0):
        cos, sin = cos.contiguous(), sin.contiguous()
    out = torch.empty(T, H, D, dtype=FP8, device=q.device)
    gate = torch.empty(T, H, dtype=torch.float32, device=q.device)
    if T == 0:
        return out, gate
    bh, bd = _pow2(H), _pow2(D)
    indexer_q_fused_kernel[(T,)](
        q, q.stride(0), q.stride(1), cos, sin, cos.stride(0), gate_raw, gate_raw.stride(0),
        gate_raw.stride(1), float(gate_scale), out, gate, H, D, cos.shape[-1],
        BLOCK_H=bh, BLOCK_D=bd, num_warps=4 if bh * bd >= 2048 else 1)
    return out, gate
