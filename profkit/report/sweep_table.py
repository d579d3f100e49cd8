"""`profkit sweep`'s closing table on the terminal: one row per compared step of sweep.json (its `attribution`
rows, as dicts) with the step's diff.json (tok/s per user, the window, idle and count changes, the optimization's
own effect and verdict, the top category), then each step's flags and the runs whose profile windows were
unstable. Pure rendering: the sweep is run and its document built in flows/sweep.py."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import msgspec
from rich.console import Console
from rich.markup import escape

from profkit.documents import Change, Decomposition, Diff, SweepDoc, diff_of, typed_or_none


def show_sweep(out: Console, doc: SweepDoc | Mapping[str, Any], diffs: Sequence[Any]) -> None:
    """The sweep's table on `out`, fitted to the terminal (report/fit.py: numbers never cut; a step label that
    does not fit goes on a line of its own), then each step's flags and unstable windows. `doc`: sweep.json
    (its JSON value is read as a SweepDoc); `diffs`: each attribution row's diff, in order."""
    from profkit.report.fit import COPY, NUM, TEXT, fit_table
    from profkit.report.views import unstable_runs
    from profkit.report.vocab import diff_timeline, words

    sweep = doc if isinstance(doc, SweepDoc) else msgspec.convert(doc, SweepDoc)
    typed = [diff_of(d) for d in diffs]  # each diff decoded once
    cpu = bool(typed) and all(diff_timeline(d) == "cpu" for d in typed)
    W = words("cpu" if cpu else "gpu")
    cols = [("step", COPY), ("tok/s/user", NUM), ("Δ window", NUM), ("Δ idle", NUM), (f"Δ {W['kernels_plain']}", NUM)]
    cols += [] if cpu else [("Δ launches", NUM), ("Δ syncs", NUM)]
    cols += [("own effect", TEXT), ("top category", TEXT)]
    rows = []
    flags: list[str] = []
    for k, row in enumerate(sweep.attribution):
        tp = row.tokens_per_s_per_user
        # diff.json's figures as the row carries them (flows/sweep.attribution_row), typed; none: "-"
        w = typed_or_none(row.gpu_window_us, Change) if row.gpu_window_us else None
        dec = typed_or_none(row.decomposition, Decomposition) if row.decomposition else None
        top = max(dec.category_us.items(), key=lambda kv: abs(kv[1]), default=None) if dec is not None else None
        c = row.counts
        rows.append((row.label, f"{tp.baseline:,.0f} → {tp.candidate:,.0f}" if tp.baseline and tp.candidate else "-",
                     f"{w.delta if w.delta is not None else 0:+,.0f}" if w is not None else "-", f"{dec.idle_us if dec.idle_us is not None else 0:+,.0f}" if dec is not None else "-", delta(c.get("gpu_kernels")),
                     *([] if cpu else [delta(c.get("kernel_launches")), delta(c.get("syncs"))]),
                     own_effect(typed[k] if k < len(typed) else None), f"{top[0]} {top[1]:+,.0f}" if top else "-"))
        flags += [f"{row.label}: {f}" for f in row.flags]
    keep = [i for i in range(len(cols)) if any(r[i] != "-" for r in rows) or cols[i][1] != NUM]  # no throughput (capture-only): no column
    # the top category said again where it is each row's own term (the own-effect cell names it): one column, not two
    if all(r[-1] == "-" or r[-2].startswith(r[-1] + " ") for r in rows):
        keep = [i for i in keep if i != len(cols) - 1]
    n = max((d.decomposition.windows or 1 for d in typed), default=1)
    stat = f"the median over {n} profile windows of the per-window change" if n > 1 else "one profile window a side, not judged"
    title = (f"attribution ({sweep.mode}): Δ µs per iteration ({W['window']}; negative: shorter, faster), each Δ {stat}; "
             "own effect: the optimization's own term and its verdict")
    out.print(fit_table(out, title, [cols[i] for i in keep], [[r[i] for i in keep] for r in rows]))
    for f in flags:
        out.print(f"[yellow]flag:[/] {escape(f)}")  # wrapped at spaces: a terminal's own wrap would split a number
    config = {r.run_id: r.label for r in sweep.runs}  # a run by its configuration's name
    steps = [(row.label, row.baseline or d.baseline.label, row.candidate or d.candidate.label, d) for row, d in zip(sweep.attribution, typed)]
    for line in unstable_runs(steps, config):
        out.print(f"[yellow]unstable:[/] {escape(line)}")


def own_effect(d: Diff | None) -> str:
    """A sweep row's own-effect cell: the optimization's largest own term, its change and verdict ("topk -351 as expected")."""
    from profkit.terms import term_label

    ee = d.expected_effect if d is not None else None
    if ee is None or not ee.known:
        return "-"
    own = [t for t in ee.own if t.delta_us]
    if not own:
        return "none in catalog"
    t = max(own, key=lambda t: abs(t.delta_us or 0.0))
    verdict = ("as expected" if t.as_expected else "WRONG WAY" if t.as_expected is False else
               "within noise" if ee.judged else "not judged")
    return f"{term_label(t.term)} {t.delta_us:+,.0f} {verdict}"


def delta(v: Any) -> str:
    return "-" if v is None else f"{v:+g}"
