"""One run: launch the target with an optimization state, drive the workload unprofiled, capture a
profile window at steady state, stop the server, analyze the traces into reports/<run_id>/summary.json.

Every stage is recorded in traces/<run_id>/manifest.json before it starts, so a failure or Ctrl-C
leaves a manifest that says where it stopped and lists what was written.
"""

from __future__ import annotations

import statistics
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

from profkit.capture.http import HTTPFailure, free_port, get_json
from profkit.capture.manifest import Manifest
from profkit.capture.profile import start_profile, wait_for_traces
from profkit.capture.server import Server
from profkit.errors import Interrupted, ProfkitError, TargetError
from profkit.targets import proxy as proxy_target
from profkit.targets import sglang as sglang_target
from profkit.targets.spec import LaunchSpec
from profkit.workloads.agentic import Workload
from profkit.workloads.driver import DriveResult, drive

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
    nsys: bool = False  # wrap the server in `nsys profile --capture-range=cudaProfilerApi`; the window uses CUDA_PROFILER


@dataclass
class RunResult:
    run_id: str
    states: dict[str, bool]
    trace_dir: Path
    report_dir: Path
    summary_path: Path
    summary: dict[str, Any]
    manifest: dict[str, Any]


NSYS_ARGS = ("profile", "--trace-fork-before-exec=true", "--cuda-graph-trace=node", "--capture-range=cudaProfilerApi",
             "--capture-range-end=stop", "--force-overwrite=true")


def compose(cfg: RunConfig, states: dict[str, bool], port: int, *, nsys_output: Path | None = None) -> LaunchSpec:
    if cfg.target == "proxy":
        spec = proxy_target.compose(states, extra_args=list(cfg.extra_server_args), port=port, python=cfg.server_python)
    else:
        spec = sglang_target.compose(states, preset=cfg.preset, model_path=cfg.model_path, extra_args=list(cfg.extra_server_args),
                                     server_python=cfg.server_python, port=port)
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


def _spread(values: list[float]) -> dict[str, float | None]:
    vals = [v for v in values if v is not None]
    if not vals:
        return {"median": None, "min": None, "max": None, "spread": None}
    # one measurement has no spread: None, so nothing is called "within" or "beyond" noise
    return {"median": statistics.median(vals), "min": min(vals), "max": max(vals), "n": len(vals),
            "spread": (max(vals) - min(vals)) if len(vals) > 1 else None}


def summarize_repeats(metrics: list[dict[str, Any]]) -> dict[str, Any]:
    keys = ("tokens_per_s", "tokens_per_s_per_gpu", "tokens_per_s_per_user_p50", "ttft_ms_p50", "itl_ms_p50", "cache_hit_rate", "accept_length")
    return {k: _spread([m.get(k) for m in metrics]) for k in keys}


