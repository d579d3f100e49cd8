"""The commands that launch engines: `trace`, `sweep`, `opts`. The options trace and sweep share
are one dataclass, RunOptions (common.options_from makes them options of both commands), which
becomes the capture's RunConfig."""

from __future__ import annotations

import datetime as dt
import json
import shlex
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer
from rich.markup import escape

from profkit.cli import interrupts
from profkit.cli.common import command, err, option, options_from, out
from profkit.cli.options import BASE, CATALOG, DEFAULT_TARGET, MARKER, MIN_BUBBLE_US, OUTPUT, TARGET, BaseMode, SweepMode, Target, TargetName, either
from profkit.errors import Interrupted, UsageError

if TYPE_CHECKING:
    from rich.progress import Progress

    from profkit.flows.engines import RunConfig
    from profkit.flows.trace import RunResult

Opt = Annotated[list[str], typer.Option("--opt", help="Optimization to attribute (repeatable); see `profkit opts`.")]


@dataclass(frozen=True)
class RunOptions:
    """What trace and sweep both take: the target, the workload, the profile windows, where runs go
    and how they are analyzed. Help texts are trace's; sweep replaces a few (SWEEP_HELP). Help uses
    rich markup: a literal "[" is written "\\[". """

    target: TargetName = TARGET.field(DEFAULT_TARGET)
    base: BaseMode = BASE.field(BaseMode.on)
    preset: Optional[str] = field(default=None, metadata=option("--preset", help="SGLang study preset: glm52-nvfp4-tp4, -tp8, -tep4, -tep8."))
    model_path: Optional[str] = field(default=None, metadata=option("--model-path", help="Override the preset's model path."))
    server_python: Optional[str] = field(default=None, metadata=option("--server-python", help="Python of the engine's environment (e.g. a before/after build of SGLang)."))
    extra_server_args: str = field(default="", metadata=option("--extra-server-args", help="More server flags, as one shell-quoted string."))
    isl: Optional[str] = field(default=None, metadata=option("--isl", help="First-prompt tokens (default 74000 on sglang: requests average 80K over 13 turns; 4096 on the proxy, where selection top-k beats the sort on a CPU too); a list measures each."))
    turns: int = field(default=13, metadata=option("--turns", min=1, help="Turns per conversation."))
    turn_tokens: Optional[int] = field(default=None, metadata=option("--turn-tokens", help="New tokens per later turn (default 800; 32 on the proxy)."))
    output_tokens: Optional[int] = field(default=None, metadata=option("--output-tokens", help="Output tokens per turn, ignore_eos (default 220; 32 on the proxy)."))
    concurrency: str = field(default="1", metadata=option("--concurrency", help="Conversations in flight; a list (1,2,4) measures each, the first is profiled."))
    workload_file: Optional[Path] = field(default=None, metadata=option("--workload-file", help="JSONL replay: one conversation per line, {\"turns\": \\[\\[ids...], ...]}."))
    seed: int = field(default=0, metadata=option("--seed", help="Workload seed (token ids, prompt lengths): the same seed gives the same requests."))
    repeat: int = field(default=1, metadata=option("--repeat", min=1, help="Repeat the unprofiled measurement N times (median and spread)."))
    warmup: bool = field(default=True, metadata=option("--warmup/--no-warmup", help="Before each workload point's repeats, one unmeasured pass of the same shape (graph captures, JIT compiles, autotuning happen there, not in a measured repeat)."))
    num_steps: int = field(default=20, metadata=option("--num-steps", min=1, help="run_batch iterations to profile."))
    profile_windows: int = field(default=3, metadata=option("--profile-windows", min=1, help="Profile windows of --num-steps iterations per side (median and spread of every trace figure; 1: changes are not judged)."))
    with_stack: bool = field(default=False, metadata=option("--with-stack", help="Record Python stacks (bigger traces, more overhead)."))
    # off by default (issue 41): shapes cost the profiled step 4-7% under CUDA graphs on an H100 and 1.15x CPU / 1.5x trace
    # bytes eagerly, and would move every profiled idle figure against baselines stored without them
    # (benchmarks/results/record_shapes_overhead_h100_2026-12-07.txt, docs/floor.md)
    record_shapes: bool = field(default=False, metadata=option("--record-shapes", help="Record op shapes: each op's work and each step's "
                                                                "hardware floor (docs/floor.md); off by default, the profiled step runs a few % slower."))
    profile_turn: int = field(default=1, metadata=option("--profile-turn", help="Turn (0-based) whose decode is profiled."))
    port: Optional[int] = field(default=None, metadata=option("--port", help="Server port (default: a free one)."))
    health_timeout: Optional[float] = field(default=None, metadata=option("--health-timeout", help="Seconds to wait for /health (default 180 proxy, 3600 sglang)."))
    profile_timeout: float = field(default=120.0, metadata=option("--profile-timeout", help="Seconds to wait for the trace files."))
    traces_dir: Path = field(default=Path("traces"), metadata=option("--traces-dir", help="Where run folders go: DIR/<run_id>/ (manifest.json, traces, server.log)."))
    reports_dir: Path = field(default=Path("reports"), metadata=option("--reports-dir", help="Where reports go: DIR/<run_id>/summary.json and the attribution folder."))
    marker: Optional[str] = MARKER.field(None)
    min_bubble_us: float = MIN_BUBBLE_US.field(2.0)
    catalog: Optional[str] = CATALOG.field(None)
    dry_run: bool = field(default=False, metadata=option("--dry-run", help="Print every command line and environment variable; start nothing."))
    capture_only: bool = field(default=False, metadata=option("--capture-only", help="Record traces and manifests only; analyze later with `profkit diff RUN_A RUN_B` (for GPU boxes without the analysis packages)."))
    nsys: bool = field(default=False, metadata=option("--nsys", help="Wrap the server in `nsys profile --capture-range=cudaProfilerApi` and open the window with the CUDA_PROFILER activity (writes .nsys-rep, exports it with `nsys export --type sqlite` and analyzes that)."))
    fit_context: bool = field(default=False, metadata=option("--fit-context", help="Trim the oldest history (the first prompt) so every turn fits the server's context length, instead of refusing the run."))
    alternate: Optional[bool] = field(default=None, metadata=option("--alternate/--sequential", help="Record the runs side by side, their unprofiled repeats and profile windows alternating (A B A B), so load drift lands on every side (default on the proxy); --sequential: one run after the other (default on sglang, where a server costs minutes and a GPU)."))
    fault: Optional[str] = field(default=None, metadata=option("--fault", help="proxy: a regression on purpose, the proxy engine's fault-injection knob (docs/proxy.md): host_delay_us=N (a host busy-wait per decode step) and/or gpu_op=N (one extra N x N matmul per decode step), comma-separated; trace: the candidate only (--opt may then be left out); calibrate: both sides."))
    accept_length: Optional[float] = field(default=None, metadata=option("--accept-length", help="sglang: fix the speculative accept length (SGLANG_SIMULATE_ACC_LEN; the study's Figure 8 used 5). Random token ids otherwise give whatever the model makes of noise."))


