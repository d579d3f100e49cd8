"""`gate`, `calibrate` and `baseline` end to end (DESIGN.md "A gate for CI"): the two sides (run
folders, stored baselines or a diff.json) through the same diff as `profkit diff` (flows/diff.py),
their comparability key, the policy and the calibration read, attribution/gate.py's decision, the
nightly history; a calibration from two recordings of one configuration; stored baselines under a
folder (default baselines/). Nothing here prints."""

from __future__ import annotations

import datetime as dt
import json
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import msgspec

from profkit.attribution.gate import (BaselineEntry, Policy, calibration_from, compare_keys, decide, default_policy, key_id,
                                      not_comparable, pick_entry, policy_from, run_key, with_history)
from profkit.documents import Calibration, Diff, Gate, RunKey, StoredBaseline, diff_of
from profkit.errors import TraceInputError, UsageError

if TYPE_CHECKING:
    from profkit.analysis.summarize import SummarizeOptions
    from profkit.flows.trace import RunResult

ENTRY_FILE = "baseline.json"


def load_policy(path: Path | None, threshold_pct: float | None) -> Policy:
    """The policy file (TOML), or the built-in one; --threshold replaces every default threshold."""
    if path is None:
        return default_policy(threshold_pct) if threshold_pct is not None else default_policy()
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - exercised on 3.10 only
        import tomli as tomllib

    try:
        doc = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise TraceInputError(f"{path}: no such policy file", hint="check the path, or drop --policy for the built-in one") from None
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise TraceInputError(f"{path}: not a TOML policy ({e})", hint="see docs/ci.md for the policy's format") from None
    try:
        return policy_from(doc, str(path), threshold_pct)
    except ValueError as e:
        raise TraceInputError(f"{path}: {e}", hint="see docs/ci.md for the policy's format") from None


def load_calibration(path: Path) -> Calibration:
    """calibration.json (profkit calibrate), decoded into its type."""
    from profkit.flows.inputs import read_json

    doc = read_json(path)
    if not isinstance(doc, dict) or doc.get("kind") != "calibration":
        raise TraceInputError(f"{path}: not a calibration.json", hint="write one with `profkit calibrate`")
    try:
        return msgspec.convert(doc, Calibration)
    except msgspec.ValidationError as e:
        raise TraceInputError(f"{path}: not a valid calibration.json ({e})", hint="re-run `profkit calibrate`") from None


def _manifest_and_summary(path: Path) -> tuple[Any, Any]:
    """A side's manifest and a summary (for its key) without summarizing anything: manifest.json in or
    beside the folder, else the summary's `run` section (reports/<run>/summary.json, window-0/)."""
    from profkit.flows.inputs import _manifest_near

    path = Path(path)
    man = _manifest_near(path)
    summary = None
    for cand in ([path] if path.is_file() else [path / "summary.json", path / "window-0" / "summary.json"]):
        if cand.is_file() and cand.suffix == ".json":
            try:
                doc = json.loads(cand.read_text())
            except (OSError, ValueError):
                continue
            if isinstance(doc, dict) and "ranks" in doc:
                summary = doc
                if man is None and isinstance(doc.get("manifest"), dict):
                    man = doc["manifest"]
                break
    return man, summary


def side_key(path: Path) -> RunKey:
    man, summary = _manifest_and_summary(path)
    key = run_key(man, summary)
    if key["schema"] is None and summary is None:
        from profkit.analysis.summary import SCHEMA_VERSION

        key["schema"] = SCHEMA_VERSION  # traces, summarized now: this profkit's summary schema
    return key


def gate(baseline: Path | None, candidate: Path, opts: SummarizeOptions, policy: Policy, *, baseline_name: str | None = None,
         baselines_dir: Path = Path("baselines"), calibration: Path | None = None, inconclusive: str = "fail",
         history: Path | None = None, warn: Callable[[str], None] = lambda w: None) -> tuple[Gate, Diff | None]:
    """gate.json for CANDIDATE against BASELINE (a run folder, a stored baseline's folder or summary), the
    stored baseline named `baseline_name` whose key matches the candidate, or a diff.json given alone
    as `candidate`; and the diff it judged (None when the sides were not compared)."""
    from profkit.flows.diff import diff_paths
    from profkit.flows.inputs import check_diff, is_diff_doc, read_json

    cal = load_calibration(calibration) if calibration is not None else None
    candidate = Path(candidate)
    d: Diff | None = None
    if baseline is None and baseline_name is None:
        doc = read_json(candidate) if candidate.is_file() else None
        if not is_diff_doc(doc):
            raise UsageError(f"{candidate}: one argument must be a diff.json", hint="pass BASELINE CANDIDATE, or --baseline NAME CANDIDATE")
        d = diff_of(check_diff(doc, candidate))
        cmp = compare_keys(run_key(d.manifests.baseline), run_key(d.manifests.candidate))
    else:
        ckey = side_key(candidate)
        if baseline_name is not None:
            entries = list_baselines(baselines_dir)
            entry, cmp0 = pick_entry(entries, baseline_name, ckey)
            if cmp0 is None:
                have = ", ".join(sorted({e.name for e in entries})) or "none"
                raise UsageError(f"no stored baseline named {baseline_name!r} in {baselines_dir} (stored: {have})",
                                 hint=f"store one with `profkit baseline save RUN --name {baseline_name} --dir {baselines_dir}`")
            if entry is None:
                return _finish(not_comparable(cmp0, (f"baseline {baseline_name}", str(candidate)), policy, inconclusive), history), None
            baseline = Path(entry.folder)
            cmp = cmp0
        else:
            assert baseline is not None
            cmp = compare_keys(side_key(baseline), ckey)
        if not cmp.comparable:
            return _finish(not_comparable(cmp, (str(baseline), str(candidate)), policy, inconclusive), history), None
        d, _, _ = diff_paths(baseline, candidate, opts, opt=None, rank=None, allow_shape_mismatch=False, warn=warn)
    doc = decide(d, policy, calibration=cal, comparability=cmp, inconclusive=inconclusive)
    if cal is not None:
        doc.calibration.source = str(calibration)
    return _finish(doc, history), d


