"""`profkit report SWEEP --md FILE` (issue 37 point 6): a sweep's PR comment, on a real proxy sweep recorded here
(a ladder of two optimizations, two profile windows a run) and on the H200 leave-one-out runs of tests/data/gpu_loo
(recorded --capture-only: each pair attributed here by `profkit diff`, as `profkit sweep` attributes its pairs).

Every figure of the comment is checked against the diff.json of its step and the ladder of the HTML report
(DESIGN.md "One statistic, everywhere"); the H200 topk_v2 step's own topk change also against a plain count of the
raw window traces (tests/data/gpu_loo/plain_owned.py: stdlib, no profkit code)."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
from markdown_it import MarkdownIt
from typer.testing import CliRunner

from support import DATA
from processes import free_port, run_to_end
from profkit.cli import app

LOO = DATA / "gpu_loo"
runner = CliRunner()
SMALL = ["--isl", "64", "--turns", "3", "--turn-tokens", "16", "--output-tokens", "24", "--num-steps", "4", "--profile-windows", "2"]


def _md(text: str) -> list:
    return MarkdownIt("commonmark", {"html": True}).enable("table").parse(text)


def _tables(text: str) -> list[list[list[str]]]:
    """Every table of the comment as rendered: rows of cell texts (the header row first)."""
    out, row, cell, table = [], None, None, None
    for t in _md(text):
        if t.type == "table_open":
            table = []
        elif t.type == "tr_open":
            row = []
        elif t.type == "inline" and row is not None and cell is not None:
            cell = "".join(c.content for c in t.children or [] if c.type in ("text", "code_inline"))
        elif t.type in ("th_open", "td_open"):
            cell = ""
        elif t.type in ("th_close", "td_close"):
            row.append(cell)
            cell = None
        elif t.type == "tr_close":
            table.append(row)
            row = None
        elif t.type == "table_close":
            out.append(table)
    return out


def _num(v: float) -> str:
    """As the comment writes a change (report/numbers.num, sign and one decimal): written here again, not imported."""
    return "0.0" if v == 0 else f"{v:+,.1f}"


def _status(diff: dict) -> str:
    """A step's own effect from its diff.json, read here from the raw fields."""
    ee = diff.get("expected_effect")
    terms = [t for t in (ee or {}).get("own") or [] if t["baseline_us"] or t["candidate_us"] or t["delta_us"]]
    if not ee or not ee.get("known") or not terms:
        return "no own term"
    if not ee["judged"]:
        return "not judged"
    if any(t["as_expected"] is False for t in terms):
        return "the wrong way"
    if any(t["as_expected"] is True for t in terms):
        return "as expected"
    return "within noise" if all(t["within_noise"] for t in terms) else "not judged"  # beyond the spread, under the floor


