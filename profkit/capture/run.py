"""One run: launch the target with an optimization state, drive the workload unprofiled, capture a
profile window at steady state, stop the server. The capture stops at traces/<run_id>/ (the traces
and manifest.json): it analyzes nothing; profkit/flows/trace.py summarizes what it recorded.

Every stage is recorded in traces/<run_id>/manifest.json before it starts, so a failure or Ctrl-C
leaves a manifest that says where it stopped and lists what was written. A recording whose analysis
follows (no --capture-only) hands its manifest on still running, for the flow to finish.
"""

from __future__ import annotations

import statistics
import subprocess
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Generator

from profkit.http import HTTPFailure, free_port
from profkit.capture.manifest import Accept, FailedInPass, Manifest, Overhead, Point, Spread, Warmup
from profkit.capture.gpu import wait_gpus_free
from profkit.capture.profile import log_size, start_profile, wait_for_traces
from profkit.capture import hostload
from profkit.capture import vllm as vllm_profile
from profkit.capture.process import held_signals
from profkit.capture.server import INTERRUPTED_GRACE_S, Server
from profkit.errors import Interrupted, ProfkitError, TargetError, UsageError
from profkit.targets.engines import target as target_named
from profkit.targets.gpus import gpu_compute_capabilities
from profkit.targets.spec import LaunchSpec
from profkit.targets.target import Launch
from profkit.workloads.agentic import Workload
from profkit.workloads.driver import DriveResult, Metrics, RequestRecord, drive

Progress = Callable[[str], None]


@dataclass(frozen=True)
class RunConfig:
    target: str = "proxy"
    preset: str | None = None
    model_path: str | None = None
    server_python: str | None = None
    extra_server_args: tuple[str, ...] = ()
    workload: Workload = field(default_factory=lambda: Workload(isl=256, turns=4, turn_tokens=32, output_tokens=32))
    concurrency: tuple[int, ...] = (1,)
    isl: tuple[int, ...] = ()  # extra input lengths to measure (the study's Figure 8); the first profiles
    repeat: int = 1
    num_steps: int = 20
    with_stack: bool = False
    record_shapes: bool = False
    profile_turn: int = 1
    health_timeout_s: float = 300.0
    profile_timeout_s: float = 120.0
    port: int | None = None
    traces_dir: Path = Path("traces")
    reports_dir: Path = Path("reports")
    marker: str | None = None
    min_bubble_us: float = 2.0
    catalog: str | None = None
    warmup: bool = True
    capture_only: bool = False  # record traces and the manifest; analyze elsewhere (e.g. a GPU box without polars)
    # how the runs of one trace/sweep were recorded (the manifest says it, reports show it): "alternating"
    # (servers side by side, repeats and windows A B A B) or "sequential" (one run after the other)
    capture_order: str = "sequential"
    nsys: bool = False  # wrap the server in `nsys profile --capture-range=cudaProfilerApi`; the window uses CUDA_PROFILER
    base: str = "on"  # how the states were chosen (recorded: reports of --base off say so)
    fit_context: bool = False  # trim the oldest history instead of refusing a workload that overflows the context
    accept_length: float | None = None  # SGLANG_SIMULATE_ACC_LEN: a fixed speculative accept length
    request_timeout_s: float = 3600.0
    profile_windows: int = 3  # profile windows of num_steps iterations each (the trace figures' noise estimate)


@dataclass
class Recording:
    """What one run recorded: its traces and its manifest. With --capture-only the manifest is finished
    ("ok"); else it is still running at its last capture stage, for the analysis (flows/trace.py) to finish."""

    run_id: str
    label: str
    states: dict[str, bool]
    trace_dir: Path
    files: list[Path]  # the trace files of every profile window (window-<i>/ folders); --nsys: the .nsys-rep
    manifest: Manifest


NSYS_ARGS = ("profile", "--trace-fork-before-exec=true", "--cuda-graph-trace=node", "--capture-range=cudaProfilerApi",
             "--capture-range-end=stop", "--force-overwrite=true")


