"""HTML reports: escaping of hostile trace strings, figures, byte stability, plotly.js inclusion, and
(when Debian's `chromium` is installed) rendering in headless Chromium with no console errors."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess

import pytest
from typer.testing import CliRunner

from profkit.attribution import ladder_steps
from profkit.attribution.diff import compare_summaries
from profkit.documents import diff_doc
from profkit.cli import app
from profkit.documents import diff_of
from profkit.report import Report
from profkit.report import figures as F
from profkit.report.html import HtmlRenderer
from profkit.report.markdown import MarkdownRenderer
from factories import CATALOG, HOSTILE_MANIFEST, SCRIPT_NAME

from support import DATA

runner = CliRunner()


def html_page(*, diffs=(), runs=(), cdn=False):
    """The page `profkit report` writes: the runs' ladder computed by attribution, then rendered."""
    return HtmlRenderer(cdn=cdn).render(Report(diffs=diffs, runs=runs, ladder=ladder_steps(runs)))


def _no_raw_hostile(html: str) -> None:
    assert "<script>alert(" not in html
    assert "<img src=x" not in html and "<img src=y" not in html
    # every <script> in the page is plotly's (its config, its bundle, one per figure) or profkit's data block
    for m in re.finditer(r"<script\b[^>]*>", html):
        tag, body = m.group(0), html[m.end(): m.end() + 80].lstrip()
        if tag == '<script type="application/json" id="profkit-data">' or tag.startswith('<script charset="utf-8" src="https://cdn.plot.ly/'):
            continue
        if tag == '<script id="profkit-details">':  # the template's own, static: sizes figures inside a <details> when it opens
            assert body.startswith("/* a figure drawn inside a closed <details>"), body
            continue
        assert tag in ("<script>", '<script type="text/javascript">'), tag
        assert body.startswith(("window.PlotlyConfig", "/**\n* plotly.js", "window.PLOTLYENV")), body


def test_diff_report_escapes_every_trace_string(hostile):
    _, _, d = hostile
    html = html_page(diffs=[d])
    _no_raw_hostile(html)
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html  # the kernel name, as text, in the tables
    assert "cand &lt;i&gt;" in html
    assert "&lt;/script&gt;&lt;script&gt;alert(3)&lt;/script&gt;" in html  # the manifest
    assert html.count('<div id="profkit-fig-') == 7  # with the slack-per-step strip (issue 31)


def test_report_is_byte_stable_and_plotly_inline_once(hostile):
    _, _, d = hostile
    a, b = html_page(diffs=[d]), html_page(diffs=[d])
    assert a == b
    assert 'src="http' not in a  # self-contained
    assert a.count("Plotly.newPlot") == 7
    assert 1_000_000 < len(a) <= 2_000_000  # plotly.js's cartesian bundle inline, once: a self-contained report within 2 MB
    assert a.count("plotly.js (finance - minified)") == 1
    small = html_page(diffs=[d], cdn=True)
    assert len(small) < 500_000 and small.count('src="https://cdn.plot.ly/') == 1


def test_run_and_sweep_reports(hostile):
    base, cand, _ = hostile
    one = html_page(runs=[("base", base)])
    assert "Timeline of a representative iteration" in one and "Ladder" not in one
    sweep = html_page(runs=[("base", base), ("topk", cand), ("again", base)])
    _no_raw_hostile(sweep)
    assert "Ladder" in sweep and "Δ vs previous" in sweep
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in sweep
    assert "Run manifests" in sweep


def test_summary_without_timeline_still_renders(hostile):
    base, _, _ = hostile
    old = json.loads(json.dumps(base))
    for r in old["ranks"]:
        r.pop("timeline")
    html = html_page(runs=[("old", old)])
    assert "No timeline in these summaries" in html


def test_timeline_figure_data(hostile):
    _, cand, _ = hostile
    tl = cand["ranks"][0]["timeline"]
    fig = F.timeline_figure([("cand", tl)])
    names = {t.name for t in fig.data}
    assert {"gemm", "attention", "topk", "other", "memcpy"} <= names
    assert any(n.startswith("bubble: ") for n in names) and "host sync (blocked)" in names
    # op names sit in their trace's hover template (one trace per kernel name), syncs in hover text
    hover = " ".join([h for t in fig.data for h in (t.hovertext or ())] + [t.hovertemplate or "" for t in fig.data])
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in hover and SCRIPT_NAME not in hover
    n_ops = sum(len(t.x) for t in fig.data if t.legendgroup.startswith("cat:"))
    assert n_ops == len(tl["ops"]["start_us"]) == tl["ops_total"]
    # each op bar starts where its op starts (a bar without its base is drawn from 0: the timeline showed one bar)
    starts = sorted(round(v, 2) for v in tl["ops"]["start_us"])
    assert sorted(b for t in fig.data if t.legendgroup.startswith("cat:") for b in (t.base or [None])) == starts


