"""SGLang 0.5.23 as a target: the study's presets, its optimizations' switches, validation with SGLang's own parser."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

from profkit.errors import TargetError, UsageError
from profkit.targets.gpus import gpu_compute_capabilities
from profkit.targets.registry import capability_major, inactive, registry
from profkit.targets.spec import LaunchSpec
from profkit.targets.target import Capability, Defaults, Launch, Optimization, OptsWords, Switch

STUDY_MODEL = "nvidia/GLM-5.2-NVFP4"

# The study's launch commands (seeds/000, "Reproduction"), flag for flag and in its order, without
# --model-path (first), --host and --port (profkit's own, last). The two `export`s of the study are
# the registry's "on" switches of topk_v2 and moe_deferred_finalize, so all-on is exactly the study.
_COMMON = [
    "--quantization", "modelopt_fp4",
    "--context-length", "90000",
    "--max-running-requests", "16",
    "--max-prefill-tokens", "8192",
    "--chunked-prefill-size", "8192",
    "--cuda-graph-max-bs-decode", "16",
    "--mem-fraction-static", "0.87",
    "--trust-remote-code",
    "--kv-cache-dtype", "fp8_e4m3",
    "--bf16-gemm-backend", "cutedsl",
    "--reasoning-parser", "glm45",
    "--tool-call-parser", "glm47",
    "--speculative-algorithm", "EAGLE",
    "--speculative-num-steps", "5",
    "--speculative-eagle-topk", "1",
    "--speculative-num-draft-tokens", "6",
    "--enable-cache-report",
]
PRESETS: dict[str, tuple[int, list[str]]] = {
    "glm52-nvfp4-tp4": (4, ["--tensor-parallel-size", "4", *_COMMON]),
    "glm52-nvfp4-tp8": (8, ["--tensor-parallel-size", "8", *_COMMON]),
    "glm52-nvfp4-tep4": (4, ["--tensor-parallel-size", "4", "--ep-size", "4", *_COMMON]),
    "glm52-nvfp4-tep8": (8, ["--tensor-parallel-size", "8", "--ep-size", "8", *_COMMON]),
}
STUDY_ENV = {"SGLANG_OPT_USE_TOPK_V2": "1", "SGLANG_ENABLE_MOE_DEFERRED_FINALIZE": "1"}

# SGLang's own SIGTERM teardown (sglang-0.5.23.md §6.3): the sigterm watchdog polls every 5 s,
# drains in-flight requests, gives the schedulers up to 15 s to release GPU memory, then
# kill_process_tree waits up to 60 s; plus a margin for uvicorn and the interpreter's exit.
TEARDOWN_S = 5 + 15 + 60 + 10.0

# SGLang 0.5.23 turns every one of them on by default (sglang-0.5.23.md §0 #2), and the study measured each
# against the engine with everything else on: "on" is SGLang's default (or the study's own explicit setting), "off"
# is the switch that removes it.
OPTIMIZATIONS: tuple[Optimization, ...] = (
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
HARDWARE: dict[str, Capability] = {
    "bf16_gemm": Capability((10,), "--bf16-gemm-backend cutedsl needs SM10x; elsewhere profkit sends auto, which SGLang resolves to cuBLAS"),
    "moe_deferred_finalize": Capability((10,), "deferred finalize engages only with NVFP4 trtllm-gen MoE on Blackwell (Hopper uses Marlin)"),
}


# Flags the registry owns: the user may not also pass them in --extra-server-args.
_OWNED = {"--disable-overlap-schedule", "--cuda-graph-backend-decode", "--cuda-graph-backend-prefill", "--bf16-gemm-backend",
          "--disable-cuda-graph", "--disable-decode-cuda-graph", "--disable-prefill-cuda-graph", "--host", "--port"}


def owned_env() -> tuple[str, ...]:
    """Every environment variable a registry switch sets: never inherited from the user's shell."""
    names: set[str] = set()
    for o in OPTIMIZATIONS:
        names |= set(o.on.env) | set(o.off.env)
    return tuple(sorted(names))


def flag_value(argv: list[str], *flags: str) -> str | None:
    """The last value given to any of `flags` (`--f v` or `--f=v`), as argparse would keep it."""
    val = None
    for i, a in enumerate(argv):
        flag, eq, v = a.partition("=")
        if flag in flags:
            val = v if eq else (argv[i + 1] if i + 1 < len(argv) else None)
    return val


