"""`trace` (and each run of a `sweep`) end to end: record the runs (capture/run.py: traces and the
manifest), then summarize every profile window of each (analysis/summarize.py, with the catalog
chosen once per run before), write reports/<run_id>/summary.json and finish the manifest; then
attribute a compared pair (attribution/diff.py) into its folder with its reports (report/).

The manifest says where a run stopped: its "analysis" stage starts before anything is summarized, and
a failure or Ctrl-C there finishes it ("failed", "interrupted"), as every capture stage does. Nothing
here prints; progress lines go to the caller's `progress`, notes for the user are returned.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from profkit.capture.manifest import ManifestDoc
from profkit.capture.run import Progress, Recording, RunConfig, capture_traces, record_interleaved
from profkit.errors import Interrupted, ProfkitError
from profkit.flows.outputs import AFTER_JSON, BEFORE_JSON, DIFF_JSON, REPORT_HTML, REPORT_MD, SUMMARY_JSON

if TYPE_CHECKING:
    from profkit.analysis.catalog import CatalogChoice
    from profkit.documents import Diff  # msgspec: not on a GPU box that records only (--capture-only)


@dataclass
class RunResult:
    """One run recorded and (unless --capture-only) summarized."""

    run_id: str
    states: dict[str, bool]
    trace_dir: Path
    report_dir: Path
    summary_path: Path  # reports/<run_id>/summary.json; --capture-only: the run folder (--nsys: its report)
    summary: dict[str, Any]
    manifest: ManifestDoc
    windows: list[dict[str, Any]] = field(default_factory=list)  # one summary per profile window (when more than one)
    catalog: CatalogChoice | None = None  # the catalog its summaries were made with (None: not analyzed, --capture-only)


def run_one(cfg: RunConfig, states: dict[str, bool], run_id: str, *, label: str, progress: Progress = lambda s: None,
            tick: Progress = lambda s: None) -> RunResult:
    """One run recorded (capture/run.record_one), then summarized. `progress` gets one line per step
    (server start, warm-up, each repeat, each profile window, analysis); `tick` the profile window's
    decode step, many times a second."""
    return run_interleaved([(cfg, states, run_id, label)], progress, tick)[0]


def run_interleaved(jobs: list[tuple[RunConfig, dict[str, bool], str, str]], progress: Progress = lambda s: None,
                    tick: Progress = lambda s: None) -> list[RunResult]:
    """Several runs recorded side by side (capture/run.record_interleaved: their steps alternating), then
    each summarized in turn. A failure in one run's analysis finishes the manifests of those not
    analyzed yet ("interrupted")."""
    recorded = record_interleaved(jobs, progress, tick)
    out: list[RunResult] = []
    try:
        for rec, (cfg, *_) in zip(recorded, jobs):
            out.append(summarize_run(rec, cfg, progress))
    except BaseException:
        rest = recorded[len(out):]  # the first: the run whose analysis failed or was interrupted
        for r in rest:  # it too, when the interrupt came before its analysis began
            if r.manifest.data.get("status") == "running":
                r.manifest.finish("interrupted", error="interrupted before its analysis" if r is rest[0] else
                                  f"recorded, not analyzed: the analysis of {rest[0].run_id} failed or was interrupted")
        raise
    return out


def summarize_run(rec: Recording, cfg: RunConfig, progress: Progress = lambda s: None) -> RunResult:
    """A recorded run -> each profile window's summary.json under reports/<run_id>/ (window-<i>/ for each
    window, the first also at the top), with the run's `run` section; the manifest finished. With
    --capture-only (the manifest already finished): the recording as it is."""
    manifest, trace_dir, label = rec.manifest, rec.trace_dir, rec.label
    report_dir = cfg.reports_dir / rec.run_id
    if cfg.capture_only:
        where = rec.files[0] if cfg.nsys and rec.files else trace_dir
        return RunResult(rec.run_id, rec.states, trace_dir, report_dir, where, {}, manifest.data)
    try:
        files = rec.files
        if cfg.nsys:  # the report, analyzed through its SQLite export (ingest/nsys.py, the command shown)
            from profkit.ingest.nsys import exported

            rep = files[0]
            progress(f"{label}: exporting {rep.name} to SQLite")
            files = [exported(rep)]
            manifest.update(trace_files=[rep.name, files[0].name], note="an Nsight Systems report (nsys-ui) and its SQLite export (analyzed)")
        manifest.stage("analysis")
        progress(f"{label}: analyzing")
        from profkit.analysis.catalog import choose_catalog
        from profkit.store import write_json_atomic

        report_dir.mkdir(parents=True, exist_ok=True)
        # chosen once for the run, before any window is summarized, as every command chooses it:
        # --catalog, else the one this run's manifest (its target) implies
        catalog = choose_catalog(cfg.catalog, [trace_dir])
        windows = []
        groups = _by_window(files)
        for i, (name, wfiles) in enumerate(groups):
            if len(groups) > 1:
                progress(f"{label}: analyzing profile window {i + 1}/{len(groups)}")
            s = analyze_run(wfiles, cfg, manifest.data, catalog, captures=capture_traces(trace_dir), window=i)
            if name:
                write_json_atomic(report_dir / name / SUMMARY_JSON, s)
            windows.append(s)
        summary = windows[0]
        summary_path = report_dir / SUMMARY_JSON
        write_json_atomic(summary_path, summary)
        manifest.update(summary=str(summary_path))
        manifest.finish("ok")
    except KeyboardInterrupt:
        manifest.finish("interrupted", error=f"interrupted during {manifest.data['stage']}")
        raise Interrupted(f"interrupted during {manifest.data['stage']}; kept {trace_dir}", hint=f"see {trace_dir / 'manifest.json'}") from None
    except ProfkitError as e:
        manifest.finish("failed", error=str(e))
        raise
    return RunResult(rec.run_id, rec.states, trace_dir, report_dir, summary_path, summary, manifest.data,
                     windows if len(windows) > 1 else [], catalog)


def _by_window(files: list[Path]) -> list[tuple[str | None, list[Path]]]:
    """Trace files grouped by profile window (window-<i>/ folders; files at the top: one window)."""
    groups: dict[str | None, list[Path]] = {}
    for f in files:
        groups.setdefault(f.parent.name if f.parent.name.startswith("window-") else None, []).append(f)
    return sorted(groups.items(), key=lambda kv: int(kv[0].split("-")[1]) if kv[0] else -1)


def analyze_run(files: list[Path], cfg: RunConfig, manifest: ManifestDoc, catalog: CatalogChoice,
                captures: list[Path] | None = None, window: int = 0) -> dict[str, Any]:
    """One profile window's traces -> its summary.json (analysis/summarize.py, as `analyze` does it),
    with the run's `run` section (labels, switches, throughput, which profile window) added."""
    from profkit.analysis.summarize import SummarizeOptions, summarize

    # ranks in parallel, large traces through the parquet cache (a later diff/report reads it)
    summary = summarize(files, SummarizeOptions(marker=cfg.marker, min_bubble_us=cfg.min_bubble_us, catalog=catalog,
                                                captures=tuple(captures or ()))).summary
    summary["run"] = {
        "run_id": manifest["run_id"], "label": manifest["label"], "target": manifest["target"], "preset": manifest.get("preset"),
        "optimizations": manifest["optimizations"], "base": manifest.get("base"), "command": manifest["command"], "throughput": manifest.get("throughput"),
        "profiler_overhead": manifest.get("profiler_overhead"), "versions": manifest.get("versions"), "workload": manifest.get("workload"),
        "window": window,
        "capture_order": manifest.get("capture_order"),  # alternating (A B A B) or sequential: the report says which
        "recorded_with": manifest.get("recorded_with"),  # the runs alternating with it (a gate of such a pair is paired)
        "host_load": manifest.get("host_load"),  # other processes' CPU use meanwhile (a gate compares the sides')
    }
    return summary