# sweep's own words for the options it shares with trace
SWEEP_HELP = {
    "isl": "Input length(s); a list gives the input-length curve (the study's Figure 8).",
    "concurrency": "A list (1,2,4,8,16) gives the Pareto curve: tokens/s per GPU vs per user.",
    "num_steps": "Iterations (run_batch steps) per profile window.",
    "profile_windows": "Profile windows of --num-steps iterations per run.",
    "capture_only": "Record traces and manifests only (attribute later with `profkit diff`).",
    "base": "on (default): optimizations not in --opts stay on in every run, so 'all' is the full configuration; off (exploration): they are off everywhere.",
}
# trace's options that sweep does not take (its runs use their defaults)
SWEEP_EXCLUDES = ("marker", "min_bubble_us", "with_stack", "record_shapes", "nsys", "fault")

# calibrate's own words for the options it shares with trace
CALIBRATE_HELP = {
    "fault": "proxy: the fault-injection knob (docs/proxy.md), on both sides: host_delay_us=N and/or gpu_op=N.",
    "base": "on (default): the calibrated configuration is all on (minus --without); off: all off (plus nothing).",
}


def _caps(target: str) -> list[str] | None:
    """This machine's GPU compute capabilities for the target's hardware rules (None: it has none)."""
    from profkit.flows.engines import target as target_named

    return target_named(target).capabilities()