def compose(cfg: RunConfig, states: dict[str, bool], port: int, *, nsys_output: Path | None = None,
            trace_dir: Path | None = None) -> LaunchSpec:
    """The target's launch spec for one state (targets/target.py), wrapped in `nsys profile` with --nsys."""
    spec = target_named(cfg.target).compose(Launch(
        states=states, port=port, preset=cfg.preset, model_path=cfg.model_path, server_python=cfg.server_python,
        extra_args=cfg.extra_server_args, trace_dir=trace_dir or cfg.traces_dir / "<run_id>", with_stack=cfg.with_stack,
        record_shapes=cfg.record_shapes, accept_length=cfg.accept_length))
    if cfg.nsys:
        import shutil

        nsys = shutil.which("nsys")
        if nsys is None:
            from profkit.errors import UsageError

            raise UsageError("--nsys: no `nsys` on PATH", hint="install Nsight Systems, or drop --nsys to profile with the torch profiler")
        out = str(nsys_output) if nsys_output else "profkit-%p"
        spec = replace(spec, argv=[nsys, *NSYS_ARGS, "-o", out, *spec.argv],
                       notes=[*spec.notes, "nsys: the profile window sends activities [CUDA_PROFILER] (cudaProfilerStart/Stop in TP rank 0)"])
    return spec


def _spread(values: list[float | None]) -> Spread:
    vals = [v for v in values if v is not None]
    if not vals:
        return {"median": None, "min": None, "max": None, "spread": None}
    # one measurement has no spread: None, so nothing is called "within" or "beyond" noise
    return {"median": statistics.median(vals), "min": min(vals), "max": max(vals), "n": len(vals),
            "spread": (max(vals) - min(vals)) if len(vals) > 1 else None}


def summarize_repeats(metrics: list[Metrics]) -> Point:
    """Each figure's spread over the repeats (a throughput point's figures)."""
    return {"tokens_per_s": _spread([m.get("tokens_per_s") for m in metrics]),
            "tokens_per_s_per_gpu": _spread([m.get("tokens_per_s_per_gpu") for m in metrics]),
            "tokens_per_s_per_user_p50": _spread([m.get("tokens_per_s_per_user_p50") for m in metrics]),
            "ttft_ms_p50": _spread([m.get("ttft_ms_p50") for m in metrics]), "itl_ms_p50": _spread([m.get("itl_ms_p50") for m in metrics]),
            "cache_hit_rate": _spread([m.get("cache_hit_rate") for m in metrics]),
            "accept_length": _spread([m.get("accept_length") for m in metrics])}


def record_one(cfg: RunConfig, states: dict[str, bool], run_id: str, *, label: str, progress: Progress = lambda s: None,
               tick: Progress = lambda s: None) -> Recording:
    """One run from start to end (its steps one after the other). `progress` gets one line per step (server
    start, warm-up, each repeat, each profile window, server stop); `tick` the same line with the profile
    window's decode step, many times a second."""
    return record_interleaved([(cfg, states, run_id, label)], progress, tick)[0]


def record_interleaved(jobs: list[tuple[RunConfig, dict[str, bool], str, str]], progress: Progress = lambda s: None,
                       tick: Progress = lambda s: None) -> list[Recording]:
    """Several runs side by side, their steps alternating (A B A B ...): every server is started, then
    each one's warm-up and unprofiled repeat in turn, then each one's profile window in turn, so that
    a drift of the host's load lands on every side alike (DESIGN.md "Judged, or not judged"); then
    each is stopped. One job: `record_one`. A failure stops every server, and finishes the manifest of
    a run already recorded whose analysis would have followed ("interrupted": none will)."""
    made: list[Manifest] = []  # every run's manifest, from the moment it exists (a run can end between its return and `results`)
    ids = [run_id for _, _, run_id, _ in jobs]
    gens = [run_steps(cfg, states, run_id, label=label, progress=progress, tick=tick, made=made,
                      recorded_with=[i for i in ids if i != run_id] if cfg.capture_order == "alternating" else [])
            for cfg, states, run_id, label in jobs]
    results: list[Recording | None] = [None] * len(gens)
    live = list(range(len(gens)))
    try:
        while live:
            for i in list(live):
                try:
                    next(gens[i])
                except StopIteration as done:
                    results[i] = done.value
                    live.remove(i)
    except BaseException:
        with held_signals(deliver=False):
            for g in gens:  # each unfinished run stops its server and finishes its manifest (run_steps' GeneratorExit)
                g.close()
            stored = {id(r.manifest) for r in results if r is not None}
            for m in made:  # what is still running was recorded and will not be analyzed
                if m.data.get("status") == "running":
                    m.finish("interrupted", error="recorded, not analyzed: another run recorded alongside it was interrupted or failed"
                             if id(m) in stored else "recorded, not analyzed: the command failed or was interrupted as the recording ended")
        raise
    return [r for r in results if r is not None]


