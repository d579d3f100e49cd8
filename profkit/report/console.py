"""summary.json (v1 or v2) -> rich tables for the terminal (human output goes to stderr or stdout as the CLI decides)."""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from profkit.attribution.diff import shape_label, shape_of
from profkit.report.fit import COPY, NAME, NUM, TEXT, fit_table
from profkit.findings import (
    bubble_causes, cpu_ops_text, host_gap_text, idle_cpu_ops, largest_bubbles, outside_text, sync_groups,
)


def _f(x: float | None, digits: int = 1) -> str:
    return "-" if x is None else f"{x:,.{digits}f}"


def render_summary(summary: dict[str, Any], console: Console, *, top: int = 10) -> None:
    _render_ranks(summary, console, top=top)
    if summary.get("cross_rank"):
        render_cross_rank(summary["cross_rank"], console)


def _render_ranks(summary: dict[str, Any], console: Console, *, top: int) -> None:
    for r in summary["ranks"]:
        its = r["iterations"]
        kinds = Counter(shape_label(shape_of(i)) for i in its)
        console.print(
            f"[bold]rank {r['rank']}[/] {escape(r['device'] or '')}  [dim]{escape(r['path'])}[/]\n"
            f"  {len(its)} iterations ({escape(', '.join(f'{n}× {k}' for k, n in kinds.most_common()))}); marker [cyan]{escape(str(r['marker']))}[/]; catalog {escape(r['catalog'])}",
            soft_wrap=True,
        )
        for line in filter(None, (host_gap_text(r), outside_text(r))):
            console.print(f"  [bold magenta]{escape(line)}[/]", soft_wrap=True)
        m = r["median"]
        if not m:
            continue
        t = Table(title="per iteration", title_justify="left", box=None)
        for c in ("metric", "median", "min", "max"):
            t.add_column(c, justify="left" if c == "metric" else "right")
        dev = "CPU-op" if r.get("device_timeline") == "cpu" else "GPU"
        rows = (
            ("wall µs", "wall_us", 1), (f"{dev} window µs", "gpu_window_us", 1), (f"{dev} busy µs", "gpu_busy_us", 1),
            (f"{dev} idle µs", "gpu_idle_us", 1), ("overlap µs", "overlap_us", 1), ("GPU kernels" if dev == "GPU" else "top-level aten ops", "gpu_kernels", 0),
            ("kernel launches", "kernel_launches", 0), ("graph launches", "graph_launches", 0), ("launch host µs", "launch_us", 1),
            ("launch latency p50 µs", "launch_latency_us_p50", 1), ("syncs", "syncs", 0), ("sync µs", "sync_us", 1),
            ("sync copies", "sync_copies", 0), ("bubbles", "bubble_count", 0), ("bubble µs", "bubble_us", 1),
        )
        for label, key, d in rows:
            vals = [i[key] for i in its if i[key] is not None]
            t.add_row(label, _f(m[key], d), _f(min(vals), d) if vals else "-", _f(max(vals), d) if vals else "-")
        for d in ("h2d", "d2h", "d2d"):
            vals = [i["memcpy"][d] for i in its]
            if any(vals):
                t.add_row(f"memcpy {d}", _f(m["memcpy"][d], 0), _f(min(vals), 0), _f(max(vals), 0))
        console.print(t)
        cat = m.get("category_us") or {}
        total = sum(cat.values()) or 1.0
        if cat:
            console.print(fit_table(console, "time by category (median µs per iteration)", (("category", COPY), ("µs", NUM), ("share", NUM)),
                                    [(k, _f(v), f"{100 * v / total:.1f}%") for k, v in sorted(cat.items(), key=lambda kv: -kv[1])]))
        by_cause = m.get("bubble_us_by_cause") or {}
        causes = bubble_causes(r)
        if causes and any(v["count"] for v in causes.values()):
            console.print(fit_table(
                console, "bubbles by cause (median µs per iteration; count over all iterations; CPU ops by the idle time inside the bubbles)",
                (("cause", COPY), ("µs", NUM), ("count", NUM), ("CPU was in", TEXT)),
                [(c, _f(v), str(causes.get(c, {}).get("count", 0)), cpu_ops_text(idle_cpu_ops(r, c, 2)))
                 for c, v in sorted(by_cause.items(), key=lambda kv: -kv[1])]))
            big = largest_bubbles(r, top)
            console.print(fit_table(
                console, f"largest bubbles (of {r.get('bubbles_total', len(r['bubbles']))}; CPU ops with their exclusive µs inside the bubble)",
                (("µs", NUM), ("cause", COPY), ("iteration", NUM), ("CPU ops", TEXT)),
                [(_f(b["dur_us"]), b["cause"], str(b["iteration"]), cpu_ops_text(b["cpu_ops"])) for b in big]))
        groups = sync_groups(r)
        if groups:
            frames = any(g["frame"] for g in groups)
            cols = (("count", NUM), ("blocked µs", NUM), ("kind", COPY), ("dir", COPY), ("api", COPY), ("trigger", COPY)) + ((("Python frame", COPY),) if frames else ())
            console.print(fit_table(console, "host syncs and blocking copies (all iterations)", cols, [
                (str(g["count"]), _f(g["blocked_us"]), g["kind"], str(g["direction"]), str(g["api"]), str(g["trigger"] or "?"), *([g["frame"] or ""] if frames else []))
                for g in groups[:top]]))
        if r["kernels"]:
            n_it = max(len(its), 1)
            what = "kernels" if r.get("device_timeline") != "cpu" else "aten ops"
            console.print(fit_table(console, f"top {what} (of {len(r['kernels'])}; names demangled, long ones cut in the middle)",
                                    (("total µs", NUM), ("calls/iter", NUM), ("category", COPY), ("name", NAME)),
                                    [(_f(k["total_us"]), _f(k["count"] / n_it, 1), k["category"] or "-", k["name"]) for k in r["kernels"][:top]]))
        for w in r["warnings"]:
            console.print(f"[yellow]warning:[/] {escape(w)}", soft_wrap=True)
from profkit.report.console_diff import render_diff  # noqa: E402,F401  (diff tables live in console_diff; re-exported for callers)


def render_cross_rank(x: dict[str, Any], console: Console) -> None:
    """The straggler table and per-iteration spread across ranks."""
    offs = ", ".join(f"rank {r}: {v:+,.1f} µs" for r, v in x["clock_offsets_us"].items())
    console.print(f"[bold]across {len(x['ranks'])} ranks[/]: {x['aligned_iterations']} aligned iterations; clock offsets {escape(offs)}")
    t = Table(title="stragglers (the rank the others wait for in collectives)", title_justify="left", box=None)
    for c in ("rank", "times straggler", "wait it caused µs (mean)", "its own collective wait µs (mean)"):
        t.add_column(c, justify="right")
    for s in x["stragglers"]:
        t.add_row(str(s["rank"]), str(s["times_straggler"]), _f(s["mean_wait_caused_us"]), _f(s["mean_comm_wait_us"]))
    console.print(t)
    spreads = [i["spread_us"] for i in x["iterations"]]
    if spreads:
        spreads.sort()
        console.print(f"GPU-window spread across ranks per iteration: median {_f(spreads[len(spreads) // 2])} µs, max {_f(spreads[-1])} µs")
    for w in x["warnings"]:
        console.print(f"[yellow]warning:[/] {escape(w)}", soft_wrap=True)