def _finish(doc: Gate, history: Path | None) -> Gate:
    """Nightly mode: judged against the previous gate.json files of DIR, then stored there."""
    doc.created_at = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    if history is None:
        return doc
    history.mkdir(parents=True, exist_ok=True)
    previous = []
    for p in sorted(history.glob("gate-*.json")):
        try:
            previous.append(msgspec.json.decode(p.read_bytes(), type=Gate))
        except (OSError, msgspec.DecodeError):  # a ValidationError is a DecodeError
            raise TraceInputError(f"{p}: not a gate.json", hint="remove it from the history folder") from None
    with_history(doc, previous)
    assert doc.history is not None
    doc.history.folder = str(history)
    from profkit.documents import gate_doc
    from profkit.store import write_json_atomic

    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S-%f")
    write_json_atomic(history / f"gate-{stamp}.json", gate_doc(doc))
    return doc


# ---------------------------------------------------------------------------------------------
# calibrate


def calibration_of(sessions: list[tuple[RunResult, RunResult]]) -> tuple[Calibration, Diff]:
    """calibration.json of one configuration recorded in A/A sessions (each two recordings, A B A B; the
    sessions one after another), and the first session's A/A diff. Every run of a session is also
    compared with every run of each later session: the figures of runs recorded apart."""
    from profkit.analysis.catalog import CatalogChoice
    from profkit.attribution.diff import compare_summaries

    def compare(a: RunResult, b: RunResult) -> Diff:
        cat = (b.catalog or CatalogChoice()).for_effect(b.summary, 0)
        return compare_summaries(a.summary, b.summary, opt=None, catalog=cat, labels=(a.run_id, b.run_id),
                                 baseline_repeats=a.windows or (), candidate_repeats=b.windows or ())

    paired = [compare(a, b) for a, b in sessions]
    across = [compare(x, y) for i, s in enumerate(sessions) for later in sessions[i + 1:] for x in s for y in later]
    a, b = sessions[0]
    key = run_key(a.manifest, a.summary)
    source = f"{a.run_id} vs {b.run_id}" + (f" and {len(sessions) - 1} more session(s)" if len(sessions) > 1 else "")
    return calibration_from(paired, key, source=source, across=across), paired[0]


# ---------------------------------------------------------------------------------------------
# stored baselines


def list_baselines(folder: Path) -> list[BaselineEntry]:
    """Every stored baseline under `folder` (NAME/KEY_ID/baseline.json), by name and time."""
    out: list[BaselineEntry] = []
    if not folder.is_dir():
        return out
    for f in sorted(folder.glob(f"*/*/{ENTRY_FILE}")):
        try:
            e = msgspec.json.decode(f.read_bytes(), type=StoredBaseline)
            out.append(BaselineEntry(e.name, e.key, e.source, e.saved_at, str(f.parent), e.windows))
        except (OSError, msgspec.DecodeError):  # a ValidationError is a DecodeError
            raise TraceInputError(f"{f}: not a stored baseline's {ENTRY_FILE}", hint="remove its folder and save the baseline again") from None
    return sorted(out, key=lambda e: (e.name, e.saved_at))


def save_baseline(run: Path, name: str, folder: Path, opts: SummarizeOptions) -> BaselineEntry:
    """A run's summaries (each profile window's) and manifest under FOLDER/NAME/KEY_ID/: the entry that
    `gate --baseline NAME` finds when the candidate's key matches (saved again: replaced)."""
    from profkit.flows.inputs import load_side
    from profkit.store import write_json_atomic

    if not name or "/" in name or name.startswith("."):
        raise UsageError(f"--name {name!r}: a plain name (letters, digits, - and _)")
    side = load_side(run, opts)
    key = run_key(side.manifest, side.summary)
    target = folder / name / key_id(key)
    if target.exists():
        shutil.rmtree(target)
    target.mkdir(parents=True)
    summaries = side.repeats or [side.summary]
    for i, s in enumerate(summaries):
        write_json_atomic(target / f"window-{i}" / "summary.json", s)
    write_json_atomic(target / "summary.json", summaries[0])
    if side.manifest is not None:
        write_json_atomic(target / "manifest.json", side.manifest)
    saved = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    entry = StoredBaseline(name=name, key=key, source=str(run), saved_at=saved, windows=len(summaries))
    write_json_atomic(target / ENTRY_FILE, msgspec.to_builtins(entry))
    return BaselineEntry(name, key, str(run), saved, str(target), len(summaries))
