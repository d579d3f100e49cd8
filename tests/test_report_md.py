"""The Markdown PR comment: hostile names escaped, tables stay tables, the size limit holds."""

from __future__ import annotations

import copy
import re
from html import unescape

import pytest
from markdown_it import MarkdownIt

from profkit.report import Report
from profkit.report.markdown import GITHUB_COMMENT_LIMIT, MarkdownRenderer, md_escape


def render_md(d, **options):
    return MarkdownRenderer(**options).render(Report(diffs=[d]))


def gfm(text: str) -> str:
    return MarkdownIt("commonmark", {"html": True}).enable("table").enable("strikethrough").render(text)


def _table_rows(md: str) -> list[str]:
    return [ln for ln in md.splitlines() if ln.startswith("| ")]


def test_md_escape():
    assert md_escape("a|b`c`<d>&e@f") == "a&#124;b&#96;c&#96;&lt;d&gt;&amp;e&#64;f"
    cut = md_escape("a" * 300 + "b" * 300)
    assert len(cut) == 140 and cut.startswith("a") and cut.endswith("b") and "…" in cut  # cut in the middle
    assert md_escape("gemm_kernel<*>[x]") == "gemm\\_kernel&lt;\\*&gt;\\[x\\]"  # Markdown's specials get a backslash
    assert md_escape("line\nbreak") == "line break"


def test_comment_escapes_hostile_names_and_renders_tables(hostile):  # noqa: F811
    _, _, d = hostile
    md = render_md(d)
    for raw in ("<script>", "<img", "`tick`", "@everyone", "|pipe"):
        assert raw not in md, raw
    html = gfm(md)
    assert 'href="javascript' not in html
    assert "<script>" not in html and "<img" not in html and "<b>x</b>" not in html
    assert html.count("<table>") >= 3
    # every row of a table has as many cells as its header: no name broke out of its cell
    for table in html.split("<table>")[1:]:
        body = table.split("</table>")[0]
        head = len(re.findall(r"<th[ >]", body.split("</thead>")[0]))
        for row in body.split("<tbody>")[-1].split("<tr>")[1:]:
            assert row.count("<td") == head
    assert "| topk |" in md and "residual" in md and "exact" in md


def test_comment_stays_under_githubs_limit(hostile):  # noqa: F811
    _, _, d = hostile
    big = copy.deepcopy(d)
    many = [{"name": f"kernel_{i}_" + "x" * 300, "category": "other", "count_per_iteration": 1.0, "us_per_iteration": 1.0, "examples": []}
            for i in range(3000)]
    big["kernels_added"], big["kernels_removed"] = many, many
    big["kernels_added_total"] = big["kernels_removed_total"] = 3000
    big["top_movers"] = [{**k, "baseline_us": 0.0, "candidate_us": 1.0, "delta_us": 1.0, "baseline_count": 0.0, "candidate_count": 1.0,
                          "status": "added"} for k in many]
    big["syncs"] = [{"kind": "sync", "api": "cudaStreamSynchronize", "direction": "d2h", "trigger": f"op_{i}" + "y" * 200,
                     "baseline_per_iteration": 0.0, "candidate_per_iteration": 1.0, "delta": 1.0} for i in range(3000)]
    big["warnings"] = ["w" * 300] * 500
    md = render_md(big)
    assert len(md) < GITHUB_COMMENT_LIMIT
    assert "not shown (comment size limit)" in md
    assert "<table>" in gfm(md)


@pytest.mark.parametrize("noise", [False, True])
def test_noise_wording(hostile, noise):  # noqa: F811
    _, _, d = hostile
    d = copy.deepcopy(d)
    if noise:
        d["noise"] = {"available": True, "repeats": {"baseline": 3, "candidate": 3}, "note": "",
                      "metrics": {"category_us.topk": {"delta": -10.0, "spread": 0.5, "within_noise": False},
                                  "category_us.gemm": {"delta": 0.1, "spread": 0.5, "within_noise": True}}}
    md = render_md(d)
    if noise:
        assert "within noise" in md and "**beyond noise**" in md
    else:
        assert "no noise estimate" in md


def _tables(html: str) -> list[tuple[list[str], list[list[str]]]]:
    out = []
    for t in html.split("<table>")[1:]:
        body = t.split("</table>")[0]
        head = [unescape(re.sub("<[^>]+>", "", h)).strip() for h in re.findall(r"<th[^>]*>(.*?)</th>", body)]
        rows = [[unescape(re.sub("<[^>]+>", "", c)).strip() for c in re.findall(r"<td[^>]*>(.*?)</td>", r)]
                for r in body.split("<tbody>")[-1].split("<tr>")[1:]]
        out.append((head, rows))
    return out


def test_rendered_comment_reads_as_a_reviewer_needs(hostile):  # noqa: F811
    """Rendered with markdown-it as GitHub would: every column labelled, the decomposition's largest
    change first, Δ first among the movers, `_` readable (a backslash in the raw text, never &#95;)."""
    _, _, d = hostile
    d = copy.deepcopy(d)
    d["top_movers"][0]["name"] = "void flash_fwd_splitkv_kernel<Flash_fwd_kernel_traits<128, 64, 128, 4>, " + "x" * 300 + ">(Flash_fwd_params)"
    md = render_md(d)
    assert "&#95;" not in md and "\\_" in md
    html = gfm(md)
    tables = _tables(html)
    assert tables
    for head, _ in tables:
        assert all(head), head  # no unlabelled column
    dec = next((h, r) for h, r in tables if h and h[0].startswith("term"))
    deltas = [abs(float(r[3].replace(",", "").replace("*", "") or 0)) for r in dec[1] if r[0] not in ("GPU window", "residual") and r[3]]
    assert deltas == sorted(deltas, reverse=True)
    movers = next((h, r) for h, r in tables if "kernel" in h and h[0].startswith("Δ"))
    assert movers[0][:3] == ["Δ µs", "baseline µs", "candidate µs"]
    long = next(r for r in movers[1] if "flash" in r[4])
    assert len(long[4]) <= 90 and long[4].startswith("void flash_fwd_splitkv_kernel") and long[4].endswith("(Flash_fwd_params)")
    assert "flash_fwd_splitkv_kernel" in html  # `_` renders as `_`
    assert len(md) < GITHUB_COMMENT_LIMIT
