"""The Markdown renderer: diff.json v1 -> a GitHub-flavoured Markdown PR comment (pure: dict in, str out).

Every string that comes from a trace or a manifest (kernel names, triggers, paths, categories) goes
through `md_escape`: a trace is untrusted input, and a kernel name must neither break the table
(``|``), open code spans (backticks), inject HTML (``<``, ``>``, ``&``) nor ping anyone (``@``).
The comment stays under GitHub's 65,536-character limit: long lists are cut and the cut is said.
"""

from __future__ import annotations

from typing import ClassVar

from profkit.documents import UNSET, Diff
from profkit.report import capture_view
from profkit.report.base import Renderer, Report
from profkit.report.fit import demangle
from profkit.report.numbers import COUNT, RATE, RESIDUAL, num, pct
from profkit.report.views import withheld_text, counts_title, cpu_ops_text, decomposition_rows, doubt_metric, headline_lines, noise_verdict, phase_rows, row_metric, statistic_note, throughput_rows
from profkit.report.vocab import GPU_ONLY_COUNTS, banner, count_label, diff_timeline, words
from profkit.terms import COUNT_KEYS, PER_ITERATION

GITHUB_COMMENT_LIMIT = 65_536
# Headroom under GitHub's limit for whatever the bot that posts the comment adds around it.
DEFAULT_MAX_CHARS = 60_000
MAX_CELL = 140
MAX_NAME = 90  # a kernel name in a table: longer ones are cut in the middle, so the numbers stay in a GitHub-width column

# Markdown's own specials get a backslash (readable in raw text, email and `gh`: `\_`); HTML's and
# GitHub's (a mention, a table's pipe, a code span) get character references.
_MD_ESCAPES = {
    "&": "&amp;", "<": "&lt;", ">": "&gt;", "|": "&#124;", "`": "&#96;", "@": "&#64;",
    "\\": "\\\\", "*": "\\*", "_": "\\_", "[": "\\[", "]": "\\]", "~": "\\~", "#": "\\#",
    "\n": " ", "\r": " ", "\t": " ",
}


def md_escape(s: object, *, max_len: int | None = MAX_CELL) -> str:
    """Text safe inside a GFM table cell: Markdown specials backslash-escaped, HTML's and GitHub's as
    character references; longer than `max_len`, cut in the middle (a kernel name's head and tail)."""
    text = "" if s is None else str(s)
    if max_len is not None and len(text) > max_len:
        head = (max_len - 1 + 1) // 2
        text = text[:head] + "…" + text[len(text) - (max_len - 1 - head):] if max_len > 1 else "…"
    return "".join(_MD_ESCAPES.get(ch, ch) for ch in text)


def _table(header: list[str], align: str, rows: list[list[str]]) -> list[str]:
    seps = ["---:" if a == "r" else "---" for a in align]
    return ["| " + " | ".join(header) + " |", "| " + " | ".join(seps) + " |", *("| " + " | ".join(r) + " |" for r in rows)]


def _noise_mark(diff: Diff, metric: str) -> str:
    v = noise_verdict(diff, metric)
    return v.removesuffix("beyond noise") + "**beyond noise**" if v.endswith("beyond noise") else v


class MarkdownRenderer(Renderer):
    """The PR comment for a report's one diff. Lists shrink until the text fits in `max_chars`."""

    name: ClassVar[str] = "markdown"
    output_file_extension: ClassVar[str] = "md"

    def __init__(self, *, max_chars: int = DEFAULT_MAX_CHARS) -> None:
        self.max_chars = max_chars

    def render(self, report: Report) -> str:
        diff, max_chars = report.only_diff_doc("Markdown"), self.max_chars
        for limit in (25, 15, 10, 5, 3, 0):
            text = _render(diff, limit)
            if len(text) <= max_chars:
                return text
        return text[: max_chars - 80] + "\n\n… (comment cut to fit GitHub's size limit; see diff.json)\n"


def _render(diff: Diff, limit: int) -> str:
    """The comment: each section's lines, in order (`limit`: rows per long list, 0 for none)."""
    tl = diff_timeline(diff)
    W = words(tl)
    sections = (_head(diff, tl), _throughput(diff), _expected_effect(diff), _noise(diff), _decomposition(diff, limit, W), _floor(diff), _phases(diff, W),
                _counts(diff, tl), _syncs(diff, limit), _bubbles(diff, limit), _movers(diff, limit, W), _kernels(diff, limit), _warnings(diff, limit))
    return "\n".join([line for s in sections for line in s] + [_footer(diff)]) + "\n"