def _takers(option: str) -> str:
    """The --target values that take an engine's own option ("sglang"; "proxy or sglang")."""
    from profkit.flows.engines import TARGETS

    return either([t.name for t in TARGETS.values() if option in t.takes])


def _plain(o: RunOptions) -> RunOptions:
    """The choices as their plain values (run ids, manifests and the library take strings)."""
    return replace(o, target=str(o.target), base=str(o.base))  # type: ignore[arg-type]


def _ints(text: str, flag: str) -> tuple[int, ...]:
    try:
        vals = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise UsageError(f"{flag} {text!r}: expected integers separated by commas, e.g. 1,2,4") from None
    if not vals or min(vals) <= 0:
        raise UsageError(f"{flag} {text!r}: expected positive integers")
    return vals


def _config(o: RunOptions) -> RunConfig:
    """RunOptions -> the capture's RunConfig, checked (UsageError names the option)."""
    from profkit.flows.engines import TARGETS, RunConfig, Workload, load_workload_file

    target = o.target
    if target not in TARGETS:
        raise UsageError(f"--target {target!r}: use {either(list(TARGETS))}")
    engine = TARGETS[target]
    if o.preset and "preset" not in engine.takes:
        raise UsageError(f"--preset goes with --target {_takers('preset')}")
    d = engine.defaults  # each target's own (targets/<engine>.py says why)
    isls = _ints(o.isl, "--isl") if o.isl else (d.isl,)
    out_tok = o.output_tokens if o.output_tokens is not None else d.output_tokens
    if o.workload_file:
        wl = load_workload_file(o.workload_file, output_tokens=out_tok)
    else:
        wl = Workload(isl=isls[0], turns=o.turns, turn_tokens=o.turn_tokens if o.turn_tokens is not None else d.turn_tokens,
                      output_tokens=out_tok, seed=o.seed, vocab=1000)
    if o.repeat < 1 or o.num_steps < 1:
        raise UsageError("--repeat and --num-steps must be at least 1")
    if o.base not in ("on", "off"):
        raise UsageError(f"--base {o.base!r}: use on (leave-one-out, the study's regime) or off (exploration: everything off)")
    if o.accept_length is not None and ("accept_length" not in engine.takes or o.accept_length < 1):
        raise UsageError(f"--accept-length goes with --target {_takers('accept_length')} and is at least 1 (tokens per verify, bonus token included)")
    cfg = RunConfig(
        target=target, preset=o.preset, model_path=o.model_path, server_python=o.server_python,
        extra_server_args=tuple(shlex.split(o.extra_server_args)), workload=wl, concurrency=_ints(o.concurrency, "--concurrency"),
        isl=isls if len(isls) > 1 else (), repeat=o.repeat, num_steps=o.num_steps, with_stack=o.with_stack, record_shapes=o.record_shapes,
        profile_turn=o.profile_turn, health_timeout_s=o.health_timeout or d.health_timeout_s,
        profile_timeout_s=o.profile_timeout,
        port=o.port, traces_dir=o.traces_dir, reports_dir=o.reports_dir, marker=o.marker, min_bubble_us=o.min_bubble_us, catalog=o.catalog,
        capture_only=o.capture_only, nsys=o.nsys, base=o.base, fit_context=o.fit_context, accept_length=o.accept_length,
        warmup=o.warmup,
        capture_order="alternating" if (o.alternate if o.alternate is not None else d.alternate) and not o.nsys and o.port is None
        else "sequential",
    )
    return _windows(cfg, o.profile_windows)


def _windows(cfg: RunConfig, n: int) -> RunConfig:
    if n < 1:
        raise UsageError(f"--profile-windows {n}: at least 1")
    return replace(cfg, profile_windows=n)



def _stamp() -> str:
    return dt.datetime.now().strftime("%Y%m%d-%H%M%S")


