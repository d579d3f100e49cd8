"""`sweep` end to end once its runs are recorded and summarized (flows/trace.py; the plan of its runs:
capture/sweep.py): which pairs it compares, each pair's attribution folder (flows/trace.attribute),
sweep.json's rows and Pareto points, and the sweep's own report.html. Nothing here prints; notes
for the user are returned."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from profkit.capture.sweep import Plan, label_slug
from profkit.flows.trace import RunResult, attribute, write_reports


def compared_pairs(plan: Plan, mode: str, sweep_dir: Path) -> list[tuple[str, Optional[str], str, str, Path]]:
    """(label, attributed optimization, baseline label, candidate label, attribution folder) for
    every pair the sweep compares: leave-one-out compares each run with "all", the other modes
    each run with the one it was planned against."""
    pairs: list[tuple[str, Optional[str], str, str, Path]] = []
    for label, _states, against, opt in plan:
        if mode == "leave-one-out":
            if opt is None:
                continue
            pairs.append((label, opt, label, "all", sweep_dir / f"{label_slug(label)}__all"))
        elif against is not None:
            pairs.append((label, opt, against, label, sweep_dir / f"{label_slug(against)}__{label_slug(label)}"))
    return pairs


def attribute_sweep(plan: Plan, mode: str, results: dict[str, RunResult], sweep_dir: Path, doc: dict[str, Any]) -> tuple[list[dict[str, Any]], list[str]]:
    """Every compared pair attributed into its folder, its row in `doc` (sweep.json: `attribution`,
    `pareto`, status "ok", written), and the sweep's report.html over every run and diff: the diffs,
    and notes for the user."""
    from profkit.store import write_json_atomic

    diffs: list[Any] = []  # each a Diff (compare_summaries)
    notes: list[str] = []
    for label, opt, b_label, a_label, pair_dir in compared_pairs(plan, mode, sweep_dir):
        before, after = results[b_label], results[a_label]
        diff, more = attribute(before, after, [opt] if opt else [], pair_dir)
        notes += more
        diffs.append(diff)
        doc["attribution"].append(attribution_row(label, opt, before, after, diff, pair_dir))
    doc["pareto"] = pareto(doc["runs"])
    doc["status"] = "ok"
    write_json_atomic(sweep_dir / "sweep.json", doc)
    notes += write_reports(sweep_dir, diffs=diffs,  # the diffs just written (each pair's diff.json), not read back
                           runs=[(lbl, results[lbl].summary) for lbl, *_ in plan], windows=[results[lbl].windows for lbl, *_ in plan], sweep=doc)
    return diffs, notes


def attribution_row(label: str, opt: Optional[str], before: RunResult, after: RunResult, diff: Any, pair_dir: Path) -> dict[str, Any]:
    from profkit.documents import Diff, diff_doc

    diff = diff_doc(diff) if isinstance(diff, Diff) else diff  # the Diff compare_summaries returns, as sweep.json writes its parts
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


