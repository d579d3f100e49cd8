"""The `diff`, `report` and `export-perfetto` commands (registered on profkit.cli's app).

Thin: each resolves its inputs (profkit.inputs), calls the library (attribution, report, export) and
writes atomically (profkit.store). Status lines go to stderr; `--json -` puts diff.json on stdout.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.markup import escape

from profkit.cli_common import app, err, out, user_errors
from profkit.errors import ProfkitError, TraceInputError, UsageError

Marker = Annotated[Optional[str], typer.Option("--marker", help="Regex for the CPU span that opens one iteration, for inputs analyzed now (traces).")]
MinBubble = Annotated[float, typer.Option("--min-bubble-us", min=0.0, help="Shortest GPU idle gap counted as a bubble, for inputs analyzed now.")]
CatalogOpt = Annotated[Optional[str], typer.Option("--catalog", help="Kernel catalog (name in kernels/ or a .toml path): classifies traces analyzed now and says which categories --opt owns.")]
Cdn = Annotated[bool, typer.Option("--cdn", help="Load plotly.js from its CDN (a small file that needs the network) instead of inlining it.")]


def _safe(name: str) -> str:
    return re.sub(r"[^\w.-]+", "_", name).strip("_")[:80] or "run"


def manifest_catalog_name(paths: Any) -> str | None:
    """The catalog a run's manifest implies, from its target (profkit's proxy engine -> proxy;
    SGLang running a GLM-5.x preset or model -> sglang-glm52), else None (pick by kernel names).
    The manifest: the run folder's manifest.json, one beside the trace, or <trace stem>.manifest.json."""
    from profkit.ingest.identity import short_label

    for p in paths:
        p = Path(p)
        cands = (p / "manifest.json",) if p.is_dir() else (p.parent / "manifest.json", p.with_name(f"{short_label(p.name)}.manifest.json"))
        for m in cands:
            try:
                doc = json.loads(m.read_text())
            except (OSError, ValueError):
                continue
            if not isinstance(doc, dict):
                continue
            target = doc.get("target")
            if target == "proxy":
                return "proxy"
            if target == "sglang" and "glm" in json.dumps([doc.get("preset"), doc.get("model_path"), doc.get("model")]).lower():
                return "sglang-glm52"
    return None


def _catalog_from_manifests(*paths: Path) -> Any:
    """The catalog the runs' manifests imply (manifest_catalog_name), loaded, else None (auto)."""
    from profkit.catalog import load_catalog

    name = manifest_catalog_name(paths)
    if name:
        err.print(f"[dim]catalog {name}: from the run manifest's target (--catalog to choose another)[/]")
        return load_catalog(name)
    return None


def _align_single_ranks(b: Any, c: Any, rank: int | None) -> tuple[int, list[str]]:
    """Two single-rank sides are compared whatever their ranks (rank 3 of one run against rank 1
    of another): the candidate's rank entry is renumbered to the baseline's, and said. Else --rank
    (default 0) on both."""
    rb, rc = b.summary.get("ranks") or [], c.summary.get("ranks") or []
    if rank is None and len(rb) == 1 and len(rc) == 1 and not b.repeats and not c.repeats:
        want, have = rb[0].get("rank"), rc[0].get("rank")
        if want != have:
            c.summary = {**c.summary, "ranks": [{**rc[0], "rank": want}]}
            return want, [f"single-rank sides: rank {want} of the baseline compared with rank {have} of the candidate"]
        return want, []
    return (0 if rank is None else rank), []


def _catalog_for_effect(spec_catalog: Any, summary: dict[str, Any], rank: int) -> Any:
    """--catalog when given, else the catalog the candidate was classified with (None if it cannot be loaded)."""
    from profkit.catalog import load_catalog

    if spec_catalog is not None:
        return spec_catalog
    for r in summary.get("ranks") or []:
        if r.get("rank") == rank and isinstance(r.get("catalog"), str):
            try:
                return load_catalog(r["catalog"])
            except ProfkitError:
                return None
    return None


def _write_text(path: Path, text: str, *, announce: bool = True) -> None:
    from profkit.store import write_bytes_atomic

    write_bytes_atomic(path, text.encode("utf-8"))
    if announce:
        err.print(f"wrote {escape(str(path))}")


