"""CLI commands that launch engines: `trace`, `sweep`, `opts` (registered on profkit.cli.app)."""

from __future__ import annotations

import datetime as dt
import json
import shlex
import signal
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.markup import escape
from rich.table import Table

from profkit.cli_common import app, err, out, user_errors
from profkit.errors import UsageError

Target = Annotated[str, typer.Option("--target", help="proxy (the built-in engine) or sglang.")]
Opt = Annotated[list[str], typer.Option("--opt", help="Optimization to attribute (repeatable); see `profkit opts`.")]
FitContext = Annotated[bool, typer.Option("--fit-context", help="Trim the oldest history (the first prompt) so every turn fits the server's context length, instead of refusing the run.")]
AcceptLength = Annotated[Optional[float], typer.Option("--accept-length", help="sglang: fix the speculative accept length (SGLANG_SIMULATE_ACC_LEN; the study's Figure 8 used 5). Random token ids otherwise give whatever the model makes of noise.")]


# help for the options that trace and sweep share (rich markup: a literal "[" is written "\\[")
OPTION_HELP = {
    "--seed": "Workload seed (token ids, prompt lengths): the same seed gives the same requests.",
    "--traces-dir": "Where run folders go: DIR/<run_id>/ (manifest.json, traces, server.log).",
    "--reports-dir": "Where reports go: DIR/<run_id>/summary.json and the attribution folder.",
    "--marker": "Regex for the CPU span that opens one iteration (default chain: scheduler.run_batch, step\\[...], execute_..., ProfilerStep#N).",
    "--min-bubble-us": "Shortest GPU idle gap counted as a bubble (µs).",
    "--catalog": "Kernel catalog: a name in kernels/ or a .toml path (default: the target's).",
    "--preset": "SGLang study preset: glm52-nvfp4-tp4, -tp8, -tep4, -tep8.",
    "--model-path": "Override the preset's model path.",
    "--server-python": "Python of the engine's environment (e.g. a before/after build of SGLang).",
    "--extra-server-args": "More server flags, as one shell-quoted string.",
    "--turns": "Turns per conversation.",
    "--turn-tokens": "New tokens per later turn (default 800; 32 on the proxy).",
    "--output-tokens": "Output tokens per turn, ignore_eos (default 220; 32 on the proxy).",
    "--workload-file": "JSONL replay: one conversation per line, {\"turns\": \\[\\[ids...], ...]}.",
    "--repeat": "Repeat the unprofiled measurement N times (median and spread).",
    "--num-steps": "Iterations (run_batch steps) per profile window.",
    "--profile-turn": "Turn (0-based) whose decode is profiled.",
    "--port": "Server port (default: a free one).",
    "--health-timeout": "Seconds to wait for /health (default 180 proxy, 3600 sglang).",
    "--profile-timeout": "Seconds to wait for the trace files.",
    "--dry-run": "Print every command line and environment variable; start nothing.",
}

SGLANG_ISL = 74_000


def _caps(target: str) -> list[str] | None:
    if target != "sglang":
        return None
    from profkit.targets.sglang import gpu_compute_capabilities

    return gpu_compute_capabilities()


def _sigterm_as_interrupt() -> None:
    def handler(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, handler)


def _ints(text: str, flag: str) -> tuple[int, ...]:
    try:
        vals = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise UsageError(f"{flag} {text!r}: expected integers separated by commas, e.g. 1,2,4") from None
    if not vals or min(vals) <= 0:
        raise UsageError(f"{flag} {text!r}: expected positive integers")
    return vals


