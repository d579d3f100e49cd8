"""The renderer protocol (issue 15): every renderer takes a Report and returns text, is picked by
name or by the output file's suffix; the one number formatter reproduces each of the four formats it
replaced; the sweep's ladder (attribution) agrees with the full diffs of the same runs."""

from __future__ import annotations

import io
import itertools
import math

import pytest
from rich.console import Console

from profkit.attribution import compare_summaries, ladder_steps

from profkit.documents import diff_doc
from profkit.errors import UsageError
from profkit.report import Renderer, Report, get_renderer, renderer_for
from profkit.report.base import RENDERERS
from profkit.report.numbers import HYPHEN, num, pct, ratio_pct
from factories import BASE, CATALOG, decode_trace, summarize

# --- the number formatter -----------------------------------------------------------------------
# The four formatters it replaced, as they were (report/console.py, report/console_diff.py,
# report/markdown.py, report/html.py before issue 15): the reference it must reproduce.


def old_console(x, digits=1):
    return "-" if x is None else f"{x:,.{digits}f}"


def old_console_diff(x, digits=1, *, sign=False):
    if x is None:
        return "-"
    if x == 0:
        return "0" if digits == 0 else f"{0:.{digits}f}"
    return f"{x:+,.{digits}f}" if sign else f"{x:,.{digits}f}"


def old_markdown(x, digits=1, *, sign=False):
    if x is None:
        return "–"
    if x == 0:
        x, sign = 0, False
    if float(x).is_integer() and digits == 0:
        return f"{int(x):+,d}" if sign else f"{int(x):,d}"
    return f"{x:+,.{digits}f}" if sign else f"{x:,.{digits}f}"


def old_html(x, digits=1, *, sign=False):
    if x is None:
        return "–"
    if x == 0:
        return "0" if digits == 0 else f"{0:.{digits}f}"
    return f"{x:+,.{digits}f}" if sign else f"{x:,.{digits}f}"


VALUES = [None, 0, 0.0, -0.0, 1, -1, 7, 12345, -98765, 2**40, 0.5, -0.5, 1.5, 2.5, 0.04, -0.04, 0.0004, -0.0004,
          0.05, 0.005, 999.95, 1234.5678, -1234.5678, 1e9 + 0.5, 3.0, -3.0, 1e15, float("inf"), float("-inf"), float("nan")]


@pytest.mark.parametrize("digits", [0, 1, 2, 3])
def test_num_reproduces_every_old_format(digits):
    for x, sign in itertools.product(VALUES, (False, True)):
        assert num(x, digits, sign=sign) == old_markdown(x, digits, sign=sign) == old_html(x, digits, sign=sign), (x, digits, sign)
        assert num(x, digits, sign=sign, missing=HYPHEN) == old_console_diff(x, digits, sign=sign), (x, digits, sign)
        # the summary's tables never meet an exact -0.0: summary.json's times are integer ns / 1000
        if not (isinstance(x, float) and x == 0 and math.copysign(1, x) < 0):
            assert num(x, digits, missing=HYPHEN) == old_console(x, digits), (x, digits)


def test_percentages():
    assert [pct(3.21), pct(-0.04), pct(None), pct(None, missing="")] == ["+3.2%", "-0.0%", "–", ""]
    assert pct(41.04, sign=False) == "41.0%" == f"{41.04:.1f}%"
    assert ratio_pct(1.032) == "+3.2%" and ratio_pct(None, missing="n/a") == "n/a"


# --- the renderers ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("renderers")
    base = summarize(decode_trace(BASE), tmp, "base")
    topk = summarize(decode_trace([(n, 20 if n == "topk_select" else d) for n, d in BASE], period=380), tmp, "topk")
    both = summarize(decode_trace([(n, 20 if n == "topk_select" else d) for n, d in BASE], sync=True, n=8, period=450), tmp, "both")
    return [("base", base), ("topk", topk), ("both", both)]


@pytest.fixture(scope="module")
def diff(runs):
    return diff_doc(compare_summaries(runs[0][1], runs[1][1], opt="topk_v2", catalog=CATALOG, labels=("base", "topk")))


def _make(name):
    cls = get_renderer(name)
    return cls(Console(file=io.StringIO(), width=100)) if name == "terminal" else cls()


@pytest.mark.parametrize("name", list(RENDERERS))
def test_every_renderer_takes_a_report_and_returns_text(name, diff):
    r = _make(name)
    assert isinstance(r, Renderer) and r.name == name and r.output_file_extension
    text = r.render(Report(diffs=[diff]))
    assert isinstance(text, str) and "topk" in text
    assert r.render(Report(diffs=[diff])) == text  # the same input, the same bytes


@pytest.mark.parametrize("path, name", [("c.md", "markdown"), ("r.html", "html"), ("d.json", "json"), ("REPORT.HTML", "html")])
def test_renderer_picked_by_suffix(path, name):
    assert renderer_for(path) is get_renderer(name)
    assert renderer_for(path).output_file_extension == path.rsplit(".", 1)[1].lower()


def test_unknown_suffix_or_name_is_a_usage_error():
    with pytest.raises(UsageError, match=r"\.txt"):
        renderer_for("out.txt")
    with pytest.raises(UsageError, match="pdf"):
        get_renderer("pdf")


def test_markdown_and_json_render_one_diff(runs, diff):
    for name in ("markdown", "json"):
        with pytest.raises(ValueError, match="one diff"):
            _make(name).render(Report(diffs=[diff], runs=runs))


def test_terminal_render_returns_what_show_prints(runs, diff):
    shown, rendered = io.StringIO(), io.StringIO()
    from profkit.report.terminal import TerminalRenderer

    TerminalRenderer(Console(file=shown, width=90)).show(Report(diffs=[diff], runs=runs[:1]))
    text = TerminalRenderer(Console(file=rendered, width=90)).render(Report(diffs=[diff], runs=runs[:1]))
    assert rendered.getvalue() == "" and shown.getvalue() == text
    assert "change in GPU window per iteration" in text and "per iteration" in text and "rank 0" in text


# --- the ladder ---------------------------------------------------------------------------------


def test_ladder_agrees_with_the_full_diffs(runs):
    steps = ladder_steps(runs)
    assert [s["label"] for s in steps] == ["base", "topk", "both"]
    first = runs[0][1]
    for i, ((_, s), step) in enumerate(zip(runs, steps)):
        d0 = diff_doc(compare_summaries(first, s))
        assert step["shape"] == d0["shape"]["label"]
        assert step["wall_us"] == d0["wall_us"]["candidate"] and step["gpu_window_us"] == d0["gpu_window_us"]["candidate"]
        if i == 0:
            assert step["wall_delta_vs_first_us"] is None and step["wall_delta_vs_previous_us"] is None
        else:
            assert step["wall_delta_vs_first_us"] == d0["wall_us"]["delta"]
            assert step["wall_delta_vs_previous_us"] == diff_doc(compare_summaries(runs[i - 1][1], s))["wall_us"]["delta"]
    assert steps[2]["wall_delta_vs_previous_us"] != steps[2]["wall_delta_vs_first_us"]  # the test tells the two apart


def test_a_ladder_needs_two_runs_and_html_needs_the_ladder(runs):
    assert ladder_steps(runs[:1]) == [] and ladder_steps([]) == []
    html = get_renderer("html")()
    with pytest.raises(ValueError, match="ladder"):
        html.render(Report(runs=runs))
    assert "Ladder" in html.render(Report(runs=runs, ladder=ladder_steps(runs)))