def run_steps(cfg: RunConfig, states: dict[str, bool], run_id: str, *, label: str, progress: Progress = lambda s: None,
              tick: Progress = lambda s: None, made: list[Manifest] | None = None, recorded_with: list[str] | None = None) -> Generator[str, None, Recording]:
    """One run as a generator: it yields after its server is up, after each unprofiled repeat and after
    each profile window (the points where `record_interleaved` lets the next run take its turn), and
    returns the Recording. Its manifest is appended to `made` as soon as it exists. `recorded_with`: the
    runs whose steps alternate with its own (the manifest says so: a gate of such a pair is paired)."""
    trace_dir = cfg.traces_dir / run_id
    port = cfg.port or free_port()
    target = target_named(cfg.target)
    spec = compose(cfg, states, port, nsys_output=trace_dir / run_id, trace_dir=trace_dir)
    # the engine's own profiler output (graph-capture profiles) lands in the run folder: analyze/diff categorize
    # replayed kernels from traces/<run_id>/graph_capture_profile/
    if profiler_env := target.profiler_env(trace_dir):
        spec = replace(spec, env={**spec.env, **profiler_env})
    early = held_signals().hold()  # no interrupt between the manifest's creation and the `try` that finishes it
    trace_dir.mkdir(parents=True, exist_ok=False)
    warnings = list(spec.notes) + _accept_length_warning(cfg, spec)
    manifest = Manifest.create(
        trace_dir / "manifest.json",
        label=label, target=cfg.target, preset=cfg.preset, optimizations=states, base=cfg.base,
        command=spec.shell(), argv=spec.argv, env=spec.env, env_unset=list(spec.unset), world_size=spec.world_size,
        workload={**cfg.workload.describe(), "concurrency": list(cfg.concurrency), "isl_sweep": list(cfg.isl), "repeat": cfg.repeat},
        profile={"num_steps": cfg.num_steps, "windows": cfg.profile_windows, "with_stack": cfg.with_stack, "record_shapes": cfg.record_shapes, "profile_turn": cfg.profile_turn},
        capture_order=cfg.capture_order, recorded_with=list(recorded_with or []),
        versions={"profkit": manifest_version()}, warnings=warnings, failed_requests=[],
    )
    if made is not None:
        made.append(manifest)
    server = Server(spec, trace_dir / "server.log")
    try:
        early.release()  # a signal that came while the manifest was created: interrupted at "starting"
        manifest.stage("validate")
        checked = target.validate(spec)
        if checked:
            manifest.record(checked)
        if not target.reports_versions:
            manifest.update(versions={"profkit": manifest_version(), **_local_versions(spec)})
        variants: dict[int, Workload] = {}
        if spec.context_length is not None:
            variants = _fit_workloads(cfg, spec.context_length, spec.reserved_tokens, "the command line's --context-length", manifest)
        if target.claims_gpus:
            manifest.update(gpu_check=wait_gpus_free(spec.world_size))
        manifest.stage("server_start")
        progress(f"{label}: starting the {cfg.target} server on port {port}")
        server.start(on_spawn=lambda pid: manifest.update(server_pid=pid))
        server.wait_healthy(cfg.health_timeout_s)
        info = target.server_info(spec.base_url)
        manifest.update(server_info=info, versions={**manifest.data["versions"], **_versions(info)})
        yield "started"
        if not variants:
            ctx = target.context_length(info)
            if ctx is not None:
                manifest.stage("context_check")
                variants = _fit_workloads(cfg, ctx, spec.reserved_tokens, "the server's context length (/server_info)", manifest)
        isls = list(cfg.isl) or [cfg.workload.isl]
        variants = variants or {isl: replace(cfg.workload, isl=isl) if cfg.workload.replay is None else cfg.workload for isl in isls}
        points: list[Point] = []
        load = hostload.HostLoad()  # what else the machine did meanwhile (capture/hostload.py)
        primary: list[Metrics] = []
        failed: list[FailedInPass] = []
        for isl in isls:
            for conc in cfg.concurrency:
                warm = _warm_up(cfg, spec, server, manifest, variants[isl], isl, conc, label, progress) if cfg.warmup else None
                manifest.stage("workload")
                reps: list[Metrics] = []
                for r in range(cfg.repeat):
                    progress(f"{label}: workload isl={isl} concurrency={conc} repeat {r + 1}/{cfg.repeat}")
                    wl = replace(variants[isl], seed=cfg.workload.seed + 7919 * (r + 1) + isl + 131 * conc)
                    spec0 = vllm_profile.spec_counters(spec.base_url) if target.window == "vllm" else None
                    h0 = hostload.sample()
                    res = drive(spec.base_url, wl, concurrency=conc, timeout_s=cfg.request_timeout_s, api=spec.api, model=spec.model)
                    load.measure(f"repeat {r + 1} isl={isl} concurrency={conc}", h0, hostload.sample())
                    _check_transport(res, server, "workload")
                    failed += [{"isl": isl, "concurrency": conc, "repeat": r, **f} for f in res.failed_json()]
                    reps.append(res.metrics(spec.world_size, gpu=has_gpu()))
                    if spec0 is not None:  # vLLM's own spec-decode counters over this repeat
                        reps[-1]["accept_length"] = vllm_profile.accept_length(spec0, vllm_profile.spec_counters(spec.base_url))
                    yield "repeat"
                point: Point = {"isl": isl, "concurrency": conc, "repeats": reps, **summarize_repeats(reps)}
                if warm is not None:
                    point["warmup"] = warm
                points.append(point)
                if isl == isls[0] and conc == cfg.concurrency[0]:
                    primary = reps
                manifest.update(throughput=points, failed_requests=failed, host_load=load.doc())
        if failed:
            n = sum(m.get("requests", 0) + m.get("failed_requests", 0) for p in points for m in p["repeats"])
            f0 = failed[0]
            raise TargetError(f"{len(failed)} of {n} requests of the measured pass failed (excluded from the throughput); "
                              f"first: conversation {f0['conversation']} turn {f0['turn']} ({f0['prompt_tokens']} prompt tokens): {f0['error']}",
                              hint=f"every failed request is listed under failed_requests in {manifest.path}; see {server.log_path}")
        manifest.stage("capture")
        files, overhead = yield from _capture(cfg, spec, server, run_id, trace_dir, primary, manifest, variants[isls[0]], label, progress, tick, load)
        manifest.update(trace_files=[str(f.relative_to(trace_dir)) for f in files], profiler_overhead=overhead, host_load=load.doc(),
                        capture_traces=[str(p.relative_to(trace_dir)) for p in capture_traces(trace_dir)])
        manifest.stage("server_stop")
        progress(f"{label}: stopping the server (up to {spec.teardown_s:.0f} s for its own teardown)")
        server.stop(grace_s=max(spec.teardown_s, 60) if cfg.nsys else None)
        _record_stop(manifest, server)
        if cfg.nsys:  # the report; analyzed through its SQLite export (flows/trace.py), unless --capture-only
            rep = _wait_file(trace_dir / f"{run_id}.nsys-rep", cfg.profile_timeout_s)
            manifest.update(trace_files=[rep.name], note="an Nsight Systems report: `profkit analyze` exports it with `nsys export --type sqlite`")
            files = [rep]
        if cfg.capture_only:
            manifest.finish("ok")
        return Recording(run_id, label, states, trace_dir, files, manifest)
    except GeneratorExit:  # record_interleaved stopped it: another run of the same command failed or was interrupted
        with held_signals(deliver=False):  # the command is already ending: a Ctrl-C meanwhile is the same end
            server.stop(grace_s=5)
            _record_stop(manifest, server, trace_files=_written(trace_dir))  # its pid and how it ended, as every stop records
            manifest.finish("interrupted", error=f"stopped during {manifest.data['stage']}: another run recorded alongside it "
                                                 "was interrupted or failed")
        raise
    except KeyboardInterrupt:
        with held_signals(deliver=False):  # a second Ctrl-C while the tree is torn down and the manifest written is the same interrupt
            server.stop(grace_s=INTERRUPTED_GRACE_S)
            _record_stop(manifest, server, trace_files=_written(trace_dir))
            manifest.finish("interrupted", error=f"interrupted during {manifest.data['stage']}")
        raise Interrupted(f"interrupted during {manifest.data['stage']}; kept {trace_dir}", hint=f"see {trace_dir / 'manifest.json'}") from None
    except (ProfkitError, HTTPFailure) as e:
        # a Ctrl-C meanwhile hurries the stop and interrupts once the failure is recorded (the manifest says it)
        with held_signals():
            if isinstance(e, HTTPFailure):  # the server stopped answering: say whether it died
                e = server.died(f"died during the {manifest.data['stage']}") if server.exited() else TargetError(
                    f"the server stopped answering during the {manifest.data['stage']}: {e}", hint=f"see {server.log_path}")
            server.stop()
            _record_stop(manifest, server, trace_files=_written(trace_dir))
            manifest.finish("failed", error=str(e))
        raise e from None
    finally:
        server.stop(grace_s=INTERRUPTED_GRACE_S)