def _config(target: str, preset: Optional[str], model_path: Optional[str], server_python: Optional[str], extra_server_args: str,
            isl: Optional[str], turns: int, turn_tokens: Optional[int], output_tokens: Optional[int], concurrency: str, workload_file: Optional[Path],
            seed: int, repeat: int, num_steps: int, with_stack: bool, record_shapes: bool, port: Optional[int], health_timeout: Optional[float],
            profile_timeout: float, traces_dir: Path, reports_dir: Path, marker: Optional[str], min_bubble_us: float, catalog: Optional[str],
            profile_turn: int, capture_only: bool = False, nsys: bool = False, base: str = "on", fit_context: bool = False,
            accept_length: Optional[float] = None):
    from profkit.capture.run import RunConfig
    from profkit.workloads.agentic import Workload, load_workload_file

    if target not in ("proxy", "sglang"):
        raise UsageError(f"--target {target!r}: use proxy or sglang")
    if preset and target != "sglang":
        raise UsageError("--preset goes with --target sglang")
    gpu = target == "sglang"
    # 74K first prompt: the 13 requests average 80K tokens (the study's "mean input ~ 80k tokens/request")
    # and the last one, 86,466 tokens with its output and EAGLE's reserved slots, fits --context-length 90000
    isls = _ints(isl, "--isl") if isl else ((SGLANG_ISL,) if gpu else (256,))
    out_tok = output_tokens if output_tokens is not None else (220 if gpu else 32)
    if workload_file:
        wl = load_workload_file(workload_file, output_tokens=out_tok)
    else:
        wl = Workload(isl=isls[0], turns=turns, turn_tokens=turn_tokens if turn_tokens is not None else (800 if gpu else 32),
                      output_tokens=out_tok, seed=seed, vocab=1000)
    if repeat < 1 or num_steps < 1:
        raise UsageError("--repeat and --num-steps must be at least 1")
    if base not in ("on", "off"):
        raise UsageError(f"--base {base!r}: use on (leave-one-out, the study's regime) or off (exploration: everything off)")
    if accept_length is not None and (target != "sglang" or accept_length < 1):
        raise UsageError("--accept-length goes with --target sglang and is at least 1 (tokens per verify, bonus token included)")
    return RunConfig(
        target=target, preset=preset, model_path=model_path, server_python=server_python,
        extra_server_args=tuple(shlex.split(extra_server_args)), workload=wl, concurrency=_ints(concurrency, "--concurrency"),
        isl=isls if len(isls) > 1 else (), repeat=repeat, num_steps=num_steps, with_stack=with_stack, record_shapes=record_shapes,
        profile_turn=profile_turn, health_timeout_s=health_timeout or (3600.0 if gpu else 180.0), profile_timeout_s=profile_timeout,
        port=port, traces_dir=traces_dir, reports_dir=reports_dir, marker=marker, min_bubble_us=min_bubble_us, catalog=catalog,
        capture_only=capture_only, nsys=nsys, base=base, fit_context=fit_context, accept_length=accept_length,
    )


def _windows(cfg: Any, n: int) -> Any:
    if n < 1:
        raise UsageError(f"--profile-windows {n}: at least 1")
    return replace(cfg, profile_windows=n)


def _stamp() -> str:
    return dt.datetime.now().strftime("%Y%m%d-%H%M%S")


def _progress_runner():
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    return Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), console=err, transient=False)


def _run(cfg, states: dict[str, bool], run_id: str, label: str, progress) -> Any:
    from profkit.capture.run import run_one

    task = progress.add_task(escape(label), total=None)
    res = run_one(cfg, states, run_id, label=label, progress=lambda s: progress.update(task, description=escape(s)))
    progress.update(task, description=escape(f"{label}: done -> {res.summary_path}"))
    progress.stop_task(task)
    for w in res.manifest.get("warnings") or []:  # no-op switches, --fit-context trims, an uncontrolled accept length
        err.print(f"[yellow]warning:[/] {escape(label)}: {escape(w)}", soft_wrap=True)
    return res


def _dry_run(cfg, plans: list[tuple[str, dict[str, bool]]]) -> None:
    from profkit.capture.run import compose
    from profkit.targets import sglang as sg

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
        if cfg.target == "sglang":
            sg.check_gpu(spec, sg.gpu_compute_capabilities())
            res = sg.validate(spec)
            out.print(f"# SGLang's parser: {res or 'the arguments parse'}", soft_wrap=True, markup=False)
    wl = cfg.workload.describe()
    out.print(f"# workload: {json.dumps(wl)}; concurrency {list(cfg.concurrency)}; profile {cfg.num_steps} steps", soft_wrap=True, markup=False)