def live_progress(console: Any) -> Progress:
    """The live line of a long run on a terminal: spinner, elapsed time, the stage. The stage's column takes what is left
    of the line (ratio=1 with expand=True: without it rich shrank every column alike and the elapsed time read "0:…" at
    80 columns) and folds onto a second line rather than cut (issue 40: at 80 columns "analyzing profile window 2/3" lost
    its end); the elapsed time is never cut."""
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
    from rich.table import Column

    return Progress(SpinnerColumn(), TimeElapsedColumn(),
                    TextColumn("{task.description}", table_column=Column(ratio=1, no_wrap=False, overflow="fold")),
                    console=console, transient=True, expand=True)


class _Steps:
    """Where a long run is, on stderr. On a terminal: one live line (spinner, run i of N, its step: the
    repeat, the profile window, the window's iteration; elapsed time). Elsewhere (a pipe, `| tee`, a
    log): one line per step as it happens, with the elapsed time, no spinner and no iteration ticks.
    Finished runs get a "done" line with their full paths either way (never cut)."""

    def __init__(self, runs: int) -> None:
        import time

        self.runs, self.n, self.t0 = runs, 0, time.monotonic()
        self.live: Progress | None = None
        if err.is_terminal:
            self.live = live_progress(err)

    def __enter__(self) -> "_Steps":
        if self.live:
            self.live.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.live:
            self.live.__exit__(*exc)

    def _line(self, text: str) -> None:
        import time

        s = int(time.monotonic() - self.t0)
        err.print(f"[dim]\\[{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}][/] {escape(text)}", soft_wrap=True)

    def run(self, cfg: RunConfig, states: dict[str, bool], run_id: str, label: str) -> RunResult:
        from profkit.flows.trace import run_one

        self.n += 1
        where = f"run {self.n}/{self.runs}"
        if self.live:
            live = self.live
            task = live.add_task(escape(f"{where} {label}"), total=None)
            step = tick = lambda s: live.update(task, description=escape(f"{where} {s}"))  # noqa: E731
        else:
            step, tick = (lambda s: self._line(f"{where} {s}")), (lambda s: None)
        res = run_one(cfg, states, run_id, label=label, progress=step, tick=tick)
        if self.live:
            self.live.remove_task(task)
        self._line(f"{where} {label}: done; traces {res.trace_dir}, summary {res.summary_path}")
        for w in res.manifest.get("warnings") or []:  # no-op switches, --fit-context trims, an uncontrolled accept length
            err.print(f"[yellow]warning:[/] {escape(label)}: {escape(w)}")
        return res

    def run_all(self, cfg: RunConfig, jobs: list[tuple[dict[str, bool], str, str]], cfgs: list[RunConfig] | None = None) -> list[RunResult]:
        """The runs of one command: side by side, their steps alternating (cfg.capture_order "alternating":
        flows/trace.run_interleaved; each progress line starts with its run's label), or one after the other.
        `cfgs`: each job's own config (trace --fault: the candidate's server flags), else `cfg` for every job."""
        each = cfgs or [cfg] * len(jobs)
        if cfg.capture_order != "alternating" or len(jobs) < 2:
            return [self.run(c, states, run_id, label) for c, (states, run_id, label) in zip(each, jobs)]
        from profkit.flows.trace import run_interleaved

        first, self.n = self.n + 1, self.n + len(jobs)
        where = f"runs {first}-{self.n}/{self.runs}, alternating:"
        if self.live:
            live = self.live
            task = live.add_task(escape(where), total=None)
            step = tick = lambda s: live.update(task, description=escape(f"{where} {s}"))  # noqa: E731
        else:
            step, tick = (lambda s: self._line(f"{where} {s}")), (lambda s: None)
        res = run_interleaved([(c, states, run_id, label) for c, (states, run_id, label) in zip(each, jobs)], progress=step, tick=tick)
        if self.live:
            self.live.remove_task(task)
        for (_, _, label), r in zip(jobs, res):
            self._line(f"{label}: done; traces {r.trace_dir}, summary {r.summary_path}")
            for w in r.manifest.get("warnings") or []:
                err.print(f"[yellow]warning:[/] {escape(label)}: {escape(w)}")
        return res


