"""A sweep's PR comment (`profkit report SWEEP --md FILE`): sweep.json, its compared pairs' diff.json and its
runs' ladder in, GitHub-flavoured Markdown out (pure; the Markdown renderer calls it for a Report with a sweep).

The first line is the decision, at most 80 columns: how many steps' own effect was seen as expected, the wrong
way, within noise or not judged, and the flags. Then the step table (a leave-one-out's "what each optimization
is worth", a ladder's steps, one-at-a-time's each alone), one row per own term of the step's optimization with
the step's own diff's figures and verdict (report/views.own_verdict: judged or not, as the diff's headline says
it); the runs' ladder with the HTML report's figures (attribution/ladder.py: the same statistic as each step's
diff); flags, unstable runs, and each step's headline folded. Every string from a trace or a manifest goes
through `md_escape`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from profkit import __version__
import msgspec

from profkit.documents import Diff, Rank, SweepDoc, Summary
from profkit.report import capture_view
from profkit.report.base import Renderer, Report
from profkit.report.markdown import DEFAULT_MAX_CHARS, _table, md_escape
from profkit.report.numbers import RATE, num, pct
from profkit.report.views import headline_lines, noise_verdict, own_terms, own_verdict, throughput_rows, unstable_runs
from profkit.report.vocab import diff_timeline, rank_timeline, words
from profkit.terms import term_label

FIRST_LINE_MAX = 80  # columns: what a PR's notification and a terminal show of the comment's first line

TITLES = {
    "leave-one-out": "Leave-one-out: what each optimization is worth (all without it → all)",
    "ladder": "Ladder: each optimization added to the step before",
    "one-at-a-time": "One at a time: each optimization alone against the baseline",
}


class SweepMarkdownRenderer(Renderer):
    """The PR comment for a Report with a sweep (its `diffs`: the sweep's compared pairs, in sweep.json's order;
    its `runs` and `ladder`: the sweep's runs). Each step's folded headline goes first when the text is too long."""

    name: ClassVar[str] = "sweep-markdown"
    output_file_extension: ClassVar[str] = "md"

    def __init__(self, *, max_chars: int = DEFAULT_MAX_CHARS) -> None:
        self.max_chars = max_chars

    def render(self, report: Report) -> str:
        if report.sweep is None:
            raise ValueError("the sweep Markdown renderer renders a sweep: pass Report(sweep=sweep.json's document, ...)")
        sweep = sweep_of(report.sweep)
        if len(report.diffs) != len(sweep.attribution):
            raise ValueError(f"the sweep has {len(sweep.attribution)} compared steps and the report {len(report.diffs)} diffs")
        text = render_sweep(sweep, report.diff_docs, report.run_docs, report.ladder)
        if len(text) > self.max_chars:
            text = render_sweep(sweep, report.diff_docs, report.run_docs, report.ladder, details=False)
        return text if len(text) <= self.max_chars else text[: self.max_chars - 80] + "\n\n… (comment cut to fit GitHub's size limit; see sweep.json)\n"


def step_status(diff: Diff) -> str:
    """A step's own effect in one word group: ``as expected``, ``the wrong way``, ``within noise``, ``not judged``,
    or ``no own term`` (no optimization named, or none the catalog knows)."""
    ee = diff.expected_effect
    terms = own_terms(diff)
    if ee is None or not terms:
        return "no own term"
    if not ee.judged:
        return "not judged"
    if any(t.as_expected is False for t in terms):
        return "the wrong way"
    if any(t.as_expected is True for t in terms):
        return "as expected"
    # within the noise, or beyond it but under the floor a change must reach to matter (own_verdict: not judged)
    return "within noise" if all(t.within_noise for t in terms) else "not judged"


ORDER = ("as expected", "the wrong way", "within noise", "not judged", "no own term")


SHORT = {"as expected": "as expected", "the wrong way": "wrong way", "within noise": "in noise", "not judged": "unjudged", "no own term": "no own"}


def first_line(mode: str, diffs: Sequence[Diff]) -> str:
    """The decision, ≤ FIRST_LINE_MAX columns with its ``**``: ``leave-one-out sweep, 4 steps: 4 as expected; no flags;
    largest own: topk -351.3 µs (topk_v2)``. Where that is too long the largest own term goes first, then the step
    count and the word "sweep", then the statuses are said shorter (SHORT); never cut."""
    counts = Counter(step_status(d) for d in diffs)
    flags = sum(len(d.expected_effect.flags) for d in diffs if d.expected_effect is not None)
    flagged = f"{flags} flag{'s' if flags != 1 else ''}" if flags else "no flags"
    seen = [(t, d.optimization) for d in diffs if step_status(d) in ("as expected", "the wrong way")
            for t in own_terms(d) if t.as_expected is not None]
    largest = ""
    if seen:
        t, opt = max(seen, key=lambda x: abs(x[0].delta_us))
        largest = f"; largest own: {term_label(t.term)} {num(t.delta_us, sign=True)} µs ({opt})"
    steps = f", {len(diffs)} step{'s' if len(diffs) != 1 else ''}"

    def line(words: Mapping[str, str], *, sweep: str, steps: str, largest: str) -> str:
        return f"**{md_escape(f'{mode}{sweep}{steps}: ' + ', '.join(f'{counts[k]} {words[k]}' for k in ORDER if counts[k]) + f'; {flagged}{largest}', max_len=None)}**"

    full = {k: k for k in ORDER}
    tries = (line(full, sweep=" sweep", steps=steps, largest=largest), line(full, sweep=" sweep", steps=steps, largest=""),
             line(full, sweep=" sweep", steps="", largest=""), line(full, sweep="", steps="", largest=""),
             line(SHORT, sweep="", steps="", largest=""))
    return next((x for x in tries if len(x) <= FIRST_LINE_MAX), tries[-1])


def sweep_of(doc: SweepDoc | Mapping[str, Any]) -> SweepDoc:
    """sweep.json's document (its JSON value, as flows/sweep.py writes it) as the SweepDoc it is; a SweepDoc as is."""
    return doc if isinstance(doc, SweepDoc) else msgspec.convert(doc, SweepDoc)


def _named(config: Mapping[str, str], run_id: str | None, default: str) -> str:
    """A run by its configuration's name, else `default` (the diff's own label)."""
    return config.get(run_id, default) if run_id is not None else default


def render_sweep(doc: SweepDoc | Mapping[str, Any], diffs: Sequence[Diff], runs: Sequence[tuple[str, Summary]],
                 ladder: Sequence[Mapping[str, Any]] | None, *, details: bool = True) -> str:
    """The comment. `diffs`: the diff of each of sweep.json's `attribution` rows, in order; `runs` and `ladder`:
    the sweep's runs and their ladder (attribution.ladder_steps, as the HTML report draws it)."""
    sweep = sweep_of(doc)
    mode = sweep.mode or "sweep"
    rows = sweep.attribution
    config = {r.run_id: r.label for r in sweep.runs}  # a run by its configuration's name
    names = [f"{_named(config, row.baseline, d.baseline.label)} → {_named(config, row.candidate, d.candidate.label)}"
             for row, d in zip(rows, diffs)]
    cpu = bool(diffs) and all(diff_timeline(d) == "cpu" for d in diffs)
    W = words("cpu" if cpu else "gpu")
    out = [first_line(mode, diffs), ""]
    out += [f"### profkit sweep: {md_escape(mode)}, {md_escape(sweep.target)}, {len(runs) or len(sweep.runs)} runs, "
            f"{len(diffs)} compared steps", ""]
    out += _health(names, diffs)
    out += _steps(mode, names, diffs, W)
    out += _gaps(names, diffs)
    out += _ladder(runs, ladder)
    out += _flags(names, diffs)
    unstable = unstable_runs([(n, row.baseline or d.baseline.label, row.candidate or d.candidate.label, d)
                              for n, row, d in zip(names, rows, diffs)], config)
    if unstable:
        out += ["#### Unstable runs", "", *(f"- {md_escape(u, max_len=400)}" for u in unstable), ""]
    if details:
        out += _details(names, diffs)
    stat = {d.decomposition.statistic for d in diffs if d.decomposition.statistic}
    out.append(f"<sub>profkit {md_escape(__version__)} · sweep.json schema {md_escape(sweep.schema_version)} · "
               f"each figure: {md_escape('; '.join(sorted(stat)) or 'mean')} · the whole report: report.html in the sweep's folder</sub>")
    return "\n".join(out) + "\n"


def _health(names: Sequence[str], diffs: Sequence[Diff]) -> list[str]:
    """Each step's capture health, said once for the steps that share it."""
    by: dict[str, list[str]] = {}
    for n, d in zip(names, diffs):
        by.setdefault(capture_view.diff_health(d), []).append(n)
    if len(by) == 1:
        return [f"{md_escape(next(iter(by)), max_len=None)}", ""]
    return [*(f"- {md_escape(h, max_len=None)} ({md_escape(', '.join(ns), max_len=None)})" for h, ns in by.items()), ""]


def _steps(mode: str, names: Sequence[str], diffs: Sequence[Diff], W: Mapping[str, str]) -> list[str]:
    """One row per own term of each step (its optimization's categories, phases and idle causes that either side has),
    the step's window, wall and unprofiled tokens/s per user beside its first; every figure the step's diff's."""
    table = []
    for n, d in zip(names, diffs):
        g, w = d.decomposition.gpu_window_us, d.wall_us
        tp = [r for r in throughput_rows(d) if r["key"] == "tokens_per_s_per_user_p50"]
        judged = {None: "not judged", True: "within noise", False: "beyond noise"}[tp[0]["within_noise"]] if tp else ""
        tps = (f"{num(tp[0]['baseline'], 0)} → {num(tp[0]['candidate'], 0)} ({pct(tp[0]['change_pct'])}, {judged})" if tp and tp[0]["baseline"] is not None
               and tp[0]["candidate"] is not None else "–")
        step = [f"{md_escape(n)}" + (f" ({md_escape(d.optimization)})" if d.optimization and d.optimization not in n else "")]
        whole = [_with_noise(g.delta, noise_verdict(d, "gpu_window_us")), _with_noise(w.delta, noise_verdict(d, "wall_us")), md_escape(tps)]
        terms = own_terms(d)
        if not terms:
            why = ("no single optimization" if not d.optimization else
                   "none in the catalog" if d.expected_effect is None or not d.expected_effect.known else "no time of its own in either run")
            table.append([*step, f"– ({why})", "–", "–", "–", *whole])
            continue
        for i, t in enumerate(terms):
            verdict = own_verdict(d, t)
            verdict = f"**{verdict}**" if verdict.startswith("beyond noise") else verdict
            table.append([*(step if i == 0 else [""]), md_escape(term_label(t.term)), num(t.delta_us, sign=True),
                          "–" if t.spread_us is None else f"±{num(t.spread_us)}", verdict, *(whole if i == 0 else ["", "", ""])])
    n_windows = max((d.decomposition.windows or 1 for d in diffs), default=1)
    stat = (f"the median over {n_windows} paired profile windows of the per-window change, as in each step's diff" if n_windows > 1
            else "one profile window a side: nothing is judged")
    return [f"#### {md_escape(TITLES.get(mode, mode))}", "",
            *_table(["step", "own term", "Δ µs", "noise", "verdict", f"Δ {W['window']} µs", "Δ wall µs", "tokens/s per user"], "llrrlrrl", table),
            "", f"<sub>µs per iteration, {md_escape(stat)}; each step's own terms are its optimization's categories, phases and idle "
                "causes (the catalog's), expected to shrink.</sub>", ""]


def _gaps(names: Sequence[str], diffs: Sequence[Diff]) -> list[str]:
    """Each step's change of the gap to the hardware floor and what its optimization closed (report/floor_view.py), for
    the steps whose runs were recorded with shapes; nothing when none were."""
    from profkit.report.floor_view import closed_text, diff_floor

    lines = [f"- {md_escape(n)}: {md_escape(closed_text(d) or '', max_len=None)}" for n, d in zip(names, diffs)
             if (f := diff_floor(d)) is not None and f.gap_us is not None]
    return ["#### The gap to the hardware floor", "", *lines, ""] if lines else []


def _with_noise(delta: float | None, verdict: str) -> str:
    mark = verdict.replace("beyond noise", "**beyond noise**") if verdict else ""
    return num(delta, sign=True) + (f" ({mark})" if mark else "")


def _ladder(runs: Sequence[tuple[str, Summary]], ladder: Sequence[Mapping[str, Any]] | None) -> list[str]:
    """The runs' ladder, the HTML report's figures (each run against the previous one and the first)."""
    if not ladder or len(ladder) != len(runs):
        return []
    LW = words("cpu" if all(rank_timeline(s.ranks[0] if s.ranks else Rank()) == "cpu" for _, s in runs) else "gpu")
    tps = any(st["tokens_per_s_per_user"] is not None for st in ladder)
    rows = [[md_escape(label), md_escape(st["shape"]), *([num(st["tokens_per_s_per_user"], RATE)] if tps else []), num(st["wall_us"]),
             "" if i == 0 else num(st["wall_delta_vs_previous_us"], sign=True), "" if i == 0 else num(st["wall_delta_vs_first_us"], sign=True),
             num(st["gpu_window_us"])] for i, ((label, _), st) in enumerate(zip(runs, ladder))]
    nw = min(st["windows"] for st in ladder)
    return ["#### Runs (the ladder)", "",
            *_table(["configuration", "shape", *(["tokens/s per user (unprofiled)"] if tps else []), "wall µs", "Δ vs previous", "Δ vs first",
                     f"{LW['window']} µs"], "ll" + "r" * (4 + tps), rows),
            "", "<sub>µs per iteration over the iterations of the shape both share"
                + (f"; the median over {nw} profile windows, a change the median over paired windows of the per-window change" if nw > 1 else "")
                + ".</sub>", ""]


def _flags(names: Sequence[str], diffs: Sequence[Diff]) -> list[str]:
    """What the expected-effect checks found, judged only (beyond the noise and the floor): own terms that went the
    wrong way, then the flags (changes outside an optimization's own categories)."""
    out = []
    for title, what in (("Own effect the wrong way", "against"), ("Flags: changes outside the optimization's own categories", "flags")):
        lines = [f"- {md_escape(n)}: {md_escape(f, max_len=300)}" for n, d in zip(names, diffs) if d.expected_effect is not None
                 for f in getattr(d.expected_effect, what)]
        out += [f"#### {title}", "", *lines, ""] if lines else []
    return out


def _details(names: Sequence[str], diffs: Sequence[Diff]) -> list[str]:
    out = []
    for n, d in zip(names, diffs):
        first, *bullets = headline_lines(d)
        out += [f"<details><summary>{md_escape(n)}</summary>", "", md_escape(first, max_len=None),
                *(f"- {md_escape(b, max_len=None)}" for b in bullets), "", "</details>", ""]
    return out