def _attribute(before: Any, after: Any, opts: list[str], group_dir: Path, catalog_name: Optional[str], target: str) -> dict[str, Any]:
    """before.json, after.json, diff.json (+ report.html and report.md where the report modules exist) in group_dir."""
    from profkit.attribution.diff import compare_summaries
    from profkit.catalog import load_catalog
    from profkit.store import write_json_atomic

    cat = load_catalog(catalog_name or ("proxy" if target == "proxy" else "sglang-glm52"))
    group_dir.mkdir(parents=True, exist_ok=True)
    write_json_atomic(group_dir / "before.json", before.summary)
    write_json_atomic(group_dir / "after.json", after.summary)
    diff = compare_summaries(before.summary, after.summary, opt=opts[0] if len(opts) == 1 else None, catalog=cat,
                             labels=(before.run_id, after.run_id), baseline_repeats=getattr(before, "windows", None) or (),
                             candidate_repeats=getattr(after, "windows", None) or ())
    diff["throughput"] = {
        "baseline": (before.manifest.get("throughput") or [{}])[0], "candidate": (after.manifest.get("throughput") or [{}])[0],
    }
    write_json_atomic(group_dir / "diff.json", diff)
    write_reports(group_dir, diffs=[diff], runs=[(before.run_id, before.summary), (after.run_id, after.summary)])
    return diff


def write_reports(folder: Path, *, diffs: list[dict[str, Any]], runs: list[tuple[str, dict[str, Any]]]) -> None:
    """report.html (self-contained) and, for a single diff, report.md (a PR comment) in `folder`."""
    from profkit.attribution import ladder_steps
    from profkit.report import Report, renderer_for
    from profkit.store import write_bytes_atomic

    if len(diffs) == 1:
        write_bytes_atomic(folder / "report.md", renderer_for("report.md")().render(Report(diffs=diffs)).encode())
    try:
        html = renderer_for("report.html")
    except ImportError as e:  # plotly/jinja2 are the `report` extra
        err.print(f"[yellow]note:[/] no report.html: {escape(str(e))}; pip install 'profkit[report]'", soft_wrap=True)
        return
    write_bytes_atomic(folder / "report.html", html().render(Report(diffs=diffs, runs=runs, ladder=ladder_steps(runs))).encode())


def _render_attribution(diff: dict[str, Any], group_dir: Path) -> None:
    from profkit.report import Report
    from profkit.report.terminal import TerminalRenderer

    TerminalRenderer(out).show(Report(diffs=[diff]))
    out.print(f"wrote {escape(str(group_dir))}/ (before.json, after.json, diff.json, report.md, report.html)", soft_wrap=True)


