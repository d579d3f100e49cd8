"""Every file name a command chooses when it is not given one, and the checks on where outputs go, in
one place (memray's `determine_output_filename` is the model): `analyze --json DIR/`'s one summary per
run, `report`'s default page under reports/, `export-perfetto`'s file beside the trace, the folders
`trace`, `sweep` and `calibrate` write under --reports-dir and the names of the files in them.

Every output is written over what is there (profkit.store writes atomically): no command refuses an
existing file today, so there is no --force to ask for yet; a check that refuses would go here."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

REPORTS = Path("reports")  # where `report` writes when -o is not given
SUMMARY_JSON = "summary.json"
DIFF_JSON = "diff.json"
SWEEP_JSON = "sweep.json"
REPORT_HTML = "report.html"
REPORT_MD = "report.md"
CALIBRATION_JSON = "calibration.json"
POLICY_TOML = "policy.toml"
BEFORE_JSON = "before.json"
AFTER_JSON = "after.json"
PAIR_FILES = (BEFORE_JSON, AFTER_JSON, DIFF_JSON, REPORT_MD, REPORT_HTML)  # an attribution folder (flows/trace.attribute)
SWEEP_FILES = (SWEEP_JSON, REPORT_HTML, REPORT_MD)  # a sweep's folder, besides its pairs' folders


def safe_name(name: str) -> str:
    """A label as a file-name part."""
    return re.sub(r"[^\w.-]+", "_", name).strip("_")[:80] or "run"


def is_json_dir(json_out: str) -> bool:
    """`--json DIR/` (a name ending in a slash, or a folder that exists): one summary per run in it."""
    return json_out != "-" and (json_out.endswith(("/", "\\")) or Path(json_out).is_dir())


def summary_in(folder: Path | str, label: str) -> Path:
    """A run's summary.json under `--json DIR/`: DIR/<run>.summary.json."""
    return Path(folder) / f"{safe_name(label)}.summary.json"


def report_html(diffs: list[Any], runs: list[tuple[str, Any]]) -> Path:
    """`report`'s page without -o: one diff's reports/diff__<baseline>__<candidate>.html, one run's
    reports/<run>/report.html, else reports/report.html."""
    if diffs and not runs and len(diffs) == 1:
        return REPORTS / f"diff__{safe_name(diffs[0]['baseline']['label'])}__{safe_name(diffs[0]['candidate']['label'])}.html"
    if len(runs) == 1 and not diffs:
        return REPORTS / safe_name(runs[0][0]) / REPORT_HTML
    return REPORTS / REPORT_HTML


def perfetto_file(trace: Path, src: Path, output: Path | None, several: bool) -> Path:
    """`export-perfetto`'s file for the traces of `src` (a run folder or its first trace file): -o as given
    (several profile windows: one file each, the window's name before the suffixes), else
    <trace>.perfetto-trace.gz beside the trace."""
    from profkit.ingest.identity import short_label

    if output is None:
        return (src if src.is_dir() else src.parent) / f"{short_label(trace.name)}.perfetto-trace.gz"
    if not several:
        return output
    return output.with_name(f"{output.name.split('.')[0]}.{safe_name(src.name)}{''.join(output.suffixes) or '.perfetto-trace'}")


def trace_run_ids(stamp: str, target: str, base: str, tag: str) -> tuple[str, str]:
    """`trace`'s two runs: traces/<id>/ and reports/<id>/ for the baseline and the candidate."""
    return f"{stamp}-{target}-base{base}-{tag}-before", f"{stamp}-{target}-base{base}-{tag}-after"


def trace_folder(reports_dir: Path, stamp: str, target: str, tag: str) -> Path:
    """`trace`'s attribution folder (PAIR_FILES)."""
    return reports_dir / f"{stamp}-{target}-{tag}"


def sweep_folder(reports_dir: Path, stamp: str, target: str, mode: str) -> Path:
    """`sweep`'s folder (SWEEP_FILES and one attribution folder per compared pair)."""
    return reports_dir / f"{stamp}-{target}-sweep-{mode}"


def sweep_run_id(stamp: str, target: str, mode: str, slug: str) -> str:
    return f"{stamp}-{target}-{mode}-{slug}"


def calibrate_folder(reports_dir: Path, stamp: str, target: str) -> Path:
    """`calibrate`'s folder: calibration.json (unless -o), policy.toml beside it, the A/A diff.json."""
    return reports_dir / f"{stamp}-{target}-calibrate"


def calibrate_run_id(stamp: str, target: str, session: str, side: str) -> str:
    """A calibration run: session 1's keep the names -calibrate-a/-b (baseline save reports/*-calibrate-a)."""
    return f"{stamp}-{target}-calibrate-{session}{side}"


def written(folder: Path, names: tuple[str, ...]) -> list[Path]:
    """The files of `names` that are in `folder` (report.html is absent without the `report` extra)."""
    return [folder / n for n in names if (folder / n).is_file()]


def write_text(path: Path, text: str) -> None:
    """A rendered output (a report, a comment, a JSON document's text), written atomically."""
    from profkit.store import write_bytes_atomic

    write_bytes_atomic(path, text.encode("utf-8"))


def write_json(path: Path, doc: Any) -> None:
    """A JSON document (profkit.store.json_text: one-space indent, a final newline), written atomically."""
    from profkit.store import write_json_atomic

    write_json_atomic(path, doc)
