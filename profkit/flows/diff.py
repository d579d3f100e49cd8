"""`diff` end to end: the two sides (flows/inputs.load_pair: traces and run folders summarized under the
catalog chosen before, one catalog for both where it can be helped), the optimization (given, else the
one switch the run manifests differ by), the ranks compared, attribution/diff.py's diff.json, and the
shape check. Nothing here prints: load_pair's warnings go to `warn` as they come, the notes that
must precede every table are returned (and are the first of diff.json's warnings)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from profkit.documents import Diff

from profkit.analysis.summarize import SummarizeOptions
from profkit.errors import UsageError
from profkit.flows.inputs import align_single_ranks, infer_optimization, load_pair


def diff_paths(before: Path, after: Path, opts: SummarizeOptions, *, opt: str | None, rank: int | None, allow_shape_mismatch: bool,
               warn: Callable[[str], None] = lambda w: None) -> tuple[Diff, list[str], tuple[str, str]]:
    """diff.json of BEFORE against AFTER, the notes for the reader, and the two sides' labels."""
    from profkit.attribution.diff import compare_summaries, run_manifest

    b, c, choice, warnings = load_pair(before, after, opts)
    for w in warnings:
        warn(w)
    lb, lc = (b.label, c.label) if b.label != c.label else (f"{b.label} (before)", f"{c.label} (after)")
    opt_name = opt or infer_optimization(run_manifest(b.doc), run_manifest(c.doc))  # load_side put each side's manifest in its summary
    rank, notes = align_single_ranks(b, c, rank)
    notes[:0] = [s.note for s in (b, c) if s.note]  # a summary file that is one of its run's several windows, the others not found
    effect_catalog = choice.for_effect(c.doc, rank) if opt_name else None
    if opt is not None:
        check_opt(opt, effect_catalog)
    d = compare_summaries(
        b.doc, c.doc, opt=opt_name, catalog=effect_catalog,
        baseline_repeats=b.docs, candidate_repeats=c.docs, rank=rank, labels=(lb, lc),
    )
    if d.shape.kind is None:
        have = "; ".join(f"{side}: {', '.join(s.shapes) or 'none'}" for side, s in (("baseline", d.baseline), ("candidate", d.candidate)))
        if not allow_shape_mismatch:
            raise UsageError(f"the two sides share no iteration shape ({have}): comparing them would mix shapes",
                             hint="compare runs of the same shape, or pass --allow-shape-mismatch to compare all iterations anyway")
        notes.append(f"the two sides share no iteration shape ({have}); comparing all iterations (--allow-shape-mismatch)")
    d.warnings[:0] = [n for n in notes if n not in d.warnings]
    return d, notes, (lb, lc)


def check_opt(opt: str, catalog: Any) -> None:
    """`--opt NAME` names an optimization of the catalog that judges its effect, or the command stops (a typo
    such as topkv2 once exited 0 with no expected-effect check, and diff.json named it the optimization)."""
    known = sorted(getattr(catalog, "optimizations", None) or {})
    if opt in known:
        return
    name = getattr(catalog, "name", None)
    if known:
        raise UsageError(f"--opt {opt}: not an optimization of catalog {name} (known: {', '.join(known)})",
                         hint="pass one of those, or leave --opt out to take it from the run manifests")
    raise UsageError(f"--opt {opt}: catalog {name or '(none)'} declares no optimizations, so its effect cannot be checked",
                     hint="pass --catalog NAME (e.g. proxy, sglang-glm52, vllm) with the optimization, or leave --opt out")