@app.command()
def trace(
    opt: Opt,
    target: Target = "proxy",
    base: Annotated[str, typer.Option("--base", help="on (default, the study's regime): all on, baseline = all on minus opts (leave-one-out); off (exploration): baseline all off, candidate = baseline + opts.")] = "on",
    preset: Annotated[Optional[str], typer.Option("--preset", help="SGLang study preset: glm52-nvfp4-tp4, -tp8, -tep4, -tep8.")] = None,
    model_path: Annotated[Optional[str], typer.Option("--model-path", help="Override the preset's model path.")] = None,
    server_python: Annotated[Optional[str], typer.Option("--server-python", help="Python of the engine's environment (e.g. a before/after build of SGLang).")] = None,
    extra_server_args: Annotated[str, typer.Option("--extra-server-args", help="More server flags, as one shell-quoted string.")] = "",
    isl: Annotated[Optional[str], typer.Option("--isl", help="First-prompt tokens (default 74000 on sglang: requests average 80K over 13 turns; 256 on the proxy); a list measures each.")] = None,
    turns: Annotated[int, typer.Option("--turns", help="Turns per conversation.")] = 13,
    turn_tokens: Annotated[Optional[int], typer.Option("--turn-tokens", help="New tokens per later turn (default 800; 32 on the proxy).")] = None,
    output_tokens: Annotated[Optional[int], typer.Option("--output-tokens", help="Output tokens per turn, ignore_eos (default 220; 32 on the proxy).")] = None,
    concurrency: Annotated[str, typer.Option("--concurrency", help="Conversations in flight; a list (1,2,4) measures each, the first is profiled.")] = "1",
    workload_file: Annotated[Optional[Path], typer.Option("--workload-file", help=OPTION_HELP["--workload-file"])] = None,
    seed: Annotated[int, typer.Option("--seed", help=OPTION_HELP["--seed"])] = 0,
    repeat: Annotated[int, typer.Option("--repeat", help="Repeat the unprofiled measurement N times (median and spread).")] = 1,
    num_steps: Annotated[int, typer.Option("--num-steps", help="run_batch iterations to profile.")] = 20,
    profile_windows: Annotated[int, typer.Option("--profile-windows", help="Profile windows of --num-steps iterations per side (median and spread of every trace figure; 1: changes are not judged).")] = 3,
    with_stack: Annotated[bool, typer.Option("--with-stack", help="Record Python stacks (bigger traces, more overhead).")] = False,
    record_shapes: Annotated[bool, typer.Option("--record-shapes", help="Record op shapes.")] = False,
    profile_turn: Annotated[int, typer.Option("--profile-turn", help="Turn (0-based) whose decode is profiled.")] = 1,
    port: Annotated[Optional[int], typer.Option("--port", help="Server port (default: a free one).")] = None,
    health_timeout: Annotated[Optional[float], typer.Option("--health-timeout", help="Seconds to wait for /health (default 180 proxy, 3600 sglang).")] = None,
    profile_timeout: Annotated[float, typer.Option("--profile-timeout", help="Seconds to wait for the trace files.")] = 120.0,
    traces_dir: Annotated[Path, typer.Option("--traces-dir", help=OPTION_HELP["--traces-dir"])] = Path("traces"),
    reports_dir: Annotated[Path, typer.Option("--reports-dir", help=OPTION_HELP["--reports-dir"])] = Path("reports"),
    marker: Annotated[Optional[str], typer.Option("--marker", help=OPTION_HELP["--marker"])] = None,
    min_bubble_us: Annotated[float, typer.Option("--min-bubble-us", help=OPTION_HELP["--min-bubble-us"])] = 2.0,
    catalog: Annotated[Optional[str], typer.Option("--catalog", help=OPTION_HELP["--catalog"])] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print every command line and environment variable; start nothing.")] = False,
    capture_only: Annotated[bool, typer.Option("--capture-only", help="Record traces and manifests only; analyze later with `profkit diff RUN_A RUN_B` (for GPU boxes without the analysis packages).")] = False,
    nsys: Annotated[bool, typer.Option("--nsys", help="Wrap the server in `nsys profile --capture-range=cudaProfilerApi` and open the window with the CUDA_PROFILER activity (writes .nsys-rep; implies --capture-only).")] = False,
    fit_context: FitContext = False,
    accept_length: AcceptLength = None,
) -> None:
    """Baseline vs baseline+OPT: launch, drive the agentic workload, profile decode, attribute the change.

    Example:

        profkit trace --opt topk_v2

        profkit trace --target sglang --preset glm52-nvfp4-tp8 --opt topk_v2 --dry-run
    """
    from profkit.targets.registry import check_comparison, check_opts, opt_states

    with user_errors():
        cfg = _config(target, preset, model_path, server_python, extra_server_args, isl, turns, turn_tokens, output_tokens, concurrency,
                      workload_file, seed, repeat, num_steps, with_stack, record_shapes, port, health_timeout, profile_timeout, traces_dir,
                      reports_dir, marker, min_bubble_us, catalog, profile_turn, capture_only or nsys, nsys, base, fit_context, accept_length)
        cfg = _windows(cfg, profile_windows)
        opts = check_opts(target, opt)
        s_base = opt_states(target, opts, base=base, candidate=False)
        s_cand = opt_states(target, opts, base=base, candidate=True)
        for w in check_comparison(target, s_base, s_cand, opts, _caps(target)):
            err.print(f"[yellow]warning:[/] {escape(w)}", soft_wrap=True)
        tag = "+".join(opts)
        if dry_run:
            _dry_run(cfg, [("baseline", s_base), (f"candidate ({tag})", s_cand)])
            return
        _sigterm_as_interrupt()
        stamp = _stamp()
        with _progress_runner() as progress:
            before = _run(cfg, s_base, f"{stamp}-{target}-base{base}-{tag}-before", "baseline", progress)
            after = _run(cfg, s_cand, f"{stamp}-{target}-base{base}-{tag}-after", f"candidate ({tag})", progress)
        if capture_only:
            out.print(f"captured; attribute with: profkit diff {before.trace_dir} {after.trace_dir} --opt {tag} --html report.html", soft_wrap=True)
            return
        group = reports_dir / f"{stamp}-{target}-{tag}"
        diff = _attribute(before, after, opts, group, catalog, target)
        _render_attribution(diff, group)
        err.print(f"reproduce the attribution: {reproduce_command(before, after, opts, catalog, target)}", soft_wrap=True)


