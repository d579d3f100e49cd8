"""The optimization registry's rules, for any target: each engine's table (its optimizations' real
on/off switches, what depends on what, what needs a GPU or a compute capability) is its own
(targets/<engine>.py: `Target.optimizations`, `gpu_only`, `hardware`); these functions read it
through the Target protocol, never by the engine's name.

On is the engine's default (or the study's own explicit setting), off is the switch that removes it,
and the default baseline is leave-one-out: `--base on` starts from everything on and switches the
chosen ones off for the baseline. `--base off` (everything off, the chosen ones on) is an exploration
of an eager regime the study never ran.
"""

from __future__ import annotations

from profkit.errors import UsageError
from profkit.targets.target import Optimization, Target


def registry(target: Target) -> dict[str, Optimization]:
    """The target's optimizations by name, in its table's order."""
    return {o.name: o for o in target.optimizations}


def check_opts(target: Target, names: list[str]) -> list[str]:
    """Validate optimization names for a target; keep the given order, drop duplicates."""
    reg = registry(target)
    out: list[str] = []
    for n in names:
        if n not in reg:
            raise UsageError(f"unknown optimization {n!r} for target {target.name}",
                             hint=f"known: {', '.join(reg)} (see `profkit opts --target {target.name}`)")
        if n not in out:
            out.append(n)
    return out


def opt_states(target: Target, chosen: list[str], *, base: str, candidate: bool) -> dict[str, bool]:
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


def inactive(target: Target, states: dict[str, bool], caps: list[str] | None = None) -> dict[str, str]:
    """Optimizations switched on in `states` that do nothing there, with the reason.

    A switch whose requirement is off (draft_extend_graph without cuda_graph), one the engine ignores
    without a GPU (`target.gpu_only`: vLLM's async_scheduling, cuda_graph), or one it ignores on this GPU
    (`target.hardware`: SGLang's bf16_gemm, moe_deferred_finalize off Blackwell; `caps` as '9.0', ...).
    """
    reg = registry(target)
    gpu_only, hardware = target.gpu_only, target.hardware
    out: dict[str, str] = {}
    for name, on in states.items():
        if not on or name not in reg:
            continue
        o = reg[name]
        missing = [r for r in o.requires if not states.get(r, False)]
        if missing:
            out[name] = f"{name} does nothing while {', '.join(missing)} is off ({o.requires_why})"
            continue
        if caps == [] and name in gpu_only:
            out[name] = f"{name} does nothing on a CPU: {gpu_only[name]}"
            continue
        if caps is not None and name in hardware:
            majors, why = hardware[name]
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


def check_comparison(target: Target, baseline: dict[str, bool], candidate: dict[str, bool], attributed: list[str],
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
        if caps == [] and name in target.gpu_only:
            *some, last = [n for n in reg if n not in target.gpu_only]
            raise UsageError(f"{name} cannot be measured on this machine: it has no GPU and {target.gpu_only[name]}",
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
