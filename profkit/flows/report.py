"""`report` end to end: what it is pointed at -> the diffs and the runs of one HTML report. A sweep's
folder gives its runs (under the sweep's labels) and its compared pairs' diff.json; an attribution
folder its diff.json; a diff.json file itself; anything else is a side (flows/inputs.load_side: a
summary, trace or run folder, summarized under the catalog chosen before; --window picks a profile
window). Nothing here prints: notes for the reader go to `note`."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import msgspec

from profkit.analysis.summarize import SummarizeOptions
from profkit.documents import SweepDoc, SweepStep
from profkit.errors import TraceInputError
from profkit.documents import Diff, Summary
from profkit.flows.inputs import checked_diff, is_diff_doc, load_side, profile_windows_of, read_diff, read_json, read_summary


def is_sweep(path: Path) -> bool:
    return path.is_dir() and (path / "sweep.json").is_file()


def _in_sweep(sweep_dir: Path, recorded: str) -> Path:
    """A path sweep.json recorded (relative to where `profkit sweep` ran: reports/<run_id>/summary.json,
    reports/<sweep>/<pair>/diff.json) as it is from here: as written when it exists, else found by its
    last two parts beside the sweep's folder (a run) or inside it (a compared pair)."""
    p = Path(recorded)
    if p.exists() or p.is_absolute() or len(p.parts) < 2:
        return p
    tail = Path(*p.parts[-2:])
    for base in (sweep_dir, sweep_dir.parent):
        if (base / tail).exists():
            return base / tail
    return p


def read_sweep(sweep_dir: Path) -> tuple[SweepDoc, list[tuple[SweepStep, Diff | None]]]:
    """sweep.json (decoded once, into documents.SweepDoc) and each of its compared pairs (its `attribution`
    rows, in order) with the pair's diff.json (None where the file is missing: a sweep interrupted while
    attributing)."""
    path = sweep_dir / "sweep.json"
    raw = read_json(path)
    if not isinstance(raw, dict) or raw.get("kind") != "sweep":
        raise TraceInputError(f"{path}: not a profkit sweep.json (no \"kind\": \"sweep\")",
                              hint="point at the folder `profkit sweep` wrote (reports/<stamp>-<target>-sweep-<mode>/)")
    try:
        doc = msgspec.convert(raw, SweepDoc)
    except msgspec.ValidationError as e:
        raise TraceInputError(f"{path}: not a valid sweep.json ({e})", hint="re-run the sweep, or point at its diff.json files") from None
    steps: list[tuple[SweepStep, Diff | None]] = []
    for row in doc.attribution:
        f = _in_sweep(sweep_dir, str(row.diff))
        steps.append((row, checked_diff(f) if f.is_file() else None))
    return doc, steps


def gather(paths: list[Path], opts: SummarizeOptions, window: int | None,
           note: Callable[[str], None] = lambda n: None
           ) -> tuple[list[Diff], list[tuple[str, Summary]], list[list[Summary]]]:
    """The report's diffs, its runs (label, summary; labels made unique (#i) where two runs share one) and
    each run's profile-window summaries (empty for a run of one window, or with --window: the ladder's
    figures are then medians over them, as the diffs' are)."""
    diffs: list[Diff] = []
    runs: list[tuple[str, Summary]] = []
    windows: list[list[Summary]] = []
    expanded: list[Path] = []
    named: dict[Path, str] = {}  # a sweep's runs keep the sweep's labels (baseline, +topk_v2, ...)
    for p in paths:
        if is_sweep(p):  # a sweep's folder: its runs, then its compared pairs
            doc, steps = read_sweep(p)
            for r in doc.runs:
                expanded.append(_in_sweep(p, r.summary).parent)
                named[expanded[-1]] = r.label
            diffs += [d for _, d in steps if d is not None]
        elif p.is_dir() and (p / "diff.json").is_file():  # an attribution folder (trace's, or one pair of a sweep)
            diffs.append(checked_diff(p / "diff.json"))
        else:
            expanded.append(p)
    for p in expanded:
        label = named.get(p)
        if window is not None and p.is_dir():
            wins = profile_windows_of(p)
            hit = [w for w in wins if w.name.split("-")[1] == str(window)]
            if not hit:
                raise TraceInputError(f"{p}: no profile window {window} (it has {', '.join(w.name + '/' for w in wins) or 'none'})",
                                      hint="pick one of those with --window, or leave --window out")
            p = hit[0]
        read = None
        if p.is_file() and p.suffix == ".json" and not p.name.endswith(".trace.json"):
            d = read_diff(p)
            if d is not None:
                diffs.append(d)
                continue
            read = read_summary(p)  # a summary.json: decoded once, here; else its JSON value
            if not isinstance(read, Summary) and is_diff_doc(read):
                diffs.append(checked_diff(p))  # check_diff says what is wrong with it
                continue
        side = load_side(p, opts, read)
        if side.others:
            note(f"{p}: {len(side.others)} profile windows; this report shows the first (--window i for another; "
                 f"diff uses every window for noise)")
        runs.append((label or side.label, side.doc))
        windows.append(side.docs)
    labels = [label for label, _ in runs]
    if len(set(labels)) != len(labels):
        runs = [(f"{label} #{i + 1}", s) for i, (label, s) in enumerate(runs)]
    return diffs, runs, windows


def ladder_steps(runs: list[tuple[str, Any]], windows: list[list[Any]] | None = None) -> Any:
    """The report's ladder over its runs (attribution.ladder_steps: medians over each run's profile windows)."""
    from profkit.attribution import ladder_steps as steps

    return steps(runs, windows=windows)
