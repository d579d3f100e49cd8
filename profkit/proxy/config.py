"""Proxy-engine configuration: model sizes, serving limits, optimization switches, device.

No torch at import time: the CLI (`profkit opts`, `--dry-run`) may read the switch list without it.
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass, field

# profkit's registry names, in the order of the study's ablation ladder.
SWITCHES: tuple[str, ...] = (
    "cuda_graph",
    "overlap",
    "index_share",
    "topk_v2",
    "indexer_fusion",
    "moe_deferred_finalize",
)

SWITCH_HELP: dict[str, str] = {
    "overlap": "no host read-back in the decode loop; each step's KV slots and metadata "
    "planned from host bookkeeping on a CUDA plan stream (the forward waits by event), the CPU "
    "one step ahead, results copied non_blocking and consumed one iteration later",
    "topk_v2": "selection top-k (CUDA: radix/threshold select; CPU: quickselect threshold) fused with the "
    "index -> cache-slot translation (off: full sort of the score row, slice, gather)",
    "indexer_fusion": "wk_weights_proj GEMM + fused k-side (norm+rope+quant+store) + fused q-side "
    "(rope+quant+gate) (off: the 12-step unfused chain incl. Hadamard)",
    "index_share": "draft steps 1.. reuse the indexer top-k of draft step 0",
    "cuda_graph": "decode/verify/draft steps captured in CUDA graphs and replayed (CUDA only)",
    "moe_deferred_finalize": "shared-expert add folded into the MoE combine (one op)",
}

# Switches that need a particular device type.
DEVICE_ONLY: dict[str, str] = {"cuda_graph": "cuda"}


def parse_opts(spec: str) -> frozenset[str]:
    """`all`, `none`, or a comma-separated subset of SWITCHES -> the set that is ON."""
    spec = (spec or "").strip()
    if spec in ("all", ""):
        return frozenset(SWITCHES)
    if spec == "none":
        return frozenset()
    names = [s.strip() for s in spec.split(",") if s.strip()]
    unknown = [n for n in names if n not in SWITCHES]
    if unknown:
        raise ValueError(f"unknown switch(es) {unknown}; known: {', '.join(SWITCHES)}, all, none")
    return frozenset(names)


@dataclass
class ModelSize:
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int  # attention heads (MLA-style, attending over one latent per position)
    kv_lora_rank: int  # latent width of the compressed KV cache
    qk_rope_dim: int  # decoupled RoPE part of the attention key (stored beside the latent)
    q_lora_rank: int
    index_n_heads: int
    index_head_dim: int
    index_rope_dim: int
    index_topk: int
    num_experts: int
    moe_topk: int
    moe_inter_size: int
    shared_inter_size: int


CPU_SIZE = ModelSize(
    vocab_size=1024, hidden_size=128, num_layers=2, num_heads=4, kv_lora_rank=64, qk_rope_dim=16,
    q_lora_rank=64, index_n_heads=4, index_head_dim=32, index_rope_dim=16, index_topk=64,
    num_experts=8, moe_topk=2, moe_inter_size=64, shared_inter_size=64,
)
# Larger on CUDA: still a toy next to GLM-5.2 (hidden 6144, 78 layers, 256 experts), but big
# enough that decode iterations are kernel-bound rather than pure launch latency.
CUDA_SIZE = ModelSize(
    vocab_size=32768, hidden_size=1024, num_layers=4, num_heads=16, kv_lora_rank=256,
    qk_rope_dim=32, q_lora_rank=512, index_n_heads=16, index_head_dim=64, index_rope_dim=32,
    index_topk=2048, num_experts=64, moe_topk=8, moe_inter_size=256, shared_inter_size=512,
)


@dataclass
class ProxyConfig:
    size: ModelSize
    device: str = "cpu"
    dtype: str = "float32"
    seed: int = 0
    page_size: int = 16
    num_pages: int = 4096
    max_running_requests: int = 16
    chunked_prefill_size: int = 512
    speculative_num_steps: int = 5
    simulate_acc_len: float = 3.0
    switches: frozenset[str] = field(default_factory=lambda: frozenset(SWITCHES))
    tp_size: int = 1  # tensor-parallel ranks (one scheduler process each)
    # fault injection (docs/proxy.md "Fault injection"): a regression made on purpose, to test a gate end to end
    fault_host_delay_us: float = 0.0  # host busy-wait per decode step, inside scheduler.run_batch (no op runs)
    fault_gpu_op: int = 0  # one extra N x N matmul per decode step on the device (0: none)

    def on(self, name: str) -> bool:
        """Is the switch ON *and* applicable on this device."""
        return name in self.switches and self.applicable(name)

    def applicable(self, name: str) -> bool:
        need = DEVICE_ONLY.get(name)
        return need is None or self.device.startswith(need)

    def switch_states(self) -> dict[str, str]:
        out = {}
        for s in SWITCHES:
            if not self.applicable(s):
                out[s] = f"n/a on {self.device.split(':')[0]}"
            else:
                out[s] = "on" if s in self.switches else "off"
        return out

    @property
    def spec(self) -> bool:
        return self.speculative_num_steps > 0

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["switches"] = sorted(self.switches)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "ProxyConfig":
        d = dict(d)
        d["size"] = ModelSize(**d["size"])
        d["switches"] = frozenset(d["switches"])
        return cls(**d)

    def rank_device(self, rank: int) -> str:
        """The device of TP rank `rank`: cuda:(base index + rank) on CUDA, cpu otherwise."""
        if not self.device.startswith("cuda"):
            return self.device
        base = int(self.device.split(":")[1]) if ":" in self.device else 0
        return f"cuda:{base + rank}"

    def check_tp(self) -> None:
        s, n = self.size, self.tp_size
        if n < 1:
            raise ValueError("--tp must be >= 1")
        for name in ("num_heads", "num_experts", "shared_inter_size"):
            if getattr(s, name) % n:
                raise ValueError(f"--tp {n} must divide {name} ({getattr(s, name)})")


SIZE_FLAGS = [f.name for f in dataclasses.fields(ModelSize)]


def add_cli_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("engine")
    g.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto (cuda if available)")
    g.add_argument("--dtype", default="auto", help="float32, bfloat16, float16 or auto "
                   "(float32 on CPU, bfloat16 on CUDA)")
    g.add_argument("--seed", type=int, default=0, help="seed of the random weights and acceptance")
    g.add_argument("--opts", default="all",
                   help=f"switches ON (all others OFF): all (default), none, or a comma list of "
                   f"{','.join(SWITCHES)}")
    g.add_argument("--cpu-threads", type=int, default=1,
                   help="torch intra-op threads (the tiny CPU model is fastest on 1; 0 = torch's "
                   "default)")
    g.add_argument("--tp", "--tp-size", dest="tp", type=int, default=1,
                   help="tensor-parallel ranks: one scheduler process per rank (rank 0 in the server "
                   "process), gloo on CPU, NCCL on CUDA (rank r on cuda:base+r); attention heads "
                   "and the shared expert are split (column/row parallel), routed experts are "
                   "sharded (expert parallel), one all-reduce after attention and one after the MoE "
                   "of every layer")
    g.add_argument("--page-size", type=int, default=16)
    g.add_argument("--num-pages", type=int, default=None,
                   help="KV pool pages (default 4096 on CPU, 65536 on CUDA)")
    g.add_argument("--max-running-requests", type=int, default=16)
    g.add_argument("--chunked-prefill-size", type=int, default=None,
                   help="max prefill tokens per iteration (default 512 on CPU, 1024 on CUDA)")
    g.add_argument("--speculative-num-steps", type=int, default=5,
                   help="MTP draft tokens per verify; 0 disables speculative decoding")
    g.add_argument("--simulate-acc-len", type=float, default=None,
                   help="mean accepted tokens per verify incl. the bonus token, in [1, steps+1] "
                   "(default: $SGLANG_SIMULATE_ACC_LEN or 3.0)")
    f = p.add_argument_group("fault injection (a regression on purpose, for testing a gate; docs/proxy.md)")
    f.add_argument("--fault-host-delay-us", type=float, default=0.0,
                   help="busy-wait this many µs on the host in every decode step (inside run_batch, "
                   "before the step's forward; range proxy.fault.host_delay)")
    f.add_argument("--fault-gpu-op", type=int, default=0,
                   help="one extra N x N matmul per decode step on the device (range proxy.fault.gpu_op); "
                   "0: none")
    m = p.add_argument_group("model sizes (defaults: tiny on CPU, larger on CUDA)")
    for name in SIZE_FLAGS:
        m.add_argument("--" + name.replace("_", "-"), type=int, default=None)


def config_from_args(ns: argparse.Namespace, cuda_available: bool) -> ProxyConfig:
    import os

    device = ns.device
    if device == "auto":
        device = "cuda" if cuda_available else "cpu"
    on_cuda = device.startswith("cuda")
    base = CUDA_SIZE if on_cuda else CPU_SIZE
    size = dataclasses.replace(
        base, **{k: getattr(ns, k) for k in SIZE_FLAGS if getattr(ns, k, None) is not None})
    dtype = ns.dtype if ns.dtype != "auto" else ("bfloat16" if on_cuda else "float32")
    acc = ns.simulate_acc_len
    if acc is None:
        acc = float(os.environ.get("SGLANG_SIMULATE_ACC_LEN", "3.0"))
    steps = ns.speculative_num_steps
    acc = min(max(acc, 1.0), steps + 1.0)
    cfg = ProxyConfig(
        size=size, device=device, dtype=dtype, seed=ns.seed, page_size=ns.page_size,
        num_pages=ns.num_pages or (65536 if on_cuda else 4096),
        max_running_requests=ns.max_running_requests,
        chunked_prefill_size=ns.chunked_prefill_size or (1024 if on_cuda else 512),
        speculative_num_steps=steps, simulate_acc_len=acc, switches=parse_opts(ns.opts),
        tp_size=int(getattr(ns, "tp", 1) or 1),
        fault_host_delay_us=float(getattr(ns, "fault_host_delay_us", 0.0) or 0.0),
        fault_gpu_op=int(getattr(ns, "fault_gpu_op", 0) or 0),
    )
    if cfg.fault_host_delay_us < 0 or cfg.fault_gpu_op < 0:
        raise ValueError("--fault-host-delay-us and --fault-gpu-op must be >= 0")
    cfg.check_tp()
    return cfg
