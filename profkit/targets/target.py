"""What every engine profkit can launch answers: the `Target` protocol, `Launch`, what the command
line asks of one server, and `Optimization`, one row of an engine's optimization table. The run
(capture/run.py) and the registry's rules (targets/registry.py) call a target through this protocol
only, never by its name; each engine is its module (targets/<engine>.py: its Target and its
optimizations), its catalog (kernels/<engine>.toml) and a line in targets/engines.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple, Protocol

from profkit.targets.spec import LaunchSpec


@dataclass(frozen=True)
class Switch:
    """What to add to the server's command line and environment for one state of an optimization."""

    args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    model_override: dict[str, object] = field(default_factory=dict)  # merged into --json-model-override-args


@dataclass(frozen=True)
class Optimization:
    """One studied optimization of an engine: its real on/off switch and what it depends on."""

    name: str
    title: str  # the study's name for it
    on: Switch
    off: Switch
    kernels: str  # what it is expected to touch, in words (the catalog holds the categories)
    note: str = ""
    meaning: str = ""  # what the switch really does in the engine release profkit targets
    requires: tuple[str, ...] = ()  # optimizations that must be on for this one to do anything
    requires_why: str = ""


class Capability(NamedTuple):
    """An optimization that does nothing on GPUs outside these compute-capability majors (warned: the runs still go)."""

    majors: tuple[int, ...]
    why: str


@dataclass(frozen=True)
class Launch:
    """One server launch as the command line asks for it, whatever the engine (each target reads what it takes)."""

    states: dict[str, bool]  # optimization -> on/off
    port: int
    host: str = "127.0.0.1"
    preset: str | None = None
    model_path: str | None = None
    server_python: str | None = None
    extra_args: tuple[str, ...] = ()
    trace_dir: Path = Path("traces") / "<run_id>"  # where the profiler writes (an engine whose profiler is set at launch)
    with_stack: bool = False
    record_shapes: bool = False
    accept_length: float | None = None  # a fixed speculative accept length, where the engine can simulate one


@dataclass(frozen=True)
class Defaults:
    """What a run of the target takes where the command line does not say (trace, sweep, calibrate)."""

    isl: int  # first-prompt tokens (--isl)
    turn_tokens: int  # new tokens per later turn (--turn-tokens)
    output_tokens: int  # output tokens per turn (--output-tokens)
    health_timeout_s: float  # seconds to wait for /health (--health-timeout)
    alternate: bool  # runs recorded side by side, A B A B (--alternate/--sequential)


@dataclass(frozen=True)
class OptsWords:
    """How `profkit opts` words the target's registry."""

    unset: str  # a switch with no flag and no environment variable
    off: str | None = None  # every off switch, where the engine's switches are not its flags (None: the switch's own)
    note: str | None = None  # after the title, in parentheses


class Target(Protocol):
    """An engine profkit launches, drives and profiles."""

    @property
    def name(self) -> str:
        """The `--target` value, recorded in the manifest."""
        ...

    @property
    def package(self) -> str | None:
        """The Python package the server's Python must import before any server starts (None: profkit's own engine)."""
        ...

    @property
    def window(self) -> str:
        """How a profile window is opened and its files found: "sglang" (POST /start_profile with output_dir and
        num_steps; the server logs when every rank has written: SGLang and the proxy) or "vllm" (the profiler set on
        the command line, /start_profile with max_iterations, /stop_profile; the profiled turn waits for the window;
        speculative counters from /metrics)."""
        ...

    @property
    def claims_gpus(self) -> bool:
        """Whether the server claims a fixed share of every GPU's memory at start-up, so it starts only on free GPUs."""
        ...

    @property
    def reports_versions(self) -> bool:
        """Whether its server info names the torch and the device it runs (else they are asked of this machine)."""
        ...

    @property
    def takes(self) -> frozenset[str]:
        """The engine's own options it takes, of "preset", "accept_length" and "fault" (others refuse them)."""
        ...

    @property
    def optimizations(self) -> tuple[Optimization, ...]:
        """Its optimizations, in the order `profkit opts` lists them and a run's states go."""
        ...

    @property
    def gpu_only(self) -> Mapping[str, str]:
        """Its optimizations that do nothing without a GPU, with why (refused on a CPU: the engine would ignore them)."""
        ...

    @property
    def hardware(self) -> Mapping[str, Capability]:
        """Its optimizations that do nothing outside some compute capabilities (warned: the runs still go)."""
        ...

    @property
    def defaults(self) -> Defaults:
        """The workload and run defaults of this target."""
        ...

    @property
    def opts_words(self) -> OptsWords:
        """How `profkit opts` words its registry."""
        ...

    def capabilities(self) -> list[str] | None:
        """This machine's GPU compute capabilities, for the registry's hardware rules (None: the target has none)."""
        ...

    def dry_run_checks(self, spec: LaunchSpec) -> list[str]:
        """What a dry run checks of a composed launch without starting it: refuse (TargetError, UsageError) or its lines."""
        ...

    def compose(self, launch: Launch) -> LaunchSpec:
        """The server's command line, environment and where it listens, for one optimization state."""
        ...

    def profiler_env(self, trace_dir: Path) -> dict[str, str]:
        """Environment that points the engine's own profiler output (graph-capture profiles) into the run folder."""
        ...

    def validate(self, spec: LaunchSpec) -> dict[str, object]:
        """Refuse (TargetError, UsageError) what the engine would die on at start-up; what was checked, for the manifest."""
        ...

    def server_info(self, base_url: str) -> dict[str, object]:
        """What the running server says about itself (its resolved arguments, version, model)."""
        ...

    def context_length(self, info: Mapping[str, object]) -> int | None:
        """The context length the running server enforces, from its server info (None: unknown)."""
        ...

    def catalog(self, manifest: Mapping[str, object]) -> str | None:
        """The shipped kernel catalog a run of this target implies, from its manifest (None: none implied)."""
        ...