def _interrupted_hint(cfg: RunConfig, run_ids: tuple[str, ...], tag: str) -> str | None:
    """When both runs' traces were recorded (an interrupt during the analysis): the command that attributes them,
    `profkit diff` of the two run folders (it analyzes their every profile window); else None."""
    dirs = [cfg.traces_dir / r for r in run_ids]

    def recorded(d: Path) -> bool:  # its capture finished: analyzed, being analyzed, or waiting for its analysis
        try:
            m = json.loads((d / "manifest.json").read_text())
        except (OSError, ValueError):
            return False
        err = str(m.get("error") or "")
        return m.get("status") == "ok" or m.get("stage") == "analysis" or err.startswith(("interrupted before its analysis",
                                                                                          "recorded, not analyzed"))

    if not all(recorded(d) for d in dirs):
        return None
    return f"both runs were recorded; attribute them with: {shlex.join(['profkit', 'diff', str(dirs[0]), str(dirs[1]), '--opt', tag])}"


def _engine_importable(cfg: RunConfig, states: dict[str, bool]) -> None:
    """Before any server starts: the engine's package must import in the server's Python (the dry run says "sglang is
    not importable with ..."; a real run started a server and failed in its log, issue 40). sglang and vllm only."""
    import subprocess

    from profkit.errors import TargetError
    from profkit.flows.engines import compose, target

    module = target(cfg.target).package
    if module is None:
        return
    py = compose(cfg, states, cfg.port or 30000).argv[0]
    try:
        p = subprocess.run([py, "-c", f"import importlib.util, sys; sys.exit(0 if importlib.util.find_spec({module!r}) else 3)"],
                           capture_output=True, text=True, timeout=120)
        ok = p.returncode == 0
    except (OSError, subprocess.TimeoutExpired) as e:
        raise TargetError(f"cannot run the server's Python {py}: {e}", hint="pass --server-python PATH (the engine's environment)") from None
    if not ok:
        raise TargetError(f"{module} is not importable with {py}: no server started",
                          hint=f"install {module} there, or pass --server-python PATH (the Python of the {module} environment); "
                               "--dry-run shows the commands")


def _dry_run(cfg: RunConfig, plans: list[tuple[str, dict[str, bool]]]) -> None:
    from profkit.flows.engines import compose, target

    engine = target(cfg.target)
    for label, states in plans:
        spec = compose(cfg, states, cfg.port or 30000)
        on = [k for k, v in states.items() if v]
        out.print(f"[bold]# {escape(label)}[/]  (on: {escape(', '.join(on) or 'none')})", soft_wrap=True)
        if spec.unset:
            out.print(f"unset {' '.join(spec.unset)}", soft_wrap=True, markup=False)
        for k, v in sorted(spec.env.items()):
            out.print(f"export {k}={shlex.quote(v)}", soft_wrap=True, markup=False)
        out.print(shlex.join(spec.argv), soft_wrap=True, markup=False)
        for n in spec.notes:
            out.print(f"# note: {n}", soft_wrap=True, markup=False)
        if spec.context_length is not None:
            over = [cfg.workload if cfg.workload.replay is not None else replace(cfg.workload, isl=i) for i in (list(cfg.isl) or [cfg.workload.isl])]
            bad = [(w, w.overflow(spec.context_length, spec.reserved_tokens)) for w in over]
            bad = [(w, o) for w, o in bad if o is not None]
            msg = (f"turn {bad[0][1][1]} needs {bad[0][1][2]} tokens: over; " + ("--fit-context trims it" if cfg.fit_context else "the run would be refused")
                   if bad else "every turn fits")
            out.print(f"# context length {spec.context_length} (reserved {spec.reserved_tokens}): {msg}", soft_wrap=True, markup=False)
        for line in engine.dry_run_checks(spec):
            out.print(f"# {line}", soft_wrap=True, markup=False)
    wl = cfg.workload.describe()
    out.print(f"# workload: {json.dumps(wl)}; concurrency {list(cfg.concurrency)}; profile {cfg.num_steps} step{'' if cfg.num_steps == 1 else 's'}", soft_wrap=True, markup=False)


def _notes(notes: list[str]) -> None:
    for n in notes:
        err.print(f"[yellow]note:[/] {escape(n)}", soft_wrap=True)


