"""What it takes to start one server: argv, environment additions, where it listens."""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field


@dataclass(frozen=True)
class LaunchSpec:
    target: str
    argv: list[str]
    env: dict[str, str]  # added to the inherited environment
    host: str
    port: int
    world_size: int  # rank trace files one profile window writes
    preset: str | None = None
    states: dict[str, bool] = field(default_factory=dict)  # optimization -> on/off
    notes: list[str] = field(default_factory=list)
    unset: tuple[str, ...] = ()  # removed from the inherited environment (switches the registry owns)
    context_length: int | None = None  # from the command line; None: ask the server
    reserved_tokens: int = 0  # per-request slots the engine reserves on top of the input (EAGLE draft tokens)
    teardown_s: float = 20.0  # how long the engine's own graceful shutdown may take before profkit kills it
    api: str = "sglang"  # the request protocol: "sglang" (POST /generate, input_ids) or "openai" (POST /v1/completions, token ids)
    model: str | None = None  # the served model name ("openai" requests name it)

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def shell(self) -> str:
        """The command as one copy-pasteable shell line, environment first."""
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(self.env.items()))
        unset = " ".join(f"-u {k}" for k in self.unset)
        prefix = f"env {unset} " if unset else ""
        return prefix + (env + " " if env else "") + shlex.join(self.argv)