def _head(diff: Diff, tl: str) -> list[str]:
    """Capture health (issue 31: first, before any number), the title, the headline and its bullets, the capture lines, the banner."""
    opt = diff.optimization
    title = f"### profkit diff: {md_escape(diff.baseline.label, max_len=80)} → {md_escape(diff.candidate.label, max_len=80)}"
    if opt:
        title += f" — {md_escape(opt, max_len=60)}"
    first, *bullets = headline_lines(diff)  # one line, then at most three bullets
    health_line = md_escape(capture_view.diff_health(diff), max_len=None)
    # in words, first; bold only when the capture cannot be measured at all (a degraded one is read with its † marks)
    out = [f"**{health_line}**" if health_line.startswith("health: unusable") or "unusable" in health_line.split(";")[0] else health_line, "",
           title, "", f"> **{md_escape(first, max_len=None)}**", *(f"> - {md_escape(line, max_len=None)}" for line in bullets), ""]
    lines = capture_view.diff_lines(diff)
    out += [*(f"- {md_escape(line, max_len=None)}" for line in lines), ""] if lines else []
    if banner(tl):
        out += [f"> [!WARNING]\n> {md_escape(banner(tl), max_len=None)}", ""]
    return out


def _throughput(diff: Diff) -> list[str]:
    tp = throughput_rows(diff)
    if not tp:
        return []
    mark = {None: "not judged", True: "within noise", False: "**beyond noise**"}
    return ["#### Unprofiled throughput", "",
            *_table(["metric", "baseline", "candidate", "change", "noise"], "lrrrl",
                    [[t["label"], num(t["baseline"], RATE), num(t["candidate"], RATE), pct(t["change_pct"]), mark[t["within_noise"]]] for t in tp]),
            ""]


def _expected_effect(diff: Diff) -> list[str]:
    ee, opt = diff.expected_effect, diff.optimization
    if not ee:
        return []
    out: list[str] = []
    if not ee.known:
        out.append(f"ℹ️ {md_escape(ee.note, max_len=300)}")
    elif not ee.judged:
        out.append(f"Expected-effect check {md_escape(ee.threshold)}.")  # "not judged: ..." (this branch: nothing judged)
    elif withheld_text(ee) and not ee.against and not ee.flags:
        out.append(md_escape(withheld_text(ee) or "", max_len=600))
    elif ee.ok:
        owned = ", ".join(md_escape(x) for x in ee.categories) or "none (idle and launch time only)"
        out.append(f"✅ Expected-effect check passed: no change outside {md_escape(opt)}'s categories ({owned}) beyond "
                   f"{md_escape(ee.threshold)}.")
    else:
        if ee.against:
            out.append(f"⚠️ **Expected-effect check: {md_escape(opt)}'s own effect went the wrong way** "
                       f"(threshold: {md_escape(ee.threshold)}):")
            out += [f"- {md_escape(f, max_len=300)}" for f in ee.against]
        if ee.flags:
            out.append(f"⚠️ **Expected-effect check: {len(ee.flags)} change(s) outside {md_escape(opt)}'s categories** "
                       f"(threshold: {md_escape(ee.threshold)}):")
            out += [f"- {md_escape(f, max_len=300)}" for f in ee.flags]
    return [*out, ""]


def _noise(diff: Diff) -> list[str]:
    noise = diff.noise
    if noise.available:
        r = noise.repeats
        return [f"Noise: {r['baseline']} baseline and {r['candidate']} candidate profile windows; a change smaller than the spread is marked *within noise*.", ""]
    return [f"Noise: {md_escape(noise.note, max_len=300)}.", ""]