@app.command()
def diff(
    before: Annotated[Path, typer.Argument(readable=False, help="Baseline: a summary.json, a trace file, or a run folder (repeat-*/ subfolders are repeats).")],
    after: Annotated[Path, typer.Argument(readable=False, help="Candidate: same kinds as BEFORE.")],
    opt: Annotated[Optional[str], typer.Option("--opt", help="The optimization the candidate adds (default: from the run manifests) for the expected-effect check.")] = None,
    catalog: CatalogOpt = None,
    md: Annotated[Optional[Path], typer.Option("--md", help="Write a GitHub Markdown PR comment to FILE.")] = None,
    html: Annotated[Optional[Path], typer.Option("--html", help="Write a self-contained HTML report to FILE.")] = None,
    json_out: Annotated[Optional[str], typer.Option("--json", help="Write diff.json (schema v1) to FILE, or '-' for stdout.")] = None,
    marker: Marker = None,
    min_bubble_us: MinBubble = 2.0,
    rank: Annotated[Optional[int], typer.Option("--rank", help="Which rank to compare (default 0; two single-rank sides are compared whatever their ranks).")] = None,
    allow_shape_mismatch: Annotated[bool, typer.Option("--allow-shape-mismatch", help="Compare sides that share no iteration shape (kind, batch size), mixing shapes; refused without it.")] = False,
    cdn: Cdn = False,
    top: Annotated[int, typer.Option("--top", help="How many movers and sync groups to print.")] = 10,
    capture: Annotated[Optional[list[Path]], typer.Option("--capture", help="Graph-capture profile(s) for the replayed kernels' categories (default: graph_capture_profile/ of each run folder).")] = None,
) -> None:
    """Attribute the change between two runs: per-category time, overlap and idle by bubble cause
    (exact, mean per iteration), launches and syncs per iteration, kernels added and removed, and
    the expected-effect check for --opt.

    Example:

        profkit diff traces/base/summary.json traces/topk/summary.json --opt topk_v2 --md comment.md --html diff.html
    """
    from profkit.attribution.diff import compare_summaries
    from profkit.catalog import load_catalog
    from profkit.inputs import AnalyzeOptions, infer_optimization, load_side
    from profkit.report import Report, get_renderer
    from profkit.report.terminal import TerminalRenderer

    with user_errors():
        cat = load_catalog(catalog) if catalog else _catalog_from_manifests(before, after)
        opts = AnalyzeOptions(marker=marker, min_bubble_us=min_bubble_us, catalog=cat, captures=capture or None)
        b = load_side(before, opts)
        c = load_side(after, opts)
        if cat is None:
            # each side auto-picked its catalog by its own kernel names; categories only compare
            # under one catalog, so re-analyze both with the more specific pick
            names = {s.summary["ranks"][0].get("catalog") for s in (b, c) if s.summary.get("ranks")}
            specific = sorted(n for n in names if n and n != "generic")
            if len(names) > 1 and specific:
                cat = load_catalog(specific[0])
                opts = AnalyzeOptions(marker=marker, min_bubble_us=min_bubble_us, catalog=cat, captures=capture or None)
                b, c = load_side(before, opts), load_side(after, opts)
                if {s.summary["ranks"][0].get("catalog") for s in (b, c)} != {cat.name}:
                    err.print(f"[yellow]warning:[/] the two sides were categorized with different kernel catalogs; "
                              f"pass --catalog {cat.name} when analyzing them", soft_wrap=True)
        lb, lc = (b.label, c.label) if b.label != c.label else (f"{b.label} (before)", f"{c.label} (after)")
        from profkit.attribution.diff import run_manifest

        opt_name = opt or infer_optimization(run_manifest({"manifest": b.manifest, **b.summary}), run_manifest({"manifest": c.manifest, **c.summary}))
        rank, notes = _align_single_ranks(b, c, rank)
        d = compare_summaries(
            b.summary, c.summary, opt=opt_name, catalog=_catalog_for_effect(cat, c.summary, rank) if opt_name else None,
            baseline_repeats=b.repeats, candidate_repeats=c.repeats, rank=rank, labels=(lb, lc),
        )
        if d["shape"].get("kind") is None:
            have = "; ".join(f"{side}: {', '.join(d[side].get('shapes') or {}) or 'none'}" for side in ("baseline", "candidate"))
            if not allow_shape_mismatch:
                raise UsageError(f"the two sides share no iteration shape ({have}): comparing them would mix shapes",
                                 hint="compare runs of the same shape, or pass --allow-shape-mismatch to compare all iterations anyway")
            notes.append(f"the two sides share no iteration shape ({have}); comparing all iterations (--allow-shape-mismatch)")
        d.setdefault("warnings", [])
        d["warnings"][:0] = [n for n in notes if n not in d["warnings"]]
        for n in notes:  # before every table: the reader must know what is compared
            err.print(f"[yellow]warning:[/] {escape(n)}", soft_wrap=True)
        to_stdout = json_out == "-"
        result = Report(diffs=[d])
        # the files first: a reader that stops early (`| head -3`) must not cost them
        wrote: list[str] = []
        if json_out and not to_stdout:
            _write_text(Path(json_out), get_renderer("json")().render(result), announce=False)
            wrote.append(json_out)
        if md is not None:
            _write_text(md, get_renderer("markdown")().render(result), announce=False)
            wrote.append(str(md))
        if html is not None:
            _write_text(html, get_renderer("html")(cdn=cdn).render(result), announce=False)
            wrote.append(str(html))
        TerminalRenderer(err if to_stdout else out, top=top).show(result)
        if to_stdout:
            sys.stdout.write(json.dumps(d, indent=1, allow_nan=False) + "\n")
        for w in wrote:
            err.print(f"wrote {escape(w)}")