# ---------------------------------------------------------------- one compared pair

def attribute(before: RunResult, after: RunResult, opts: list[str], group_dir: Path) -> tuple[Diff, list[str]]:
    """before.json, after.json, diff.json (+ report.html and report.md where the report modules exist) in
    group_dir: the diff, and notes for the user."""
    from profkit.analysis.catalog import CatalogChoice
    from profkit.attribution.diff import compare_summaries
    from profkit.documents import diff_doc
    from profkit.store import write_json_atomic

    # the expected effect is judged with the catalog the candidate was summarized with (summarize_run's
    # choice: --catalog, else the manifest's target), as `profkit diff` of the two folders judges it
    cat = (after.catalog or CatalogChoice()).for_effect(after.summary, 0)
    group_dir.mkdir(parents=True, exist_ok=True)
    write_json_atomic(group_dir / BEFORE_JSON, before.summary)
    write_json_atomic(group_dir / AFTER_JSON, after.summary)
    diff = compare_summaries(before.summary, after.summary, opt=opts[0] if len(opts) == 1 else None, catalog=cat,
                             labels=(before.run_id, after.run_id), baseline_repeats=before.windows,
                             candidate_repeats=after.windows)
    write_json_atomic(group_dir / DIFF_JSON, diff_doc(diff))
    notes = write_reports(group_dir, diffs=[diff], runs=[(before.run_id, before.summary), (after.run_id, after.summary)],
                          windows=[before.windows, after.windows])
    return diff, notes