def test_waterfall_adds_up(hostile):
    _, _, d = hostile
    fig = F.waterfall_figure(diff_of(d))
    w = fig.data[0]
    assert w.measure[0] == "absolute" and w.measure[-1] == "total"
    assert w.y[0] + sum(w.y[1:-1]) == pytest.approx(d["decomposition"]["gpu_window_us"]["candidate"], abs=1e-6)


def test_cli_report_from_diff_json_and_folders(tmp_path, hostile):
    base, cand, d = hostile
    (tmp_path / "d.json").write_text(json.dumps(d))
    r = runner.invoke(app, ["report", str(tmp_path / "d.json"), "-o", str(tmp_path / "r.html"), "--cdn"])
    assert r.exit_code == 0, r.output
    assert "Where the GPU window went" in (tmp_path / "r.html").read_text()
    for name, s in (("base", base), ("cand", cand)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "summary.json").write_text(json.dumps(s))
    r = runner.invoke(app, ["report", str(tmp_path / "base"), str(tmp_path / "cand"), "-o", str(tmp_path / "s.html"), "--cdn"])
    assert r.exit_code == 0, r.output
    assert "Ladder" in (tmp_path / "s.html").read_text()
    r = runner.invoke(app, ["report", str(tmp_path / "nope")])
    assert r.exit_code == 3 and "nope" in r.output


# --- headless Chromium -------------------------------------------------------------------------

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="headless Chromium not installed (Debian: apt-get install chromium); CI installs it")