def reproduce_command(before: Any, after: Any, opts: list[str], catalog: Optional[str], target: str) -> str:
    """The `profkit diff` that gives the diff.json `trace` wrote: the two runs' report folders (their
    summary.json, the profile windows' summaries as repeats, the `run` section for the labels,
    throughput and switches), --opt when one optimization was attributed (several: none, as trace
    did), and the catalog trace judged the expected effect with when the folders do not imply it."""
    parts = ["profkit", "diff", str(before.report_dir), str(after.report_dir)]
    if len(opts) == 1:
        parts += ["--opt", opts[0]]
    cat = catalog or (None if target == "proxy" else "sglang-glm52")
    if cat:
        parts += ["--catalog", cat]
    return shlex.join(parts)


@app.command()
def opts(target: Target = "proxy") -> None:
    """The optimization registry: each optimization's real on/off switch, what it means in the engine, what it depends on.

    Example:

        profkit opts --target sglang
    """
    from profkit.targets.registry import registry

    with user_errors():
        reg = registry(target)
        title = ("optimizations for --target sglang (SGLang 0.5.23: every one is on by default; on = that default or the study's "
                 "own setting, off = the switch that removes it; --base on switches one off at a time)" if target == "sglang"
                 else f"optimizations for --target {target}")
        out.print(f"[bold]{escape(title)}[/]", soft_wrap=True)

        def fmt(sw: Any) -> str:
            parts = [f"{k}={v}" for k, v in sw.env.items()] + list(sw.args)
            if sw.model_override:
                parts.append(f"--json-model-override-args '{json.dumps(sw.model_override)}'")
            return " ".join(parts) or ("(SGLang's default)" if target == "sglang" else "--opts includes it")

        for o in reg.values():
            off = fmt(o.off) if target == "sglang" else "--opts omits it"
            out.print(f"\n[bold cyan]{o.name}[/]: {escape(o.title)}", soft_wrap=True)
            rows = [("meaning", o.meaning), ("on", fmt(o.on)), ("off", off),
                    ("requires", ", ".join(o.requires) + (f" ({o.requires_why})" if o.requires_why else "") if o.requires else ""),
                    ("touches", o.kernels), ("note", o.note)]
            for k, v in rows:
                if v:
                    out.print(f"  [dim]{k + ':':<9}[/] {escape(v)}", soft_wrap=True)