def _render_attribution(diff: Any, group_dir: Path) -> None:
    from profkit.report import Report
    from profkit.report.terminal import TerminalRenderer

    TerminalRenderer(out).show(Report(diffs=[diff]))
    from profkit.flows.outputs import PAIR_FILES

    out.print(f"wrote {escape(str(group_dir))}/ ({', '.join(PAIR_FILES)})", soft_wrap=True)


def _faulted(cfg: RunConfig, o: RunOptions) -> RunConfig:
    """The config with --fault's proxy server flags added (targets/proxy.fault_args checks them)."""
    if not o.fault:
        return cfg
    from profkit.flows.engines import fault_args, target

    if "fault" not in target(o.target).takes:
        raise UsageError(f"--fault is the proxy engine's knob; --target {o.target} has none", hint=f"drop --fault, or use --target {_takers('fault')}")
    return replace(cfg, extra_server_args=(*cfg.extra_server_args, *fault_args(o.fault)))


@command()
@options_from(RunOptions)
def trace(opt: Annotated[Optional[list[str]], typer.Option("--opt", help="Optimization to attribute (repeatable); see `profkit opts`. Required unless --fault is given.")] = None,
          options: RunOptions = RunOptions()) -> None:
    """Baseline vs baseline+OPT: launch, drive the agentic workload, profile decode, attribute the change.

    Example:

        profkit trace --opt topk_v2

        profkit trace --target sglang --preset glm52-nvfp4-tp8 --opt topk_v2 --dry-run
    """
    from profkit.flows.outputs import trace_folder, trace_run_ids
    from profkit.flows.trace import attribute, reproduce_command
    from profkit.flows.engines import check_comparison, check_opts, opt_states, target as target_named

    o = _plain(options)
    target, base, catalog, reports_dir, capture_only = o.target, o.base, o.catalog, o.reports_dir, o.capture_only
    cfg = _config(o)
    if not opt and not o.fault:
        raise UsageError("missing --opt: the optimization to attribute", hint="e.g. --opt topk_v2 (see `profkit opts`), or --fault to inject one on the proxy")
    cand_cfg = _faulted(cfg, o)
    engine = target_named(target)
    opts = check_opts(engine, opt or [])
    s_base = opt_states(engine, opts, base=base, candidate=False)
    s_cand = opt_states(engine, opts, base=base, candidate=True)
    for w in check_comparison(engine, s_base, s_cand, opts, engine.capabilities()):
        err.print(f"[yellow]warning:[/] {escape(w)}", soft_wrap=True)
    tag = "+".join(opts + (["fault"] if o.fault else []))
    if o.dry_run:
        if o.fault:  # the candidate's own server flags
            _dry_run(cfg, [("baseline", s_base)])
            _dry_run(cand_cfg, [(f"candidate ({tag})", s_cand)])
        else:
            _dry_run(cfg, [("baseline", s_base), (f"candidate ({tag})", s_cand)])
        return
    _engine_importable(cfg, s_base)
    interrupts.install(terminate_too=True)  # SIGTERM and SIGHUP end a run as Ctrl-C does
    stamp = _stamp()
    ids = trace_run_ids(stamp, target, base, tag)
    try:
        with _Steps(2) as steps:
            before, after = steps.run_all(cfg, [(s_base, ids[0], "baseline"), (s_cand, ids[1], f"candidate ({tag})")],
                                          cfgs=[cfg, cand_cfg])
    except Interrupted as e:
        raise Interrupted(str(e), hint=_interrupted_hint(cfg, ids, tag) or e.hint) from None
    if capture_only:
        out.print(f"captured; attribute with: profkit diff {before.trace_dir} {after.trace_dir} --opt {tag} --html report.html", soft_wrap=True)
        return
    group = trace_folder(reports_dir, stamp, target, tag)
    diff, notes = attribute(before, after, opts, group)
    _notes(notes)
    _render_attribution(diff, group)
    err.print(f"reproduce the attribution: {reproduce_command(before, after, opts, catalog, target)}", soft_wrap=True)


