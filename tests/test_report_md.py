"""The Markdown PR comment: hostile names escaped, tables stay tables, the size limit holds."""

from __future__ import annotations

import copy
import re

import pytest
from markdown_it import MarkdownIt

from profkit.report.markdown import GITHUB_COMMENT_LIMIT, md_escape, render_diff_markdown
from test_report_html import hostile  # noqa: F401  (fixture)


def gfm(text: str) -> str:
    return MarkdownIt("commonmark", {"html": True}).enable("table").enable("strikethrough").render(text)


def _table_rows(md: str) -> list[str]:
    return [ln for ln in md.splitlines() if ln.startswith("| ")]


def test_md_escape():
    assert md_escape("a|b`c`<d>&e@f") == "a&#124;b&#96;c&#96;&lt;d&gt;&amp;e&#64;f"
    assert md_escape("x" * 500).endswith("…") and len(md_escape("x" * 500)) == 140
    assert md_escape("line\nbreak") == "line break"


def test_comment_escapes_hostile_names_and_renders_tables(hostile):  # noqa: F811
    _, _, d = hostile
    md = render_diff_markdown(d)
    for raw in ("<script>", "<img", "`tick`", "@everyone", "|pipe", "](javascript:"):
        assert raw not in md, raw
    html = gfm(md)
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
    md = render_diff_markdown(big)
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
    md = render_diff_markdown(d)
    if noise:
        assert "within noise" in md and "**beyond noise**" in md
    else:
        assert "no noise estimate" in md