def run_one(cfg: RunConfig, states: dict[str, bool], run_id: str, *, label: str, progress: Progress = lambda s: None) -> RunResult:
    trace_dir = cfg.traces_dir / run_id
    report_dir = cfg.reports_dir / run_id
    port = cfg.port or free_port()
    spec = compose(cfg, states, port, nsys_output=trace_dir / run_id)
    trace_dir.mkdir(parents=True, exist_ok=False)
    manifest = Manifest.create(
        trace_dir / "manifest.json",
        label=label, target=cfg.target, preset=cfg.preset, optimizations=states,
        command=spec.shell(), argv=spec.argv, env=spec.env, world_size=spec.world_size,
        workload={**cfg.workload.describe(), "concurrency": list(cfg.concurrency), "isl_sweep": list(cfg.isl), "repeat": cfg.repeat},
        profile={"num_steps": cfg.num_steps, "with_stack": cfg.with_stack, "record_shapes": cfg.record_shapes, "profile_turn": cfg.profile_turn},
        versions={"profkit": manifest_version()},
    )
    server = Server(spec, trace_dir / "server.log")
    try:
        if cfg.target == "sglang":
            manifest.stage("validate")
            sglang_target.check_gpu(spec, sglang_target.gpu_compute_capabilities())
            manifest.update(parser_check=sglang_target.validate(spec) or "passed")
        manifest.stage("server_start")
        progress(f"{label}: starting the {cfg.target} server on port {port}")
        server.start()
        manifest.update(server_pid=server.pid)
        server.wait_healthy(cfg.health_timeout_s)
        info = _server_info(spec.base_url)
        manifest.update(server_info=info, versions={"profkit": manifest_version(), **_versions(info)})
        if cfg.warmup:
            manifest.stage("warmup")
            progress(f"{label}: warm-up")
            w = replace(cfg.workload, seed=cfg.workload.seed + 999_983, turns=2, output_tokens=min(8, cfg.workload.output_tokens))
            _check(drive(spec.base_url, w, concurrency=1), server, "warm-up")

        manifest.stage("workload")
        points: list[dict[str, Any]] = []
        primary: list[dict[str, Any]] = []
        isls = list(cfg.isl) or [cfg.workload.isl]
        for isl in isls:
            for conc in cfg.concurrency:
                reps = []
                for r in range(cfg.repeat):
                    progress(f"{label}: workload isl={isl} concurrency={conc} repeat {r + 1}/{cfg.repeat}")
                    wl = replace(cfg.workload, isl=isl, seed=cfg.workload.seed + 7919 * (r + 1) + isl + 131 * conc)
                    res = _check(drive(spec.base_url, wl, concurrency=conc), server, "workload")
                    reps.append(res.metrics(spec.world_size))
                points.append({"isl": isl, "concurrency": conc, "repeats": reps, **summarize_repeats(reps)})
                if isl == isls[0] and conc == cfg.concurrency[0]:
                    primary = reps
                manifest.update(throughput=points)
        manifest.stage("capture")
        progress(f"{label}: capturing {cfg.num_steps} iterations")
        files, overhead = _capture(cfg, spec, server, run_id, trace_dir, primary, manifest)
        manifest.update(trace_files=[f.name for f in files], profiler_overhead=overhead)
        manifest.stage("server_stop")
        server.stop(grace_s=60 if cfg.nsys else 20)
        manifest.update(leftover_pids=server.leftovers())
        if cfg.nsys:
            rep = _wait_file(trace_dir / f"{run_id}.nsys-rep", cfg.profile_timeout_s)
            manifest.update(trace_files=[rep.name], note="an Nsight Systems report: open it in nsys-ui; profkit analyzes torch-profiler traces")
            manifest.finish("ok")
            return RunResult(run_id, states, trace_dir, report_dir, rep, {}, manifest.data)

        if cfg.capture_only:
            manifest.finish("ok")
            return RunResult(run_id, states, trace_dir, report_dir, trace_dir, {}, manifest.data)
        manifest.stage("analysis")
        progress(f"{label}: analyzing")
        summary = analyze_run(files, cfg, manifest.data)
        report_dir.mkdir(parents=True, exist_ok=True)
        from profkit.store import write_json_atomic

        summary_path = report_dir / "summary.json"
        write_json_atomic(summary_path, summary)
        manifest.update(summary=str(summary_path))
        manifest.finish("ok")
        return RunResult(run_id, states, trace_dir, report_dir, summary_path, summary, manifest.data)
    except KeyboardInterrupt:
        server.stop(grace_s=5)
        manifest.update(trace_files=_written(trace_dir))
        manifest.finish("interrupted", error=f"interrupted during {manifest.data['stage']}")
        raise Interrupted(f"interrupted during {manifest.data['stage']}; kept {trace_dir}", hint=f"see {trace_dir / 'manifest.json'}") from None
    except (ProfkitError, HTTPFailure) as e:
        if isinstance(e, HTTPFailure):  # the server stopped answering: say whether it died
            e = server.died(f"died during the {manifest.data['stage']}") if not server.alive() else TargetError(
                f"the server stopped answering during the {manifest.data['stage']}: {e}", hint=f"see {server.log_path}")
        server.stop(grace_s=5)
        manifest.update(trace_files=_written(trace_dir))
        manifest.finish("failed", error=str(e))
        raise e from None
    finally:
        server.stop(grace_s=5)


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
    return sorted(p.name for p in trace_dir.glob("*.trace.json.gz"))


def _server_info(base_url: str) -> dict[str, Any]:
    for path in ("/server_info", "/get_server_info"):
        try:
            info = get_json(base_url + path, timeout=30)
            return info if isinstance(info, dict) else {"raw": info}
        except (HTTPFailure, ValueError):
            continue
    return {}


