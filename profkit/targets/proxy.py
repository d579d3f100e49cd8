"""profkit's built-in proxy engine as a target."""

from __future__ import annotations

import sys

from profkit.targets.spec import LaunchSpec


def compose(states: dict[str, bool], *, extra_args: list[str], port: int, host: str = "127.0.0.1", python: str | None = None) -> LaunchSpec:
    on = [n for n, v in states.items() if v]
    argv = [python or sys.executable, "-m", "profkit.proxy.server", "--host", host, "--port", str(port),
            "--opts", ",".join(on) if on else "none", *extra_args]
    return LaunchSpec(target="proxy", argv=argv, env={}, host=host, port=port, world_size=1, states=dict(states))
