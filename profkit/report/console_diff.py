"""diff.json -> rich tables for the terminal. Trace strings go through rich.markup.escape."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from profkit.attribution.diff import decomposition_rows, headline, headline_lines, throughput_rows, within_noise
from profkit.findings import cpu_ops_text
from profkit.report.fit import COPY, NAME, NUM, TEXT, fit_table
from profkit.report.vocab import banner, count_label, diff_timeline, words


def _f(x: float | None, digits: int = 1, *, sign: bool = False) -> str:
    if x is None:
        return "-"
    if x == 0:
        return "0" if digits == 0 else f"{0:.{digits}f}"
    return f"{x:+,.{digits}f}" if sign else f"{x:,.{digits}f}"


def _noise(diff: Mapping[str, Any], metric: str) -> str:
    w = within_noise(diff, metric)
    return "" if w is None else ("within noise" if w else "beyond noise")


def render_diff(diff: Mapping[str, Any], console: Console, *, top: int = 10) -> None:
    b, c = diff["baseline"], diff["candidate"]
    for line in headline_lines(diff):  # the headline first (what bounds it, its own effect, what else moved, throughput)
        console.print(f"[bold]{escape(line)}[/]", soft_wrap=True)
    console.print(f"[bold]{escape(b['label'])}[/] → [bold]{escape(c['label'])}[/]"
                  + (f"  [cyan]{escape(diff['optimization'])}[/]" if diff.get("optimization") else ""))
    console.print(escape(headline(diff)))
    tp = throughput_rows(diff)
    if tp:
        t = Table(title="unprofiled throughput", title_justify="left", box=None)
        for col in ("", "baseline", "candidate", "change", ""):
            t.add_column(col, justify="left" if col == "" else "right")
        for r in tp:
            t.add_row(r["label"], _f(r["baseline"], 2), _f(r["candidate"], 2), "-" if r["change_pct"] is None else f"{r['change_pct']:+.1f}%",
                      {None: "", True: "[dim]within noise[/]", False: "[bold]beyond noise[/]"}[r["within_noise"]])
        console.print(t)
    ee = diff.get("expected_effect")
    if ee and ee.get("known"):
        if ee["flags"]:
            for f in ee["flags"]:
                console.print(f"[bold red]flag:[/] {escape(f)}", soft_wrap=True)
        else:
            console.print(f"[green]expected effect ok:[/] no change outside {escape(', '.join(ee['categories']) or 'its (empty) categories')} "
                          f"beyond {escape(ee['threshold'])}")
    elif ee:
        console.print(f"[yellow]note:[/] {escape(ee.get('note', ''))}", soft_wrap=True)
    noise = diff.get("noise") or {}
    if not noise.get("available"):
        console.print(f"[dim]{escape(noise.get('note', 'no noise estimate'))}[/]", soft_wrap=True)

    tl = diff_timeline(diff)
    W = words(tl)
    if banner(tl):
        console.print(f"[bold yellow]{escape(banner(tl) or '')}[/]", soft_wrap=True)
    g = diff["decomposition"]["gpu_window_us"]
    rows: list[tuple[str, ...]] = []
    for group, term, delta, bv, cv in decomposition_rows(diff):
        metric = {"category": f"category_us.{term}", "overlap": "overlap_us", "idle": f"idle_us_by_cause.{term}"}[group]
        if group == "overlap":
            bv, cv = -(bv or 0), -(cv or 0)
            label = "− overlap"
        else:
            label = term if group == "category" else f"idle: {term.replace('_', ' ')}"
        rows.append((label, _f(bv), _f(cv), _f(delta, sign=True), _noise(diff, metric)))
    rows.append((W["window"], _f(g["baseline"]), _f(g["candidate"]), _f(g["delta"], sign=True), _noise(diff, "gpu_window_us")))
    rows.append(("residual", "", "", _f(diff["decomposition"]["residual_us"], 3), "exact" if diff["decomposition"].get("exact") else "inexact"))
    console.print(fit_table(console, f"change in mean {W['window']} per iteration ({diff['shape']['label']})",
                            (("term", COPY), ("baseline µs", NUM), ("candidate µs", NUM), ("Δ µs", NUM), ("noise", TEXT)), rows))

    ph = diff["decomposition"].get("phase_us") or {}
    if ph:
        sb, sc = diff["decomposition"]["baseline"].get("phase_us") or {}, diff["decomposition"]["candidate"].get("phase_us") or {}
        console.print(fit_table(console, f"the same change in {W['device']} time by phase (mean µs per iteration)",
                                (("phase", COPY), ("baseline µs", NUM), ("candidate µs", NUM), ("Δ µs", NUM)),
                                [(k, _f(sb.get(k)), _f(sc.get(k)), _f(d, sign=True)) for k, d in ph.items()]))

    console.print(fit_table(console, "per iteration (medians)", (("count", COPY), ("baseline", NUM), ("candidate", NUM), ("Δ", NUM), ("noise", TEXT)),
                            [(count_label(k, tl), _f(v["baseline"], 0), _f(v["candidate"], 0), _f(v["delta"], 0, sign=True), _noise(diff, f"counts.{k}"))
                             for k, v in diff["counts"].items()]))
    if diff.get("syncs"):
        console.print(fit_table(console, "host syncs and blocking copies per iteration",
                                (("Δ", NUM), ("baseline", NUM), ("candidate", NUM), ("kind", COPY), ("dir", COPY), ("api", COPY), ("trigger", COPY)),
                                [(_f(s["delta"], 2, sign=True), _f(s["baseline_per_iteration"], 2), _f(s["candidate_per_iteration"], 2),
                                  s["kind"], s["direction"], s["api"], s["trigger"]) for s in diff["syncs"][:top]]))
    if diff.get("top_movers"):
        console.print(fit_table(console, "top movers (µs per iteration, normalized names)",
                                (("Δ µs", NUM), ("baseline", NUM), ("candidate", NUM), ("category", COPY), (W["kernel"], NAME)),
                                [(_f(m["delta_us"], sign=True), _f(m["baseline_us"]), _f(m["candidate_us"]), m["category"], m["name"])
                                 for m in diff["top_movers"][:top]]))
    bub = diff.get("bubbles") or {}
    for side in ("baseline", "candidate"):
        v = bub.get(side) or {}
        if not v.get("largest"):
            continue
        console.print(fit_table(console, f"largest bubbles: {diff[side]['label']} (CPU ops with their exclusive µs inside the bubble)",
                                (("µs", NUM), ("cause", COPY), ("iteration", NUM), ("CPU ops", TEXT)),
                                [(_f(x["dur_us"]), str(x["cause"]), str(x["iteration"]), cpu_ops_text([(o["name"], o["us"]) for o in x["cpu_ops"]]))
                                 for x in v["largest"][:5]]))
    for key, what in (("kernels_added", "added"), ("kernels_removed", "removed")):
        ks = diff.get(key) or []
        if ks:
            names = ", ".join(k["name"] for k in ks[:5])
            more = f" and {diff.get(f'{key}_total', len(ks)) - 5} more" if diff.get(f"{key}_total", len(ks)) > 5 else ""
            console.print(f"kernels {what}: {escape(names)}{more}", soft_wrap=True)
    for w in diff.get("warnings") or []:
        console.print(f"[yellow]warning:[/] {escape(w)}", soft_wrap=True)
