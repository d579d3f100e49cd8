"""The terminal renderer: summary.json and diff.json as rich tables on a console (human output;
the CLI decides between stdout and stderr). Trace strings go through rich.markup.escape; tables
are fitted to the console's width (fit.py)."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Collection
from functools import partial
from typing import ClassVar, cast

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from profkit.attribution.diff import shape_label, shape_of
from profkit.attribution.findings import bubble_causes, idle_cpu_ops, largest_bubbles, sync_groups
from profkit.documents import UNSET, CrossRank, Diff, Rank, Summary
from profkit.report import capture_view
from profkit.report.base import Renderer, Report
from profkit.report.fit import COPY, MIN_NAME, NAME, NUM, TEXT, cut_names, demangle, demangle_many, fit_table
from profkit.report.numbers import COUNT, HYPHEN, RATE, RESIDUAL, US, counted, num, pct
from profkit.report.views import (
    counts_title, merged_ops, cpu_ops_text, decomposition_rows, device_text, doubt_metric, effect_flags, headline_lines, idle_verdict, host_gap_text, noise_verdict, outside_text, phase_rows,
    row_metric, statistic_note, withheld_text,
    throughput_rows,
)
from profkit.terms import RUN_ROWS, PerIteration, shape_text
from profkit.report.vocab import GPU_ONLY_COUNTS, banner, count_label, diff_timeline, words

SHAPE_WIDTH = 120  # the narrowest console whose kernels table shows the shape column beside the names
SHAPE_CELL = 44  # a shape longer than this is cut in the middle (the whole one is in summary.json's kernels)
PY_FRAME = re.compile(r"\.py\(\d+\): ")  # a Python frame as Kineto names it (analysis/syncs.py's user frames)

_num = partial(num, missing=HYPHEN)  # the terminal writes a missing number as "-"


def _run_label(f: PerIteration, dev: str) -> str:
    """A per-iteration figure's row in a single run's table (a CPU-op timeline's "kernels" are its top-level aten ops)."""
    if f.key == "gpu_kernels" and dev != "GPU":
        return "top-level aten ops"
    return f.run_label or f.label


class TerminalRenderer(Renderer):
    """Tables for `console` (its width and colours): each diff, then each run's summary.

    `show` prints them on the console as they are drawn (rich handles a reader that leaves early);
    `render` returns the same text instead.
    """

    name: ClassVar[str] = "terminal"
    output_file_extension: ClassVar[str] = "txt"

    def __init__(self, console: Console, *, top: int = 10, warn: Console | None = None, said: Collection[str] = ()) -> None:
        """`warn`: print each run's warnings there, before its tables (analyze: stderr), instead of after them;
        `said`: warnings printed already (one that every profile window of a run shares is printed once)."""
        self.console = console
        self.top = top
        self.warn = warn
        self.said = said

    def render(self, report: Report) -> str:
        with self.console.capture() as captured:
            self.show(report)
        return captured.get()

    def show(self, report: Report) -> None:
        for d in report.diff_docs:
            _diff(d, self.console, top=self.top)
        for _label, s in report.run_docs:
            _summary(s, self.console, top=self.top, warn=self.warn, said=self.said)


def summary_warnings(summary: Summary) -> list[str]:
    """A summary's warnings, as `analyze` prints them: each rank's, then the cross-rank figures'."""
    return [w for r in summary.ranks for w in r.warnings] + (summary.cross_rank.warnings if summary.cross_rank is not None else [])


def _summary(summary: Summary, console: Console, *, top: int, warn: Console | None = None, said: Collection[str] = ()) -> None:
    console.print(f"[bold]{escape(capture_view.summary_health(summary))}[/]")  # issue 31: first, before any number
    for line in capture_view.summary_lines(summary):
        console.print(escape(line))
    if warn is not None:
        for w in summary_warnings(summary):
            if w in said:
                continue
            warn.print(f"[yellow]warning:[/] {escape(w)}")
    _ranks(summary, console, top=top, warnings=warn is None)
    if summary.cross_rank is not None:
        _cross_rank(summary.cross_rank, console, warnings=warn is None)


def _ranks(summary: Summary, console: Console, *, top: int, warnings: bool = True) -> None:
    for r in summary.ranks:
        its = r.iterations
        kinds = Counter(shape_label(shape_of(i)) for i in its)
        # the trace's path whole on its line (the terminal wraps it, and a copy joins it back: rich folded it with a newline
        # inside, '…/20261202-022808-proxy' then '-baseon-topk_v2-after-TP-0.trace.json.gz', in a run folder's windows)
        src = r.source
        whose = f" ({src.process} of the merged file)" if src is not None and src.merged and src.process else ""  # ingest/processes.py
        console.print(f"[bold]rank {r.rank}[/] {escape(device_text(r, summary.manifest))}  [dim]{escape(str(r.path) + whose)}[/]", soft_wrap=True)
        console.print(f"  {counted(len(its), 'iteration')} ({escape(', '.join(f'{n}× {k}' for k, n in kinds.most_common()))}); marker [cyan]{escape(str(r.marker))}[/]; "
                      f"catalog {escape(str(r.catalog))}")
        verdict = idle_verdict(r)
        if verdict:
            console.print(f"  [bold]{escape(verdict)}[/]")
        for line in filter(None, (host_gap_text(r), outside_text(r))):
            console.print(f"  [bold magenta]{escape(line)}[/]")
        m = r.median
        if not its:  # no iterations: no medians
            continue
        t = Table(title="per iteration", title_justify="left", box=None)
        for c in ("metric", "median", "min", "max"):
            t.add_column(c, justify="left" if c == "metric" else "right")
        dev = "CPU-op" if r.device_timeline == "cpu" else "GPU"
        rows = (
            ("wall µs", "wall_us", US), (f"{dev} window µs", "gpu_window_us", US), (f"{dev} busy µs", "gpu_busy_us", US),
            (f"{dev} idle µs", "gpu_idle_us", US), ("overlap µs", "overlap_us", US),
            *((_run_label(f, dev), f.key, COUNT if f.unit == "count" else US) for f in RUN_ROWS),
        )
        for label, key, d in rows:
            vals = [v for i in its if (v := getattr(i, key)) is not None]
            label = capture_view.mark(label, summary.health is not None and summary.health.doubts(key))
            t.add_row(label, _num(getattr(m, key), d), _num(min(vals), d) if vals else "-", _num(max(vals), d) if vals else "-")
        for way in ("h2d", "d2h", "d2d"):
            counts = [i.memcpy[way] or 0 for i in its]
            if any(counts):
                t.add_row(f"memcpy {way}", _num(m.memcpy[way], COUNT), _num(min(counts), COUNT), _num(max(counts), COUNT))
        console.print(t)
        cat = cast(dict[str, float], m.category_us)  # medians of numbers
        total = sum(cat.values()) or 1.0
        if cat:
            console.print(fit_table(console, "time by category (median µs per iteration)", (("category", COPY), ("µs", NUM), ("share", NUM)),
                                    [(k, _num(v), pct(100 * v / total, sign=False)) for k, v in sorted(cat.items(), key=lambda kv: -kv[1])]))
        _floor(r, console)
        by_cause = cast(dict[str, float], m.bubble_us_by_cause)
        causes = bubble_causes(r)
        if causes and any(v["count"] for v in causes.values()):
            n_it = max(len(its), 1)  # the CPU ops' idle time is summed over every iteration: per iteration, like the µs beside it
            console.print(fit_table(
                console, "bubbles by cause (µs: median per iteration; count: all iterations; CPU ops: idle µs inside, mean per iteration)",
                (("cause", COPY), ("µs", NUM), ("count", NUM), ("CPU was in (µs)", TEXT)),
                [(c, _num(v), str(causes[c]["count"] if c in causes else 0),
                  cpu_ops_text(merged_ops([(op, None if us is None else us / n_it) for op, us in idle_cpu_ops(r, c, 50)])[:2], unit=""))
                 for c, v in sorted(by_cause.items(), key=lambda kv: -kv[1])]))
            big = largest_bubbles(r, top)
            console.print(fit_table(
                console, f"largest bubbles (of {r.bubbles_total if r.bubbles_total is not None else len(r.bubbles)}; CPU ops with their exclusive µs inside the bubble)",
                (("µs", NUM), ("cause", COPY), ("iteration", NUM), ("CPU ops (µs)", TEXT)),
                [(_num(b["dur_us"]), b["cause"], str(b["iteration"]), cpu_ops_text(b["cpu_ops"], unit="")) for b in big]))
        groups = sync_groups(r)
        if groups:
            frames = [g["frame"] for g in groups if g["frame"]]
            # a Python frame ("file.py(12): fn") from Kineto's stacks; a native one from an nsys backtrace
            label = "Python frame" if all(PY_FRAME.search(f) for f in frames) else "frame"
            cols = (("count", NUM), ("blocked µs", NUM), ("kind", COPY), ("dir", COPY), ("api", COPY), ("trigger", COPY)) + (((label, COPY),) if frames else ())
            console.print(fit_table(console, "host syncs and blocking copies (all iterations)", cols, [
                (str(g["count"]), _num(g["blocked_us"]), g["kind"], str(g["direction"]), str(g["name"]), str(g["trigger"] or "?"), *([g["frame"] or ""] if frames else []))
                for g in groups[:top]]))
        if r.kernels:
            n_it = max(len(its), 1)
            what = "kernels" if r.device_timeline != "cpu" else "aten ops"
            # recorded with shapes: a row per (kernel, launching op's shape), the shape shown where the names keep their room
            has = any(k.shape_op for k in r.kernels)
            shaped = has and console.width >= SHAPE_WIDTH
            note = "; shapes: a wider terminal or --json" if has and not shaped else ""
            console.print(fit_table(console, f"top {what} (of {len(r.kernels)}; names demangled, long ones cut in the middle{note})",
                                    (("total µs", NUM), ("calls/iter", NUM), ("category", COPY), ("name", NAME), *((("shape", TEXT),) if shaped else ())),
                                    # calls per iteration with one decimal in this table (the diff tables use RATE, two)
                                    [(_num(k.total_us), _num((k.count or 0) / n_it, 1), k.category or "-", k.name,
                                      *((_cut(shape_text(k.shape_op, k.shape, k.shape_dtypes), SHAPE_CELL),) if shaped else ())) for k in r.kernels[:top]]))
        for w in r.warnings if warnings else ():
            console.print(f"[yellow]warning:[/] {escape(w)}")


def _floor(r: Rank, console: Console) -> None:
    """The step's floor and the gap's split (report/floor_view.py), or the one line saying why there is none."""
    from profkit.report.floor_view import GAP_TITLE, OPS_COLUMNS, floor_line, floor_note, gap_rows, op_rows

    note = floor_note(r)
    if note:
        console.print(f"[dim]{escape(note)}[/]")
        return
    line = floor_line(r)
    if line is None:
        return
    console.print(f"[bold]floor:[/] {escape(line)}")
    console.print(fit_table(console, GAP_TITLE, (("term", COPY), ("µs", NUM)), [(k, _num(v)) for k, v in gap_rows(r)]))
    ops = op_rows(r, 5)
    if ops:
        console.print(fit_table(console, "modeled ops, most time first (all iterations; achieved rates, share of the peak of their bound)",
                                tuple(zip(OPS_COLUMNS, (NAME, NUM, NUM, NUM, NUM, NUM, COPY))), ops))


def _cross_rank(x: CrossRank, console: Console, *, warnings: bool = True) -> None:
    """The straggler table and per-iteration spread across ranks."""
    offs = ", ".join(f"rank {r}: {v:+,.1f} µs" for r, v in x.clock_offsets_us.items())
    console.print(f"[bold]across {len(x.ranks)} ranks[/]: {x.aligned_iterations} aligned iterations; clock offsets {escape(offs)}")
    t = Table(title="stragglers (the rank the others wait for in collectives)", title_justify="left", box=None)
    for c in ("rank", "times straggler", "wait it caused µs (mean)", "its own collective wait µs (mean)"):
        t.add_column(c, justify="right")
    for s in x.stragglers:
        t.add_row(str(s.rank), str(s.times_straggler), _num(s.mean_wait_caused_us), _num(s.mean_comm_wait_us))
    console.print(t)
    spreads = [i.spread_us for i in x.iterations]
    if spreads:
        spreads.sort()
        console.print(f"GPU-window spread across ranks per iteration: median {_num(spreads[len(spreads) // 2])} µs, max {_num(spreads[-1])} µs")
    for w in x.warnings if warnings else ():
        console.print(f"[yellow]warning:[/] {escape(w)}")


def _diff(diff: Diff, console: Console, *, top: int) -> None:
    """A diff's tables, in the order every renderer has them."""
    tl = diff_timeline(diff)
    W = words(tl)
    _diff_head(diff, console)
    _throughput_table(diff, console)
    _effect_lines(diff, console)
    if banner(tl):
        console.print(f"[bold yellow]{escape(banner(tl) or '')}[/]")
    _decomposition_table(diff, console, W)
    _diff_floor(diff, console)
    ph = phase_rows(diff)
    if ph:
        console.print(fit_table(console, f"the same change in {W['device']} time by phase (µs per iteration)",
                                (("phase", COPY), ("baseline", NUM), ("candidate", NUM), ("Δ", NUM), ("noise", TEXT)),
                                [(k, _num(bv), _num(cv), _num(d, sign=True), noise_verdict(diff, m)) for k, bv, cv, d, m in ph]))
    console.print(fit_table(console, counts_title(diff), (("count", COPY), ("baseline", NUM), ("candidate", NUM), ("Δ", NUM), ("noise", TEXT)),
                            [(count_label(k, tl), _num(v.baseline, COUNT), _num(v.candidate, COUNT), _num(v.delta, COUNT, sign=True), noise_verdict(diff, f"counts.{k}"))
                             for k, v in diff.counts.items() if not (tl == "cpu" and k in GPU_ONLY_COUNTS)]))
    _kernel_and_sync_tables(diff, console, W, top=top)
    for w in diff.warnings:
        console.print(f"[yellow]warning:[/] {escape(w)}")


def _diff_floor(diff: Diff, console: Console) -> None:
    """What the optimization closed of the gap to the floor, and the gap's split on each side (report/floor_view.py)."""
    from profkit.report.floor_view import closed_text, diff_floor, diff_gap_rows

    text = closed_text(diff)
    f = diff_floor(diff)
    if text is None or f is None:
        return
    if f.note:
        console.print(f"[dim]{escape(text)}[/]")
        return
    console.print(f"[bold]{escape(text)}[/]")
    console.print(fit_table(console, "the gap to the floor on each side (µs per iteration, medians over windows of the means)",
                            (("term", COPY), ("baseline", NUM), ("candidate", NUM), ("Δ", NUM)),
                            [(k, _num(b), _num(c), _num(d, sign=True)) for k, b, c, d in diff_gap_rows(diff)]))


def _diff_head(diff: Diff, console: Console) -> None:
    """Capture health (issue 31: first, before any number), the headline and its bullets, the capture lines, the sides."""
    console.print(f"[bold]{escape(capture_view.diff_health(diff))}[/]")
    first, *bullets = headline_lines(diff)  # the headline: one line, then at most three bullets
    console.print(f"[bold]{escape(first)}[/]")
    for line in bullets:  # a hanging indent: a bullet's second line starts under its text, not at column 0
        g = Table.grid(padding=(0, 1))
        g.add_column(no_wrap=True)
        g.add_column()
        g.add_row(" •", Text(line))
        console.print(g)
    for line in capture_view.diff_lines(diff):
        console.print(escape(line))
    console.print(f"[bold]{escape(diff.baseline.label)}[/] → [bold]{escape(diff.candidate.label)}[/]"
                  + (f"  [cyan]{escape(diff.optimization)}[/]" if diff.optimization else ""))


def _throughput_table(diff: Diff, console: Console) -> None:
    tp = throughput_rows(diff)
    if not tp:
        return
    t = Table(title="unprofiled throughput", title_justify="left", box=None)
    for col in ("", "baseline", "candidate", "change", ""):
        t.add_column(col, justify="left" if col == "" else "right")
    for r in tp:
        t.add_row(r["label"], _num(r["baseline"], RATE), _num(r["candidate"], RATE), pct(r["change_pct"], missing=HYPHEN),
                  {None: "[dim]not judged[/]", True: "[dim]within noise[/]", False: "[bold]beyond noise[/]"}[r["within_noise"]])
    console.print(t)


def _effect_lines(diff: Diff, console: Console) -> None:
    """The expected-effect check (flags, a pass, or what it was judged against) and the noise note when nothing is judged."""
    ee = diff.expected_effect
    if ee and ee.known:
        if effect_flags(ee):
            for f in effect_flags(ee):
                console.print(f"[bold red]flag:[/] {escape(f)}")
        elif ee.ok:  # judged, and nothing against it: the only case with a pass
            console.print(f"[green]expected effect ok:[/] no change outside {escape(', '.join(ee.categories) or 'its (empty) categories')} "
                          f"beyond {escape(ee.threshold)}")
        elif withheld_text(ee):
            console.print(escape(withheld_text(ee) or ""))
        else:
            sep = " " if not ee.judged else ": "  # "expected effect not judged: ...", or what it was judged against
            console.print(f"expected effect{sep}{escape(ee.threshold)}")
    elif ee:
        console.print(f"[yellow]note:[/] {escape(ee.note)}")
    if not diff.noise.available:
        console.print(f"[dim]{escape(diff.noise.note)}[/]")


def _decomposition_table(diff: Diff, console: Console, W: dict[str, str]) -> None:
    g = diff.decomposition.gpu_window_us
    rows: list[tuple[str, ...]] = []
    for group, term, delta, bv, cv in decomposition_rows(diff):
        if group == "overlap":
            bv, cv = -(bv or 0), -(cv or 0)
            label = "− overlap"
        else:
            label = term if group in ("category", "backlog") else f"idle: {term.replace('_', ' ')}"
        label = capture_view.mark(label, capture_view.doubted_in_diff(diff, doubt_metric(group)))
        rows.append((label, _num(bv), _num(cv), _num(delta, sign=True), noise_verdict(diff, row_metric(group, term))))
    rows.append((W["window"], _num(g.baseline), _num(g.candidate), _num(g.delta, sign=True), noise_verdict(diff, "gpu_window_us")))
    rows.append(("residual (worst window)", "", "", _num(diff.decomposition.residual_us, RESIDUAL), "exact" if diff.decomposition.exact else "inexact"))
    # µs in the title, not in every header: at 80 columns the noise verdicts then stay on one line (a long term folds instead)
    console.print(fit_table(console, f"change in {W['window']} per iteration (µs, {diff.shape.label})",
                            (("term", TEXT), ("baseline", NUM), ("candidate", NUM), ("Δ", NUM), ("noise", TEXT)), rows))
    console.print(f"[dim]{escape(statistic_note(diff))}[/]")


def _kernel_and_sync_tables(diff: Diff, console: Console, W: dict[str, str], *, top: int) -> None:
    """Syncs, top movers, each side's largest bubbles, kernels added and removed."""
    if diff.syncs:
        console.print(fit_table(console, "host syncs and blocking copies per iteration",
                                (("Δ", NUM), ("baseline", NUM), ("candidate", NUM), ("kind", COPY), ("dir", COPY), ("api", COPY), ("trigger", COPY)),
                                [(_num(s.delta, RATE, sign=True), _num(s.baseline_per_iteration, RATE), _num(s.candidate_per_iteration, RATE),
                                  s.kind, s.direction, s.api, s.trigger) for s in diff.syncs[:top]]))
    if diff.top_movers:
        # both sides recorded with shapes: movers by (kernel, launching op's shape), the shape shown from SHAPE_WIDTH columns
        has = any(m.shape is not UNSET for m in diff.top_movers)
        shaped = has and console.width >= SHAPE_WIDTH
        by = "normalized names and shapes" + ("" if shaped else "; shapes: a wider terminal or --json") if has else "normalized names"
        console.print(fit_table(console, f"top movers (µs per iteration, {by})",
                                (("Δ µs", NUM), ("baseline", NUM), ("candidate", NUM), ("category", COPY), (W["kernel"], NAME),
                                 *((("shape", TEXT),) if shaped else ())),
                                [(_num(m.delta_us, sign=True), _num(m.baseline_us), _num(m.candidate_us), m.category, m.name,
                                  *((_cut(m.shape or "", SHAPE_CELL),) if shaped else ())) for m in diff.top_movers[:top]]))
    for side, v in ((diff.baseline, diff.bubbles.baseline), (diff.candidate, diff.bubbles.candidate)):
        if not v or not v.largest:
            continue
        console.print(fit_table(console, f"largest bubbles: {side.label} (CPU ops with their exclusive µs inside the bubble)",
                                (("µs", NUM), ("cause", COPY), ("iteration", NUM), ("CPU ops (µs)", TEXT)),
                                [(_num(x.dur_us), str(x.cause), str(x.iteration), cpu_ops_text([(o.name, o.us) for o in x.cpu_ops], unit=""))
                                 for x in v.largest[:5]]))
    for what in ("added", "removed"):
        ks, total = diff.kernel_list(what)
        if ks:
            # one name a line, demangled and cut in the middle to the width (a list folded at spaces left "void" alone on a line)
            console.print(f"{W['kernels_plain']} {what}" + (f" ({total}, the first 5)" if total > 5 else "") + ":")
            demangle_many(k.name for k in ks[:5])
            for n in cut_names([demangle(k.name) for k in ks[:5]], max(MIN_NAME, console.width - 3)):
                console.print(f"  {escape(n)}", no_wrap=True, overflow="ellipsis")


def _cut(text: str, n: int) -> str:
    """`text` cut in the middle to n characters."""
    return text if len(text) <= n else text[: n // 2 - 1] + "…" + text[-(n - n // 2):]