def sweep_plan(target: str, opts: list[str], mode: str, base: str = "on") -> list[tuple[str, dict[str, bool], str | None, str | None]]:
    """(label, states, compare_against_label, attributed_opt) for every run of a sweep.

    "all" is the full configuration: with `base` "on" (default) every optimization the sweep does
    not list stays on in every run (the study's regime: CUDA graphs, overlap, ...), so the ladder
    ends at the study's own launch command and leave-one-out removes one thing from it. With
    `base` "off" the unlisted ones are off everywhere (exploration).
    """
    from profkit.targets.registry import registry

    names = list(registry(target))
    rest = base == "on"
    allon = {n: (n in opts) or rest for n in names}
    none = {n: (n not in opts) and rest for n in names}
    plan: list[tuple[str, dict[str, bool], str | None, str | None]] = []
    if mode == "one-at-a-time":
        plan.append(("baseline", none, None, None))
        for o in opts:
            plan.append((f"+{o}", {**none, o: True}, "baseline", o))
        if len(opts) > 1:
            plan.append(("all", allon, "baseline", None))
    elif mode == "ladder":
        plan.append(("baseline", none, None, None))
        prev, cur = "baseline", dict(none)
        for o in opts:
            cur = {**cur, o: True}
            label = "+" + "+".join(x for x in opts[: opts.index(o) + 1])
            plan.append((label, dict(cur), prev, o))
            prev = label
    elif mode == "leave-one-out":
        plan.append(("all", allon, None, None))
        for o in opts:
            plan.append((f"all-{o}", {**allon, o: False}, None, o))
    else:
        raise UsageError(f"--mode {mode!r}: use one-at-a-time, ladder or leave-one-out")
    return plan


def check_sweep(target: str, plan: list[tuple[str, dict[str, bool], str | None, str | None]], caps: list[str] | None) -> list[str]:
    """Refuse a sweep with a no-op comparison (registry.check_comparison); the warnings of the rest."""
    from profkit.targets.registry import check_comparison

    runs = {label: st for label, st, _, _ in plan}
    warnings: list[str] = []
    for label, states, against, opt in plan:
        if opt is None:
            continue
        before, after = (states, runs["all"]) if against is None else (runs[against], states)
        for w in check_comparison(target, before, after, [opt], caps):
            warnings.append(f"{label}: {w}")
    return warnings