def _tp(args: list[str]) -> int:
    v = flag_value(args, "--tensor-parallel-size", "--tp-size", "--tp")
    return int(v) if v and v.isdigit() else 1


def _int(v: str | None) -> int | None:
    return int(v) if v is not None and v.lstrip("-").isdigit() else None


def reserved_tokens(argv: list[str]) -> int:
    """Token slots SGLang reserves per request on top of its input (managers/utils.py
    compute_num_reserved_tokens): EAGLE stores draft tokens in the output slots, so
    max(topk * num_steps, num_draft_tokens); every other algorithm reserves nothing."""
    algo = (flag_value(argv, "--speculative-algorithm") or "").upper()
    if algo not in ("EAGLE", "EAGLE3", "NEXTN", "FROZEN_KV_MTP"):
        return 0
    topk = _int(flag_value(argv, "--speculative-eagle-topk")) or 1
    steps = _int(flag_value(argv, "--speculative-num-steps")) or 0
    draft = _int(flag_value(argv, "--speculative-num-draft-tokens")) or 0
    return max(topk * steps, draft)


def _apply(argv: list[str], args: tuple[str, ...]) -> None:
    """Put a switch's flags into argv: a flag already there gets its value replaced in place (the
    preset keeps the study's order), a new one is appended."""
    i = 0
    while i < len(args):
        flag = args[i]
        has_val = i + 1 < len(args) and not args[i + 1].startswith("--")
        if has_val:
            val = args[i + 1]
            if flag in argv:
                argv[argv.index(flag) + 1] = val
            else:
                argv += [flag, val]
            i += 2
        else:
            if flag not in argv:
                argv.append(flag)
            i += 1


def compose(
    states: dict[str, bool], *, preset: str | None, model_path: str | None, extra_args: list[str], server_python: str | None,
    port: int, host: str = "127.0.0.1", caps: list[str] | None = None,
) -> LaunchSpec:
    """The sglang.launch_server command for one optimization state.

    `caps`: the GPUs' compute capabilities when known ([]: this machine has no NVIDIA GPU; None:
    unknown, e.g. composing for another machine). bf16_gemm "on" is the study's
    `--bf16-gemm-backend cutedsl` on SM10x or an unknown GPU, and `auto` on any other GPU and
    without one (where cutedsl makes SGLang raise at start-up, unquant.py:338 "requires SM100/SM103
    (Blackwell)", seen on a CPU machine; auto means cuBLAS or torch there: on and off are the same).
    """
    reg = registry(TARGET)
    if preset is not None and preset not in PRESETS:
        raise UsageError(f"unknown preset {preset!r}", hint=f"choose one of: {', '.join(PRESETS)}")
    world, base = PRESETS[preset] if preset else (1, [])
    model = model_path or (STUDY_MODEL if preset else None)
    if model is None and "--model-path" not in extra_args:
        raise UsageError("--target sglang needs --preset or --model-path", hint="e.g. --preset glm52-nvfp4-tp8")
    for a in extra_args:
        flag = a.split("=", 1)[0]
        if flag in _OWNED:
            raise UsageError(f"--extra-server-args sets {flag}, which profkit sets itself",
                             hint="use --opt/--base to switch optimizations; host and port are chosen by profkit")
    extra = list(extra_args)
    overrides: dict[str, object] = {}
    if "--json-model-override-args" in extra:
        i = extra.index("--json-model-override-args")
        try:
            overrides.update(json.loads(extra[i + 1]))
        except (IndexError, ValueError) as e:
            raise UsageError(f"--json-model-override-args in --extra-server-args is not JSON ({e})") from None
        del extra[i : i + 2]
    args: list[str] = list(base)
    env: dict[str, str] = {}
    notes: list[str] = []
    off_blackwell = caps is not None and (not caps or any(capability_major(c) not in HARDWARE["bf16_gemm"].majors for c in caps))
    for name, on in states.items():
        sw = reg[name].on if on else reg[name].off
        sw_args = sw.args
        if name == "bf16_gemm" and on and off_blackwell:
            sw_args = ("--bf16-gemm-backend", "auto")
            where = f"on compute capability {', '.join(sorted(set(caps or [])))}" if caps else "without a GPU (no nvidia-smi)"
            notes.append(f"bf16_gemm on is --bf16-gemm-backend auto {where} (cutedsl needs SM10x; SGLang refuses it elsewhere)")
        _apply(args, sw_args)
        env.update(sw.env)
        overrides.update(sw.model_override)
    if overrides:
        args += ["--json-model-override-args", json.dumps(overrides, sort_keys=True)]
    argv = [server_python or sys.executable, "-m", "sglang.launch_server"]
    if model is not None:
        argv += ["--model-path", model]
    argv += args + extra + ["--host", host, "--port", str(port)]
    world = _tp(argv) if not preset else world
    notes += list(inactive(TARGET, states, caps).values())
    return LaunchSpec(target="sglang", argv=argv, env=env, host=host, port=port, world_size=world, preset=preset, states=dict(states),
                      notes=notes, unset=tuple(n for n in owned_env() if n not in env),
                      context_length=_int(flag_value(argv, "--context-length")), reserved_tokens=reserved_tokens(argv),
                      teardown_s=TEARDOWN_S)


