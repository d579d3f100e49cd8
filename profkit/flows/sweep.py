"""`sweep` end to end once its runs are recorded and summarized (flows/trace.py; the plan of its runs:
capture/sweep.py): sweep.json (documents.SweepDoc), which pairs it compares, each pair's attribution
folder (flows/trace.attribute), sweep.json's rows and Pareto points, and the sweep's own report.html.
Nothing here prints; notes for the user are returned.

While the runs are recorded, sweep.json is the plain JSON value of a SweepDoc (new_sweep, add_run: the
struct's fields, in its order; tests/test_sweep_doc.py holds them equal): `sweep --capture-only` records
on a GPU box without the analysis packages, msgspec among them. Attributing needs them: the document
becomes its SweepDoc there (attribute_sweep), rows and Pareto points are added to the struct, and
sweep.json is encoded from it."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional, TypedDict

from profkit.capture.manifest import Point
from profkit.capture.sweep import Plan, label_slug
from profkit.flows.outputs import DIFF_JSON, SWEEP_JSON, write_json
from profkit.flows.trace import RunResult, attribute, write_reports

if TYPE_CHECKING:
    from profkit.documents import ParetoPoint, SweepDoc, SweepRun



class RecordedRun(TypedDict):
    """A SweepRun's fields, in its order."""
    label: str
    run_id: str
    states: dict[str, bool]
    summary: str
    throughput: list[Point] | None


class Recorded(TypedDict):
    """sweep.json while its runs are recorded: a SweepDoc's fields in its order (new_sweep, add_run), without `pareto`."""
    schema_version: int
    kind: str
    mode: str
    base: str
    target: str
    optimizations: list[str]
    runs: list[RecordedRun]
    attribution: list[object]  # empty until attribute_sweep adds the rows, to the SweepDoc
    status: str


def new_sweep(mode: str, base: str, target: str, optimizations: list[str]) -> Recorded:
    """sweep.json before any run (a SweepDoc's fields): status "running"."""
    return {"schema_version": 1, "kind": "sweep", "mode": mode, "base": base, "target": target, "optimizations": list(optimizations),
            "runs": [], "attribution": [], "status": "running"}


def add_run(doc: Recorded, label: str, states: dict[str, bool], res: RunResult) -> None:
    """A recorded (and summarized) run's row in sweep.json's `runs` (a SweepRun's fields): its plan's label and switches."""
    doc["runs"].append({"label": label, "run_id": res.run_id, "states": states, "summary": str(res.summary_path),
                        "throughput": res.manifest.get("throughput")})


def write_sweep(sweep_dir: Path, doc: Recorded | SweepDoc, status: str | None = None) -> None:
    """sweep.json written (atomically) as `doc` is now; `status` set first when given."""
    if isinstance(doc, dict):
        if status is not None:
            doc["status"] = status
        write_json(sweep_dir / SWEEP_JSON, doc)
        return
    from profkit.documents import sweep_values

    if status is not None:
        doc.status = status
    write_json(sweep_dir / SWEEP_JSON, sweep_values(doc))




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


def attribute_sweep(plan: Plan, mode: str, results: dict[str, RunResult], sweep_dir: Path,
                    recorded: Recorded) -> tuple[SweepDoc, list[Any], list[str]]:
    """Every compared pair attributed into its folder, its row in sweep.json (the `recorded` document as
    its SweepDoc, with `attribution`, `pareto` and status "ok"; written), and the sweep's report.html over
    every run and diff: the document, the diffs, and notes for the user."""
    import msgspec

    from profkit.documents import SweepDoc, SweepStep, sweep_values

    doc = msgspec.convert(recorded, SweepDoc)
    diffs: list[Any] = []  # each a Diff (compare_summaries)
    notes: list[str] = []
    for label, opt, b_label, a_label, pair_dir in compared_pairs(plan, mode, sweep_dir):
        before, after = results[b_label], results[a_label]
        diff, more = attribute(before, after, [opt] if opt else [], pair_dir)
        notes += more
        diffs.append(diff)
        doc.attribution.append(msgspec.convert(attribution_row(label, opt, before, after, diff, pair_dir), SweepStep))
    doc.pareto = pareto(doc.runs)
    write_sweep(sweep_dir, doc, "ok")
    notes += write_reports(sweep_dir, diffs=diffs,  # the diffs just written (each pair's diff.json), not read back
                           runs=[(lbl, results[lbl].summary) for lbl, *_ in plan], windows=[results[lbl].windows for lbl, *_ in plan],
                           sweep=sweep_values(doc))
    return doc, diffs, notes


def attribution_row(label: str, opt: Optional[str], before: RunResult, after: RunResult, diff: Any, pair_dir: Path) -> dict[str, Any]:
    from profkit.documents import Diff, diff_doc

    diff = diff_doc(diff) if isinstance(diff, Diff) else diff  # the Diff compare_summaries returns, as sweep.json writes its parts
    tb = ((diff.get("throughput") or {}).get("baseline") or {}).get("tokens_per_s_per_user_p50", {}).get("median")
    tc = ((diff.get("throughput") or {}).get("candidate") or {}).get("tokens_per_s_per_user_p50", {}).get("median")
    counts = diff.get("counts", {})
    return {
        "label": label, "optimization": opt, "baseline": before.run_id, "candidate": after.run_id, "diff": str(pair_dir / DIFF_JSON),
        "tokens_per_s_per_user": {"baseline": tb, "candidate": tc, "ratio": (tc / tb) if tb and tc else None},
        "gpu_window_us": diff.get("gpu_window_us"), "wall_us": diff.get("wall_us"),
        "decomposition": diff.get("decomposition"),
        "counts": {k: (v or {}).get("delta") for k, v in counts.items()},
        "flags": [f for f in ((diff.get("expected_effect") or {}).get("flags") or [])],
    }


def pareto(runs: list[SweepRun]) -> dict[str, list[ParetoPoint]]:
    """sweep.json's `pareto`: per run, tokens/s per GPU and per user at each measured point."""
    from profkit.documents import ParetoPoint

    return {r.label: [ParetoPoint(concurrency=p["concurrency"], isl=p["isl"], tokens_per_s_per_gpu=p["tokens_per_s_per_gpu"]["median"],
                                  tokens_per_s_per_user=p["tokens_per_s_per_user_p50"]["median"]) for p in (r.throughput or [])]
            for r in runs}


