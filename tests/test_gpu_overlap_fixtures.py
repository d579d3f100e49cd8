"""tests/data/gpu_overlap: the committed traces still give the committed expected.json under the
folder's own stdlib checker, and show what they were recorded to show (no profkit code involved)."""

import importlib.util
import json

import pytest

from support import DATA

HERE = DATA / "gpu_overlap"


def _checker():
    spec = importlib.util.spec_from_file_location("gpu_overlap_check", HERE / "check.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


EXPECTED = json.loads((HERE / "expected.json").read_text())["traces"]


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_checker_reproduces_expected(name):
    check = _checker()
    res = check.analyze(str(HERE / name))
    exp = EXPECTED[name]
    assert check.checks(res) == [] == exp["checks_failed"]
    for key in ("iterations", "gpu_ops", "gpu_ops_outside_iterations", "gaps_ge_2us", "busy_share_min",
                "top_ops_by_idle_us", "top_ops_by_gap_count"):
        assert res[key] == exp[key], key
    assert res["per_iteration"] == exp["per_iteration"]


def test_what_the_fixtures_show():
    dec = EXPECTED["overlap_decode.trace.json.gz"]
    assert dec["iterations"] == 6 and all(r["step"] == "step[VERIFY bs=1]" for r in dec["per_iteration"])
    for r in dec["per_iteration"][:-1]:
        assert r["busy_share"] >= 0.95 and r["spill_us"] > 0
        assert len(r["streams"]) == 2  # the plan stream and the main stream
    con = EXPECTED["overlap_construction.trace.json.gz"]
    assert all(r["busy_share"] >= 0.98 for r in con["per_iteration"])
    gap = EXPECTED["eager_long_gap.trace.json.gz"]
    assert gap["top_ops_by_idle_us"][0][0] == "aten::sort"
    assert gap["top_ops_by_gap_count"][0][0] == "aten::mul" and gap["top_ops_by_gap_count"][0][1] >= 50
    assert gap["longest_gap_us"] > 4000