def check_gpu(spec: LaunchSpec, caps: list[str] | None) -> None:
    """Refuse what SGLang would die on at start-up: --bf16-gemm-backend cutedsl off SM10x
    (unquant.py: `get_platform().is_sm100`, i.e. compute capability major 10: B200, B300, GB300),
    and without a GPU at all (`caps == []`: SGLang on a CPU machine raises the same ValueError)."""
    if flag_value(spec.argv, "--bf16-gemm-backend") == "cutedsl" and caps is not None:
        bad = [c for c in caps if capability_major(c) not in HARDWARE["bf16_gemm"].majors]
        if not caps:
            raise TargetError(
                "--bf16-gemm-backend cutedsl needs an SM10x GPU (B200/B300/GB300); this machine has none (no nvidia-smi)",
                hint="SGLang raises ValueError for it at start-up; drop it from --extra-server-args (profkit composes `auto` for bf16_gemm on here)",
            )
        if bad:
            raise TargetError(
                f"--bf16-gemm-backend cutedsl needs an SM10x GPU (B200/B300/GB300); this machine has compute capability {', '.join(sorted(set(bad)))}",
                hint="SGLang raises ValueError for it here; profkit composes `auto` for bf16_gemm on when it can read the GPUs (nvidia-smi)",
            )


def context_from_server_info(info: Mapping[str, object]) -> int | None:
    """The context length a running server enforces, from /server_info (resolved args), else
    the scheduler's max_req_input_len (one less than the context, at most)."""
    v = info.get("context_length")
    if isinstance(v, int) and v > 0:
        return v
    m = info.get("max_req_input_len")
    if isinstance(m, int) and m > 0:
        return m + 1
    return None


_PARSE = r"""
import argparse, json, sys
try:
    from sglang.srt.server_args import ServerArgs
except Exception as e:
    print("IMPORT-FAILED:", type(e).__name__, e); sys.exit(3)
results = []
for args in json.load(sys.stdin):
    p = argparse.ArgumentParser(prog="sglang.launch_server", exit_on_error=False)
    ServerArgs.add_cli_args(p)
    try:
        ns, unknown = p.parse_known_args(args)
        results.append(None if not unknown else "unrecognized arguments: " + " ".join(unknown))
    except (argparse.ArgumentError, SystemExit) as e:
        results.append(str(e) or "rejected")
print("RESULTS:" + json.dumps(results))
"""


def validate_many(specs: list[LaunchSpec], python: str | None = None) -> list[str | None] | str:
    """Parse several composed command lines with the sglang package's own parser, in one process.

    Returns one entry per spec (None: parses; else the parser's message), or "skipped: ..." when
    sglang is not importable in `python` (default: the specs' own server python).
    """
    import json as _json

    py = python or specs[0].argv[0]
    payload = _json.dumps([sp.argv[sp.argv.index("sglang.launch_server") + 1 :] for sp in specs])
    try:
        p = subprocess.run([py, "-c", _PARSE], input=payload, capture_output=True, text=True, timeout=600)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"skipped: could not run {py} ({e})"
    if p.returncode == 3 or "IMPORT-FAILED" in p.stdout:
        return f"skipped: sglang is not importable with {py}"
    line = next((ln for ln in p.stdout.splitlines() if ln.startswith("RESULTS:")), None)
    if p.returncode != 0 or line is None:
        msg = (p.stderr.strip().splitlines() or ["(no message)"])[-1]
        return [f"the parser failed: {msg}"] * len(specs)
    return _json.loads(line[len("RESULTS:"):])