def write_reports(folder: Path, *, diffs: list[Any], runs: list[tuple[str, dict[str, Any]]],
                  windows: list[list[dict[str, Any]]] | None = None, sweep: dict[str, Any] | None = None) -> list[str]:
    """report.html (self-contained) and report.md (a PR comment: of a single diff, or of the `sweep`, sweep.json's
    document, whose attribution rows are `diffs`) in `folder`; notes for the user (no report.html without the
    `report` extra). `windows`: each run's profile-window summaries, over which the ladder takes its medians
    (the diffs' statistic)."""
    from profkit.attribution import ladder_steps
    from profkit.report import Report, renderer_for
    from profkit.store import write_bytes_atomic

    ladder = ladder_steps(runs, windows=windows)
    if sweep is not None and diffs:
        from profkit.report.markdown_sweep import SweepMarkdownRenderer

        text = SweepMarkdownRenderer().render(Report(diffs=diffs, runs=runs, ladder=ladder, sweep=sweep))
        write_bytes_atomic(folder / REPORT_MD, text.encode())
    elif len(diffs) == 1:
        write_bytes_atomic(folder / REPORT_MD, renderer_for("report.md")().render(Report(diffs=diffs)).encode())
    try:
        html = renderer_for("report.html")
    except ImportError as e:  # plotly/jinja2 are the `report` extra
        return [f"no report.html: {e}; pip install 'profkit[report]'"]
    # one compared pair: the diff's report alone, the page `profkit report diff.json` writes of the same diff (issue 40: the
    # runs' own sections repeated the diff's, and a two-run ladder of equal bars; the diff carries both runs' manifests)
    report = Report(diffs=diffs) if len(diffs) == 1 else Report(diffs=diffs, runs=runs, ladder=ladder)
    write_bytes_atomic(folder / REPORT_HTML, html().render(report).encode())
    return []


def reproduce_command(before: RunResult, after: RunResult, opts: list[str], catalog: Optional[str], target: str) -> str:
    """The `profkit diff` that gives the diff.json `trace` wrote: the two runs' report folders (their
    summary.json, the profile windows' summaries as repeats, the `run` section for the labels,
    throughput and switches), --opt when one optimization was attributed (several: none, as trace
    did), and the catalog trace judged the expected effect with when the folders do not imply it
    (--catalog as given; on an engine's own package, sglang or vllm, the one its manifest implied, named for the reader)."""
    parts = ["profkit", "diff", str(before.report_dir), str(after.report_dir)]
    if len(opts) == 1:
        parts += ["--opt", opts[0]]
    from profkit.targets.engines import target as target_named

    choice = after.catalog
    # an engine of its own package names the catalog its manifest implied; profkit's own engine (package None) goes without
    named = choice is not None and choice.how == "manifest" and target_named(target).package is not None
    cat = catalog or (choice.name if choice is not None and named else None)
    if cat:
        parts += ["--catalog", cat]
    return shlex.join(parts)