def _record_stop(manifest: Manifest, server: Server, trace_files: list[str] | None = None) -> None:
    """The server's pid and how it ended, and any of its processes still running (none, unless a kill failed);
    `trace_files`: what the run had written, where it ended early."""
    if trace_files is not None:
        manifest.update(trace_files=trace_files, server_exit=server.ended, leftover_pids=server.leftovers())
    else:
        manifest.update(server_exit=server.ended, leftover_pids=server.leftovers())


def _accept_length_warning(cfg: RunConfig, spec: LaunchSpec) -> list[str]:
    if cfg.accept_length is not None or cfg.workload.replay is not None:
        return []
    if spec.reserved_tokens == 0:  # not speculative (or no slots the engine reserves for drafts: SGLang's EAGLE only)
        return []
    return ["random token ids make the speculative accept length whatever the model makes of noise: pass --accept-length 5 "
            "(SGLANG_SIMULATE_ACC_LEN, the study's Figure 8 setting) or replay real conversations with --workload-file"]


def _fit_workloads(cfg: RunConfig, context_length: int, reserved: int, source: str, manifest: Manifest) -> dict[int, Workload]:
    """The workload of every input length, checked against the context length (refused) or,
    with --fit-context, trimmed to it (and the manifest says so)."""
    out: dict[int, Workload] = {}
    notes: list[str] = []
    for isl in list(cfg.isl) or [cfg.workload.isl]:
        wl = replace(cfg.workload, isl=isl) if cfg.workload.replay is None else cfg.workload
        over = wl.overflow(context_length, reserved)
        if over is not None and cfg.fit_context:
            wl, note = wl.fit(context_length, reserved)
            if note:
                notes.append(note)
        elif over is not None:
            conv, turn, need = over
            lens = wl.prompt_lengths(conv)
            what = f"conversation {conv} of the workload file" if wl.replay is not None else f"--isl {isl} --turns {wl.turns} --turn-tokens {wl.turn_tokens} --output-tokens {wl.output_tokens}"
            raise UsageError(
                f"the workload overflows the context: turn {turn} (0-based) of {what} needs {need} tokens "
                f"({lens[turn]} input + {wl.output_tokens} output + {reserved} reserved for speculative decoding) "
                f"but {source} is {context_length}",
                hint="lower --isl, --turns, --turn-tokens or --output-tokens, or pass --fit-context to trim the oldest history",
            )
        out[isl] = wl
    manifest.update(context={"length": context_length, "source": source, "reserved_tokens": reserved, "fit": notes})
    if notes:
        manifest.update(warnings=[*manifest.data.get("warnings", []), *notes])
    return out


