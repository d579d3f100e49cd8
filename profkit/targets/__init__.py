"""Engines profkit can launch: the built-in proxy engine, SGLang and vLLM. Each composes a LaunchSpec."""

from profkit.targets.spec import LaunchSpec

__all__ = ["LaunchSpec"]
