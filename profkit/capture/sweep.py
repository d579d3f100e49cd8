"""The library side of `trace` and `sweep` once their runs are recorded: which runs a sweep makes
and which pairs it compares, the attribution folder of one compared pair (before.json,
after.json, diff.json, report.md, report.html), sweep.json's rows, and the `profkit diff` that
reproduces an attribution. Nothing here prints; notes for the user are returned."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from profkit.errors import UsageError

if TYPE_CHECKING:
    from profkit.capture.run import RunResult

# (label, switch states, the label it is compared against or None, the optimization it attributes or None)
Plan = list[tuple[str, dict[str, bool], Optional[str], Optional[str]]]


def sweep_plan(target: str, opts: list[str], mode: str, base: str = "on") -> Plan:
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
    plan: Plan = []
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


def check_sweep(target: str, plan: Plan, caps: list[str] | None) -> list[str]:
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


def compared_pairs(plan: Plan, mode: str, sweep_dir: Path) -> list[tuple[str, Optional[str], str, str, Path]]:
    """(label, attributed optimization, baseline label, candidate label, attribution folder) for
    every pair the sweep compares: leave-one-out compares each run with "all", the other modes
    each run with the one it was planned against."""
    pairs = []
    for label, _states, against, opt in plan:
        if mode == "leave-one-out":
            if opt is None:
                continue
            pairs.append((label, opt, label, "all", sweep_dir / f"{label_slug(label)}__all"))
        elif against is not None:
            pairs.append((label, opt, against, label, sweep_dir / f"{label_slug(against)}__{label_slug(label)}"))
    return pairs


def attribute(before: RunResult, after: RunResult, opts: list[str], group_dir: Path) -> tuple[dict[str, Any], list[str]]:
    """before.json, after.json, diff.json (+ report.html and report.md where the report modules exist) in
    group_dir: the diff, and notes for the user."""
    from profkit.attribution.diff import compare_summaries
    from profkit.analysis.catalog import CatalogChoice
    from profkit.store import write_json_atomic

    # the expected effect is judged with the catalog the candidate was summarized with (run_one's
    # choice: --catalog, else the manifest's target), as `profkit diff` of the two folders judges it
    cat = (after.catalog or CatalogChoice()).for_effect(after.summary, 0)
    group_dir.mkdir(parents=True, exist_ok=True)
    write_json_atomic(group_dir / "before.json", before.summary)
    write_json_atomic(group_dir / "after.json", after.summary)
    diff = compare_summaries(before.summary, after.summary, opt=opts[0] if len(opts) == 1 else None, catalog=cat,
                             labels=(before.run_id, after.run_id), baseline_repeats=getattr(before, "windows", None) or (),
                             candidate_repeats=getattr(after, "windows", None) or ())
    write_json_atomic(group_dir / "diff.json", diff)
    notes = write_reports(group_dir, diffs=[diff], runs=[(before.run_id, before.summary), (after.run_id, after.summary)])
    return diff, notes


def write_reports(folder: Path, *, diffs: list[dict[str, Any]], runs: list[tuple[str, dict[str, Any]]]) -> list[str]:
    """report.html (self-contained) and, for a single diff, report.md (a PR comment) in `folder`;
    notes for the user (no report.html without the `report` extra)."""
    from profkit.attribution import ladder_steps
    from profkit.report import Report, renderer_for
    from profkit.store import write_bytes_atomic

    if len(diffs) == 1:
        write_bytes_atomic(folder / "report.md", renderer_for("report.md")().render(Report(diffs=diffs)).encode())
    try:
        html = renderer_for("report.html")
    except ImportError as e:  # plotly/jinja2 are the `report` extra
        return [f"no report.html: {e}; pip install 'profkit[report]'"]
    write_bytes_atomic(folder / "report.html", html().render(Report(diffs=diffs, runs=runs, ladder=ladder_steps(runs))).encode())
    return []


def label_slug(label: str) -> str:
    """A sweep label as a folder-name part, its steps kept apart: "+overlap+topk_v2" ->
    "plus-overlap-plus-topk_v2", "all-topk_v2" stays, "baseline" stays."""
    import re

    first, *added = label.split("+")
    slug = "-".join(([first] if first else []) + [f"plus-{p}" for p in added if p])
    return re.sub(r"[^\w.-]+", "_", slug) or "run"


def attribution_row(label: str, opt: Optional[str], before: RunResult, after: RunResult, diff: dict[str, Any], pair_dir: Path) -> dict[str, Any]:
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


def pareto(runs: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """sweep.json's `pareto`: per run, tokens/s per GPU and per user at each measured point."""
    return {r["label"]: [{"concurrency": p["concurrency"], "isl": p["isl"],
                          "tokens_per_s_per_gpu": p["tokens_per_s_per_gpu"]["median"],
                          "tokens_per_s_per_user": p["tokens_per_s_per_user_p50"]["median"]} for p in (r["throughput"] or [])]
            for r in runs}


def reproduce_command(before: RunResult, after: RunResult, opts: list[str], catalog: Optional[str], target: str) -> str:
    """The `profkit diff` that gives the diff.json `trace` wrote: the two runs' report folders (their
    summary.json, the profile windows' summaries as repeats, the `run` section for the labels,
    throughput and switches), --opt when one optimization was attributed (several: none, as trace
    did), and the catalog trace judged the expected effect with when the folders do not imply it
    (--catalog as given; on sglang the one its manifest implied, named for the reader)."""
    parts = ["profkit", "diff", str(before.report_dir), str(after.report_dir)]
    if len(opts) == 1:
        parts += ["--opt", opts[0]]
    choice = after.catalog
    cat = catalog or (choice.name if choice is not None and target != "proxy" and choice.how == "manifest" else None)
    if cat:
        parts += ["--catalog", cat]
    return shlex.join(parts)