def _local_versions(spec: LaunchSpec) -> dict[str, object]:
    """The GPU and the engine's torch, asked of this machine: /server_info reports neither
    (it is the resolved server args, scheduler info, internal states and `version`)."""
    out: dict[str, object] = {}
    try:
        p = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True, timeout=20)
        names = [x.strip() for x in p.stdout.splitlines() if x.strip()] if p.returncode == 0 else []
    except (OSError, subprocess.TimeoutExpired):
        names = []
    out["gpu"] = names[0] if names else None
    out["gpu_count"] = len(names)
    try:
        p = subprocess.run([spec.argv[0], "-c", "import importlib.metadata as m; print(m.version('torch'))"], capture_output=True,
                           text=True, timeout=60)
        out["torch"] = p.stdout.strip() or None if p.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired):
        out["torch"] = None
    return out


def _wait_file(path: Path, timeout_s: float) -> Path:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists() and path.stat().st_size > 0:
            return path
        time.sleep(0.5)
    raise TargetError(f"nsys did not write {path} within {timeout_s:.0f} s", hint="see server.log for nsys's own messages")


def manifest_version() -> str:
    from profkit import __version__

    return __version__


def _written(trace_dir: Path) -> list[str]:
    return sorted(str(p.relative_to(trace_dir)) for p in [*trace_dir.glob("*.trace.json.gz"), *trace_dir.glob("window-*/*.trace.json.gz")])


