"""The HTML renderer: summary.json / diff.json -> one self-contained HTML report (jinja2 templates
+ plotly figures).

Rendering only: the report data (diff.json, summary.json, the sweep's ladder) is computed before,
in `profkit.attribution` and `profkit.analysis`; figures come from `profkit.report.figures`.
Templates autoescape every value (a trace is untrusted input); figures are inserted as plotly's
own div + script (its JSON escapes ``<``), and the page's data for scripts goes in through
``|tojson`` only. plotly.js is inlined once (first figure), or loaded from the CDN
with ``cdn=True``. Figure div ids are fixed so that the same input gives the same bytes.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from functools import lru_cache
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar, TypedDict

import jinja2
import msgspec
import plotly.graph_objects as go
from markupsafe import Markup

from profkit import __version__
from profkit.attribution.diff import IDLE_KEYS, swings
from profkit.attribution.findings import largest_bubbles, sync_groups
from profkit.documents import UNSET, Diff, Iteration, KernelEntry, Mover, Rank, SeriesPoint, Summary, ThroughputPoint, run_labels, throughput_of
from profkit.report import capture_view
from profkit.report import figures as F
from profkit.report.base import Renderer, Report
from profkit.report.fit import cut_names, demangle, demangle_many
from profkit.report.numbers import COUNT, RATE, RESIDUAL, US, counted, num, pct, ratio_pct
from profkit.report.views import (
    cpu_ops_text, decomposition_rows, device_text, effect_flags, headline_lines, idle_verdict, host_gap_text, noise_verdict, outside_text, phase_rows,
    doubt_metric, row_metric, statistic_note, within_noise, withheld_text,
    throughput_rows, unstable_runs,
)
from profkit.report.vocab import GPU_ONLY_COUNTS, banner, count_label, diff_timeline, rank_timeline, words
from profkit.terms import COUNT_KEYS, PER_ITERATION, SERIES_FIELDS

MAX_ROWS = 50
MAX_BYTES = 2_000_000  # a report is at most 2 MB (README)
MAX_MANIFEST_ROWS = 200


@lru_cache(maxsize=1)
def _env() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("profkit.report", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.policies["json.dumps_kwargs"] = {"sort_keys": True, "ensure_ascii": False}
    return env


class _Figures:
    """Turns figures into divs, including plotly.js with the first one only."""

    def __init__(self, *, cdn: bool) -> None:
        self.cdn = cdn
        self.n = 0

    def div(self, fig: go.Figure) -> Markup:
        include: bool | str = "cdn" if self.cdn and self.n == 0 else False
        bundle = "" if self.cdn or self.n else _inline_bundle()
        self.n += 1
        return Markup(bundle + fig.to_html(full_html=False, include_plotlyjs=include, div_id=f"profkit-fig-{self.n}",
                                           config={"displaylogo": False, "responsive": True}))


BUNDLE = "plotly-finance.min.js"  # plotly.js's finance partial bundle (bar, scatter, waterfall): 1.3 MB, not 4.8 (assets/README.md)


@lru_cache(maxsize=1)
def _inline_bundle() -> str:
    """plotly.js's smallest bundle that draws these charts, inline; plotly.py's full one if it is missing."""
    from importlib.resources import files

    try:
        js = (files("profkit.report") / "assets" / BUNDLE).read_text(encoding="utf-8")
    except (OSError, FileNotFoundError):
        from plotly.offline import get_plotlyjs

        js = get_plotlyjs()
    return ('<script type="text/javascript">window.PlotlyConfig = {MathJaxConfig: \'local\'};</script>\n'
            f'<script type="text/javascript">{js}</script>\n')


def _instability(label: str, series: Sequence[SeriesPoint], window: str) -> str | None:
    """A warning when the compared iterations' windows swing (max over min above 2, the rule of diff.json's
    stability: attribution.diff.swings): their mean then says little, and a change between two such runs
    may be the swing, not the change."""
    part = _swing(label, series, window)
    return None if part is None else (f"unstable: {part} over the compared iterations; its mean says little, and a change may be "
                                      "that swing (see the plot of every iteration)")


def _swing(label: str, series: Sequence[SeriesPoint], window: str) -> str | None:
    vals = [x.gpu_window_us for x in series if x.used and x.gpu_window_us]
    if not swings(vals):
        return None
    return f"{label}'s {window} per iteration swings {min(vals):,.1f} – {max(vals):,.1f} µs ({max(vals) / min(vals):.1f}×)"


class Hover(TypedDict):
    """A table cell whose whole text is in its hover (the template tells it by `cell is mapping`)."""
    text: str
    title: str


@dataclass
class Card:
    """A headline card: its label, value, second line and colour (good, bad or none)."""
    label: str
    value: str
    sub: str = ""
    tone: str = ""


@dataclass
class Table:
    """A table as report.html's `table` macro lays it out. `wide_cols`: columns left out under 1100 px (base.html's .wide),
    whose text a hover elsewhere in the row keeps."""
    columns: list[str]
    rows: list[list[Any]]
    align: list[str]
    caption: str | None = None
    name_cols: list[int] = field(default_factory=list)
    more: str | None = None
    collapsed: bool = False
    wide_cols: list[int] = field(default_factory=list)


@dataclass
class Section:
    """One section of the page, as report.html reads it (by attribute)."""
    id: str
    title: str
    headline: str | None = None
    bullets: list[str] = field(default_factory=list)
    cards: list[Card] = field(default_factory=list)
    flags: list[str] = field(default_factory=list)
    flags_title: str = ""
    ok: str | None = None
    health: str | None = None
    notes: list[str] = field(default_factory=list)
    figures: list[Markup] = field(default_factory=list)
    tables: list[Table] = field(default_factory=list)
    details_open: str | None = None
    details_close: bool = False


def _table(columns: Sequence[str], rows: Sequence[Sequence[Any]], *, align: str | None = None, caption: str | None = None,
           name_cols: Sequence[int] = (), more: str | None = None, collapsed: bool = False, wide_cols: Sequence[int] = ()) -> Table:
    """`wide_cols`: columns left out under 1100 px (base.html's .wide), whose text a hover elsewhere in the row keeps."""
    al = align or ("l" + "r" * (len(columns) - 1))
    return Table(columns=list(columns), rows=[list(r) for r in rows], align=["r" if a == "r" else "l" for a in al], caption=caption,
                 name_cols=list(name_cols), more=more, collapsed=collapsed, wide_cols=list(wide_cols))


def _flatten(obj: Any, prefix: str = "") -> list[tuple[str, str]]:
    if isinstance(obj, Mapping):
        out: list[tuple[str, str]] = []
        for k, v in obj.items():
            out += _flatten(v, f"{prefix}.{k}" if prefix else str(k))
        return out
    if isinstance(obj, list) and obj and all(isinstance(x, (Mapping, list)) for x in obj):
        out = []
        for i, v in enumerate(obj):
            out += _flatten(v, f"{prefix}[{i}]")
        return out
    return [(prefix, obj if isinstance(obj, str) else json.dumps(obj, ensure_ascii=False))]


def _kname(name: str) -> str | Hover:
    """A kernel name as C++ (demangled), the name as recorded in its hover; other names as they are."""
    d = demangle(name)
    return name if d == name else Hover(text=d, title=name)


def _kname_full(k: KernelEntry | Mover) -> str | Hover:
    """A kernel's normalized name as C++, its full name (an example, else as recorded) in the hover: the full-name
    column is left out at 900 px (a 300-character template name made each row 15 lines tall)."""
    d = _kname(k.name)
    text = d if isinstance(d, str) else d["text"]
    full = (k.examples or [""])[0] or k.name
    return text if full == text else Hover(text=text, title=full)


KNAME_CHARS = 90  # a run's kernel name in its table, cut in the middle (at 900 px a whole template name made a row 300 px tall)


def _knames_cut(names: Sequence[str]) -> list[str | Hover]:
    """A run's kernels as C++, each cut in the middle to KNAME_CHARS where the names sharing a start still differ
    (three instantiations of one template stay apart, as in the terminal), the whole name and the recorded one in the hover."""
    full = [demangle(n) for n in names]
    out: list[str | Hover] = []
    for raw, f, c in zip(names, full, cut_names(full, KNAME_CHARS)):
        hover = f + (f"\n{raw}" if raw != f else "")
        out.append(c if c == hover else Hover(text=c, title=hover))
    return out


def _example(k: KernelEntry | Mover, max_len: int = 160) -> str:  # the whole name is in the row's hover
    ex = (k.examples or [""])[0]
    return ex if len(ex) <= max_len else ex[: max_len - 1] + "…"


def _manifest_table(label: str, manifest: Any) -> Table | None:
    if not manifest:
        return None
    rows = _flatten(manifest)
    more = f"{len(rows) - MAX_MANIFEST_ROWS} more entries not shown" if len(rows) > MAX_MANIFEST_ROWS else None
    return _table(["key", "value"], rows[:MAX_MANIFEST_ROWS], align="ll", caption=f"run manifest: {label}", name_cols=(1,), more=more,
                  collapsed=True)


# --------------------------------------------------------------------------------------------
# a diff


def _tone(diff: Diff, metric: str, delta: float | None) -> str:
    """A card's colour: only for a change judged beyond noise (judged, or not judged: never both)."""
    if within_noise(diff, metric) is not False or not delta:
        return ""
    return "good" if delta < 0 else "bad"


def _sub(*parts: str) -> str:
    """A card's second line, its non-empty parts joined by " · " (an unjudged diff ended one with a lone "·")."""
    return " · ".join(p.strip() for p in parts if p and p.strip())


def diff_sections(diff: Diff, figs: _Figures, *, prefix: str = "diff", timeline: bool = True, single: bool = False) -> list[Section]:
    """The sections of one diff. `timeline`: draw the representative iterations and list the manifests (a
    sweep's step leaves them to the page's per-configuration timeline and manifests, which show every run once); `single`: the page holds this diff alone (its
    h1 names the two sides, so the first h2 does not again)."""
    b, c = diff.baseline, diff.candidate
    lb, lc = f"baseline: {b.label}", f"candidate: {c.label}"
    w, g = diff.wall_us, diff.gpu_window_us
    tl = diff_timeline(diff)
    W = words(tl)
    dec = diff.decomposition
    cards = [
        Card(label=f"{t['label']} (unprofiled)", value=f"{num(t['baseline'], RATE)} → {num(t['candidate'], RATE)}",
             sub=pct(t["change_pct"], missing="") + {None: " · not judged", True: " · within noise", False: " · beyond noise"}[t["within_noise"]],
             # a colour only for a change judged beyond noise (one repeat a side: not judged, no colour)
             tone="" if t["change_pct"] is None or t["within_noise"] is not False else ("good" if (t["change_pct"] > 0) == t["higher_is_better"] else "bad"))
        for t in throughput_rows(diff) if t["key"] in ("tokens_per_s_per_user_p50", "tokens_per_s_per_gpu")
    ] + [
        Card(label="wall µs per iteration", value=f"{num(w.baseline)} → {num(w.candidate)}",
             sub=_sub(f"{num(w.delta, sign=True)} µs {ratio_pct(w.ratio, missing='')}", noise_verdict(diff, "wall_us")), tone=_tone(diff, "wall_us", w.delta)),
        Card(label=f"{W['window']} µs", value=f"{num(g.baseline)} → {num(g.candidate)}",
             sub=_sub(f"{num(g.delta, sign=True)} µs {ratio_pct(g.ratio, missing='')}", noise_verdict(diff, "gpu_window_us")), tone=_tone(diff, "gpu_window_us", g.delta)),
    ]
    for key, label in ((f.key, f.label) for f in PER_ITERATION if f.card):
        if tl == "cpu" and key in GPU_ONLY_COUNTS:
            continue  # a CPU-only run has none (the banner says so): no "kernel launches 0 → 0" card
        x = diff.counts[key]
        cards.append(Card(label=f"{label} per iteration (median)", value=f"{num(x.baseline, COUNT)} → {num(x.candidate, COUNT)}",
                          sub=num(x.delta, COUNT, sign=True) if x.delta else "no change"))
    if not dec.exact or dec.residual_us:  # an exact decomposition's 0.000 tells a reader nothing: shown only when not
        cards.append(Card(label="residual", value=f"{num(dec.residual_us, RESIDUAL)} µs", sub="exact" if dec.exact else "inexact"))
    first, *bullets = headline_lines(diff)  # one line, then at most three bullets: the same words as the terminal and Markdown
    head = Section(f"{prefix}-summary", "Summary" if single else f"{b.label} → {c.label}",
                    headline=first, cards=cards)
    head.health = capture_view.diff_health(diff)  # its own line above the headline, as in the terminal and Markdown
    head.bullets = bullets
    ee = diff.expected_effect
    if ee and ee.known:
        if effect_flags(ee):
            head.flags = effect_flags(ee)
            what = [x for x, on in (("its own effect went the wrong way", ee.against),
                                    (f"changes outside {ee.optimization}'s categories ({', '.join(ee.categories) or 'none'})", ee.flags)) if on]
            head.flags_title = f"Expected-effect check: {'; '.join(what)}, threshold {ee.threshold}"
        elif ee.ok:  # judged, nothing against it: the only case with a pass box
            head.ok = f"Expected-effect check passed: {ee.optimization} changed nothing outside its categories ({', '.join(ee.categories) or 'none'}) beyond {ee.threshold}."
        elif withheld_text(ee):
            head.notes.append(withheld_text(ee) or "")
        else:
            head.notes.append(f"Expected-effect check {ee.threshold}.")
    elif ee:
        head.notes.append(ee.note)
    noise = diff.noise
    head.notes.append(
        f"Noise: {noise.repeats['baseline']} baseline and {noise.repeats['candidate']} candidate profile windows; changes smaller than the spread are marked “within noise”."
        if noise.available else f"Noise: {noise.note}."
    )
    head.notes.append(f"Compared {diff.shape.label} iterations: {diff.shape.iterations['baseline']} baseline, "
                         f"{diff.shape.iterations['candidate']} candidate (each rank's last iteration left out). Rank {diff.rank}.")
    head.notes += [f"warning: {x}" for x in diff.warnings]

    out = [head]
    # issue 40 point 5: the verdict and cards (head), then the waterfall and the timeline, then the per-iteration plot, the tables;
    # capture health's slack and speculative charts after them. Built in page order: the first figure carries plotly.js
    rows = []
    # in the waterfall's order above it: largest |Δ| first
    for group, term, delta, bv, cv in sorted(decomposition_rows(diff), key=lambda r: -abs(r[2] or 0.0)):
        metric = row_metric(group, term)
        if group == "overlap":
            bv, cv = -(bv or 0), -(cv or 0)
        label = {"category": term, "overlap": "− overlap (multi-stream, counted once)", "idle": f"idle: {term.replace('_', ' ')}",
                 "backlog": f"backlog ({W['device']} behind the host)"}[group]
        label = capture_view.mark(label, capture_view.doubted_in_diff(diff, doubt_metric(group)))
        rows.append([label, num(bv), num(cv), num(delta, sign=True), noise_verdict(diff, metric)])
    rows.append([W["window"], num(g.baseline), num(g.candidate), num(g.delta, sign=True), noise_verdict(diff, "gpu_window_us")])
    rows.append(["residual (worst window)", "", "", num(dec.residual_us, RESIDUAL), "exact" if dec.exact else "inexact"])
    out.append(Section(
        f"{prefix}-decomposition", f"Where the {W['window']} went (µs per iteration)", notes=[statistic_note(diff)],
        figures=[figs.div(F.waterfall_figure(diff, window=W["window"]))],
        tables=[_table(["term", "baseline", "candidate", "Δ µs", "noise"], rows, align="lrrrl")],
    ))
    # (not `tl`: that is the sides' device timeline, which the labels below read)
    sides = [(lb, diff.timelines.baseline), (lc, diff.timelines.candidate)]
    cats = sorted(set(dec.baseline.category_us) | set(dec.candidate.category_us))
    colors = F.category_colors(cats + [c for _, t in sides if t for c in t["ops"]["category"]])
    s = Section(f"{prefix}-timeline", "Timeline of a representative iteration")
    if not timeline:
        pass
    elif any(t for _, t in sides):
        s.figures.append(figs.div(F.timeline_figure(sides, colors=colors, window=W["window"])))
        out.append(s)
    else:
        s.notes.append("No timeline in these summaries (written by an older profkit): re-run `profkit analyze` to get one.")
        out.append(s)

    sb, sc = diff.series.baseline or [], diff.series.candidate or []
    if sb or sc:
        # first among the figures: a side whose iterations swing must be seen before its mean is read
        swing = [x for x in (_swing(lb, sb, W["window"]), _swing(lc, sc, W["window"])) if x]
        # one note for both sides, at the plot that shows it (the headline names the unstable sides too; it was one note a side)
        note = ([f"warning: unstable: {'; '.join(swing)} over the compared iterations; "
                 f"{'their means say' if len(swing) > 1 else 'its mean says'} little, and a change may be that swing (the plot below)"]
                if swing else [])
        out.append(Section(f"{prefix}-windows", f"{W['window']} per iteration, each side", notes=note,
                            figures=[figs.div(F.gpu_window_figure([(lb, sb), (lc, sc)], window=W["window"]))]))
    ph = phase_rows(diff)
    if ph:  # the same change by phase (issue 19: where in the iteration, apart from what kind of kernel)
        out.append(Section(
            f"{prefix}-phases", f"The same change by phase ({W['device']} time, µs per iteration)",
            tables=[_table(["phase", "baseline", "candidate", "Δ µs", "noise"],
                           [[k, num(bv), num(cv), num(d, sign=True), noise_verdict(diff, m)] for k, bv, cv, d, m in ph], align="lrrrl")],
        ))
    out.append(Section(
        f"{prefix}-categories", "Time by category and bubbles by cause",
        figures=[figs.div(F.category_figure([(lb, dec.baseline.category_us), (lc, dec.candidate.category_us)], device=W["device"])),
                 figs.div(F.bubbles_figure([(lb, dec.baseline.idle_us_by_cause), (lc, dec.candidate.idle_us_by_cause)], device=W["device"]))],
    ))

    from profkit.report.floor_view import closed_text, diff_gap_rows

    gap = diff_gap_rows(diff)
    if gap:  # issue 41: the gap to the hardware floor on each side, and what the optimization closed of it
        out.append(Section(f"{prefix}-floor", "The gap to the hardware floor (µs per iteration)", notes=[closed_text(diff) or ""],
                           tables=[_table(["term", "baseline", "candidate", "Δ µs"], [[k, num(b), num(c), num(d, sign=True)] for k, b, c, d in gap])]))

    labels = {k: count_label(k, tl) for k in COUNT_KEYS}
    crow = [[lab, num(diff.counts[k].baseline, COUNT), num(diff.counts[k].candidate, COUNT), num(diff.counts[k].delta, COUNT, sign=True),
             noise_verdict(diff, f"counts.{k}")] for k, lab in labels.items() if not (tl == "cpu" and k in GPU_ONLY_COUNTS)]
    for k, t in diff.timings.items():
        crow.append([k.replace("_us", " µs").replace("_", " "), num(t.baseline), num(t.candidate), num(t.delta, sign=True),
                     noise_verdict(diff, f"timings.{k}")])
    tables = [_table(["per iteration (median)", "baseline", "candidate", "Δ", "noise"], crow, align="lrrrl")]
    syncs = diff.syncs
    if syncs:
        tables.append(_table(["kind", "API", "direction", "trigger", "baseline / iter", "candidate / iter", "Δ"],
                             [[x.kind, x.api, x.direction, x.trigger, num(x.baseline_per_iteration, RATE), num(x.candidate_per_iteration, RATE),
                               num(x.delta, RATE, sign=True)] for x in syncs[:MAX_ROWS]],
                             align="llllrrr", caption="host syncs and blocking copies, with their trigger", name_cols=(3,),
                             more=f"{len(syncs) - MAX_ROWS} more not shown" if len(syncs) > MAX_ROWS else None))
    figs_l = []
    if sb or sc:
        figs_l.append(figs.div(F.per_iteration_figure([(lb, sb), (lc, sc)], cpu=tl == "cpu")))
    out.append(Section(f"{prefix}-counts", "Bubbles and timings per iteration" if tl == "cpu" else "Launches and syncs per iteration",
                        figures=figs_l, tables=tables))

    movers = diff.top_movers
    ktables = [_table([f"{W['kernel']} (normalized)", "category", "baseline µs", "candidate µs", "Δ µs", "", "full name, e.g."],
                      [[_kname_full(m), m.category, num(m.baseline_us), num(m.candidate_us), num(m.delta_us, sign=True), m.status,
                        _example(m)] for m in movers],
                      align="llrrrll", caption="top movers, µs per iteration", name_cols=(0, 6), wide_cols=(6,))]
    for change in ("added", "removed"):
        ks, total = diff.kernel_list(change)
        if ks:
            ktables.append(_table([f"{W['kernel']} (normalized)", "category", "per iteration", "µs per iteration", "full name, e.g."],
                                  [[_kname_full(k), k.category, num(k.count_per_iteration, RATE), num(k.us_per_iteration), _example(k)]
                                   for k in ks[:MAX_ROWS]],
                                  align="llrrl", caption=f"{total} {W['kernel']}(s) {change}", name_cols=(0, 4), collapsed=True, wide_cols=(4,),
                                  more=f"{total - min(len(ks), MAX_ROWS)} more not shown" if total > min(len(ks), MAX_ROWS) else None))
    out.append(Section(f"{prefix}-kernels", f"Top {W['kernels_plain']}", tables=ktables))
    slack = capture_section(prefix, diff, figs, lb, lc)
    if not slack and capture_view.DOUBT_NOTE in capture_view.diff_lines(diff):
        head.notes.append(capture_view.DOUBT_NOTE)
    out += slack
    curves = _curve_section(f"{prefix}-throughput", [(lb, throughput_of(diff.manifests.baseline)),
                                                       (lc, throughput_of(diff.manifests.candidate))], figs)
    if curves:
        out.append(curves)
    man = [t for t in (_manifest_table(lb, diff.manifests.baseline), _manifest_table(lc, diff.manifests.candidate)) if t]
    if man and timeline:  # a sweep's step: its runs' manifests are at the end of the page, once
        out.append(Section(f"{prefix}-manifests", "Run manifests", tables=man))
    return out


def capture_section(prefix: str, diff: Diff, figs: _Figures, lb: str, lc: str) -> list[Section]:
    """Issue 31: overlap slack per step of each side (the first window's transitions), with the diff's slack and
    speculative-cost lines."""
    sl = capture_view.slack_diff(diff)
    strips = [(lb, sl.baseline.series if sl is not None and sl.baseline is not None else []),
              (lc, sl.candidate.series if sl is not None and sl.candidate is not None else [])]
    lines = capture_view.diff_lines(diff)
    if not any(t for _, t in strips) and all(x == capture_view.DOUBT_NOTE for x in lines):
        return []  # nothing of its own (a CPU run has no slack): the † note goes with the summary (diff_sections)
    figures = [figs.div(capture_view.slack_strip_figure(strips))] if any(t for _, t in strips) else []
    return [Section(f"{prefix}-slack", "Overlap slack per step and speculative cost", notes=lines, figures=figures)]


# --------------------------------------------------------------------------------------------
# runs (one summary, or a sweep of several)


def _rank0(summary: Summary) -> Rank:
    return summary.ranks[0] if summary.ranks else Rank()


def _series(its: Sequence[Iteration]) -> list[SeriesPoint]:
    """A run's iterations as the per-iteration figures draw them (a diff's `series`, every iteration compared)."""
    return [SeriesPoint(index=i.index, used=True, shape=f"{i.kind}" + (f" bs={i.batch_size}" if i.batch_size is not None else ""),
                        **{k: getattr(i, k) for k in SERIES_FIELDS}) for i in its]


def run_sections(runs: Sequence[tuple[str, Summary]], ladder: Sequence[Mapping[str, Any]] | None, figs: _Figures,
                 *, timelines: int | None = None) -> list[Section]:
    """The sections of one run, or of a sweep's runs (the ladder first). `timelines`: at most that many runs
    (the first and the last) in the per-configuration timeline, to keep a long sweep's page under MAX_BYTES."""
    out: list[Section] = []
    cpu_page = bool(runs) and all(rank_timeline(_rank0(s)) == "cpu" for _, s in runs)  # no launches or syncs to plot
    if len(runs) >= 2:
        if ladder is None or len(ladder) != len(runs):
            raise ValueError(f"a report of {len(runs)} runs draws their ladder: pass Report(ladder=profkit.attribution.ladder_steps(runs))")
        rows, crows = [], []
        LW = words("cpu" if all(rank_timeline(_rank0(s)) == "cpu" for _, s in runs) else "gpu")
        cpu = LW["window"] != words("gpu")["window"]
        tps = any(step["tokens_per_s_per_user"] is not None or step["tokens_per_s"] is not None for step in ladder)
        for i, ((label, s), step) in enumerate(zip(runs, ladder)):
            m = _rank0(s).median
            rows.append([label, step["shape"], *([num(step["tokens_per_s_per_user"], RATE), num(step["tokens_per_s"], RATE)] if tps else []),
                         num(step["wall_us"]), "" if i == 0 else num(step["wall_delta_vs_previous_us"], sign=True),
                         "" if i == 0 else num(step["wall_delta_vs_first_us"], sign=True), num(step["gpu_window_us"])])
            crows.append([label, num(m.gpu_kernels, COUNT), *([] if cpu else [num(m.kernel_launches, COUNT), num(m.graph_launches, COUNT),
                                                                              num(m.syncs, COUNT)]), num(m.bubble_us)])
        cols = ["configuration", "shape", *(["tokens/s per user (unprofiled)", "tokens/s (unprofiled)"] if tps else []), "wall µs", "Δ vs previous",
                "Δ vs first", f"{LW['window']} µs"]
        ccols = ["configuration", LW["kernels"], *([] if cpu else ["kernel launches", "graph launches", "syncs"]), "bubble µs"]
        # two tables, not one of 13 columns: the ladder holds at 900 px
        out.append(Section(
            "ladder", "Ladder", notes=["Each row against the previous one and against the first (mean µs per iteration, iterations of the shape both share"
                                       + (f"; the median over {nw} profile windows, a change the median over paired windows of the per-window change, "
                                          "as in each step's diff)" if (nw := min(st["windows"] for st in ladder)) > 1 else ")")
                                       + ("; tokens/s from each run's unprofiled workload (median of its repeats)." if tps else ".")],
            figures=[figs.div(F.ladder_figure([{"label": label, "wall_us": st["wall_us"], "gpu_window_us": st["gpu_window_us"]}
                                               for (label, _), st in zip(runs, ladder)], window=LW["window"]))],
            tables=[_table(cols, rows, align="ll" + "r" * (len(cols) - 2), name_cols=(0,)),
                    _table(ccols, crows, align="l" + "r" * (len(ccols) - 1), name_cols=(0,), caption="per iteration (medians)")],
        ))
    # headline cards per run
    for i, (label, s) in enumerate(runs):
        r = _rank0(s)
        m = r.median
        its = r.iterations
        W = words(rank_timeline(r))
        cards = [Card(label=lab, value=num(getattr(m, k), d), sub="median per iteration") for k, lab, d in (
            ("wall_us", "wall µs", US), ("gpu_window_us", f"{W['window']} µs", US), ("gpu_busy_us", f"{W['busy']} µs", US), ("gpu_idle_us", f"{W['idle']} µs", US),
            ("gpu_kernels", W["kernels"], COUNT), ("kernel_launches", "kernel launches", COUNT), ("graph_launches", "graph launches", COUNT), ("syncs", "host syncs", COUNT),
            ("bubble_count", "bubbles", COUNT))]
        swing = _instability(label, [SeriesPoint(gpu_window_us=i.gpu_window_us) for i in its[:-1]], W["window"])
        notes = [capture_view.summary_health(s), *capture_view.summary_lines(s)]  # issue 31: capture health first
        cards = [replace(c, label=capture_view.mark(c.label, s.health is not None and s.health.doubts(k)))
                 for c, k in zip(cards, ("wall_us", "gpu_window_us", "gpu_busy_us", "gpu_idle_us", "gpu_kernels", "kernel_launches",
                                         "graph_launches", "syncs", "bubble_count"))]
        marker = None if r.marker is UNSET else r.marker
        notes.append(f"rank {r.rank} · {device_text(r, s.manifest)} · {counted(len(its), 'iteration')} · marker {marker} · catalog {r.catalog}")
        notes += [x for x in (idle_verdict(r), host_gap_text(r), outside_text(r)) if x]
        notes += [f"warning: {w}" for w in r.warnings]
        if swing:
            notes.insert(0, f"warning: {swing}")
        big = largest_bubbles(r, 10)
        tables = [_table(["µs", "cause", "iteration", "CPU ops (exclusive µs inside the bubble)"],
                         [[num(b["dur_us"]), b["cause"], str(b["iteration"]), cpu_ops_text(b["cpu_ops"])] for b in big],
                         align="rlrl", caption=f"largest bubbles: {label} (of {r.bubbles_total if r.bubbles_total is not None else len(r.bubbles)})",
                         name_cols=(3,))] if big else []
        out.append(Section(f"run-{i}", label if len(runs) > 1 else "Summary", cards=cards, notes=notes, tables=tables))  # one run: the h1 names it
    W = words("cpu" if runs and all(rank_timeline(_rank0(s)) == "cpu" for _, s in runs) else "gpu")
    out.append(Section("runs-windows", f"{W['window']} per iteration", figures=[figs.div(F.gpu_window_figure(
        [(label, _series(_rank0(s).iterations)) for label, s in runs], window=W["window"]))]))
    sides = [(label, _rank0(s).timeline) for label, s in runs]
    sec = Section("runs-timeline", "Timeline of a representative iteration" + (" per configuration" if len(runs) > 1 else ""))
    if timelines is not None and len(sides) > timelines:
        sec.notes.append(f"The first and the last of the {len(sides)} configurations only, to keep this page under 2 MB: "
                          "each run's own report (profkit report RUN) has its timeline.")
        sides = [sides[0], sides[-1]]
    if any(t for _, t in sides):
        sec.figures.append(figs.div(F.timeline_figure(sides, window=W["window"])))
    else:
        sec.notes.append("No timeline in these summaries (written by an older profkit): re-run `profkit analyze` to get one.")
    out.append(sec)
    strips = [(label, sl.transitions if (sl := _rank0(s).overlap_slack) is not None else []) for label, s in runs]
    if any(t for _, t in strips):
        out.append(Section("runs-slack", "Overlap slack per step", figures=[figs.div(capture_view.slack_strip_figure(strips))]))
    out.append(Section("runs-categories", "Time by category and bubbles by cause (medians per iteration)", figures=[
        figs.div(F.category_figure([(label, _rank0(s).median.category_us) for label, s in runs], device=W["device"])),
        figs.div(F.bubbles_figure([(label, _bubbles_by_cause(_rank0(s))) for label, s in runs], device=W["device"])),
    ]))
    from profkit.report.floor_view import OPS_COLUMNS, floor_line, gap_rows, op_rows

    floors = [(label, _rank0(s)) for label, s in runs if floor_line(_rank0(s))]
    if floors:  # issue 41: each run's floor, the gap's split and its modeled ops
        out.append(Section("runs-floor", "The hardware floor and the gap", notes=[f"{label}: {floor_line(r)}" for label, r in floors],
                            tables=[t for label, r in floors for t in (
                                _table(["term", "µs"], [[k, num(v)] for k, v in gap_rows(r)], caption=f"gap to the floor: {label} (mean per iteration)"),
                                _table(list(OPS_COLUMNS), [list(x) for x in op_rows(r, 12)], align="lrrrrrl", caption=f"modeled ops: {label}",
                                       name_cols=(0,), collapsed=True))]))
    out.append(Section("runs-counts", "Bubbles per iteration" if cpu_page else "Launches and syncs per iteration", figures=[
        figs.div(F.per_iteration_figure([(label, _series(_rank0(s).iterations)) for label, s in runs], cpu=cpu_page))]))
    tables = []
    for label, s in runs:
        r = _rank0(s)
        n = max(len(r.iterations), 1)
        ks = r.kernels
        tables.append(_table([f"{words(rank_timeline(r))['kernel']} (whole name in the hover)", "category", "count / iter", "µs / iter", "total µs"],
                             [[kn, k.category, num((k.count or 0) / n, RATE), num((k.total_us or 0.0) / n), num(k.total_us)]
                              for kn, k in zip(_knames_cut([str(k.name) for k in ks[:MAX_ROWS]]), ks[:MAX_ROWS])],
                             align="llrrr", caption=f"top kernels: {label} ({len(ks)} distinct)", name_cols=(0,),
                             more=f"{len(ks) - MAX_ROWS} more not shown" if len(ks) > MAX_ROWS else None, collapsed=len(runs) > 1))
        # every sync (the summary's sync_groups; its `syncs` list is bounded), as the terminal's table has them
        sy = sorted(sync_groups(r), key=lambda g: -(g["count"] or 0))
        if sy:
            tables.append(_table(["kind", "API", "direction", "trigger", "count / iter", "blocked µs / iter"],
                                 [[g["kind"], g["name"], g["direction"], str(g["trigger"]), num((g["count"] or 0) / n, RATE),
                                   num((g["blocked_us"] or 0.0) / n)] for g in sy][:MAX_ROWS],
                                 align="llllrr", caption=f"host syncs and blocking copies: {label}", name_cols=(3,)))
    out.append(Section("runs-kernels", "Top kernels and syncs", tables=tables))
    curves = _curve_section("runs-throughput", [(label, throughput_of(s.manifest)) for label, s in runs], figs)
    if curves:
        out.append(curves)
    man = [t for t in (_manifest_table(label, s.manifest) for label, s in runs) if t]
    if man:
        out.append(Section("runs-manifests", "Run manifests", tables=man))
    return out


def _curve_section(id: str, sides: list[tuple[str, list[ThroughputPoint]]], figs: _Figures) -> Section | None:
    """Pareto (over concurrency) and input-length curves from the manifests' throughput points."""
    conc, isl = F.curve_kinds([pts for _, pts in sides])
    if not (conc or isl):
        return None
    s = Section(id, "Unprofiled throughput curves")
    if conc:
        s.figures.append(figs.div(F.pareto_figure(sides)))
    if isl:
        s.figures.append(figs.div(F.input_length_figure(sides)))
    return s


def _bubbles_by_cause(r: Rank) -> dict[str, float | None]:
    m = r.median
    by: dict[str, float | None] = dict(m.bubble_us_by_cause)
    if m.gpu_idle_us is not None and m.bubble_us is not None:
        by["short_gaps"] = max(m.gpu_idle_us - m.bubble_us, 0.0)
    return {k: by.get(k, 0.0) for k in IDLE_KEYS if k != "python" or k in by}


# --------------------------------------------------------------------------------------------


class HtmlRenderer(Renderer):
    """One self-contained HTML page for any mix of diffs and runs (summaries, labelled; two runs or
    more with their ladder). `cdn`: plotly.js from its CDN instead of inline; `title`: the page's
    (default: from what it holds)."""

    name: ClassVar[str] = "html"
    output_file_extension: ClassVar[str] = "html"

    def __init__(self, *, cdn: bool = False, title: str | None = None) -> None:
        self.cdn = cdn
        self.title = title

    def render(self, report: Report) -> str:
        page = _page(report.diff_docs, report.run_docs, report.ladder, cdn=self.cdn, title=self.title)
        if len(page.encode()) > MAX_BYTES and len(report.runs) > 2:
            # a long sweep: the per-configuration timeline keeps its first and last runs (each run's own report has its timeline)
            page = _page(report.diff_docs, report.run_docs, report.ladder, cdn=self.cdn, title=self.title, timelines=2)
        return page


def _page(diffs: Sequence[Diff], runs: Sequence[tuple[str, Summary]], ladder: Sequence[Mapping[str, Any]] | None,
          *, cdn: bool, title: str | None, timelines: int | None = None) -> str:
    figs = _Figures(cdn=cdn)
    sections: list[Section] = []
    # a sweep leads with its ladder, each compared step collapsed below it; one compared pair (`profkit trace`) leads with its diff
    sweep = len(runs) >= 2 and len(diffs) != 1
    demangle_many([m.name for d in diffs for m in d.top_movers] + [k.name for d in diffs for k in (*d.kernels_added, *d.kernels_removed)]
                  + [str(k.name) for _, s in runs for k in _rank0(s).kernels[:MAX_ROWS]])  # one c++filt for the page
    # built in page order: the first figure built carries plotly.js for the ones below it
    rest = run_sections(runs, ladder, figs, timelines=timelines) if runs and sweep else []
    # a run by its configuration's name (a sweep's summaries carry it in `run`): names its steps and unstable runs
    config = run_labels(sm for _, sm in runs)
    if sweep:  # a sweep leads with its own result, the ladder; each compared step follows, collapsed
        sections.append(rest.pop(0))
        # the ladder's unstable runs, as the terminal lists them under its table (the page said it only inside the steps)
        steps = [(config.get(d.candidate.label) or d.candidate.label, d.baseline.label, d.candidate.label, d) for d in diffs]
        sections[-1].notes += [f"warning: unstable: {x}" for x in unstable_runs(steps, config)]
    for i, d in enumerate(diffs):
        ds = diff_sections(d, figs, prefix=f"diff{i}" if len(diffs) > 1 else "diff", timeline=not runs, single=len(diffs) == 1)
        if sweep:
            lb, lc = d.baseline.label, d.candidate.label
            # a step by its configurations' names ("+topk_v2 → +topk_v2+overlap", from the runs' manifests), else by what
            # differs in the run ids (one sweep's share their stamp; a ladder's next id extends the previous one)
            common = os.path.commonprefix([lb, lc])
            cut = common.rfind("-") + 1
            lb, lc = config.get(lb) or lb[cut:] or lb, config.get(lc) or lc[cut:] or lc
            ds[0].details_open = f"step {i + 1} of {len(diffs)}: {lb} → {lc}" + (
                f" ({d.optimization})" if d.optimization else "") + ": " + (headline_lines(d) or [""])[0]
            ds[-1].details_close = True
        sections += ds
    if runs and not sweep:
        rest = run_sections(runs, ladder, figs, timelines=timelines)
    sections += rest
    if title is None:
        if len(diffs) == 1:
            title = f"profkit diff: {diffs[0].baseline.label} → {diffs[0].candidate.label}"
        elif len(runs) > 1:
            title = f"profkit sweep: {len(runs)} configurations" + (f", {len(diffs)} compared steps" if diffs else "")
        elif runs and not diffs:
            title = f"profkit report: {runs[0][0]}"
        else:
            title = "profkit report"
    data = {
        "profkit_version": __version__,
        "diffs": [{"baseline": d.baseline.label, "candidate": d.candidate.label, "optimization": d.optimization,
                   "wall_us": msgspec.structs.asdict(d.wall_us), "residual_us": d.decomposition.residual_us} for d in diffs],
        "runs": [label for label, _ in runs],
        "figures": figs.n,
    }
    tls = {diff_timeline(d) for d in diffs} | {rank_timeline(_rank0(s)) for _, s in runs}
    page_banner = banner("mixed" if "mixed" in tls or len(tls) > 1 else (tls.pop() if tls else "gpu"))
    return _env().get_template("report.html").render(
        title=title, subtitle=None, profkit_version=__version__, sections=sections, banner=page_banner,
        nav=[{"id": s.id, "title": s.title} for s in sections if s.id.endswith(("summary", "ladder")) and not s.details_open],
        footer="times are µs per iteration; every term and count of a diff is the median over its paired profile windows of the per-window change",
        data=data,
    )
