"""The `gate` and `baseline` commands (DESIGN.md "A gate for CI"). Thin: options parsed here, the flow
is flows/gate.py, the decision attribution/gate.py, the words report/gate.py. `calibrate` records
runs, so it lives with trace in cli/capture.py."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.markup import escape

from profkit.cli.common import app, command, err, out
from profkit.cli.options import JSON_OUT, MD, CatalogOpt, Choice, Marker, MinBubble
from profkit.errors import UsageError


class OnInconclusive(Choice):
    passes = "pass"
    fails = "fail"


BaselinesDir = Annotated[Path, typer.Option("--dir", help="Where stored baselines live (NAME/KEY/ folders; commit it or cache it in CI).")]


def _write(path: Path, text: str) -> None:
    from profkit.flows.outputs import write_text

    write_text(path, text)


@command()
def gate(
    baseline: Annotated[Optional[Path], typer.Argument(readable=False, show_default=False, help="Baseline: a run folder (its window-*/ profile windows), a stored baseline's folder, or a diff.json alone (then no CANDIDATE).")] = None,
    candidate: Annotated[Optional[Path], typer.Argument(readable=False, show_default=False, help="Candidate: a run folder or summary (with --baseline NAME: the only argument).")] = None,
    policy: Annotated[Optional[Path], typer.Option("--policy", help="Policy file (TOML): each metric's direction and threshold (docs/ci.md); default: built in.")] = None,
    threshold: Annotated[Optional[float], typer.Option("--threshold", min=0.0, help="Practical threshold in % of the baseline for every metric the policy leaves at the default (built in: 2).")] = None,
    on_inconclusive: Annotated[OnInconclusive, typer.Option("--inconclusive", help="What an inconclusive gate exits with: fail (5, the default: loud rather than silently passing) or pass (0).")] = OnInconclusive.fails,
    calibration: Annotated[Optional[Path], typer.Option("--calibration", help="calibration.json (profkit calibrate): each metric's A/A spread (added to the noise) and MDE (a threshold below it: cannot be judged here).")] = None,
    md: Annotated[Optional[Path], MD.option("Write the PR comment (GitHub Markdown; first line: the decision, at most 80 columns) to FILE.")] = None,
    json_out: Annotated[Optional[str], JSON_OUT.option("Write gate.json (every row) to FILE, or '-' for stdout (the table then goes to stderr).")] = None,
    baseline_name: Annotated[Optional[str], typer.Option("--baseline", help="The stored baseline NAME whose key matches the candidate (profkit baseline save).")] = None,
    baselines_dir: BaselinesDir = Path("baselines"),
    history: Annotated[Optional[Path], typer.Option("--history", help="Nightly: a folder of earlier gate.json files; a regression only when the last two runs both regress (one: suspect, exit 0); this run's is added.")] = None,
    all_rows: Annotated[bool, typer.Option("--all", help="Print every row (default: those not within noise).")] = False,
    catalog: CatalogOpt = None,
    marker: Marker = None,
    min_bubble_us: MinBubble = 2.0,
) -> None:
    """Decide pass, regression or inconclusive for CANDIDATE against BASELINE, from the same judged
    statistics as `diff`; exit 0 pass, 5 regression (and inconclusive unless --inconclusive pass).

    Example:

        profkit gate reports/RUN_MAIN reports/RUN_PR --calibration calibration.json --md gate.md

        profkit gate --baseline main reports/RUN_PR --json gate.json
    """
    from profkit.documents import gate_doc
    from profkit.flows.gate import gate as gate_flow, load_policy
    from profkit.flows.options import summarize_options
    from profkit.flows.outputs import write_json
    from profkit.report.gate import markdown, terminal

    if baseline_name is not None:
        if candidate is not None:
            raise UsageError("--baseline NAME takes one argument, the candidate", hint="profkit gate --baseline main reports/RUN")
        base, cand = None, baseline
    elif candidate is None:
        base, cand = None, baseline  # a diff.json alone
    else:
        base, cand = baseline, candidate
    if cand is None:
        raise UsageError("missing CANDIDATE", hint="profkit gate BASELINE CANDIDATE, profkit gate --baseline NAME CANDIDATE, or profkit gate DIFF.json")
    pol = load_policy(policy, threshold)
    paths = tuple(p for p in (base, cand) if p is not None)
    opts, _ = summarize_options(catalog, paths, marker=marker, min_bubble_us=min_bubble_us)
    got, _ = gate_flow(base, cand, opts, pol, baseline_name=baseline_name, baselines_dir=baselines_dir, calibration=calibration,
                       inconclusive=str(on_inconclusive), history=history,
                       warn=lambda w: err.print(f"[yellow]warning:[/] {escape(w)}", soft_wrap=True))
    doc = gate_doc(got)
    to_stdout = json_out == "-"
    if json_out is not None and not to_stdout:
        write_json(Path(json_out), doc)
    if md is not None:
        _write(md, markdown(got))
    for line in terminal(got, all_rows=all_rows):
        (err if to_stdout else out).print(escape(line), soft_wrap=True, highlight=False)
    if to_stdout:
        import json
        import sys

        sys.stdout.write(json.dumps(doc, indent=1) + "\n")
    for p in (None if to_stdout else json_out, md):
        if p is not None:
            err.print(f"wrote {escape(str(p))}", soft_wrap=True)
    if got.exit_code:
        raise typer.Exit(got.exit_code)


baseline_app = typer.Typer(help="Stored baselines for `profkit gate --baseline NAME`: save a run, list them.\n\n"
                           "Example:\n\n    profkit baseline save reports/RUN --name main; profkit baseline list",
                           no_args_is_help=True, context_settings={"help_option_names": ["-h", "--help"]}, rich_markup_mode=None)
app.add_typer(baseline_app, name="baseline")


def _entry_line(e: Any) -> str:
    k = e.key
    return (f"{e.name}  target={k.get('target')} engine={k.get('engine_version')} gpu={k.get('gpu')} preset={k.get('preset')} "
            f"schema={k.get('schema')}  saved {e.saved_at} from {e.source}  ({e.folder})")


@baseline_app.command("save")
def baseline_save(
    run: Annotated[Path, typer.Argument(readable=False, help="A run folder (traces/<run> or reports/<run>, with its profile windows) or summary.json.")],
    name: Annotated[str, typer.Option("--name", help="The baseline's name (e.g. main).")],
    baselines_dir: BaselinesDir = Path("baselines"),
    catalog: CatalogOpt = None,
) -> None:
    """Store a run's summaries and manifest as the baseline NAME, under its key (target, engine version,
    model, preset, workload, GPU, schema): saving again with the same key replaces it.

    Example:

        profkit baseline save reports/RUN_MAIN --name main
    """
    from profkit.cli.common import user_errors

    with user_errors():
        from profkit.flows.gate import save_baseline
        from profkit.flows.options import summarize_options

        e = save_baseline(run, name, baselines_dir, summarize_options(catalog, (run,))[0])
        out.print(escape(f"saved {_entry_line(e)}"), soft_wrap=True, highlight=False)


@baseline_app.command("list")
def baseline_list(baselines_dir: BaselinesDir = Path("baselines")) -> None:
    """The stored baselines: name, key, when and from what each was saved.

    Example:

        profkit baseline list --dir baselines
    """
    from profkit.cli.common import user_errors

    with user_errors():
        from profkit.flows.gate import list_baselines

        entries = list_baselines(baselines_dir)
        if not entries:
            err.print(f"no stored baselines in {escape(str(baselines_dir))}", soft_wrap=True)
            return
        for e in entries:
            out.print(escape(_entry_line(e)), soft_wrap=True, highlight=False)