def capture_traces(trace_dir: Path) -> list[Path]:
    """The run's CUDA-graph capture profiles (SGLang's and the proxy's graph_capture_profile/ folder)."""
    return sorted(p for p in (trace_dir / "graph_capture_profile").glob("*.json.gz") if not p.name.startswith(".") and ".tmp" not in p.name)


def has_gpu() -> bool:
    """Whether this machine has a GPU an engine could use: nvidia-smi lists one, or rocm-smi exists
    (no nvidia-smi and no rocm-smi: a CPU machine, where "tokens/s per GPU" means nothing)."""
    import shutil

    caps = gpu_compute_capabilities()
    return caps != [] or shutil.which("rocm-smi") is not None


def _versions(info: dict[str, object]) -> dict[str, object]:
    """What /server_info says about versions: SGLang's `version`; the proxy also reports its torch and device."""
    out: dict[str, object] = {}
    for k, name in (("version", "engine"), ("torch_version", "torch"), ("device", "gpu")):
        if info.get(k) is not None:
            out[name] = info[k]
    return out


def _check_transport(res: DriveResult, server: Server, what: str) -> DriveResult:
    if res.errors or res.failed:  # a stream cut off may be a dead server: say so first, once it is seen exiting
        if server.exited():
            raise server.died(f"died during the {what}")
    if res.errors:
        raise TargetError(f"the server stopped answering during the {what}: {res.errors[0]}", hint=f"see {server.log_path}")
    return res


def _warm_up(cfg: RunConfig, spec: LaunchSpec, server: Server, manifest: Manifest, workload: Workload, isl: int, conc: int,
             label: str, progress: Callable[[str], None]) -> Warmup:
    """One unmeasured pass of the point's own shape (its ISL, turns, output tokens and concurrency; other token ids,
    so no prefix is cached for the measured passes): whatever an engine does the first time it meets a shape
    (the proxy captures its CUDA graphs per context bucket and batch size as it meets them; JIT compiles,
    autotuning, allocator growth) happens here and not in the first measured repeat. Its wall time and
    throughput go to the manifest, next to the repeats they are not part of."""
    manifest.stage("warmup")
    progress(f"{label}: warm-up pass isl={isl} concurrency={conc}")
    w = replace(workload, seed=cfg.workload.seed + 999_983 + isl + 131 * conc)
    res = _check(drive(spec.base_url, w, concurrency=conc, timeout_s=cfg.request_timeout_s, api=spec.api, model=spec.model), server, "warm-up")
    m = res.metrics(spec.world_size)
    return {"duration_s": m.get("duration_s"), "tokens_per_s": m.get("tokens_per_s")}


def _check(res: DriveResult, server: Server, what: str) -> DriveResult:
    _check_transport(res, server, what)
    if res.failed:
        f = res.failed[0]
        raise TargetError(f"{len(res.failed)} request(s) failed during the {what}; first: conversation {f.conversation} turn {f.turn}: {f.error}",
                          hint=f"see {server.log_path}")
    return res


def _capture(cfg: RunConfig, spec: LaunchSpec, server: Server, run_id: str, trace_dir: Path, primary: list[Metrics],
             manifest: Manifest, workload: Workload, label: str, progress: Progress, tick: Progress,
             load: hostload.HostLoad | None = None) -> Generator[str, None, tuple[list[Path], Overhead]]:
    """`--profile-windows` windows, each in its own fresh pass (DESIGN.md "Noise": repeated profile windows;
    a short decode would end before a second window could open in the same pass); one window: at the top.
    A generator (yields after each window, see run_steps); returns (files, profiler overhead)."""
    n = 1 if cfg.nsys else max(1, cfg.profile_windows)
    files: list[Path] = []
    overheads: list[Overhead] = []
    for w in range(n):
        out_dir = trace_dir / f"window-{w}" if n > 1 else trace_dir
        out_dir.mkdir(parents=True, exist_ok=True)
        where = f"{label}: profile window {w + 1}/{n}"
        steps = f"{cfg.num_steps} iteration" + ("" if cfg.num_steps == 1 else "s")
        progress(f"{where} of {steps}: waiting for turn {min(cfg.profile_turn, workload.turns - 1)}'s decode")
        h0 = hostload.sample()

        def on_tick(j: int, w: str = where, steps: str = steps) -> None:
            tick(f"{w}: iteration ~{j}/{cfg.num_steps}" if j < cfg.num_steps else f"{w}: {steps}; the server writes the trace")

        def on_open(w: str = where, steps: str = steps) -> None:
            progress(f"{w}: profiling {steps}")

        got, oh = _capture_window(cfg, spec, server, run_id, out_dir, primary, manifest, workload, seed=cfg.workload.seed + 424_242 + 7 * w,
                                  tick=on_tick, opened=on_open)
        if load is not None:
            load.measure(f"profile window {w + 1}", h0, hostload.sample())
        files += got
        overheads.append(oh)
        yield "window"
    return files, overheads[0] if n == 1 else {**overheads[0], "windows": overheads}