def _decomposition(diff: Diff, limit: int, W: dict[str, str]) -> list[str]:
    """Where the window went: every term, the largest change first (the reader sees what moved the window in the first
    rows; beyond `limit` categories the rest in one row), the window, the worst residual; then the wall."""
    dec = diff.decomposition
    out = [f"#### Where the {W['window']} went (µs per iteration, {md_escape(diff.shape.label)}, "
           f"{diff.shape.iterations['baseline']} vs {diff.shape.iterations['candidate']} iterations)", ""]
    rows = []
    drows = decomposition_rows(diff)
    cats = [r for r in drows if r[0] == "category"]
    shown = cats if limit == 0 or len(cats) <= limit else sorted(cats, key=lambda r: -abs(r[2] or 0))[:limit]
    for group, term, delta, bv, cv in sorted(shown + [r for r in drows if r[0] != "category"], key=lambda r: -abs(r[2] or 0)):
        label = {"category": f"{md_escape(term)}", "overlap": "− overlap (multi-stream, counted once)", "backlog": f"backlog ({W['device']} behind the host)",
                 "idle": f"idle: {md_escape(term.replace('_', ' '))}"}[group]
        if group == "overlap":
            bv, cv = (-bv if bv is not None else None), (-cv if cv is not None else None)
        label = capture_view.mark(label, capture_view.doubted_in_diff(diff, doubt_metric(group)))
        rows.append([label, num(bv), num(cv), num(delta, sign=True), _noise_mark(diff, row_metric(group, term))])
    if len(shown) < len(cats):
        rest = sum(r[2] for r in cats if r not in shown)
        rows.append([f"*{len(cats) - len(shown)} more categories*", "", "", num(rest, sign=True), ""])
    g = dec.gpu_window_us
    rows.append([f"**{W['window']}**", f"**{num(g.baseline)}**", f"**{num(g.candidate)}**", f"**{num(g.delta, sign=True)}**",
                 _noise_mark(diff, "gpu_window_us")])
    rows.append(["residual (worst window)", "", "", num(dec.residual_us, RESIDUAL, sign=True), "exact" if dec.exact else "**inexact**"])
    out += _table(["term (largest change first)", "baseline µs", "candidate µs", "Δ µs", "noise"], "lrrrl", rows)
    out += ["", f"<sub>{md_escape(statistic_note(diff), max_len=None)}</sub>"]
    w = diff.wall_us
    wn = _noise_mark(diff, "wall_us")  # beside the change it judges, inside the sentence
    return [*out, "", f"Wall (CPU) per iteration: {num(w.baseline)} → {num(w.candidate)} µs ({num(w.delta, sign=True)} µs"
            + (f", {wn}" if wn else "") + ").", ""]


def _floor(diff: Diff) -> list[str]:
    """What the optimization closed of the gap to the hardware floor, and the gap's split on each side (report/floor_view.py)."""
    from profkit.report.floor_view import closed_text, diff_gap_rows

    text = closed_text(diff)
    if text is None:
        return []
    rows = diff_gap_rows(diff)
    if not rows:
        return [f"<sub>{md_escape(text, max_len=None)}</sub>", ""]
    out = ["#### The gap to the hardware floor (µs per iteration)", "", f"**{md_escape(text, max_len=None)}**", ""]
    out += _table(["term", "baseline µs", "candidate µs", "Δ µs"], "lrrr",
                  [[md_escape(k), num(b), num(c), num(d, sign=True)] for k, b, c, d in rows])
    return [*out, "", "<sub>gap = GPU window − floor = idle + above the ops' floors + floor mix + unmodeled − overlap (exact in each "
                      "iteration; medians over windows of the means here); the floor: max(bytes / bandwidth, FLOPs / peak rate) of "
                      "the step's own ops with a work model</sub>", ""]


def _phases(diff: Diff, W: dict[str, str]) -> list[str]:
    ph = phase_rows(diff)
    if not ph:
        return []
    return [f"#### The same change by phase ({W['device']} time, µs per iteration)", "",
            *_table(["phase", "baseline", "candidate", "Δ µs", "noise"], "lrrrl",
                    [[md_escape(k), num(bv), num(cv), num(d, sign=True), _noise_mark(diff, m)] for k, bv, cv, d, m in ph]),
            ""]


COUNT_ROWS = COUNT_KEYS
TIMING_ROWS = {f.key: f.md_label for f in PER_ITERATION if f.md_label}


def _counts(diff: Diff, tl: str) -> list[str]:
    rows = [[count_label(k, tl), num(diff.counts[k].baseline, COUNT), num(diff.counts[k].candidate, COUNT),
             num(diff.counts[k].delta, COUNT, sign=True), _noise_mark(diff, f"counts.{k}")] for k in COUNT_ROWS
            if not (tl == "cpu" and k in GPU_ONLY_COUNTS)]
    rows += [[lab, num(diff.timings[k].baseline), num(diff.timings[k].candidate), num(diff.timings[k].delta, sign=True), _noise_mark(diff, f"timings.{k}")]
             for k, lab in TIMING_ROWS.items() if k in diff.timings]
    return [f"#### P{counts_title(diff)[1:]}", "", *_table(["per iteration (median)", "baseline", "candidate", "Δ", "noise"], "lrrrl", rows), ""]


