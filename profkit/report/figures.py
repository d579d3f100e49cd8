"""Pure figure builders: report data (summary.json / diff.json pieces) -> plotly Figures. No I/O.

Every string that reaches a figure (kernel names, categories, labels) goes through `esc`: plotly
draws text through its own small HTML dialect, so a kernel named ``<b>`` or ``<a href=...>`` would
otherwise be interpreted. Escaped, it is drawn as the literal text.
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from typing import Any, cast

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from profkit.documents import Diff, SeriesPoint, ThroughputPoint
from profkit.report.fit import demangle, demangle_many
from profkit.report.views import decomposition_rows, material_floor, row_metric, within_noise
from profkit.terms import PER_ITERATION

PALETTE = (
    "#4C78A8", "#F58518", "#54A24B", "#72B7B2", "#B279A2", "#FF9DA6", "#9D755D", "#1F77B4", "#2CA02C", "#8C564B",
    "#17BECF", "#BCBD22", "#E377C2", "#AEC7E8", "#98DF8A", "#FFBB78",
)
# Bubbles are hatched and in their own hues (red/yellow/grey/violet), apart from the category palette.
CAUSE_COLORS = {"sync": "#C00000", "launch": "#E6B800", "iteration_boundary": "#8C8C8C", "gpu_wait": "#7B3FA0", "python": "#3A7DC9",
                 "short_gaps": "#D9D9D9"}
SIDE_COLORS = ("#4C78A8", "#F58518", "#54A24B", "#B279A2", "#E45756", "#72B7B2")
MAX_HOVER_NAME = 160
FONT = dict(family="system-ui, -apple-system, Segoe UI, sans-serif", size=12)


def esc(s: object, max_len: int | None = MAX_HOVER_NAME) -> str:
    text = "" if s is None else str(s)
    if max_len is not None and len(text) > max_len:
        text = text[: max_len - 1] + "…"
    return html.escape(text, quote=True)


# the catalogs' categories (kernels/*.toml) each in a hue of its own, the same in every report; the pairs
# that sit side by side in a decode step (attention/rope, gemm/sampling, moe/topk) far apart on the wheel
CATEGORY_COLORS = {
    "attention": "#1F77B4", "gemm": "#2CA02C", "moe": "#9467BD", "topk": "#FF7F0E", "sampling": "#8C564B", "rope": "#E377C2",
    "indexer": "#17BECF", "norm": "#BCBD22", "comm": "#D62728", "elementwise": "#AEC7E8", "memcpy": "#393B79", "quant": "#F7B6D2",
    "reduce": "#637939", "spec": "#AD494A", "other": "#C7C7C7",
}


def category_colors(categories: Sequence[str]) -> dict[str, str]:
    """A stable colour per category: the catalogs' own from CATEGORY_COLORS, any other from PALETTE
    (sorted order, skipping colours already in use), the same in every figure of a report."""
    out = {c: CATEGORY_COLORS[c] for c in set(categories) if c in CATEGORY_COLORS}
    spare = [p for p in PALETTE if p.upper() not in {v.upper() for v in out.values()}] or list(PALETTE)
    for i, c in enumerate(sorted(set(categories) - set(out))):
        out[c] = spare[i % len(spare)]
    return out


def _layout(fig: go.Figure, *, title: str, height: int = 380, **kw: Any) -> go.Figure:
    fig.update_layout(title=dict(text=esc(title, None), x=0.01), height=height, template="plotly_white", font=FONT,
                      margin=dict(l=60, r=20, t=50, b=40), legend=dict(orientation="h", y=-0.15), **kw)
    return fig


def _bubble_ops(b: Mapping[str, Any], top: int = 2) -> str:
    """The CPU ops inside a bubble with their exclusive µs, one per hover line (schema v2; the two
    with the most time: a decode iteration has ~1,400 bubbles, and the report must stay small)."""
    names, us = list(b.get("cpu_ops") or [])[:top], list(b.get("cpu_ops_us") or [])
    return "".join(f"<br>CPU in {esc(n, 60)}" + (f": {us[i]:,.1f} µs" if i < len(us) else "") for i, n in enumerate(names))


HOVER_OPS = 200  # bubbles per timeline whose hover names the CPU ops inside them (the longest)


def _round_us(values: Sequence[float]) -> Any:
    """Times in µs to 0.01 µs (the hover shows 0.1): a GPU iteration has thousands of ops, and their
    17-digit floats would double the page (a report stays under 2 MB)."""
    return [round(v, 2) for v in values]


def timeline_figure(sides: Sequence[tuple[str, Mapping[str, Any] | None]], *, colors: Mapping[str, str] | None = None,
                    window: str = "GPU window") -> go.Figure:
    """One representative iteration per side, stacked: GPU ops as bars on stream rows (colour =
    category), bubbles on their own row (colour = cause), host syncs on a row of their own.
    x is µs from the start of that iteration's GPU window (`window`: "CPU-op window" for a CPU-only
    run, report.vocab). `sides`: (label, summary timeline)."""
    present = [(lab, t) for lab, t in sides if t]
    n = max(len(present), 1)
    # two lines (the side, then the iteration): one line was cut at 900 px
    titles = [esc(lab, 70) + "<br>" + esc(f"iteration {t['iteration']} ({t['kind']}"
                                         + (f" bs={t['batch_size']}" if t.get("batch_size") is not None else "")
                                         + f"), {window} {t['gpu_window_us']:,.1f} µs", 110) for lab, t in present] or ["no timeline"]
    # each side on its own x-axis (a 60 ms baseline would make a 1 ms candidate a sliver); a button shares them
    fig = make_subplots(rows=n, cols=1, shared_xaxes=False, vertical_spacing=0.2 if n > 1 else 0.1, subplot_titles=titles)
    cats = sorted({c for _, t in present for c in t["ops"]["category"]})
    colors = dict(colors or category_colors(cats))
    shown: set[str] = set()
    for row, (_lab, t) in enumerate(present, start=1):
        ops, names = t["ops"], t["names"]
        demangle_many(names)
        # one trace per (category, kernel name): the name is written once, in its hover template,
        # rather than in every op's hover text (a decode iteration repeats ~100 names ~1,400 times)
        by_name: dict[tuple[str, int], list[int]] = {}
        for i, (c, k) in enumerate(zip(ops["category"], ops["name"])):
            by_name.setdefault((c, k), []).append(i)
        for c, k in sorted(by_name, key=lambda ck: (ck[0], names[ck[1]])):
            idx = by_name[(c, k)]
            cxx = demangle(names[k])  # as C++; the recorded (mangled) name on the hover's second line
            label = (esc(cxx) + (f"<br>{esc(names[k])}" if cxx != names[k] else "")).replace("%", "&#37;")  # a literal % would open a template field
            durs = _round_us([ops["dur_us"][i] for i in idx])
            # a bar with a base hovers %{x} as its end (base + x): the duration goes in customdata, the start is %{base}
            fig.add_trace(go.Bar(
                # a CPU run has no stream: its row is its aten ops
                y=[f"stream {ops['stream'][i]}" if window == "GPU window" else "aten ops" for i in idx], x=durs,
                base=_round_us([ops["start_us"][i] for i in idx]),
                customdata=durs,
                orientation="h", name=esc(c), legendgroup=f"cat:{c}", showlegend=c not in shown,
                marker=dict(color=colors.get(c, "#999999"), line=dict(width=0)),
                hovertemplate=f"{label}<br>{esc(c)} · %{{customdata:,.1f}} µs at %{{base:,.1f}} µs<extra></extra>",
            ), row=row, col=1)
            shown.add(c)
        by_cause: dict[str, list[Mapping[str, Any]]] = {}
        # the CPU ops in the hover of the longest HOVER_OPS bubbles only: an eager GPU iteration has ~1,500
        # bubbles, mostly launch gaps of a few µs, and their text alone was a third of the figure (2 MB per report)
        worded = {id(b) for b in sorted(t["bubbles"], key=lambda b: -b["dur_us"])[:HOVER_OPS]}
        for bub in t["bubbles"]:
            by_cause.setdefault(bub["cause"], []).append(bub)
        for cause in sorted(by_cause):
            bs = by_cause[cause]
            key = f"bubble:{cause}"
            fig.add_trace(go.Bar(
                y=["bubbles"] * len(bs), x=[b["dur_us"] for b in bs], base=[b["start_us"] for b in bs], orientation="h",
                name=esc(f"bubble: {cause}"), legendgroup=key, showlegend=key not in shown,
                marker=dict(color=CAUSE_COLORS.get(cause, "#999999"), pattern=dict(shape="/")),
                customdata=_round_us([b["dur_us"] for b in bs]), text=[_bubble_ops(b).replace("%", "&#37;") if id(b) in worded else "" for b in bs], textposition="none",
                hovertemplate=f"bubble · {esc(cause)} · %{{customdata:,.1f}} µs at %{{base:,.1f}} µs%{{text}}<extra></extra>",
            ), row=row, col=1)
            shown.add(key)
        if t["syncs"]:
            ss = t["syncs"]
            fig.add_trace(go.Bar(
                y=["host syncs"] * len(ss), x=[max(s["blocked_us"], 0.5) for s in ss], base=[s["start_us"] for s in ss], orientation="h",
                name="host sync (blocked)", legendgroup="sync", showlegend="sync" not in shown, marker=dict(color="#222222"),
                hovertext=[f"{esc(s['api'])} ({esc(s['kind'])}, {esc(s['direction'])})<br>trigger: {esc(s['trigger'])}<br>"
                           f"blocked {s['blocked_us']:,.1f} µs" for s in ss], hoverinfo="text",
            ), row=row, col=1)
            shown.add("sync")
        fig.update_yaxes(type="category", categoryorder="category descending", row=row, col=1)
    for row in range(1, n + 1):
        fig.update_xaxes(title_text=f"µs from the start of the iteration's {window}", row=row, col=1)
    if n > 1:
        share = {f"xaxis{i}.matches": "x" for i in range(2, n + 1)}
        own = {f"xaxis{i}.matches": None for i in range(2, n + 1)}
        # right above the first plot, under the modebar; the subplot titles are left-aligned, clear of it at 900 px
        fig.update_layout(updatemenus=[dict(type="buttons", direction="left", x=1.0, xanchor="right", y=1.0 + 4 / (300 + 230 * n),
                                            yanchor="bottom", showactive=True, active=0,
                                            buttons=[dict(label="x-axis per side", method="relayout", args=[own]),
                                                     dict(label="share x-axis", method="relayout", args=[share])])])
    fig.for_each_annotation(lambda a: a.update(x=0.0, xanchor="left", align="left"))  # the subplot titles
    what = {1: "", 2: ", before and after"}.get(len(present), f", {len(present)} configurations")
    fig = _layout(fig, title=f"Representative iteration (median {window}){what}", height=300 + 230 * n, barmode="overlay")
    return fig.update_layout(margin=dict(t=100))


def gpu_window_figure(sides: Sequence[tuple[str, Sequence[SeriesPoint]]], *, window: str = "GPU window") -> go.Figure:
    """The GPU window of every iteration, one line per side (compared iterations as filled markers):
    a run whose iterations swing shows it here before its mean is read as a finding."""
    fig = go.Figure()
    for i, (label, its) in enumerate(sides):
        color = SIDE_COLORS[i % len(SIDE_COLORS)]
        fig.add_trace(go.Scatter(
            x=[it.index for it in its], y=[it.gpu_window_us for it in its], mode="lines+markers", name=esc(label, 80),
            line=dict(color=color), marker=dict(symbol=["circle" if it.used else "circle-open" for it in its], size=7),
            text=[esc(it.shape or "", 60) for it in its],
            hovertemplate="iteration %{x}: %{y:,.1f} µs · %{text}<extra>" + esc(label, 80) + "</extra>",
        ))
    fig.update_xaxes(title_text="iteration")
    fig.update_yaxes(title_text=f"{window} µs", rangemode="tozero")
    return _layout(fig, title=f"{window} per iteration (open markers: not compared)", height=360)


GREY = "#C7C7C7"  # a waterfall term that is not judged, within noise or below the expected-effect floor


def waterfall_figure(diff: Diff, *, max_terms: int = 12, window: str = "GPU window") -> go.Figure:
    """Baseline GPU window -> per-term changes -> candidate GPU window (mean µs per iteration)."""
    rows = [r for r in decomposition_rows(diff) if r[2] != 0]
    rows.sort(key=lambda r: -abs(r[2]))
    shown, rest = rows[:max_terms], rows[max_terms:]
    labels = [esc(("idle: " + r[1].replace("_", " ")) if r[0] == "idle" else r[1], 60) for r in shown]
    values = [r[2] for r in shown]
    if rest:
        labels.append(f"{len(rest)} more terms")
        values.append(sum(r[2] for r in rest))
    g = diff.decomposition.gpu_window_us
    # a colour (red: grew, green: shrank) only for a term judged beyond noise and above the expected-effect floor; a term
    # within noise, below the floor or not judged is drawn grey over its bar (issue 40: they looked judged)
    floor = material_floor(diff)
    judged = [within_noise(diff, row_metric(r[0], r[1])) is False and abs(r[2]) >= floor for r in shown] + ([False] if rest else [])
    x = ["baseline", *labels, "candidate"]
    none = not any(judged)  # nothing judged (one window a side) or all within noise: one grey, no overlay
    fig = go.Figure(go.Waterfall(
        x=x, y=[g.baseline, *values, g.candidate],
        measure=["absolute", *["relative"] * len(values), "total"], width=0.6,
        increasing=dict(marker=dict(color=GREY if none else "#D62728")), decreasing=dict(marker=dict(color=GREY if none else "#2CA02C")),
        totals=dict(marker=dict(color="#4C78A8")), connector=dict(line=dict(color="#BBBBBB")),
        hovertemplate="%{x}: %{y:,.1f} µs<extra></extra>", showlegend=False,
    ))
    level, gx, gbase, gy = float(g.baseline or 0.0), [], [], []
    for lab, v, j in zip(labels, values, judged):
        if not j and not none:
            gx.append(lab)
            gbase.append(round(min(level, level + v), 2))
            gy.append(round(abs(v), 2))
        level += v
    if gx:
        fig.add_trace(go.Bar(x=gx, y=gy, base=gbase, width=0.6, marker_color=GREY, showlegend=False,
                             hovertemplate="%{x}: not judged or within noise<extra></extra>"))
    # zoomed to the changes: from a little below the lowest running total to a little above the highest
    # (a 200 µs change on a 12 ms window is a flat line on an axis that starts at zero)
    b0, c0 = cast(float, g.baseline), cast(float, g.candidate)  # a diff's window is always a number
    levels, level = [b0, c0], b0
    for v in values:
        level += v
        levels.append(level)
    lo, hi = min(levels), max(levels)
    pad = max((hi - lo) * 0.25, abs(hi) * 0.002, 1.0)
    fig.update_yaxes(title_text="µs per iteration (zoomed)", range=[max(lo - pad, 0.0), hi + pad])
    return _layout(fig, title=f"Where the {window} went: {g.delta:+,.1f} µs per iteration" + (" (grey: not judged or within noise)" if gx or none and values else ""),
                   height=420)


def grouped_bars_figure(sides: Sequence[tuple[str, Mapping[str, Any]]], *, title: str, y_title: str,
                        colors: Mapping[str, str] | None = None, order: Sequence[str] | None = None) -> go.Figure:
    """One bar group per key (category, cause, ...), one bar per side."""
    keys = list(order) if order is not None else sorted({k for _, m in sides for k in m}, key=lambda k: -max(m.get(k, 0) for _, m in sides))
    fig = go.Figure()
    for i, (label, m) in enumerate(sides):
        fig.add_trace(go.Bar(x=[esc(k, 60) for k in keys], y=[m.get(k, 0.0) or 0.0 for k in keys], name=esc(label, 80),
                             marker_color=SIDE_COLORS[i % len(SIDE_COLORS)],
                             hovertemplate="%{x}: %{y:,.1f}<extra>" + esc(label, 80) + "</extra>"))
    fig.update_yaxes(title_text=y_title)
    return _layout(fig, title=title, barmode="group")


def category_figure(sides: Sequence[tuple[str, Mapping[str, Any]]], *, device: str = "GPU") -> go.Figure:
    return grouped_bars_figure(sides, title=f"{device} time by category", y_title="µs per iteration")


def bubbles_figure(sides: Sequence[tuple[str, Mapping[str, Any]]], *, device: str = "GPU") -> go.Figure:
    order = [c for c in CAUSE_COLORS if any(c in m for _, m in sides)]
    return grouped_bars_figure(sides, title=f"{device} idle time by bubble cause", y_title="µs per iteration", order=order)


SERIES_KEYS = tuple((f.key, f.label, f.panel) for f in PER_ITERATION if f.panel)


def per_iteration_figure(sides: Sequence[tuple[str, Sequence[SeriesPoint]]], *, cpu: bool = False) -> go.Figure:
    """Launches, syncs and bubbles per iteration, one line per (side, metric); `cpu`: a CPU-only run's bubbles alone (it
    has no launches or syncs: issue 40)."""
    if cpu:
        fig = go.Figure()
        for i, (label, its) in enumerate(sides):
            fig.add_trace(go.Scatter(x=[it.index for it in its], y=[it.bubble_count or 0 for it in its], mode="lines+markers",
                                     name=esc(f"{label}: bubbles", 100), line=dict(color=SIDE_COLORS[i % len(SIDE_COLORS)])))
        fig.update_xaxes(title_text="iteration")
        return _layout(fig, title="Bubbles per iteration (CPU-op timeline)", height=360)
    fig = make_subplots(rows=1, cols=2, subplot_titles=("launches per iteration", "syncs and bubbles per iteration"))
    dashes = ("solid", "dash", "dot", "dashdot")
    for i, (label, its) in enumerate(sides):
        x = [it.index for it in its]
        for j, (key, name, col) in enumerate(SERIES_KEYS):
            fig.add_trace(go.Scatter(
                x=x, y=[getattr(it, key) or 0 for it in its], mode="lines+markers", name=esc(f"{label}: {name}", 100),
                line=dict(color=PALETTE[j], dash=dashes[i % len(dashes)]), legendgroup=f"side{i}",
            ), row=1, col=col)
    fig.update_xaxes(title_text="iteration")
    return _layout(fig, title="Launches, syncs and bubbles per iteration", height=400)


def ladder_figure(rows: Sequence[Mapping[str, Any]], *, window: str = "GPU window") -> go.Figure:
    """Sweep ladder: mean wall and GPU window (`window`: "CPU-op window" on a CPU) per configuration, in order."""
    x = [esc(r["label"], 60) for r in rows]
    fig = go.Figure()
    fig.add_trace(go.Bar(x=x, y=[r["wall_us"] for r in rows], name="wall µs", marker_color=SIDE_COLORS[0]))
    fig.add_trace(go.Bar(x=x, y=[r["gpu_window_us"] for r in rows], name=f"{window} µs", marker_color=SIDE_COLORS[1]))
    fig.update_yaxes(title_text="µs per iteration (mean)")
    return _layout(fig, title="Ladder: per-iteration time by configuration", barmode="group")


def _med(point: ThroughputPoint, key: str) -> float | None:
    v = getattr(point, key)
    return point.median(key) if not isinstance(v, (int, float)) else v


def pareto_figure(sides: Sequence[tuple[str, Sequence[ThroughputPoint]]]) -> go.Figure:
    """Unprofiled throughput over concurrency: tokens/s per GPU against tokens/s per user, one
    line per configuration (points of its first input length)."""
    fig = go.Figure()
    for i, (label, points) in enumerate(sides):
        if not points:
            continue
        isl0 = points[0].isl
        pts = sorted((p for p in points if p.isl == isl0), key=lambda p: p.concurrency or 0)
        fig.add_trace(go.Scatter(
            x=[_med(p, "tokens_per_s_per_user_p50") for p in pts], y=[_med(p, "tokens_per_s_per_gpu") for p in pts],
            text=[f"c={p.concurrency}" for p in pts], mode="lines+markers+text", textposition="top center",
            name=esc(label, 80), line=dict(color=SIDE_COLORS[i % len(SIDE_COLORS)]),
        ))
    fig.update_xaxes(title_text="tokens/s per user (p50)")
    fig.update_yaxes(title_text="tokens/s per GPU")
    return _layout(fig, title="Throughput Pareto curve over concurrency (unprofiled)", height=420)


def input_length_figure(sides: Sequence[tuple[str, Sequence[ThroughputPoint]]]) -> go.Figure:
    """Unprofiled tokens/s per user against input length (points of the first concurrency)."""
    fig = go.Figure()
    for i, (label, points) in enumerate(sides):
        if not points:
            continue
        c0 = points[0].concurrency
        pts = sorted((p for p in points if p.concurrency == c0), key=lambda p: p.isl or 0)
        fig.add_trace(go.Scatter(x=[p.isl for p in pts], y=[_med(p, "tokens_per_s_per_user_p50") for p in pts], mode="lines+markers",
                                 name=esc(label, 80), line=dict(color=SIDE_COLORS[i % len(SIDE_COLORS)])))
    fig.update_xaxes(title_text="input length (tokens)")
    fig.update_yaxes(title_text="tokens/s per user (p50)")
    return _layout(fig, title="Throughput over input length (unprofiled)", height=400)


def curve_kinds(points_by_side: Sequence[Sequence[ThroughputPoint]]) -> tuple[bool, bool]:
    """(has a concurrency sweep, has an input-length sweep) in any side's throughput points."""
    conc = any(len({p.concurrency for p in pts}) > 1 for pts in points_by_side)
    isl = any(len({p.isl for p in pts}) > 1 for pts in points_by_side)
    return conc, isl