def _capture_window(cfg: RunConfig, spec: LaunchSpec, server: Server, run_id: str, trace_dir: Path, primary: list[Metrics],
                    manifest: Manifest, workload: Workload, *, seed: int,
                    tick: Callable[[int], None] = lambda j: None, opened: Callable[[], None] = lambda: None) -> tuple[list[Path], Overhead]:
    """Drive a fresh pass; once every conversation is inside `profile_turn` and decoding, open the window.
    `tick(j)`: the window's decode step as the stream shows it (chunks since the window opened, the
    most any one conversation got; an estimate: the server does not report its profiler's steps)."""
    conc = cfg.concurrency[0]
    wl = replace(workload, seed=seed)
    turn = min(cfg.profile_turn, wl.turns - 1)
    submitted: dict[int, int] = {}
    ready = threading.Event()
    decoding: set[int] = set()  # conversations whose profiled turn has streamed its first token: past prefill
    all_decoding = threading.Event()
    lock = threading.Lock()

    # vLLM: the profiled turn's requests wait (in the driver's threads, before they are sent) until the
    # window is open. vLLM counts the window in engine steps and has none while idle, so the window then
    # starts with that turn's prefill; a request sent first can finish before the profiler starts (a small
    # model decodes a token in about a millisecond on a quiet CPU), leaving a window without a step
    held = target_named(cfg.target).window == "vllm"
    gate = threading.Event()

    def on_submit(conv: int, t: int) -> None:
        if t == turn:
            with lock:
                submitted[conv] = t
                if len(submitted) >= conc:
                    ready.set()
            if held:
                gate.wait(cfg.profile_timeout_s)

    result: dict[str, DriveResult] = {}
    stop = threading.Event()
    window_open = threading.Event()
    chunks: dict[int, int] = {}
    shown = [0]

    def on_chunk(conv: int) -> None:
        if not window_open.is_set():
            with lock:
                if conv in submitted and conv not in decoding:  # a chunk after its profiled turn was sent: that turn's
                    decoding.add(conv)
                    if len(decoding) >= conc:
                        all_decoding.set()
            return
        with lock:
            chunks[conv] = chunks.get(conv, 0) + 1
            j = min(max(chunks.values()), cfg.num_steps)
            if j == shown[0]:
                return
            shown[0] = j
        tick(j)

    th = threading.Thread(target=lambda: result.setdefault("r", drive(spec.base_url, wl, concurrency=conc, on_submit=on_submit, stop=stop,
                                                                      timeout_s=cfg.request_timeout_s, api=spec.api, model=spec.model,
                                                                      on_chunk=on_chunk)),
                          daemon=True)
    th.start()
    while not ready.wait(0.2):
        if not th.is_alive():
            res = result.get("r")
            _check(res, server, "capture pass") if res else None
            raise TargetError("the capture pass ended before reaching the profiled turn", hint="raise --turns or lower --profile-turn")
        if not server.alive():
            raise server.died("died during the capture pass")
    if held:
        # before the profiled turn is sent (it waits on `gate`): the window opens with that turn's prefill
        # (one step for a short prompt) and holds num_steps steps
        t_start = time.perf_counter()
        prefix = f"{run_id}-{trace_dir.name}" if trace_dir.name.startswith("window-") else run_id
        counted = vllm_profile.spec_counters(spec.base_url)  # the window's accepted length: the counters' change across it
        try:
            manifest.update(profile_request=vllm_profile.start(spec.base_url, prefix=prefix, num_steps=cfg.num_steps))
        finally:
            gate.set()  # the requests go, whether the window opened or not (a failure is raised here, not hung on)
        got = vllm_profile.finish(spec.base_url, cfg.traces_dir / run_id, prefix, spec.world_size, timeout_s=cfg.profile_timeout_s,
                                  alive=server.alive, idle=lambda: not th.is_alive())
        accept = vllm_profile.window_accept(counted, vllm_profile.spec_counters(spec.base_url))
        files = vllm_profile.into_window(got, trace_dir)
        return _after_window(cfg, server, th, result, primary, files, t_start, accept=accept)
    # the window opens once every conversation's profiled turn is decoding (its first token streamed): an
    # event, not a guess from the unprofiled pass's latency (on a host whose load changed since, a wait of
    # 0.3 x e2e could outlast a short turn and open the window on an idle server: "captured nothing")
    while not all_decoding.wait(0.05):
        if not th.is_alive():
            break  # the pass ended (a turn shorter than one chunk): the window opens now and says what it got
        if not server.alive():
            raise server.died("died during the capture pass")
    log_offset = log_size(server.log_path)
    t_start = time.perf_counter()
    body = start_profile(spec.base_url, output_dir=trace_dir, profile_id=run_id, num_steps=cfg.num_steps, with_stack=cfg.with_stack,
                         record_shapes=cfg.record_shapes, activities=("CUDA_PROFILER",) if cfg.nsys else ("CPU", "GPU"))
    manifest.update(profile_request=body)
    window_open.set()
    opened()
    if cfg.nsys:  # no torch-profiler files: the window closes after num_steps; nsys writes its report when the server exits
        while th.is_alive():
            th.join(0.2)
        return [], {"note": "nsys mode: profiler overhead not measured"}
    notes: list[str] = []
    files = wait_for_traces(spec.base_url, trace_dir, run_id, spec.world_size, timeout_s=cfg.profile_timeout_s, alive=server.alive,
                            idle=lambda: not th.is_alive(), log_path=server.log_path, log_offset=log_offset, notes=notes)
    if notes:
        manifest.update(profile_stop=[*manifest.data.get("profile_stop", []), *notes])
    return _after_window(cfg, server, th, result, primary, files, t_start)


