"""Engines profkit can launch: the built-in proxy engine, SGLang and vLLM. Each is a Target (target.py) that
composes a LaunchSpec; engines.py names them."""

from profkit.targets.spec import LaunchSpec

__all__ = ["LaunchSpec"]