@app.command()
def sweep(
    opts_: Annotated[str, typer.Option("--opts", help="Comma-separated optimizations, e.g. overlap,topk_v2,indexer_fusion.")],
    mode: Annotated[str, typer.Option("--mode", help="one-at-a-time (each alone vs baseline, then all), ladder (cumulative), leave-one-out (all on, each off).")] = "one-at-a-time",
    base: Annotated[str, typer.Option("--base", help="on (default): optimizations not in --opts stay on in every run, so 'all' is the full configuration; off (exploration): they are off everywhere.")] = "on",
    target: Target = "proxy",
    preset: Annotated[Optional[str], typer.Option("--preset", help=OPTION_HELP["--preset"])] = None,
    model_path: Annotated[Optional[str], typer.Option("--model-path", help=OPTION_HELP["--model-path"])] = None,
    server_python: Annotated[Optional[str], typer.Option("--server-python", help=OPTION_HELP["--server-python"])] = None,
    extra_server_args: Annotated[str, typer.Option("--extra-server-args", help=OPTION_HELP["--extra-server-args"])] = "",
    isl: Annotated[Optional[str], typer.Option("--isl", help="Input length(s); a list gives the input-length curve (the study's Figure 8).")] = None,
    turns: Annotated[int, typer.Option("--turns", help=OPTION_HELP["--turns"])] = 13,
    turn_tokens: Annotated[Optional[int], typer.Option("--turn-tokens", help=OPTION_HELP["--turn-tokens"])] = None,
    output_tokens: Annotated[Optional[int], typer.Option("--output-tokens", help=OPTION_HELP["--output-tokens"])] = None,
    concurrency: Annotated[str, typer.Option("--concurrency", help="A list (1,2,4,8,16) gives the Pareto curve: tokens/s per GPU vs per user.")] = "1",
    workload_file: Annotated[Optional[Path], typer.Option("--workload-file", help=OPTION_HELP["--workload-file"])] = None,
    seed: Annotated[int, typer.Option("--seed", help=OPTION_HELP["--seed"])] = 0,
    repeat: Annotated[int, typer.Option("--repeat", help=OPTION_HELP["--repeat"])] = 1,
    num_steps: Annotated[int, typer.Option("--num-steps", help=OPTION_HELP["--num-steps"])] = 20,
    profile_windows: Annotated[int, typer.Option("--profile-windows", help="Profile windows of --num-steps iterations per run.")] = 3,
    profile_turn: Annotated[int, typer.Option("--profile-turn", help=OPTION_HELP["--profile-turn"])] = 1,
    port: Annotated[Optional[int], typer.Option("--port", help=OPTION_HELP["--port"])] = None,
    health_timeout: Annotated[Optional[float], typer.Option("--health-timeout", help=OPTION_HELP["--health-timeout"])] = None,
    profile_timeout: Annotated[float, typer.Option("--profile-timeout", help=OPTION_HELP["--profile-timeout"])] = 120.0,
    traces_dir: Annotated[Path, typer.Option("--traces-dir", help=OPTION_HELP["--traces-dir"])] = Path("traces"),
    reports_dir: Annotated[Path, typer.Option("--reports-dir", help=OPTION_HELP["--reports-dir"])] = Path("reports"),
    catalog: Annotated[Optional[str], typer.Option("--catalog", help=OPTION_HELP["--catalog"])] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help=OPTION_HELP["--dry-run"])] = False,
    capture_only: Annotated[bool, typer.Option("--capture-only", help="Record traces and manifests only (attribute later with `profkit diff`).")] = False,
    fit_context: FitContext = False,
    accept_length: AcceptLength = None,
) -> None:
    """Run a set of optimizations one at a time, as a ladder, or leave-one-out; one attribution table.

    Example:

        profkit sweep --opts overlap,topk_v2,indexer_fusion --mode ladder
    """
    from profkit.targets.registry import check_opts
    from profkit.store import write_json_atomic

    with user_errors():
        cfg = _config(target, preset, model_path, server_python, extra_server_args, isl, turns, turn_tokens, output_tokens, concurrency,
                      workload_file, seed, repeat, num_steps, False, False, port, health_timeout, profile_timeout, traces_dir, reports_dir,
                      None, 2.0, catalog, profile_turn, capture_only, False, base, fit_context, accept_length)
        cfg = _windows(cfg, profile_windows)
        chosen = check_opts(target, [o.strip() for o in opts_.split(",") if o.strip()])
        if not chosen:
            raise UsageError("--opts is empty")
        plan = sweep_plan(target, chosen, mode, base)
        for w in check_sweep(target, plan, _caps(target)):
            err.print(f"[yellow]warning:[/] {escape(w)}", soft_wrap=True)
        if dry_run:
            _dry_run(cfg, [(label, st) for label, st, _, _ in plan])
            return
        _sigterm_as_interrupt()
        stamp = _stamp()
        sweep_dir = reports_dir / f"{stamp}-{target}-sweep-{mode}"
        results: dict[str, Any] = {}
        doc: dict[str, Any] = {"schema_version": 1, "kind": "sweep", "mode": mode, "base": base, "target": target, "optimizations": chosen, "runs": [],
                               "attribution": [], "status": "running"}
        with _progress_runner() as progress:
            for label, states, _, _ in plan:
                res = _run(cfg, states, f"{stamp}-{target}-{mode}-{label_slug(label)}", label, progress)
                results[label] = res
                doc["runs"].append({"label": label, "run_id": res.run_id, "states": states, "summary": str(res.summary_path),
                                    "throughput": res.manifest.get("throughput")})
                write_json_atomic(sweep_dir / "sweep.json", doc)
        if capture_only:
            doc["status"] = "captured"
            write_json_atomic(sweep_dir / "sweep.json", doc)
            for r in doc["runs"]:
                out.print(f"{escape(r['label'])}: {escape(str(cfg.traces_dir / r['run_id']))}", soft_wrap=True)
            return
        for label, states, against, opt in plan:
            if mode == "leave-one-out":
                if opt is None:
                    continue
                before, after = results[label], results["all"]
                pair_dir = sweep_dir / f"{label_slug(label)}__all"
            elif against is None:
                continue
            else:
                before, after = results[against], results[label]
                pair_dir = sweep_dir / f"{label_slug(against)}__{label_slug(label)}"
            diff = _attribute(before, after, [opt] if opt else [], pair_dir, catalog, target)
            doc["attribution"].append(_attribution_row(label, opt, before, after, diff, pair_dir))
        doc["pareto"] = {r["label"]: [{"concurrency": p["concurrency"], "isl": p["isl"],
                                       "tokens_per_s_per_gpu": p["tokens_per_s_per_gpu"]["median"],
                                       "tokens_per_s_per_user": p["tokens_per_s_per_user_p50"]["median"]} for p in (r["throughput"] or [])]
                         for r in doc["runs"]}
        doc["status"] = "ok"
        write_json_atomic(sweep_dir / "sweep.json", doc)
        write_reports(sweep_dir, diffs=[json.loads(Path(a["diff"]).read_text()) for a in doc["attribution"]],
                      runs=[(lbl, results[lbl].summary) for lbl, *_ in plan])
        _render_sweep(doc)
        wrote = [sweep_dir / n for n in ("sweep.json", "report.html") if (sweep_dir / n).is_file()]
        out.print(f"wrote {', '.join(escape(str(p)) for p in wrote)}", soft_wrap=True)