def _after_window(cfg: RunConfig, server: Server, th: threading.Thread, result: dict[str, DriveResult], primary: list[Metrics],
                  files: list[Path], t_start: float, accept: Accept | None = None) -> tuple[list[Path], Overhead]:
    """Let the capture pass finish; the profiler's overhead from the requests that ran during the window, and the
    window's accepted length (`accept`: vLLM's counters, else the requests' own counts)."""
    t_end = time.perf_counter()
    while th.is_alive():
        th.join(0.2)
        if not server.alive():
            raise server.died("died during the capture pass")
    res = _check(result["r"], server, "capture pass")
    during = [r for r in res.records if r.ok and r.start_s < t_end and r.start_s + r.e2e_s > t_start and r.ttft_s is not None and r.completion_tokens > 1
              and r.e2e_s > r.ttft_s]
    prof_user = statistics.median([(r.completion_tokens - 1) / (r.e2e_s - r.ttft_s) for r in during if r.ttft_s is not None]) if during else None
    base_user = statistics.median([v for m in primary if (v := m.get("tokens_per_s_per_user_p50"))] or [0]) or None
    overhead: Overhead = {
        "tokens_per_s_per_user_unprofiled": base_user,
        "tokens_per_s_per_user_profiled": prof_user,
        "slowdown": (base_user / prof_user) if (base_user and prof_user) else None,
        "window_s": t_end - t_start,
        "requests_in_window": len(during),
        "accept": accept if accept is not None else window_accept(during),
    }
    return files, overhead


def window_accept(during: list[RequestRecord]) -> Accept | None:
    """The accepted length of the tokens decoded in a profile window, from the server's own per-request counts
    (SGLang's and the proxy's final meta_info: completion_tokens and spec_verify_ct, the verify rounds) over the
    requests that were decoding while the window was open. Each request's first token comes from its prefill,
    not from a verify round: `accept_length` = (Σ completion_tokens − requests) / Σ spec_verify_ct, the tokens
    one verify iteration emits; `server_accept_length` = Σ completion_tokens / Σ spec_verify_ct, SGLang's
    `spec_accept_length` as it reports it. None when the server reports no verify rounds (not speculative)."""
    spec = [r for r in during if r.spec_verify_ct]
    if not spec:
        return None
    tokens = sum(r.completion_tokens for r in spec)
    verify = sum(int(r.spec_verify_ct or 0) for r in spec)
    return {"accept_length": (tokens - len(spec)) / verify, "server_accept_length": tokens / verify,
            "completion_tokens": tokens, "spec_verify_ct": verify, "requests": len(spec),
            "source": "server: completion_tokens / spec_verify_ct of the requests decoding during the window"}
