"""Issue 30 on every fixture pair: the decomposition by ownership with the backlog term adds up in each
profile window; the numbers a report shows are the numbers its verdicts were computed on; and, on the
H200 fixtures, a plain script (tests/data/gpu_loo/plain_owned.py: stdlib, no profkit code) that sums
owned GPU time per category over the compared iterations from the raw traces agrees with
summary.json's owned_category_us within 0.5%."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from profkit.cli import app

DATA = Path(__file__).parent / "data"
LOO = DATA / "gpu_loo"
PROXY = DATA / "gpu_proxy"

# (baseline, candidate, --opt): every pair of recordings the fixtures hold (benchmarks/golden.py's pairs)
PAIRS = [
    *[(PROXY / "baseline.trace.json.gz", PROXY / f"{o}.trace.json.gz", o) for o in ("topk_v2", "indexer_fusion", "cuda_graph")],
    (PROXY / "loo_topk_v2_before.trace.json.gz", PROXY / "loo_topk_v2_after.trace.json.gz", "topk_v2"),
    *[(d, LOO / "all", d.name.removeprefix("all-")) for d in sorted(LOO.glob("all-*"))],
    (DATA / "gpu" / "eager_decode.pt.trace.json.gz", DATA / "gpu" / "graph_decode.pt.trace.json.gz", None),
    (DATA / "gpu" / "eager_sync.pt.trace.json.gz", DATA / "gpu" / "graph_decode.pt.trace.json.gz", None),
]


def _diff(tmp_path: Path, monkeypatch, before: Path, after: Path, opt: str | None) -> tuple[dict, str]:
    monkeypatch.setenv("PROFKIT_NO_CACHE", "1")
    out, md = tmp_path / "d.json", tmp_path / "d.md"
    args = ["diff", str(before), str(after), "--json", str(out), "--md", str(md)] + (["--opt", opt, "--catalog", "proxy"] if opt else [])
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    return json.loads(out.read_text()), md.read_text()


def _identity_residual(t: dict) -> float:
    return t["gpu_window_us"] - (sum(t["category_us"].values()) - t["overlap_us"] + sum(t["idle_us_by_cause"].values()) + t["backlog_us"])


@pytest.mark.parametrize("before,after,opt", PAIRS, ids=lambda x: getattr(x, "name", str(x)))
def test_identity_and_the_numbers_the_verdicts_use(tmp_path, monkeypatch, before, after, opt):
    d, md = _diff(tmp_path, monkeypatch, before, after, opt)
    dec = d["decomposition"]
    assert dec["basis"] == "ownership" and dec["exact"] is True
    # the identity with the backlog term, in every profile window pair, from diff.json's own figures
    assert dec["per_window"] and all(abs(_identity_residual(p)) <= 0.01 for p in dec["per_window"]), dec["per_window"]
    if dec["windows"] == 1:  # one window a side: the figures are that window's, so the identity holds on them too
        top = {"gpu_window_us": dec["gpu_window_us"]["delta"], **{k: dec[k] for k in ("category_us", "overlap_us", "idle_us_by_cause", "backlog_us")}}
        assert abs(_identity_residual(top)) <= 0.01
    # the figures the verdicts were computed on are the figures the decomposition shows
    noise = d["noise"]
    if noise["available"]:
        m = noise["metrics"]
        for k, v in dec["category_us"].items():
            assert m[f"category_us.{k}"]["delta"] == pytest.approx(v, abs=1e-9) and dec["spread_us"]["category_us"][k] == pytest.approx(m[f"category_us.{k}"]["spread"], abs=1e-9)
        for k, v in dec["idle_us_by_cause"].items():
            assert m[f"idle_us_by_cause.{k}"]["delta"] == pytest.approx(v, abs=1e-9)
        for k, v in dec["phase_us"].items():
            assert m[f"phase_us.{k}"]["delta"] == pytest.approx(v, abs=1e-9)
        assert m["backlog_us"]["delta"] == pytest.approx(dec["backlog_us"], abs=1e-9)
        assert m["gpu_window_us"]["delta"] == pytest.approx(dec["gpu_window_us"]["delta"], abs=1e-9) == pytest.approx(d["gpu_window_us"]["delta"], abs=1e-9)
    else:
        assert all(v is None for v in dec["spread_us"]["category_us"].values())
    ee = d.get("expected_effect")
    if ee:
        for t in ee["own"]:
            group, _, key = t["term"].partition(".")
            assert t["delta_us"] == pytest.approx(dec[group][key], abs=1e-9)
            assert (t["as_expected"] is None) if not ee["judged"] else True
        for c in ee["changes"]:
            assert c["delta_us"] == pytest.approx(dec["category_us"][c["category"]], abs=1e-9)
        assert ee["ok"] is None if not ee["judged"] else ee["ok"] in (True, False)
        if not ee["judged"]:  # not judged: no pass box, no flag
            assert not ee["flags"] and not ee["against"] and "✅" not in md
    # ... and the report's table shows them, with the noise they were judged against
    for k, v in dec["category_us"].items():
        row = re.search(rf"^\| {re.escape(k.replace('_', chr(92) + '_'))} \| [^|]* \| [^|]* \| ([^|]+) \| ([^|]*) \|$", md, re.M)
        if row is None:  # a category cut from the comment to fit its size limit
            continue
        assert row.group(1).strip() == f"{v:+,.1f}".replace("+0.0", "0.0").replace("-0.0", "0.0") or float(row.group(1).replace(",", "")) == pytest.approx(v, abs=0.05)
        s = dec["spread_us"]["category_us"][k]
        if s is not None:
            assert f"±{s:,.1f}" in row.group(2)
    # the headline's first line says whether the own effect was judged
    first = next(ln for ln in md.splitlines() if ln.startswith("> **"))  # the headline, after the health banner
    if ee and ee.get("known") and not ee["judged"]:
        assert "not judged" in first and "--profile-windows" in first


def _compared(summary: dict) -> list[dict]:
    """The iterations a diff compares: verify bs=1 (the runs' shape), each rank's last left out."""
    its = summary["ranks"][0]["iterations"][:-1]
    return [i for i in its if i["kind"] == "verify" and i["batch_size"] == 1]


@pytest.mark.parametrize("run", sorted(p.name for p in LOO.glob("all*")))
def test_owned_category_time_agrees_with_a_plain_count(run):
    from support.helpers import analyze_paths
    from profkit.analysis.summary import build_summary
    from profkit.analysis.catalog import load_catalog

    d = LOO / run
    caps = sorted((d / "graph_capture_profile").glob("*.json.gz"))
    for w in sorted(d.glob("window-*")):
        plain = json.loads(subprocess.run([sys.executable, str(LOO / "plain_owned.py"), str(d), w.name.split("-")[1]],
                                          capture_output=True, text=True, check=True).stdout)
        s = build_summary(analyze_paths([w], catalog=load_catalog("proxy"), captures=caps or None, cache=False))
        its = _compared(s)
        assert [i["index"] for i in its] == plain["iterations"]
        ours: dict[str, float] = {}
        for i in its:
            for k, v in i["owned_category_us"].items():
                ours[k] = ours.get(k, 0.0) + v
        theirs = plain["owned_category_us"]
        assert set(ours) == set(theirs), (run, w.name)
        for k in ours:
            assert ours[k] == pytest.approx(theirs[k], rel=0.005), (run, w.name, k)
        # and by ownership the categories add up to the owned GPU time (their union) plus the owned overlap
        for i in its:
            assert sum(i["owned_category_us"].values()) - i["owned_overlap_us"] == pytest.approx(i["owned_gpu_us"], abs=0.002)


def test_windows_that_disagree_are_not_judged():
    """DESIGN.md "Judged, or not judged": a side whose profile windows disagree by more than the instability
    rule (2x in mean GPU window) gets no verdict, whatever the spreads; the median statistic and the exact
    per-window identity are unaffected."""
    from fractions import Fraction as F

    from msgspec import to_builtins

    from profkit.attribution.windows import decomposition, unstable_windows

    def w(window, topk):  # one window's exact means: topk plus idle make up the window, no backlog
        return {"gpu_window_us": F(window), "category_us.topk": F(topk), "idle_us_by_cause.launch": F(window - topk),
                "overlap_us": F(0), "backlog_us": F(0)}

    base, cand = [w(1000_000, 400_000), w(1100_000, 410_000), w(2500_000, 420_000)], [w(900_000, 300_000)] * 3
    why = unstable_windows(base, cand, 2.0)
    assert why and "baseline" in why and "2.5×" in why
    d = to_builtins(decomposition(base, cand, "ownership", unstable=why))
    assert d["judged"] is False and d["spread_us"]["category_us"]["topk"] is None
    assert d["category_us"]["topk"] == -110.0 and all(p["exact"] for p in d["per_window"])
    assert unstable_windows(base[:2], cand, 2.0) is None and to_builtins(decomposition(base[:2], cand[:2], "ownership"))["judged"] is True