def check_comment(text: str, sweep_dir: Path) -> dict[str, list[list[str]]]:
    """What every sweep comment must be, checked against sweep.json and its diffs: the decision first (≤ 80 columns,
    bold, the steps' statuses counted from their diff.json), then the step table with each own term's change, noise
    and verdict as its diff has them; returns the step rows by step and the tables."""
    doc = json.loads((sweep_dir / "sweep.json").read_text())
    rows = doc["attribution"]
    diffs = [json.loads(Path(r["diff"]).read_text()) if Path(r["diff"]).is_file()
             else json.loads((sweep_dir / Path(r["diff"]).parent.name / "diff.json").read_text()) for r in rows]
    first = text.split("\n", 1)[0]
    assert len(first) <= 80 and first.startswith("**") and first.endswith("**"), first
    tokens = _md(text)
    kids = [c.type for c in tokens[1].children if c.type != "text" or c.content]
    assert tokens[0].type == "paragraph_open" and kids[0] == "strong_open" and kids[-1] == "strong_close", kids
    statuses = [_status(d) for d in diffs]
    short = {"the wrong way": "wrong way", "within noise": "in noise", "not judged": "unjudged", "no own term": "no own"}  # a long line's words
    for what in ("as expected", "the wrong way", "within noise", "not judged", "no own term"):
        n = statuses.count(what)
        assert (f"{n} {what}" in first or f"{n} {short.get(what, what)}" in first) is (n > 0), (what, first)
    flags = sum(len((d.get("expected_effect") or {}).get("flags") or []) for d in diffs)
    assert (f"{flags} flag" in first) if flags else "no flags" in first
    tables = _tables(text)
    steps = tables[0]
    assert steps[0][:5] == ["step", "own term", "Δ µs", "noise", "verdict"]
    labels = {r["run_id"]: r["label"] for r in doc["runs"]}
    by_step: dict[str, list[list[str]]] = {}
    current = None
    for r in steps[1:]:
        if r[0]:
            current = r[0]
        by_step.setdefault(current, []).append(r)
    assert len(by_step) == len(rows)
    for row, d in zip(rows, diffs):
        name = f"{labels[row['baseline']]} → {labels[row['candidate']]}"
        got = by_step[next(k for k in by_step if k.startswith(name))]
        ee = d["expected_effect"]
        own = [t for t in ee["own"] if t["baseline_us"] or t["candidate_us"] or t["delta_us"]]
        assert len(got) == max(len(own), 1)
        # the step's own window and wall change, the diff's statistic, with its noise verdict
        assert got[0][5].startswith(_num(d["decomposition"]["gpu_window_us"]["delta"]))
        assert got[0][6].startswith(_num(d["wall_us"]["delta"]))
        for r, t in zip(got, own):
            assert r[2] == _num(t["delta_us"])
            if not ee["judged"]:
                assert r[3] == "–" and r[4].startswith("not judged"), r
            else:
                assert r[3] == f"±{t['spread_us']:,.1f}"
                want = {True: "beyond noise, a decrease as expected", False: "beyond noise the WRONG way"}.get(t["as_expected"])
                assert r[4].startswith(want or ("within noise" if t["within_noise"] else "not judged: under the")), (r, t)
    return {"steps": steps, "ladder": tables[1]}


@pytest.fixture(scope="module")
def ladder_sweep(tmp_path_factory) -> Path:
    """A real proxy sweep: baseline, +topk_v2, +topk_v2+indexer_fusion, two profile windows each."""
    pytest.importorskip("torch")
    root = tmp_path_factory.mktemp("sweep")
    argv = [sys.executable, "-m", "profkit", "sweep", "--opts", "topk_v2,indexer_fusion", "--mode", "ladder", *SMALL,
            "--port", str(free_port()), "--traces-dir", "traces", "--reports-dir", "reports"]
    p = run_to_end(argv, cwd=root, env={**os.environ, "COLUMNS": "160"})  # PYTHONPATH kept: this checkout's profkit
    assert p.returncode == 0, p.stderr
    return next((root / "reports").glob("*-sweep-ladder"))


def test_a_ladder_sweeps_comment_has_each_steps_figures(ladder_sweep, tmp_path):
    """Run from another folder than the sweep's (sweep.json's paths are relative to where it ran): the comment's
    step rows are each step's diff, the ladder table is the HTML report's ladder, and a ladder step's change
    vs the previous run is that step's own diff's wall change."""
    md, html = tmp_path / "sweep.md", tmp_path / "sweep.html"
    r = runner.invoke(app, ["report", str(ladder_sweep), "--md", str(md), "-o", str(html)])
    assert r.exit_code == 0, r.output
    text = md.read_text()
    t = check_comment(text, ladder_sweep)
    doc = json.loads((ladder_sweep / "sweep.json").read_text())
    assert [row[0] for row in t["ladder"][1:]] == [x["label"] for x in doc["runs"]]
    ladder = t["ladder"]
    cols = ladder[0]
    prev = cols.index("Δ vs previous")
    for row, a in zip(ladder[2:], doc["attribution"]):
        d = json.loads((ladder_sweep / Path(a["diff"]).parent.name / "diff.json").read_text())
        assert row[prev] == _num(d["wall_us"]["delta"]), (row, a["label"])
    # the HTML report's ladder shows the same figures
    page = html.read_text()
    for row in ladder[1:]:
        assert row[cols.index("wall µs")] in page and row[-1] in page
    # and the sweep's own report.html, written by the sweep itself, and its report.md: this comment
    own = (ladder_sweep / "report.html").read_text()
    assert all(row[cols.index("wall µs")] in own for row in ladder[1:])
    assert (ladder_sweep / "report.md").read_text() == text


