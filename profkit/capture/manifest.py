"""traces/<run_id>/manifest.json: what a run was. Written first, updated atomically at each stage,
so an interrupted or failed run still says how far it got and what it had written.

The document is a `ManifestDoc` (every key this module and capture/run.py, flows/trace.py write, typed), kept
as the JSON value it is written as: its keys appear in the order the stages first set them (a run whose
context length the command line gave checks it before the server starts, another after), which no struct
with a fixed field order reproduces; documents.Manifest is how readers type it."""

from __future__ import annotations

import datetime as dt
import getpass
import platform
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

from profkit import __version__
from profkit.store import write_json_atomic
from profkit.workloads.driver import Metrics

if TYPE_CHECKING:
    from typing_extensions import Unpack  # typing's from Python 3.11

MANIFEST_SCHEMA = 1


def now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="milliseconds")


def git_revision(cwd: Path) -> str | None:
    try:
        p = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=5)
        return p.stdout.strip() or None if p.returncode == 0 else None
    except OSError:
        return None


class Host(TypedDict):
    python: str
    platform: str
    user: str | None


class Spread(TypedDict, total=False):
    """A figure over repeats (capture/run.summarize_repeats); `n` absent when no repeat had the figure."""
    median: float | None
    min: float | None
    max: float | None
    n: int
    spread: float | None


class Warmup(TypedDict):
    duration_s: float | None
    tokens_per_s: float | None


class Point(TypedDict, total=False):
    """One workload point of `throughput` (documents.ThroughputPoint reads it): its repeats and each figure's spread."""
    isl: int
    concurrency: int
    repeats: list[Metrics]
    tokens_per_s: Spread
    tokens_per_s_per_gpu: Spread
    tokens_per_s_per_user_p50: Spread
    ttft_ms_p50: Spread
    itl_ms_p50: Spread
    cache_hit_rate: Spread
    accept_length: Spread
    warmup: Warmup


class FailedInPass(TypedDict):
    """A failed request of the measured pass, with the point and repeat it belonged to."""
    isl: int
    concurrency: int
    repeat: int
    conversation: int
    turn: int
    prompt_tokens: int
    completion_tokens: int
    error: str | None


class Accept(TypedDict, total=False):
    """A profile window's accepted length: vLLM's spec-decode counters (capture/vllm.window_accept), or the requests' own counts
    (capture/run.window_accept)."""
    accept_length: float | None
    server_accept_length: float
    completion_tokens: int
    spec_verify_ct: int
    requests: int
    accepted_drafts: int  # vLLM's: the accepted drafts and draft tokens over the window
    draft_tokens: int
    source: str


class Overhead(TypedDict, total=False):
    """`profiler_overhead`: one window's (the first at the top), and every window's under `windows` when several."""
    tokens_per_s_per_user_unprofiled: float | None
    tokens_per_s_per_user_profiled: float | None
    slowdown: float | None
    window_s: float
    requests_in_window: int
    accept: Accept | None
    note: str  # --nsys: not measured
    windows: list[Overhead]


class HostLoadStep(TypedDict):
    step: str
    seconds: float
    other_cpus: float


class HostLoadDoc(TypedDict):
    """`host_load` (capture/hostload.py)."""
    cpus: int | None
    other_cpus_median: float | None
    other_cpus_max: float | None
    steps: list[HostLoadStep]


class Context(TypedDict):
    length: int
    source: str
    reserved_tokens: int
    fit: list[str]


class ManifestDoc(TypedDict, total=False):
    """manifest.json: every key profkit writes. `versions`, `server_info`, `server_exit` and the profile request
    are what the engine, its server and its profiler answered (their own keys)."""
    schema_version: int
    profkit_version: str
    run_id: str
    status: str  # running, ok, failed, interrupted
    stage: str
    started_at: str
    ended_at: str | None
    host: Host
    git_revision: str | None
    label: str
    target: str
    preset: str | None
    optimizations: dict[str, bool]
    base: str
    command: str
    argv: list[str]
    env: dict[str, str]
    env_unset: list[str]
    world_size: int
    workload: dict[str, object]  # Workload.describe(), concurrency, isl_sweep, repeat
    profile: dict[str, object]  # num_steps, windows, with_stack, record_shapes, profile_turn
    capture_order: str
    recorded_with: list[str]
    versions: dict[str, object]
    warnings: list[str]
    failed_requests: list[FailedInPass]
    parser_check: str  # SGLang's validate (targets/sglang.py)
    context: Context
    gpu_check: str
    server_pid: int
    server_info: dict[str, object]
    throughput: list[Point]
    host_load: HostLoadDoc
    profile_request: dict[str, object]
    profile_stop: list[str]
    trace_files: list[str]
    profiler_overhead: Overhead
    capture_traces: list[str]
    server_exit: dict[str, object] | None
    leftover_pids: list[int]
    note: str
    summary: str
    error: str | None


class Manifest:
    def __init__(self, path: Path, data: ManifestDoc) -> None:
        self.path = path
        self.data = data

    @classmethod
    def create(cls, path: Path, **fields: Unpack[ManifestDoc]) -> "Manifest":
        data: ManifestDoc = {
            "schema_version": MANIFEST_SCHEMA,
            "profkit_version": __version__,
            "run_id": path.parent.name,
            "status": "running",
            "stage": "starting",
            "started_at": now(),
            "ended_at": None,
            "host": {"python": platform.python_version(), "platform": platform.platform(), "user": _user()},
            "git_revision": git_revision(Path.cwd()),
            **fields,
            "trace_files": [],
            "error": None,
        }
        m = cls(path, data)
        m.write()
        return m

    def write(self) -> None:
        write_json_atomic(self.path, self.data)

    def update(self, **fields: Unpack[ManifestDoc]) -> None:
        self.data.update(fields)
        self.write()

    def record(self, found: dict[str, object]) -> None:
        """What the target's own check found (Target.validate: keys of its choosing, e.g. SGLang's `parser_check`)."""
        self.data.update(found)  # type: ignore[typeddict-item]  # the target's keys: ManifestDoc declares the known ones
        self.write()

    def stage(self, name: str) -> None:
        self.update(stage=name)

    def finish(self, status: str, error: str | None = None) -> None:
        self.update(status=status, error=error, ended_at=now())


def _user() -> str | None:
    try:
        return getpass.getuser()
    except Exception:
        return None