def label_slug(label: str) -> str:
    """A sweep label as a folder-name part, its steps kept apart: "+overlap+topk_v2" ->
    "plus-overlap-plus-topk_v2", "all-topk_v2" stays, "baseline" stays."""
    import re

    first, *added = label.split("+")
    slug = "-".join(([first] if first else []) + [f"plus-{p}" for p in added if p])
    return re.sub(r"[^\w.-]+", "_", slug) or "run"


def _attribution_row(label: str, opt: Optional[str], before: Any, after: Any, diff: dict[str, Any], pair_dir: Path) -> dict[str, Any]:
    tb = ((diff.get("throughput") or {}).get("baseline") or {}).get("tokens_per_s_per_user_p50", {}).get("median")
    tc = ((diff.get("throughput") or {}).get("candidate") or {}).get("tokens_per_s_per_user_p50", {}).get("median")
    counts = diff.get("counts", {})
    return {
        "label": label, "optimization": opt, "baseline": before.run_id, "candidate": after.run_id, "diff": str(pair_dir / "diff.json"),
        "tokens_per_s_per_user": {"baseline": tb, "candidate": tc, "ratio": (tc / tb) if tb and tc else None},
        "gpu_window_us": diff.get("gpu_window_us"), "wall_us": diff.get("wall_us"),
        "decomposition": diff.get("decomposition"),
        "counts": {k: (v or {}).get("delta") for k, v in counts.items()},
        "flags": [f for f in ((diff.get("expected_effect") or {}).get("flags") or [])],
    }


def _render_sweep(doc: dict[str, Any]) -> None:
    t = Table(title=f"attribution ({doc['mode']}); per-iteration means, counts per-iteration medians", title_justify="left", box=None)
    for c in ("run", "tok/s/user", "Δ window µs", "top category Δ", "Δ idle µs", "Δ kernels", "Δ launches", "Δ syncs"):
        t.add_column(c, justify="left" if c in ("run", "top category Δ") else "right", no_wrap=True)
    flags: list[str] = []
    for row in doc["attribution"]:
        tp = row["tokens_per_s_per_user"]
        w = row.get("gpu_window_us") or {}
        dec = row.get("decomposition") or {}
        cats = dec.get("category_us") or {}
        top = max(cats.items(), key=lambda kv: abs(kv[1]), default=None)
        c = row["counts"]
        t.add_row(
            escape(row["label"]),
            f"{tp['baseline']:.0f}→{tp['candidate']:.0f}" if tp["baseline"] and tp["candidate"] else "-",
            f"{w.get('delta', 0):+,.0f}" if w else "-",
            escape(f"{top[0]} {top[1]:+,.0f}") if top else "-",
            f"{dec.get('idle_us', 0):+,.0f}" if dec else "-",
            _d(c.get("gpu_kernels")), _d(c.get("kernel_launches")), _d(c.get("syncs")),
        )
        flags += [f"{row['label']}: {f}" for f in row["flags"]]
    out.print(t)
    for f in flags:
        out.print(f"[yellow]flag:[/] {escape(f)}", soft_wrap=True)


def _d(v: Any) -> str:
    return "-" if v is None else f"{v:+g}"