def test_report_md_refuses_what_is_not_one_sweep_or_one_diff(ladder_sweep, tmp_path):
    doc = json.loads((ladder_sweep / "sweep.json").read_text())
    a, b = (ladder_sweep.parent / Path(x["summary"]).parent.name for x in doc["runs"][:2])
    r = runner.invoke(app, ["report", str(a), str(b), "--md", str(tmp_path / "x.md"), "-o", str(tmp_path / "x.html")])
    assert r.exit_code == 2 and "--md writes the comment of one sweep folder or of one diff" in r.output
    assert not (tmp_path / "x.md").exists()
    # a sweep's comment is each step's diff, over every window: --window would show one beside them
    r = runner.invoke(app, ["report", str(ladder_sweep), "--window", "0", "--md", str(tmp_path / "x.md"), "-o", str(tmp_path / "x.html")])
    assert r.exit_code == 2 and "--md with --window" in r.output and not (tmp_path / "x.html").exists()
    # one step's attribution folder: that diff's own comment, as `profkit diff --md` writes it
    pair = ladder_sweep / Path(doc["attribution"][0]["diff"]).parent.name
    r = runner.invoke(app, ["report", str(pair), "--md", str(tmp_path / "one.md"), "-o", str(tmp_path / "one.html")])
    assert r.exit_code == 0, r.output
    assert (tmp_path / "one.md").read_text().count("### profkit diff:") == 1


@pytest.fixture(scope="module")
def h200_sweep(tmp_path_factory) -> Path:
    """The H200 leave-one-out runs as the sweep folder `profkit sweep --mode leave-one-out` writes: sweep.json
    (its runs: reports/<run>/summary.json, whose folder is the run's) and each pair's diff.json, attributed by
    `profkit diff` as the sweep attributes it (all-<opt> against all, --opt <opt>)."""
    opts = ["topk_v2", "indexer_fusion", "index_share", "overlap"]
    sweep = tmp_path_factory.mktemp("h200") / "reports" / "20261201-190608-proxy-sweep-leave-one-out"
    sweep.mkdir(parents=True)
    runs = [{"label": name, "run_id": name, "summary": str(LOO / name / "summary.json")} for name in ["all", *(f"all-{o}" for o in opts)]]
    rows = []
    for o in opts:
        pair = sweep / f"all-{o}__all"
        r = runner.invoke(app, ["diff", str(LOO / f"all-{o}"), str(LOO / "all"), "--opt", o, "--json", str(pair / "diff.json")])
        assert r.exit_code == 0, r.output
        rows.append({"label": f"all-{o}", "optimization": o, "baseline": f"all-{o}", "candidate": "all", "diff": str(pair / "diff.json")})
    (sweep / "sweep.json").write_text(json.dumps({"schema_version": 1, "kind": "sweep", "mode": "leave-one-out", "base": "on", "target": "proxy",
                                                  "optimizations": opts, "runs": runs, "attribution": rows, "status": "ok"}))
    return sweep


