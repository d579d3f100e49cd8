"""Busy time by the clock on every real trace under tests/data and ../shared/public-traces (DESIGN.md "Time inside a window").

The expected side is a plain computation over the raw events (gzip + json, no profkit code): the
union of every GPU op (kernel, memcpy, memset; any owner) inside each of profkit's GPU windows.
Summed over the iterations it must match profkit's gpu_busy_us within 0.5%, and every iteration
must keep the identities exactly (to the µs rounding of the JSON).
"""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import pytest

from profkit.analysis.summary import build_summary

from support import DATA, PUBLIC_TRACES, TRACELENS_STEPS, public_trace
from support.helpers import analyze_paths, raw_gpu_ops, union_inside

TRACES = sorted(p for d in ("gpu", "gpu_proxy", "gpu_tp2", "gpu_overlap") for p in (DATA / d).glob("*.json.gz")
                if not p.name.startswith("expected")) + [PUBLIC_TRACES / n for n in TRACELENS_STEPS]
@pytest.mark.parametrize("path", TRACES, ids=lambda p: f"{'public' if p.parent == PUBLIC_TRACES else p.parent.name}/{p.name}")
def test_busy_is_the_union_of_all_ops_inside_each_window(path: Path) -> None:
    if path.parent == PUBLIC_TRACES:
        path = public_trace(path.name)
    s = build_summary(analyze_paths([path], cache=False))
    r = s["ranks"][0]
    ops = raw_gpu_ops(path)
    t0 = round(Fraction(r["t0_us"]) * 1000)
    mine = theirs = 0.0
    for it in r["iterations"]:
        assert it["gpu_window_us"] == pytest.approx(it["gpu_busy_us"] + it["gpu_idle_us"], abs=2e-3)
        assert sum(it["category_us"].values()) - it["overlap_us"] == pytest.approx(it["gpu_busy_us"], abs=2e-3 * (1 + len(it["category_us"])))
        assert sum(it["phase_us"].values()) - it["overlap_us"] == pytest.approx(it["gpu_busy_us"], abs=2e-3 * (1 + len(it["phase_us"])))
        assert it["overlap_us"] >= -1e-3 and it["gpu_idle_us"] >= -1e-3 and it["bubble_us"] <= it["gpu_idle_us"] + 1e-3
        assert 0 <= it["spill_us"] <= it["owned_gpu_us"] + 1e-3
        if it["gpu_start_us"] is None:
            continue
        g0 = t0 + round(Fraction(it["gpu_start_us"]) * 1000)
        mine += it["gpu_busy_us"]
        theirs += union_inside(ops, g0, g0 + round(Fraction(it["gpu_window_us"]) * 1000)) / 1000
    assert mine == pytest.approx(theirs, rel=5e-3, abs=1.0)


def test_every_fixture_folder_is_covered() -> None:
    assert {p.parent.name for p in TRACES} >= {"gpu", "gpu_proxy", "gpu_tp2", PUBLIC_TRACES.name}
