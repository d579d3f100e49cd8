"""A GLM-5.2-shaped model with random (seeded) weights, token ids in and out.

Decoder layer: RMSNorm -> q/kv compression (MLA-like: one latent row per position in the KV
cache) -> DSA indexer (prologue, logits against every cached indexer key, top-k) -> attention over
the selected positions only -> RMSNorm -> routed MoE (top-k of E experts + one shared expert).
An MTP head (one more such layer over [embed(token); hidden]) drafts tokens for speculative
decoding. Its KV lives at layer index `num_layers` of the same caches.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.profiler import record_function

from . import ops
from .config import ProxyConfig

try:  # optional NVTX ranges for Nsight users (CUDA only)
    import nvtx as _nvtx  # type: ignore
except Exception:  # pragma: no cover
    _nvtx = None


class rng:
    """record_function + (when available on CUDA) an NVTX range of the same name."""

    nvtx_on = False

    def __init__(self, name: str):
        self.name = name
        self.rf = record_function(name)

    def __enter__(self):
        self.rf.__enter__()
        if rng.nvtx_on:
            _nvtx.push_range(self.name)
        return self

    def __exit__(self, *a):
        if rng.nvtx_on:
            _nvtx.pop_range()
        return self.rf.__exit__(*a)


@dataclass
class FwdBatch:
    """Device tensors describing one forward over B rows of Q query tokens each."""

    positions: torch.Tensor  # [B,Q] int64
    out_slots: torch.Tensor  # [B,Q] int64, where each token's KV goes (dummy slot for pads)
    slot_table: torch.Tensor  # [B,L] int64, logical position -> cache slot

    @property
    def lengths(self) -> torch.Tensor:
        return self.positions + 1  # causal: a query sees positions <= its own


def _rope_tables(positions: torch.Tensor, dim: int, base: float = 10000.0):
    inv = base ** (-torch.arange(0, dim, 2, device=positions.device, dtype=torch.float32) / dim)
    f = positions.reshape(-1, 1).float() * inv
    return torch.cos(f), torch.sin(f)


class ProxyModel:
    """tp: a profkit.proxy.tp.TPState (None: one rank). Every rank draws the same full weights from
    the same seed, then keeps its shard: attention heads (`wq_b` rows, `wo` columns), routed experts
    (`E / tp` consecutive ones), the shared expert's intermediate dim (`s_w13` rows, `s_w2` columns).
    The partial attention and MoE outputs are summed by one all-reduce each."""

    def __init__(self, cfg: ProxyConfig, tp=None):
        self.cfg = cfg
        s = cfg.size
        self.s = s
        self.tp = tp
        rank, world = (tp.rank, tp.world) if tp is not None else (0, 1)
        self.device = torch.device(cfg.rank_device(rank) if world > 1 else cfg.device)
        self.dtype = getattr(torch, cfg.dtype)
        g = torch.Generator().manual_seed(cfg.seed)
        dt, dev = self.dtype, self.device

        def w(*shape, fan_in=None):
            fan = fan_in or shape[-1]
            return (torch.randn(*shape, generator=g) / fan ** 0.5).to(dev, dt)

        def ones(n):
            return torch.ones(n, device=dev, dtype=dt)

        H, C, dr = s.hidden_size, s.kv_lora_rank, s.qk_rope_dim
        nh, Di, Hi = s.num_heads, s.index_head_dim, s.index_n_heads
        E, I = s.num_experts, s.moe_inter_size
        if s.index_rope_dim > Di or s.index_rope_dim % 2 or dr % 2:
            raise ValueError("rope dims must be even and <= head dims")
        self.embed = w(s.vocab_size, H, fan_in=1) * 0.5
        self.lm_head = w(s.vocab_size, H)
        self.final_norm = ones(H)
        had = ops.hadamard_matrix(Di).to(dev, torch.float32)
        self.layers = []
        for _ in range(s.num_layers + 1):  # the last one is the MTP layer
            wk, wp = w(Di, H), w(Hi, H)
            idx = {
                "n_heads": Hi, "head_dim": Di, "hadamard": had.to(dt),
                "wq_b": w(Hi * Di, s.q_lora_rank), "wk": wk, "weights_proj": wp,
                "wk_weights_proj": torch.cat([wk, wp], 0).contiguous(),
                "k_norm_w": ones(Di), "k_norm_b": torch.zeros(Di, device=dev, dtype=dt),
                "gate_scale": (Hi ** -0.5) * (Di ** -0.5),
            }
            self.layers.append({
                "ln1": ones(H), "ln2": ones(H), "q_norm": ones(s.q_lora_rank), "kv_norm": ones(C),
                "wq_a": w(s.q_lora_rank, H), "wkv_a": w(C + dr, H),
                "wq_b": w(nh * (C + dr), s.q_lora_rank), "wo": w(H, nh * C),
                "indexer": idx,
                "router": w(E, H),
                "w13": w(E, H, 2 * I, fan_in=H), "w2": w(E, I, H, fan_in=I),
                "s_w13": w(2 * s.shared_inter_size, H), "s_w2": w(H, s.shared_inter_size),
            })
        if world > 1:
            self._shard(rank, world)
        self.mtp = {"enorm": ones(H), "hnorm": ones(H), "norm": ones(H), "eh_proj": w(H, 2 * H)}
        nslots = cfg.num_pages * cfg.page_size
        self.kv_cache = torch.zeros(s.num_layers + 1, nslots, C + dr, device=dev, dtype=dt)
        self.idx_cache = torch.zeros(s.num_layers + 1, nslots, Di + 4, device=dev,
                                     dtype=torch.uint8)
        self.topk_fn = ops.select_topk(cfg.on("topk_v2"))
        self.prologue = (ops.indexer_prologue_fused if cfg.on("indexer_fusion")
                         else ops.indexer_prologue_unfused)
        self.deferred_finalize = cfg.on("moe_deferred_finalize")
        rng.nvtx_on = _nvtx is not None and self.device.type == "cuda"

    def _shard(self, rank: int, world: int):
        s = self.s
        C, dr = s.kv_lora_rank, s.qk_rope_dim
        nh = s.num_heads // world
        E = s.num_experts // world
        Is = s.shared_inter_size // world
        self.local_heads, self.local_experts = nh, E
        self.expert_lo = rank * E
        for lw in self.layers:
            h0 = rank * nh
            lw["wq_b"] = lw["wq_b"].view(s.num_heads, C + dr, -1)[h0:h0 + nh].reshape(
                nh * (C + dr), -1).contiguous()
            lw["wo"] = lw["wo"].view(s.hidden_size, s.num_heads, C)[:, h0:h0 + nh].reshape(
                s.hidden_size, nh * C).contiguous()
            lw["w13"] = lw["w13"][self.expert_lo:self.expert_lo + E].contiguous()
            lw["w2"] = lw["w2"][self.expert_lo:self.expert_lo + E].contiguous()
            g, u = lw["s_w13"].chunk(2, 0)
            i0 = rank * Is
            lw["s_w13"] = torch.cat([g[i0:i0 + Is], u[i0:i0 + Is]], 0).contiguous()
            lw["s_w2"] = lw["s_w2"][:, i0:i0 + Is].contiguous()

    def _all_reduce(self, x):
        return self.tp.all_reduce(x) if self.tp is not None else x

    # -- one decoder layer --------------------------------------------------------------------
    def layer(self, x, li: int, fb: FwdBatch, rope, topk_slots=None):
        s, lw = self.s, self.layers[li]
        B, Q, H = x.shape
        C, dr = s.kv_lora_rank, s.qk_rope_dim
        irope, acos, asin = rope
        slots = fb.out_slots.reshape(-1)
        hf = F.rms_norm(x, (H,), lw["ln1"]).reshape(B * Q, H)
        with rng("proxy.qkv_proj"):
            q_lat = F.rms_norm(F.linear(hf, lw["wq_a"]), (s.q_lora_rank,), lw["q_norm"])
            ckv = F.linear(hf, lw["wkv_a"])
        if topk_slots is None:
            iw = lw["indexer"]
            with rng("proxy.indexer.prologue"):
                qq, gate = self.prologue(iw, hf, q_lat, irope["cos"], irope["sin"],
                                         self.idx_cache[li], slots, cis=irope.get("cis"))
            with rng("proxy.indexer.logits"):
                rows = self.idx_cache[li][fb.slot_table]
                scores = ops.indexer_logits(qq.view(B, Q, iw["n_heads"], -1),
                                            gate.view(B, Q, -1), rows, iw["head_dim"])
            with rng("proxy.indexer.topk"):
                topk_slots = self.topk_fn(scores, fb.lengths, s.index_topk,
                                          fb.slot_table.unsqueeze(1))
        with rng("proxy.attention"):
            lat = F.rms_norm(ckv[:, :C], (C,), lw["kv_norm"])
            kr = ops._rope_unfused(ckv[:, C:], acos, asin)
            self.kv_cache[li].index_copy_(0, slots, torch.cat([lat, kr], -1))
            nh = lw["wq_b"].shape[0] // (C + dr)  # this rank's heads
            q = F.linear(q_lat, lw["wq_b"]).view(B * Q, nh, C + dr)
            q = torch.cat([q[..., :C], ops._rope_unfused(q[..., C:], acos.unsqueeze(1),
                                                         asin.unsqueeze(1))], -1)
            q = q.view(B, Q, nh, C + dr)
            sel = self.kv_cache[li][topk_slots.clamp(min=0)]  # [B,Q,K,C+dr]
            sc = torch.einsum("bqhd,bqkd->bqhk", q, sel).float() * (C + dr) ** -0.5
            sc = sc.masked_fill((topk_slots < 0).unsqueeze(2), float("-inf"))
            p = torch.softmax(sc, -1).to(x.dtype)
            o = torch.einsum("bqhk,bqkc->bqhc", p, sel[..., :C]).reshape(B, Q, -1)
            x = x + self._all_reduce(F.linear(o, lw["wo"]))
        h2 = F.rms_norm(x, (H,), lw["ln2"]).reshape(B * Q, H)
        with rng("proxy.moe"):
            x = x + self._all_reduce(self.moe(h2, lw)).view(B, Q, H)
        return x, topk_slots

    def moe(self, h, lw):
        s = self.s
        E = lw["w13"].shape[0]  # this rank's experts (all of them without TP)
        probs = torch.softmax(F.linear(h, lw["router"]).float(), -1)
        tw, ti = torch.topk(probs, s.moe_topk, -1)
        combine = torch.zeros_like(probs).scatter_(-1, ti, tw / tw.sum(-1, keepdim=True))
        if E != s.num_experts:  # expert parallel: the routing weights of the local experts
            combine = combine[:, self.expert_lo:self.expert_lo + E].contiguous()
        a = torch.bmm(h.unsqueeze(0).expand(E, -1, -1), lw["w13"])  # [E,N,2I]
        g, u = a.chunk(2, -1)
        eo = torch.bmm(F.silu(g) * u, lw["w2"])  # [E,N,H]
        sg, su = F.linear(h, lw["s_w13"]).chunk(2, -1)
        return ops.moe_finalize(eo, combine, F.silu(sg) * su, lw["s_w2"], self.deferred_finalize)

    def rope(self, fb: FwdBatch):
        s = self.s
        ic, is_ = _rope_tables(fb.positions, s.index_rope_dim)
        ac, as_ = _rope_tables(fb.positions, s.qk_rope_dim)
        dt = self.dtype
        # precomputed per forward, shared by all layers (like a cos/sin cache lookup)
        if self.cfg.on("indexer_fusion"):
            irope = {"cos": ic, "sin": is_, "cis": ops.rope_cis(ic, is_, s.index_head_dim)}
        else:  # the unfused chain runs in the model dtype (bf16 on CUDA), like SGLang's
            irope = {"cos": ic.to(dt), "sin": is_.to(dt)}
        return irope, ac.to(dt), as_.to(dt)

    # -- model entry points -------------------------------------------------------------------
    def target(self, tokens: torch.Tensor, fb: FwdBatch) -> torch.Tensor:
        """Target model over tokens [B,Q]; returns the last hidden states [B,Q,H] (pre-norm)."""
        rope = self.rope(fb)
        x = self.embed[tokens]
        for li in range(self.s.num_layers):
            x, _ = self.layer(x, li, fb, rope)
        return x

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return F.linear(F.rms_norm(hidden, (self.s.hidden_size,), self.final_norm), self.lm_head)

    def mtp_forward(self, tokens, prev_hidden, fb: FwdBatch, topk_slots=None):
        """MTP layer at the positions of fb: input [embed(tokens); prev_hidden].

        Returns (hidden [B,Q,H], logits [B,Q,V], the top-k slots it used)."""
        H = self.s.hidden_size
        with rng("proxy.mtp"):
            e = F.rms_norm(self.embed[tokens], (H,), self.mtp["enorm"])
            hh = F.rms_norm(prev_hidden, (H,), self.mtp["hnorm"])
            x = F.linear(torch.cat([e, hh], -1), self.mtp["eh_proj"])
            x, topk = self.layer(x, self.s.num_layers, fb, self.rope(fb), topk_slots)
            logits = F.linear(F.rms_norm(x, (H,), self.mtp["norm"]), self.lm_head)
        return x, logits, topk