@command()
@options_from(RunOptions, exclude=("nsys",), help=CALIBRATE_HELP)
def calibrate(
    without: Annotated[Optional[list[str]], typer.Option("--without", help="Optimization off in the calibrated configuration (repeatable; default: the configuration --base gives, all on).")] = None,
    output: Annotated[Optional[Path], OUTPUT.option("calibration.json to write, policy.toml beside it (default: REPORTS_DIR/<stamp>-<target>-calibrate/).")] = None,
    sessions: Annotated[int, typer.Option("--sessions", min=1, help="A/A sessions, one after another (each two runs, alternating): with 2 or more, every metric also gets its MDE across sessions, which a gate against a stored baseline uses.")] = 2,
    options: RunOptions = RunOptions(),
) -> None:
    """A/A calibration for `profkit gate`: the same configuration recorded twice, alternating (A B A B),
    in each of --sessions sessions, and calibration.json with each gated metric's A/A spread and minimum
    detectable effect (MDE): within a session (for pairs recorded together) and across sessions (for a
    stored baseline against a later recording).

    Example:

        profkit calibrate --turns 3 --num-steps 10 -o calibration.json
    """
    from profkit.flows.gate import calibration_of
    from profkit.report.gate import calibration_lines, policy_toml
    from profkit.flows.engines import check_opts, opt_states, target as target_named
    from profkit.flows.outputs import (CALIBRATION_JSON, DIFF_JSON, POLICY_TOML, calibrate_folder, calibrate_run_id,
                                       write_json as write_json_atomic, write_text)

    o = _plain(options)
    target, base = o.target, o.base
    cfg = _faulted(_config(o), o)
    engine = target_named(target)
    off = check_opts(engine, without or [])
    states = {n: (v and n not in off) for n, v in opt_states(engine, [], base=base, candidate=True).items()}
    if o.dry_run:
        _dry_run(cfg, [("A", states), ("A again", states)])
        return
    interrupts.install(terminate_too=True)
    stamp = _stamp()
    folder = calibrate_folder(o.reports_dir, stamp, target)
    pairs = []
    with _Steps(2 * sessions) as steps:
        for k in range(sessions):  # session 1's runs keep the names -calibrate-a/-b (baseline save reports/*-calibrate-a)
            tag, say = ("", "") if k == 0 else (f"{k + 1}", f" (session {k + 1})")
            a, b = steps.run_all(cfg, [(states, calibrate_run_id(stamp, target, tag, "a"), f"A{say}"),
                                       (states, calibrate_run_id(stamp, target, tag, "b"), f"A again{say}")])
            pairs.append((a, b))
    cal, d = calibration_of(pairs)
    from profkit.documents import calibration_doc, diff_doc

    a, b = pairs[0]
    path = output or folder / CALIBRATION_JSON
    write_json_atomic(path, calibration_doc(cal))
    write_json_atomic(folder / DIFF_JSON, diff_doc(d))
    suggested = path.with_name(POLICY_TOML)
    write_text(suggested, policy_toml(cal))
    from profkit.report.vocab import diff_timeline
    from profkit.documents import diff_of

    for line in calibration_lines(cal, diff_timeline(diff_of(d))):
        out.print(escape(line), soft_wrap=True, highlight=False)
    if not cal.judged:
        err.print(f"[yellow]warning:[/] the A/A is not judged, so the trace figures have no MDE: {escape(str(cal.note))}", soft_wrap=True)
    more = f" (and {sessions - 1} more session(s) beside them)" if sessions > 1 else ""
    out.print(f"wrote {escape(str(path))}, {escape(str(suggested))} (thresholds at the MDEs: gate --policy) and the A/A diff "
              f"{escape(str(folder / 'diff.json'))}; runs {escape(str(a.report_dir))} and {escape(str(b.report_dir))}{more}", soft_wrap=True)