def _versions(info: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for k in ("version", "torch_version", "device", "gpu"):
        if k in info:
            out["engine" if k == "version" else k] = info[k]
    return out


def _check(res: DriveResult, server: Server, what: str) -> DriveResult:
    if res.errors:
        if not server.alive():
            raise server.died(f"died during the {what}")
        raise TargetError(f"requests failed during the {what}: {res.errors[0]}", hint=f"see {server.log_path}")
    return res


def _capture(cfg: RunConfig, spec: LaunchSpec, server: Server, run_id: str, trace_dir: Path, primary: list[dict[str, Any]],
             manifest: Manifest) -> tuple[list[Path], dict[str, Any]]:
    """Drive a fresh pass; once every conversation is inside `profile_turn` and decoding, open the window."""
    conc = cfg.concurrency[0]
    isl = (list(cfg.isl) or [cfg.workload.isl])[0]
    wl = replace(cfg.workload, isl=isl, seed=cfg.workload.seed + 424_242)
    turn = min(cfg.profile_turn, wl.turns - 1)
    e2e = statistics.median([m["e2e_s_p50"] for m in primary if m.get("e2e_s_p50")] or [1.0])
    submitted: dict[int, int] = {}
    ready = threading.Event()
    lock = threading.Lock()

    def on_submit(conv: int, t: int) -> None:
        if t == turn:
            with lock:
                submitted[conv] = t
                if len(submitted) >= conc:
                    ready.set()

    result: dict[str, DriveResult] = {}
    stop = threading.Event()
    th = threading.Thread(target=lambda: result.setdefault("r", drive(spec.base_url, wl, concurrency=conc, on_submit=on_submit, stop=stop)), daemon=True)
    th.start()
    while not ready.wait(0.2):
        if not th.is_alive():
            res = result.get("r")
            _check(res, server, "capture pass") if res else None
            raise TargetError("the capture pass ended before reaching the profiled turn", hint="raise --turns or lower --profile-turn")
        if not server.alive():
            raise server.died("died during the capture pass")
    time.sleep(0.3 * e2e)  # past prefill, into decode
    t_start = time.perf_counter()
    body = start_profile(spec.base_url, output_dir=trace_dir, profile_id=run_id, num_steps=cfg.num_steps, with_stack=cfg.with_stack,
                         record_shapes=cfg.record_shapes, activities=("CUDA_PROFILER",) if cfg.nsys else ("CPU", "GPU"))
    manifest.update(profile_request=body)
    if cfg.nsys:  # no torch-profiler files: the window closes after num_steps; nsys writes its report when the server exits
        while th.is_alive():
            th.join(0.2)
        return [], {"note": "nsys mode: profiler overhead not measured"}
    files = wait_for_traces(spec.base_url, trace_dir, run_id, spec.world_size, timeout_s=cfg.profile_timeout_s, alive=server.alive,
                            idle=lambda: not th.is_alive())
    t_end = time.perf_counter()
    while th.is_alive():
        th.join(0.2)
        if not server.alive():
            raise server.died("died during the capture pass")
    res = _check(result["r"], server, "capture pass")
    during = [r for r in res.records if r.start_s < t_end and r.start_s + r.e2e_s > t_start and r.ttft_s is not None and r.completion_tokens > 1
              and r.e2e_s > r.ttft_s]
    prof_user = statistics.median([(r.completion_tokens - 1) / (r.e2e_s - r.ttft_s) for r in during]) if during else None
    base_user = statistics.median([m["tokens_per_s_per_user_p50"] for m in primary if m.get("tokens_per_s_per_user_p50")] or [0]) or None
    overhead = {
        "tokens_per_s_per_user_unprofiled": base_user,
        "tokens_per_s_per_user_profiled": prof_user,
        "slowdown": (base_user / prof_user) if (base_user and prof_user) else None,
        "window_s": t_end - t_start,
        "requests_in_window": len(during),
    }
    return files, overhead


def analyze_run(files: list[Path], cfg: RunConfig, manifest: dict[str, Any]) -> dict[str, Any]:
    from profkit.analysis.parallel import analyze_paths
    from profkit.analysis.summary import build_summary
    from profkit.catalog import load_catalog

    cat = load_catalog(cfg.catalog) if cfg.catalog else (load_catalog("proxy") if cfg.target == "proxy" else None)
    # ranks in parallel, large traces through the parquet cache (a later diff/report reads it)
    analyses = analyze_paths(files, marker=cfg.marker, min_bubble_us=cfg.min_bubble_us, catalog=cat)
    summary = build_summary(analyses, marker=cfg.marker)
    if len(analyses) > 1:
        from profkit.analysis.ranks import cross_rank

        summary["cross_rank"] = cross_rank(analyses)
    summary["run"] = {
        "run_id": manifest["run_id"], "label": manifest["label"], "target": manifest["target"], "preset": manifest.get("preset"),
        "optimizations": manifest["optimizations"], "command": manifest["command"], "throughput": manifest.get("throughput"),
        "profiler_overhead": manifest.get("profiler_overhead"), "versions": manifest.get("versions"), "workload": manifest.get("workload"),
    }
    return summary