def validate(spec: LaunchSpec, python: str | None = None) -> str | None:
    """Parse the composed arguments with the sglang package's own parser in `python`.

    Returns None when they parse, "skipped: ..." when sglang is not importable there; raises
    UsageError with the parser's message when an argument is rejected.
    """
    res = validate_many([spec], python)
    if isinstance(res, str):
        return res
    if res[0] is not None:
        raise UsageError(f"SGLang's parser rejects the composed arguments: {res[0]}", hint="check --extra-server-args and the preset")
    return None


def server_info(base_url: str) -> dict[str, object]:
    """/server_info (the older /get_server_info): the resolved server args, scheduler info and `version`; {} when neither answers."""
    from profkit.http import HTTPFailure, get_json  # here: the command line reads the engines' names at start-up, urllib is slow to import

    for path in ("/server_info", "/get_server_info"):
        try:
            info = get_json(base_url + path, timeout=30)
            return info if isinstance(info, dict) else {"raw": info}
        except (HTTPFailure, ValueError):
            continue
    return {}


def profiler_env(trace_dir: Path) -> dict[str, str]:
    """SGLang 0.5.23's graph-capture profiles (SGLANG_ENABLE_CUDA_GRAPH_CAPTURE_TRACE; the proxy does the same) into
    traces/<run_id>/graph_capture_profile/: analyze/diff categorize replayed kernels from them."""
    return {"SGLANG_ENABLE_CUDA_GRAPH_CAPTURE_TRACE": "1", "SGLANG_TORCH_PROFILER_DIR": str(trace_dir.resolve())}


class SGLang:
    """SGLang 0.5.23 as a Target (targets/target.py)."""

    name = "sglang"
    package = "sglang"
    window = "sglang"
    claims_gpus = True  # --mem-fraction-static: a fixed share of every GPU's memory
    reports_versions = False  # /server_info names neither torch nor the GPU
    takes = frozenset({"preset", "accept_length"})
    optimizations = OPTIMIZATIONS
    gpu_only: dict[str, str] = {}
    hardware = HARDWARE
    # 74K first prompt: the 13 requests average 80K tokens (the study's "mean input ~ 80k tokens/request")
    # and the last one, 86,466 tokens with its output and EAGLE's reserved slots, fits --context-length 90000
    defaults = Defaults(isl=74_000, turn_tokens=800, output_tokens=220, health_timeout_s=3600.0, alternate=False)
    opts_words = OptsWords(unset="(SGLang's default)",
                           note="SGLang 0.5.23: every one is on by default; on = that default or the study's own setting, off = the "
                                "switch that removes it; --base on switches one off at a time")

    def capabilities(self) -> list[str] | None:
        return gpu_compute_capabilities()

    def dry_run_checks(self, spec: LaunchSpec) -> list[str]:
        check_gpu(spec, gpu_compute_capabilities())
        res = validate(spec)
        return [f"SGLang's parser: {res or 'the arguments parse'}"]

    def compose(self, launch: Launch) -> LaunchSpec:
        spec = compose(launch.states, preset=launch.preset, model_path=launch.model_path, extra_args=list(launch.extra_args),
                       server_python=launch.server_python, port=launch.port, host=launch.host, caps=gpu_compute_capabilities())
        if launch.accept_length is not None:
            # spec_utils.py reads it at import in every scheduler: fixed acceptance after the real verify
            spec = replace(spec, env={**spec.env, "SGLANG_SIMULATE_ACC_LEN": f"{launch.accept_length:g}"},
                           unset=tuple(n for n in spec.unset if n != "SGLANG_SIMULATE_ACC_LEN"))
        return spec

    def profiler_env(self, trace_dir: Path) -> dict[str, str]:
        return profiler_env(trace_dir)

    def validate(self, spec: LaunchSpec) -> dict[str, object]:
        check_gpu(spec, gpu_compute_capabilities())
        return {"parser_check": validate(spec) or "passed"}

    def server_info(self, base_url: str) -> dict[str, object]:
        return server_info(base_url)

    def context_length(self, info: Mapping[str, object]) -> int | None:
        return context_from_server_info(info)

    def catalog(self, manifest: Mapping[str, object]) -> str | None:
        """The study's GLM-5.2 catalog when the preset or the model names GLM."""
        named = json.dumps([manifest.get("preset"), manifest.get("model_path"), manifest.get("model")]).lower()
        return "sglang-glm52" if "glm" in named else None


TARGET = SGLang()