def _syncs(diff: Diff, limit: int) -> list[str]:
    syncs = [s for s in diff.syncs if s.delta != 0 or limit]
    if not syncs:
        return []
    cut = syncs if limit == 0 else syncs[:limit]
    rows = [[num(s.delta, RATE, sign=True), num(s.baseline_per_iteration, RATE), num(s.candidate_per_iteration, RATE), md_escape(s.kind),
             md_escape(s.direction), md_escape(s.api, max_len=None), md_escape(s.trigger, max_len=None)] for s in cut]
    return ["#### Host syncs and blocking copies (per iteration)", "",
            *_table(["Δ", "baseline", "candidate", "kind", "dir", "API", "trigger"], "rrrllll", rows), *_more(len(syncs), len(cut), "sync groups"), ""]


def _bubbles(diff: Diff, limit: int) -> list[str]:
    largest = {side: v.largest if v else [] for side, v in (("baseline", diff.bubbles.baseline), ("candidate", diff.bubbles.candidate))}
    if not limit or not any(largest.values()):
        return []
    rows = [[side, num(x.dur_us), md_escape(x.cause), str(x.iteration), md_escape(cpu_ops_text([(o.name, o.us) for o in x.cpu_ops]), max_len=300)]
            for side, xs in largest.items() for x in xs[: min(limit, 5)]]
    return [f"#### Largest bubbles ({words(diff_timeline(diff))['idle']}, with the CPU ops' exclusive µs inside each)", "",
            *_table(["side", "µs", "cause", "iteration", "CPU ops"], "lrlrl", rows), ""]


def _movers(diff: Diff, limit: int, W: dict[str, str]) -> list[str]:
    movers = diff.top_movers
    if not movers or not limit:
        return []
    cut = movers[:limit]
    shaped = any(m.shape is not UNSET for m in cut)  # both sides recorded with shapes: by (kernel, shape)
    rows = [[num(m.delta_us, sign=True), num(m.baseline_us), num(m.candidate_us), md_escape(m.category),
             md_escape(demangle(m.name), max_len=MAX_NAME), *([md_escape(m.shape or "", max_len=MAX_NAME)] if shaped else []), md_escape(m.status)]
            for m in cut]
    return [f"#### Top movers (µs per iteration, by normalized kernel name{' and shape' if shaped else ''})", "",
            *_table(["Δ µs", "baseline µs", "candidate µs", "category", W["kernel"], *(["shape"] if shaped else []), "status"],
                    "rrrlll" + ("l" if shaped else ""), rows), *_more(len(movers), len(cut), "movers"), ""]


def _kernels(diff: Diff, limit: int) -> list[str]:
    out: list[str] = []
    for what in ("added", "removed"):
        ks, total = diff.kernel_list(what)
        if not ks:
            continue
        cut = ks[:limit] if limit else []
        out += [f"<details><summary>{total} kernel(s) {what}</summary>", ""]
        if cut:
            out += _table(["µs per iteration", "calls/iter", "category", "kernel"], "rrll",
                          [[num(k.us_per_iteration), num(k.count_per_iteration, RATE), md_escape(k.category), md_escape(demangle(k.name), max_len=MAX_NAME)]
                           for k in cut])
        out += [*_more(total, len(cut), f"{what} kernels"), "", "</details>", ""]
    return out


def _warnings(diff: Diff, limit: int) -> list[str]:
    warns = diff.warnings
    if not warns:
        return []
    cut = warns[: max(limit, 3)]
    return ["#### Warnings", "", *(f"- {md_escape(x, max_len=400)}" for x in cut), *_more(len(warns), len(cut), "warnings"), ""]


def _footer(diff: Diff) -> str:
    return (f"<sub>profkit {md_escape(diff.profkit_version)} · diff.json schema {diff.schema_version} · rank {diff.rank} · "
            f"every term and count: {md_escape(diff.decomposition.statistic or 'mean')}</sub>")


def _more(total: int, shown: int, what: str) -> list[str]:
    return [] if shown >= total else ["", f"*… {total - shown} more {what} not shown (comment size limit); see diff.json.*"]

