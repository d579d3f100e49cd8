"""Every engine profkit can launch, by its `--target` name: one line each (targets/target.py says what a target answers)."""

from __future__ import annotations

from profkit.errors import UsageError
from profkit.targets import proxy, sglang, vllm
from profkit.targets.target import Target

TARGETS: dict[str, Target] = {t.name: t for t in (proxy.TARGET, sglang.TARGET, vllm.TARGET)}


def target(name: str) -> Target:
    """The target named `name` (UsageError naming the known ones otherwise)."""
    try:
        return TARGETS[name]
    except KeyError:
        raise UsageError(f"unknown target {name!r}", hint=f"choose one of: {', '.join(TARGETS)}") from None