@command()
def opts(target: Target = DEFAULT_TARGET) -> None:
    """The optimization registry: each optimization's real on/off switch, what it means in the engine, what it depends on.

    Example:

        profkit opts --target sglang
    """
    from profkit.flows.engines import registry
    from profkit.flows.engines import target as target_named

    engine = target_named(str(target))
    reg = registry(engine)
    words = engine.opts_words
    title = f"optimizations for --target {engine.name}" + (f" ({words.note})" if words.note else "")
    out.print(f"[bold]{escape(title)}[/]", soft_wrap=True)

    def fmt(sw: Any) -> str:
        parts = [f"{k}={v}" for k, v in sw.env.items()] + list(sw.args)
        if sw.model_override:
            parts.append(f"--json-model-override-args '{json.dumps(sw.model_override)}'")
        return " ".join(parts) or words.unset

    for o in reg.values():
        off = fmt(o.off) if words.off is None else words.off
        out.print(f"\n[bold cyan]{o.name}[/]: {escape(o.title)}", soft_wrap=True)
        rows = [("meaning", o.meaning), ("on", fmt(o.on)), ("off", off),
                ("requires", ", ".join(o.requires) + (f" ({o.requires_why})" if o.requires_why else "") if o.requires else ""),
                ("touches", o.kernels), ("note", o.note)]
        for k, v in rows:
            if v:
                out.print(f"  [dim]{k + ':':<9}[/] {escape(v)}", soft_wrap=True)


@command()
@options_from(RunOptions, exclude=SWEEP_EXCLUDES, help=SWEEP_HELP)
def sweep(
    opts_: Annotated[str, typer.Option("--opts", help="Comma-separated optimizations, e.g. overlap,topk_v2,indexer_fusion.")],
    mode: Annotated[SweepMode, typer.Option("--mode", help="one-at-a-time (each alone vs baseline, then all), ladder (cumulative), leave-one-out (all on, each off).")] = SweepMode.one_at_a_time,
    options: RunOptions = RunOptions(),
) -> None:
    """Run a set of optimizations one at a time, as a ladder, or leave-one-out; one attribution table.

    Example:

        profkit sweep --opts overlap,topk_v2,indexer_fusion --mode ladder
    """
    from profkit.flows.engines import check_opts, check_sweep, label_slug, sweep_plan, target as target_named
    from profkit.flows.outputs import SWEEP_FILES, sweep_folder, sweep_run_id, written
    from profkit.flows.sweep import add_run, attribute_sweep, new_sweep, write_sweep

    o = _plain(options)
    target, base, mode, reports_dir, capture_only = o.target, o.base, str(mode), o.reports_dir, o.capture_only
    cfg = _config(o)
    chosen = check_opts(target_named(target), [x.strip() for x in opts_.split(",") if x.strip()])
    if not chosen:
        raise UsageError("--opts is empty")
    plan = sweep_plan(target, chosen, mode, base)
    for w in check_sweep(target, plan, _caps(target)):
        err.print(f"[yellow]warning:[/] {escape(w)}", soft_wrap=True)
    if o.dry_run:
        _dry_run(cfg, [(label, st) for label, st, _, _ in plan])
        return
    _engine_importable(cfg, plan[0][1])
    interrupts.install(terminate_too=True)  # SIGTERM and SIGHUP end a run as Ctrl-C does
    stamp = _stamp()
    sweep_dir = sweep_folder(reports_dir, stamp, target, mode)
    results: dict[str, Any] = {}
    doc = new_sweep(mode, base, target, chosen)
    with _Steps(len(plan)) as steps:
        ran = steps.run_all(cfg, [(states, sweep_run_id(stamp, target, mode, label_slug(label)), label) for label, states, _, _ in plan])
        for (label, states, _, _), res in zip(plan, ran):
            results[label] = res
            add_run(doc, label, states, res)
            write_sweep(sweep_dir, doc)
    if capture_only:
        write_sweep(sweep_dir, doc, "captured")
        for r in doc["runs"]:
            out.print(f"{escape(r['label'])}: {escape(str(cfg.traces_dir / r['run_id']))}", soft_wrap=True)
        return
    done, diffs, notes = attribute_sweep(plan, mode, results, sweep_dir, doc)
    _notes(notes)
    _render_sweep(done, diffs)
    wrote = written(sweep_dir, SWEEP_FILES)
    out.print(f"wrote {', '.join(escape(str(p)) for p in wrote)}", soft_wrap=True)


def _render_sweep(doc: Any, diffs: list[Any]) -> None:
    """The sweep's table and its flags and unstable runs (sweep.json: a SweepDoc or its JSON value), on stdout
    (report/sweep_table.py)."""
    from profkit.report.sweep_table import show_sweep

    show_sweep(out, doc, diffs)
