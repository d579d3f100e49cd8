"""profkit's built-in proxy engine as a target."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path

from profkit.errors import UsageError
from profkit.targets import sglang
from profkit.targets.spec import LaunchSpec
from profkit.targets.target import Capability, Defaults, Launch, Optimization, OptsWords, Switch


def _tp(args: list[str]) -> int:
    """`--tp N` / `--tp-size N` / `--tp=N` in the extra server args: the rank files per profile."""
    n = 1
    for i, a in enumerate(args):
        flag, eq, val = a.partition("=")
        if flag not in ("--tp", "--tp-size"):
            continue
        if not eq:
            val = args[i + 1] if i + 1 < len(args) else ""
        if not val.isdigit() or int(val) < 1:
            raise UsageError(f"--extra-server-args: {flag} needs a positive integer, got {val!r}")
        n = int(val)
    return n


def compose(states: dict[str, bool], *, extra_args: list[str], port: int, host: str = "127.0.0.1", python: str | None = None) -> LaunchSpec:
    on = [n for n, v in states.items() if v]
    argv = [python or sys.executable, "-m", "profkit.proxy.server", "--host", host, "--port", str(port),
            "--opts", ",".join(on) if on else "none", *extra_args]
    return LaunchSpec(target="proxy", argv=argv, env={}, host=host, port=port, world_size=_tp(list(extra_args)), states=dict(states))


FAULTS = {"host_delay_us": ("--fault-host-delay-us", float), "gpu_op": ("--fault-gpu-op", int)}


def fault_args(spec: str) -> list[str]:
    """`--fault host_delay_us=200,gpu_op=256` -> the proxy server's fault-injection flags (docs/proxy.md)."""
    out: list[str] = []
    for part in (p.strip() for p in spec.split(",") if p.strip()):
        name, eq, val = part.partition("=")
        if name not in FAULTS or not eq:
            raise UsageError(f"--fault {spec!r}: {part!r} is not NAME=VALUE with NAME one of {', '.join(FAULTS)}",
                             hint="e.g. --fault host_delay_us=200 or --fault gpu_op=256")
        flag, kind = FAULTS[name]
        try:
            v = kind(val)
        except ValueError:
            raise UsageError(f"--fault {name}={val!r}: expected a {'number' if kind is float else 'whole number'}") from None
        if v < 0:
            raise UsageError(f"--fault {name}={val}: at least 0")
        out += [flag, str(v)]
    if not out:
        raise UsageError("--fault is empty", hint="e.g. --fault host_delay_us=200")
    return out


# The proxy's switches (--opts) by the names of SGLang's (profkit/proxy/README.md): no flags or environment of
# their own; compose() names the ones on.
OPTIMIZATIONS: tuple[Optimization, ...] = (
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



class Proxy:
    """profkit's proxy engine as a Target (targets/target.py): it speaks SGLang's HTTP API and profiler protocol."""

    name = "proxy"
    package = None  # profkit's own: profkit.proxy.server
    window = "sglang"
    claims_gpus = False
    reports_versions = True  # /server_info names its torch and device
    takes = frozenset({"fault"})
    optimizations = OPTIMIZATIONS
    gpu_only: dict[str, str] = {}
    hardware: dict[str, Capability] = {}
    # 4K first prompt, a long context for its size: the top-k then selects 64 of 4K+ positions, where a selection beats the
    # full sort on a CPU as on a GPU (at 256 the sort of a 300-score row is cheaper than a selection's extra ops: issue 30)
    defaults = Defaults(isl=4096, turn_tokens=32, output_tokens=32, health_timeout_s=180.0, alternate=True)
    opts_words = OptsWords(unset="--opts includes it", off="--opts omits it")

    def capabilities(self) -> list[str] | None:
        return None  # no hardware rules: the proxy runs anywhere

    def dry_run_checks(self, spec: LaunchSpec) -> list[str]:
        return []

    def compose(self, launch: Launch) -> LaunchSpec:
        return compose(launch.states, extra_args=list(launch.extra_args), port=launch.port, host=launch.host, python=launch.server_python)

    def profiler_env(self, trace_dir: Path) -> dict[str, str]:
        return sglang.profiler_env(trace_dir)

    def validate(self, spec: LaunchSpec) -> dict[str, object]:
        return {}

    def server_info(self, base_url: str) -> dict[str, object]:
        return sglang.server_info(base_url)

    def context_length(self, info: Mapping[str, object]) -> int | None:
        return None  # not checked: the proxy states no context length it enforces

    def catalog(self, manifest: Mapping[str, object]) -> str | None:
        return "proxy"


TARGET = Proxy()
