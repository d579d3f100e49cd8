"""The optimization registry: every studied optimization, its real on/off switch per target.

SGLang 0.5.23 turns all of them on by default (sglang-0.5.23.md §0 #2), so a baseline must be
explicit: `--base off` starts from everything off and switches the chosen ones on (isolates each);
`--base on` starts from everything on and switches the chosen ones off for the baseline
(leave-one-out).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from profkit.errors import UsageError


@dataclass(frozen=True)
class Switch:
    """What to add to the server's command line and environment for one state of an optimization."""

    args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    model_override: dict[str, object] = field(default_factory=dict)  # merged into --json-model-override-args


@dataclass(frozen=True)
class Optimization:
    name: str
    title: str  # the study's name for it
    on: Switch
    off: Switch
    kernels: str  # what it is expected to touch, in words (the catalog holds the categories)
    note: str = ""


SGLANG: tuple[Optimization, ...] = (
    Optimization(
        "overlap", "Spec V2 overlap scheduling (sync-free spec decoding)",
        on=Switch(), off=Switch(args=("--disable-overlap-schedule",)),
        kernels="no kernels: removes host syncs and the bubbles between run_batch iterations",
        note="there is no Spec-V2 env switch in 0.5.23 (SGLANG_ENABLE_SPEC_V2 was removed); off = synchronous V2",
    ),
    Optimization(
        "topk_v2", "TopK-V2 radix-select top-k fused with the page-table transform",
        on=Switch(env={"SGLANG_OPT_USE_TOPK_V2": "1"}), off=Switch(env={"SGLANG_OPT_USE_TOPK_V2": "0"}),
        kernels="topk: topk_main_kernel/topk_*_cluster_kernel instead of topk_transform_decode_kernel",
    ),
    Optimization(
        "indexer_fusion", "DSA indexer prologue fusion (12 kernels -> 4)",
        on=Switch(env={"SGLANG_DISABLE_DSA_INDEXER_FUSION": "0"}), off=Switch(env={"SGLANG_DISABLE_DSA_INDEXER_FUSION": "1"}),
        kernels="indexer prologue: wk_weights_proj GEMM, fused_q_indexer_rope_hadamard_quant, fused_k_indexer_norm_rope_store",
        note="needs indexer_rope_interleave: true in the checkpoint config (GLM-5.x sets it)",
    ),
    Optimization(
        "index_share", "IndexShare MTP: draft steps reuse the indexer top-k",
        on=Switch(model_override={"index_share_for_mtp_iteration": True}),
        off=Switch(model_override={"index_share_for_mtp_iteration": False}),
        kernels="fewer paged_mqa_logits/top-k kernels inside the draft range",
        note="no CLI/env switch; a model-config attribute set through --json-model-override-args",
    ),
    Optimization(
        "draft_extend_graph", "CUDA graph for the DSA draft-extend path",
        on=Switch(env={"SGLANG_DISABLE_DRAFT_EXTEND_CUDA_GRAPH": "0"}), off=Switch(env={"SGLANG_DISABLE_DRAFT_EXTEND_CUDA_GRAPH": "1"}),
        kernels="no kernels: fewer launches inside draft_extend",
    ),
    Optimization(
        "cuda_graph", "CUDA graphs for decode (and prefill)",
        on=Switch(args=("--cuda-graph-backend-decode", "full", "--cuda-graph-backend-prefill", "breakable")),
        off=Switch(args=("--cuda-graph-backend-decode", "disabled", "--cuda-graph-backend-prefill", "disabled")),
        kernels="no kernels: kernel launches replaced by graph launches",
        note="decode disabled also disables the draft and draft-extend graphs",
    ),
    Optimization(
        "bf16_gemm", "CuTe DSL BF16 GEMM backend",
        on=Switch(args=("--bf16-gemm-backend", "cutedsl")), off=Switch(args=("--bf16-gemm-backend", "torch")),
        kernels="gemm: TgvGemm CuTe kernels instead of cuBLAS nvjet_* for the BF16 attention projections",
        note="cutedsl raises ValueError at start-up on GPUs other than SM100/SM103; profkit refuses it before launch",
    ),
    Optimization(
        "moe_deferred_finalize", "MoE deferred finalize (shared-expert add folded into finalize)",
        on=Switch(env={"SGLANG_ENABLE_MOE_DEFERRED_FINALIZE": "1"}), off=Switch(env={"SGLANG_ENABLE_MOE_DEFERRED_FINALIZE": "0"}),
        kernels="moe: moeFinalizeKernel / moe_finalize_all_reduce_kernel instead of finalizeKernel + add",
        note="engages only with NVFP4 trtllm-gen MoE on Blackwell",
    ),
)

PROXY: tuple[Optimization, ...] = (
    Optimization("overlap", "overlap scheduling without host syncs", on=Switch(), off=Switch(),
                 kernels="no kernels: removes the per-step D2H read-back and sync"),
    Optimization("topk_v2", "radix/histogram top-k selection fused with slot translation", on=Switch(), off=Switch(),
                 kernels="topk: selection instead of a full sort"),
    Optimization("indexer_fusion", "fused indexer prologue", on=Switch(), off=Switch(),
                 kernels="indexer prologue: one wk_weights_proj GEMM + fused k/q steps"),
    Optimization("index_share", "draft steps reuse the top-k of draft step 0", on=Switch(), off=Switch(),
                 kernels="fewer indexer/top-k ops inside draft"),
    Optimization("cuda_graph", "decode and draft steps replayed from CUDA graphs (CUDA only)", on=Switch(), off=Switch(),
                 kernels="no kernels: kernel launches replaced by graph launches"),
    Optimization("moe_deferred_finalize", "shared-expert add folded into the MoE combine", on=Switch(), off=Switch(),
                 kernels="moe: one op fewer per layer"),
)

REGISTRY: dict[str, tuple[Optimization, ...]] = {"sglang": SGLANG, "proxy": PROXY}


def registry(target: str) -> dict[str, Optimization]:
    try:
        return {o.name: o for o in REGISTRY[target]}
    except KeyError:
        raise UsageError(f"unknown target {target!r}", hint=f"choose one of: {', '.join(REGISTRY)}") from None


def check_opts(target: str, names: list[str]) -> list[str]:
    """Validate optimization names for a target; keep the given order, drop duplicates."""
    reg = registry(target)
    out: list[str] = []
    for n in names:
        if n not in reg:
            raise UsageError(f"unknown optimization {n!r} for target {target}", hint=f"known: {', '.join(reg)} (see `profkit opts --target {target}`)")
        if n not in out:
            out.append(n)
    return out


def opt_states(target: str, chosen: list[str], *, base: str, candidate: bool) -> dict[str, bool]:
    """On/off per optimization for the baseline (candidate=False) or the candidate run.

    base "off": baseline all off; candidate = chosen on. base "on": baseline = all on except the
    chosen ones (leave-one-out); candidate = all on.
    """
    names = list(registry(target))
    if base == "off":
        return {n: (candidate and n in chosen) for n in names}
    if base == "on":
        return {n: (candidate or n not in chosen) for n in names}
    raise UsageError(f"--base {base!r}: use 'off' or 'on'")