@app.command()
def report(
    paths: Annotated[list[Path], typer.Argument(readable=False, help="Run folders, summary.json files, trace files or diff.json files; several runs make a sweep (ladder).")],
    output: Annotated[Optional[Path], typer.Option("--output", "-o", help="The HTML file to write (default: under reports/).")] = None,
    cdn: Cdn = False,
    marker: Marker = None,
    min_bubble_us: MinBubble = 2.0,
    catalog: CatalogOpt = None,
) -> None:
    """Write one self-contained HTML report: headline numbers, a representative iteration's timeline,
    time by category, bubbles by cause, launches and syncs per iteration, top kernels, manifests;
    for a diff the decomposition waterfall; for several runs the ladder.

    Example:

        profkit report traces/base traces/topk -o reports/sweep.html
    """
    from profkit.catalog import load_catalog
    from profkit.attribution import ladder_steps
    from profkit.inputs import AnalyzeOptions, is_diff_doc, load_side, read_json
    from profkit.report import Report
    from profkit.report.html import HtmlRenderer

    with user_errors():
        cat = load_catalog(catalog) if catalog else None
        opts = AnalyzeOptions(marker=marker, min_bubble_us=min_bubble_us, catalog=cat)
        diffs: list[dict[str, Any]] = []
        runs: list[tuple[str, dict[str, Any]]] = []
        for p in paths:
            if p.is_file() and p.suffix == ".json" and not p.name.endswith(".trace.json"):
                doc = read_json(p)
                if is_diff_doc(doc):
                    if doc.get("schema_version") != 1:
                        raise TraceInputError(f"{p}: diff.json schema version {doc.get('schema_version')!r}; this profkit reads 1", hint="re-run profkit diff")
                    diffs.append(doc)
                    continue
            side = load_side(p, opts)
            if side.repeats:
                err.print(f"[dim]{escape(str(p))}: {len(side.repeats)} repeats; reporting the first (diff uses all of them for noise)[/]")
            runs.append((side.label, side.summary))
        labels = [label for label, _ in runs]
        if len(set(labels)) != len(labels):
            runs = [(f"{label} #{i + 1}", s) for i, (label, s) in enumerate(runs)]
        if output is None:
            if diffs and not runs and len(diffs) == 1:
                name = f"diff__{_safe(diffs[0]['baseline']['label'])}__{_safe(diffs[0]['candidate']['label'])}.html"
                output = Path("reports") / name
            elif len(runs) == 1 and not diffs:
                output = Path("reports") / _safe(runs[0][0]) / "report.html"
            else:
                output = Path("reports") / "report.html"
        _write_text(output, HtmlRenderer(cdn=cdn).render(Report(diffs=diffs, runs=runs, ladder=ladder_steps(runs))))


@app.command("export-perfetto")
def export_perfetto(
    trace: Annotated[Path, typer.Argument(readable=False, help="A trace file, or a run folder of trace files (one per rank).")],
    output: Annotated[Optional[Path], typer.Option("--output", "-o", help="The .perfetto-trace file to write (default: beside the trace).")] = None,
    marker: Marker = None,
    min_bubble_us: MinBubble = 2.0,
    catalog: CatalogOpt = None,
) -> None:
    """Write the trace plus profkit's findings (iterations, GPU windows, bubbles with cause, syncs
    with trigger) as a Perfetto protobuf trace; open it at ui.perfetto.dev.

    Example:

        profkit export-perfetto traces/sample/eager_sync.pt.trace.json.gz -o eager_sync.perfetto-trace
    """
    from profkit.analysis import analyze_trace
    from profkit.ingest.identity import short_label
    from profkit.catalog import load_catalog
    from profkit.export.perfetto import build_perfetto
    from profkit.ingest import load_traces
    from profkit.store import write_bytes_atomic

    with user_errors():
        cat = load_catalog(catalog) if catalog else None
        traces = load_traces([trace])
        pairs = [(t, analyze_trace(t, marker=marker, min_bubble_us=min_bubble_us, catalog=cat)) for t in traces]
        data = build_perfetto(pairs)
        if output is None:
            base = trace if trace.is_dir() else trace.parent
            output = base / f"{short_label(trace.name)}.perfetto-trace"
        write_bytes_atomic(output, data)
        err.print(f"wrote {escape(str(output))} ({len(data):,} bytes, {len(traces)} rank(s)); open it at https://ui.perfetto.dev")