def _chromium(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    cmd = [CHROMIUM, "--headless", "--disable-gpu", "--no-sandbox", "--enable-logging=stderr", "--v=0", "--virtual-time-budget=5000", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


@needs_chromium
def test_html_renders_in_headless_chromium_and_runs_no_injected_script(tmp_path, hostile):
    base, cand, d = hostile
    page = tmp_path / "report.html"
    # one page with everything: the diff and a sweep of the two runs
    page.write_text(html_page(diffs=[d], runs=[("base", base), ("cand", cand)]))
    expected_figures = page.read_text().count('<div id="profkit-fig-')
    shot = tmp_path / "report.png"
    r = _chromium("--window-size=1280,4000", f"--screenshot={shot}", "--dump-dom", page.as_uri())
    assert r.returncode == 0, r.stderr[-2000:]
    dom = r.stdout
    # an alert() would block the page and leave the dump empty; an injected script would set data-pwned
    assert "</html>" in dom
    assert "data-pwned=" not in dom
    console = [ln for ln in r.stderr.splitlines() if "CONSOLE" in ln or "Uncaught" in ln]
    assert console == [], console
    assert dom.count('class="plot-container plotly"') == expected_figures == 13  # slack-per-step strips (issue 31); the sweep step leaves its timeline to the per-configuration one (issue 28)
    assert dom.count("js-plotly-plot") >= expected_figures
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in dom  # shown as text
    assert shot.exists() and shot.stat().st_size > 20_000


def _points(scale: float) -> list[dict]:
    def m(v, spread=0.5):
        return {"median": v, "min": v - spread / 2, "max": v + spread / 2, "spread": spread}
    return [{"isl": isl, "concurrency": c, "repeats": [], "tokens_per_s_per_user_p50": m(scale * 100 / c),
             "tokens_per_s_per_gpu": m(scale * 100 * c ** 0.8 / 8), "tokens_per_s": m(scale * 100 * c ** 0.8)}
            for isl in (1000, 8000) for c in (1, 4, 16)]


def test_throughput_headline_and_curves(hostile):
    base, cand, _ = hostile
    base = {**base, "manifest": {"optimizations": [], "throughput": _points(1.0)}}
    cand = {**cand, "manifest": {**HOSTILE_MANIFEST, "throughput": _points(1.1)}}
    d = diff_doc(compare_summaries(base, cand, opt="topk_v2", catalog=CATALOG))
    assert d["throughput"]["baseline"]["concurrency"] == 1
    html = html_page(diffs=[d])
    assert "tokens/s per user (p50) (unprofiled)" in html and "+10.0%" in html
    assert "Unprofiled throughput curves" in html and html.count('<div id="profkit-fig-') == 9
    md = MarkdownRenderer().render(Report(diffs=[d]))
    assert "#### Unprofiled throughput" in md and "| tokens/s per user (p50) | 100.00 | 110.00 | +10.0% | **beyond noise** |" in md
    sweep = html_page(runs=[("base", base), ("cand", cand)])
    assert "Throughput Pareto curve" in sweep and "Throughput over input length" in sweep


def test_manifest_json_beside_a_summary_reaches_the_report(tmp_path, hostile):
    base, _, _ = hostile
    run = tmp_path / "run1"
    run.mkdir()
    (run / "summary.json").write_text(json.dumps({k: v for k, v in base.items() if k != "manifest"}))
    (run / "manifest.json").write_text(json.dumps({"command": "python -m sglang.launch_server --x <y>", "gpu": "H200"}))
    r = runner.invoke(app, ["report", str(run / "summary.json"), "-o", str(tmp_path / "r.html"), "--cdn"])
    assert r.exit_code == 0, r.output
    html = (tmp_path / "r.html").read_text()
    assert "Run manifests" in html and "--x &lt;y&gt;" in html


SHOTS = os.environ.get("PROFKIT_SCREENSHOTS")  # a folder: keep the screenshots there to look at them


@needs_chromium
@pytest.mark.parametrize("width", [1400, 900])
def test_diff_report_in_chromium_at_two_widths(tmp_path, width):
    """The sample pair's diff report at 1400 and 900 px: it draws every figure, logs no console
    error, has its banner-free top (a GPU run), per-side x-axes and the GPU window per iteration."""
    from pathlib import Path as P

    sample = P(__file__).resolve().parent.parent / "traces" / "sample"
    page = tmp_path / "diff.html"
    r = runner.invoke(app, ["diff", str(sample / "eager_sync.pt.trace.json.gz"), str(sample / "graph_decode.pt.trace.json.gz"), "--html", str(page)])
    assert r.exit_code == 0, r.output
    html = page.read_text()
    assert len(html.encode()) <= 2_000_000
    assert "before and after" in html and "GPU window per iteration" in html and "x-axis per side" in html
    shot = (P(SHOTS) if SHOTS else tmp_path) / f"diff-{width}.png"
    r = _chromium(f"--window-size={width},2400", f"--screenshot={shot}", "--dump-dom", page.as_uri())
    assert r.returncode == 0, r.stderr[-2000:]
    console = [ln for ln in r.stderr.splitlines() if "CONSOLE" in ln or "Uncaught" in ln]
    assert console == [], console
    n = html.count('<div id="profkit-fig-')
    assert r.stdout.count('class="plot-container plotly"') == n >= 6
    assert "waterfalllayer" in r.stdout  # the bundle draws the waterfall (plotly.js's cartesian bundle has none)
    assert shot.stat().st_size > 20_000


@needs_chromium
def test_cpu_only_run_report_has_the_banner_first(tmp_path):
    from pathlib import Path as P

    trace = P(__file__).resolve().parent / "data" / "bad" / "cpu_only.json.gz"
    page = tmp_path / "cpu.html"
    r = runner.invoke(app, ["report", str(trace), "-o", str(page)])
    assert r.exit_code == 0, r.output
    html = page.read_text()
    body = html.split("<body>", 1)[1]
    assert body.index('class="banner"') < body.index("<section")
    assert "CPU-op window" in html and "GPU window µs" not in html
    assert "before and after" not in html  # one run: not a before/after timeline
    r = _chromium("--window-size=900,1600", "--dump-dom", page.as_uri())
    assert [ln for ln in r.stderr.splitlines() if "CONSOLE" in ln or "Uncaught" in ln] == []


def test_a_real_proxy_diff_report_stays_under_2_mb(tmp_path):
    """issue 17: a self-contained report of a real eager H200 proxy pair (~1,400 ops and bubbles per
    iteration on each side's timeline) is at most 2 MB: kernel names are written once per trace."""
    from pathlib import Path as P

    d = P(__file__).resolve().parent / "data" / "gpu_proxy"
    page = tmp_path / "diff.html"
    r = runner.invoke(app, ["diff", str(d / "baseline.trace.json.gz"), str(d / "topk_v2.trace.json.gz"), "--html", str(page)])
    assert r.exit_code == 0, r.output
    assert len(page.read_bytes()) <= 2_000_000


def test_run_report_counts_every_sync_not_only_the_listed_ones():
    """summary.json lists only the largest syncs (max_items) and counts all of them in sync_groups: the HTML
    run report's sync table reads the groups (eager_sync, expected.json: 2 syncs and 1 blocking copy from
    pageable memory per iteration), so it says 3 per iteration when the list holds a single one (it said 1/8)."""

    from support.helpers import analyze_paths
    from profkit.analysis.summary import build_summary

    data = DATA / "gpu"
    per = json.loads((data / "expected.json").read_text())["eager_sync"]["per_iteration"]
    want = per["syncs"] + per["memcpy_from_or_to_pageable"]
    s = build_summary(analyze_paths([data / "eager_sync.pt.trace.json.gz"], cache=False), max_items=1)
    r = s["ranks"][0]
    n = len(r["iterations"])
    assert len(r["syncs"]) == 1 and sum(g["count"] for g in r["sync_groups"]) == want * n
    html = html_page(runs=[("eager_sync", s)])
    table = html[html.index("host syncs and blocking copies: eager_sync"):]
    table = table[:table.index("</table>")]
    rates = [float(x) for x in re.findall(r'<td class="r">([0-9.]+)</td>\s*<td class="r">[0-9.,]+</td>\s*</tr>', table)]
    assert rates and sum(rates) == pytest.approx(want)


def test_a_sweep_report_leads_with_its_ladder_and_folds_each_step():
    """issue 28: the sweep's own result first (the ladder, with tokens/s), then each compared step
    collapsed in a <details> named by what differs, then the runs; under 2 MB with the H200 proxy runs."""
    from pathlib import Path as P

    from profkit.attribution import ladder_steps
    from profkit.analysis.catalog import CatalogChoice, load_catalog
    from profkit.analysis.summarize import SummarizeOptions, summarize

    data = P(__file__).resolve().parent / "data" / "gpu_proxy"
    opts = SummarizeOptions(catalog=CatalogChoice(load_catalog("proxy"), "test"), cache=False)
    runs = []
    for n, label in (("baseline", "baseline"), ("topk_v2", "+topk_v2"), ("indexer_fusion", "+indexer_fusion")):
        s = summarize([data / f"{n}.trace.json.gz"], opts).summary
        s["manifest"] = json.loads((data / f"{n}.manifest.json").read_text())
        runs.append((label, s))
    diffs = [diff_doc(compare_summaries(runs[0][1], s, opt=label[1:], catalog=load_catalog("proxy"), labels=("sweep-x-baseline", f"sweep-x-{label[1:]}")))
             for label, s in runs[1:]]
    # a step whose candidate swings (diff.json's stability, as windows.py writes it): the ladder says so, as the terminal does
    diffs[0]["stability"] = {"candidate": "profile window 0: GPU window 26,771–138,605 µs"}
    html = HtmlRenderer().render(Report(diffs=diffs, runs=runs, ladder=ladder_steps(runs)))
    assert len(html.encode()) <= 2_000_000
    body = html.split("<body>", 1)[1]
    assert ("warning: unstable: sweep-x-topk_v2: profile window 0: GPU window 26,771–138,605 µs; step sweep-x-topk_v2: its change is "
            "the swing as much as the step") in body[body.index('id="ladder"'):body.index('<details class="step">')]
    assert body.index('id="ladder"') < body.index('<details class="step">') < body.index('id="run-0"')
    assert body.count('<details class="step">') == 2 and body.count("</details>") >= 2
    assert "<summary>step 1 of 2: baseline → topk_v2 (topk_v2): " in body
    ladder = body[body.index('id="ladder"'):body.index('<details class="step">')]
    assert "tokens/s per user (unprofiled)" in ladder and "GPU window µs" in ladder
    h = re.findall(r"<h[12]>([^<]*)</h[12]>", html)
    assert h[0].startswith("profkit sweep: 3 configurations") and h[1] == "Ladder"


def test_one_diff_page_does_not_repeat_its_title_nor_show_an_exact_zero_residual(hostile):
    _, _, d = hostile
    html = html_page(diffs=[d])
    h = re.findall(r"<h[12]>([^<]*)</h[12]>", html)
    assert h[1] == "Summary" and h[0] != h[1]
    assert d["decomposition"]["exact"] and '<div class="label">residual</div>' not in html


MEASURE = """<script>window.addEventListener("load", function () { setTimeout(function () {
  var w = window.innerWidth, over = [];
  document.querySelectorAll("section, table, .js-plotly-plot, .cards, .headline, .note, summary").forEach(function (e) {
    var r = e.getBoundingClientRect(); if (r.width > 0 && r.right > w + 1) over.push(e.tagName + "." + e.className + ":" + Math.round(r.right)); });
  var tallest = 0; document.querySelectorAll("tr").forEach(function (r) { tallest = Math.max(tallest, r.getBoundingClientRect().height); });
  document.body.setAttribute("data-measure", JSON.stringify({inner: w, scroll: document.documentElement.scrollWidth, over: over,
    plots: document.querySelectorAll(".js-plotly-plot .main-svg").length, tallest: Math.round(tallest),
    figures: document.querySelectorAll('div[id^="profkit-fig-"]').length, drawn: document.querySelectorAll('div[id^="profkit-fig-"].js-plotly-plot').length}));
}, 500); });</script>"""


@needs_chromium
@pytest.mark.parametrize("width", [900, 1400])
def test_the_diff_and_the_sweep_hold_their_layout_at_900_px(tmp_path, width):
    """issue 28: at 900 px (and 1400) nothing sticks out of the page: no horizontal scroll, every section,
    table, figure and card inside the viewport; the sample diff and a 3-run sweep of the H200 proxy runs."""
    from pathlib import Path as P

    from profkit.analysis.catalog import CatalogChoice, load_catalog
    from profkit.analysis.summarize import SummarizeOptions, summarize as summarize_files

    sample = P(__file__).resolve().parent.parent / "traces" / "sample"
    diff_page = tmp_path / "diff.html"
    r = runner.invoke(app, ["diff", str(sample / "eager_sync.pt.trace.json.gz"), str(sample / "graph_decode.pt.trace.json.gz"), "--html", str(diff_page)])
    assert r.exit_code == 0, r.output
    data = P(__file__).resolve().parent / "data" / "gpu_proxy"
    opts = SummarizeOptions(catalog=CatalogChoice(load_catalog("proxy"), "test"), cache=False)
    runs = [(label, summarize_files([data / f"{n}.trace.json.gz"], opts).summary)
            for n, label in (("baseline", "baseline"), ("topk_v2", "+topk_v2"), ("all", "all"))]
    diffs = [diff_doc(compare_summaries(runs[0][1], s, labels=("baseline", label))) for label, s in runs[1:]]
    sweep_page = tmp_path / "sweep.html"
    sweep_page.write_text(HtmlRenderer().render(Report(diffs=diffs, runs=runs, ladder=ladder_steps(runs))))
    # `profkit trace`'s page: one compared pair and its two runs (the diff first and open, its top movers' long names)
    trace_page = tmp_path / "trace.html"
    trace_page.write_text(HtmlRenderer().render(Report(diffs=diffs[:1], runs=runs[:2], ladder=ladder_steps(runs[:2]))))
    for page in (diff_page, sweep_page, trace_page):
        probe = tmp_path / f"probe-{page.name}"
        probe.write_text(page.read_text().replace("</body>", MEASURE + "</body>"))  # a copy: the report itself is not changed
        r = _chromium(f"--window-size={width},1600", "--dump-dom", probe.as_uri())
        assert r.returncode == 0, r.stderr[-2000:]
        assert [ln for ln in r.stderr.splitlines() if "CONSOLE" in ln or "Uncaught" in ln] == []
        m = json.loads(html_unescape(re.search(r'data-measure="([^"]*)"', r.stdout).group(1)))
        assert m["plots"] > 0 and m["over"] == [] and m["scroll"] <= m["inner"], (page.name, m)
        # every figure drawn (one built before plotly.js was on the page stayed blank), no table row taller than
        # ~7 lines (at 900 px a 300-character kernel template name made a top-movers row 15 lines tall)
        assert m["drawn"] == m["figures"] > 0 and m["tallest"] <= 140, (page.name, m)


def html_unescape(s: str) -> str:
    import html

    return html.unescape(s)