def test_the_h200_leave_one_out_comment(h200_sweep, tmp_path):
    md = tmp_path / "loo.md"
    r = runner.invoke(app, ["report", str(h200_sweep), "--md", str(md), "-o", str(tmp_path / "loo.html")])
    assert r.exit_code == 0, r.output
    text = md.read_text()
    t = check_comment(text, h200_sweep)
    assert "Leave-one-out: what each optimization is worth" in text
    first = text.split("\n", 1)[0]
    assert first.startswith("**leave-one-out sweep, 4 steps:") and "as expected" in first
    # each run against the first ("all"): a leave-one-out ladder's change is the step's diff reversed (all-<opt> → all)
    ladder = t["ladder"]
    first_col = ladder[0].index("Δ vs first")
    for row in ladder[2:]:
        d = json.loads((h200_sweep / f"{row[0]}__all" / "diff.json").read_text())
        assert row[first_col] == _num(-d["wall_us"]["delta"]), row
    # topk_v2's own topk change, against a plain count of the raw traces: per window the mean owned topk µs per compared
    # iteration, the change the median over the three window pairs
    def owned_topk(run: str, w: int) -> float:
        p = json.loads(subprocess.run([sys.executable, str(LOO / "plain_owned.py"), str(LOO / run), str(w)],
                                      capture_output=True, text=True, check=True).stdout)
        return p["owned_category_us"].get("topk", 0.0) / len(p["iterations"])

    plain = statistics.median(owned_topk("all", w) - owned_topk("all-topk_v2", w) for w in range(3))
    row = next(r for r in t["steps"] if r[0].startswith("all-topk_v2 → all"))
    assert row[1] == "topk" and row[4] == "beyond noise, a decrease as expected"
    assert float(row[2].replace(",", "")) == pytest.approx(plain, abs=0.1 + 0.005 * abs(plain))


def test_the_first_line_fits_80_columns_whatever_the_sweep(ladder_sweep):
    """However many steps, the decision line keeps every count and the flags within 80 columns (shorter words, never cut)."""
    from profkit.documents import diff_of
    from profkit.report.markdown_sweep import first_line

    doc = json.loads((ladder_sweep / "sweep.json").read_text())
    diffs = [json.loads((ladder_sweep / Path(a["diff"]).parent.name / "diff.json").read_text()) for a in doc["attribution"]]
    for mode in ("ladder", "one-at-a-time", "leave-one-out"):
        for k in (1, 3, 40, 400):
            many = diffs * k
            line = first_line(mode, [diff_of(d) for d in many])
            assert len(line) <= 80 and "…" not in line and line.endswith(("flags**", "flag**")), line
            statuses = [_status(d) for d in many]
            for what in set(statuses):
                assert f"{statuses.count(what)} " in line, (what, line)


def test_a_ladder_step_with_an_empty_profile_window_shows_its_diffs_figures(tmp_path):
    """A loaded CI run once recorded a profile window without one step of the compared shape: the diff leaves such a
    window out of its statistic, and the ladder's "Δ vs previous" must be that diff's (it took the median over every
    pair, the empty one included). Real H200 window summaries; the candidate's window 1 relabelled to share no shape."""
    import copy

    from profkit.attribution import ladder_steps
    from profkit.attribution.diff import compare_summaries

    def summary(folder: Path) -> dict:
        out = tmp_path / f"{folder.parent.name}-{folder.name}.json"
        r = runner.invoke(app, ["analyze", str(folder), "--no-cache", "--json", str(out)])
        assert r.exit_code == 0, r.output
        return json.loads(out.read_text())

    loo = DATA / "gpu_loo"
    a = [summary(loo / "all-topk_v2" / f"window-{i}") for i in (0, 1)]
    b = [summary(loo / "all" / f"window-{i}") for i in (0, 1)]
    odd = copy.deepcopy(b[1])
    for it in odd["ranks"][0]["iterations"]:
        it["kind"], it["batch_size"] = "extend", 999  # no shape the other run has
    b = [b[0], odd]
    steps = ladder_steps([("before", a[0]), ("after", b[0])], windows=[a, b])
    d = compare_summaries(a[0], b[0], baseline_repeats=a, candidate_repeats=b)
    assert steps[1]["wall_delta_vs_previous_us"] == d.wall_us.delta == steps[1]["wall_delta_vs_first_us"]
    assert steps[1]["wall_us"] == d.wall_us.candidate and steps[1]["shape"] == d.shape.label
    assert any("hold no iterations of the compared shape" in w for w in d.warnings)
