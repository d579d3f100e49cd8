"""Speculative cost per accepted token on real H200 traces (tests/data/gpu_spec, README there): index_share's
diff states draft GPU µs per accepted token for both sides, and each window's figure equals a plain second
opinion: owned draft-phase GPU time per verify iteration from the raw events (tests/data/gpu_loo/plain_phases.py,
stdlib, no profkit code) over the accepted length recomputed from the manifest's raw counts."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys

import pytest

from support import DATA, ROOT

SPEC = DATA / "gpu_spec"
sys.path.insert(0, str(DATA / "gpu_loo"))
import plain_phases  # noqa: E402  (the second opinion beside its fixture)


@pytest.fixture(scope="module")
def diff(tmp_path_factory) -> tuple[dict, str]:
    out = tmp_path_factory.mktemp("spec") / "diff.json"
    r = subprocess.run([sys.executable, "-m", "profkit", "diff", str(SPEC / "all-index_share"), str(SPEC / "all"), "--opt", "index_share",
                        "--json", str(out)], capture_output=True, text=True, cwd=ROOT, env={"PROFKIT_NO_CACHE": "1", "PATH": "/usr/bin:/bin", "COLUMNS": "200"})
    assert r.returncode == 0, r.stderr
    return json.loads(out.read_text()), r.stdout


def _plain(side: str) -> list[tuple[float, float]]:
    """Per window: (draft µs per verify iteration, accepted length) from the raw events and the manifest's counts."""
    manifest = json.loads((SPEC / side / "manifest.json").read_text())
    out = []
    for i, w in enumerate(manifest["profiler_overhead"]["windows"]):
        its = plain_phases.per_iteration(str(next((SPEC / side / f"window-{i}").glob("*.trace.json.gz"))))
        a = w["accept"]
        out.append((statistics.mean(it.get("draft", 0.0) for it in its), (a["completion_tokens"] - a["requests"]) / a["spec_verify_ct"]))
    return out


@pytest.mark.parametrize(("side", "run"), [("baseline", "all-index_share"), ("candidate", "all")])
def test_draft_per_accepted_token_equals_the_plain_count(diff, side, run):
    windows = diff[0]["speculative"][side]["windows"]
    plain = _plain(run)
    assert len(windows) == len(plain) == 3
    for w, (draft_us, accept) in zip(windows, plain):
        assert w["accept_length"] == pytest.approx(accept, rel=1e-9)
        assert w["owned_phase_us"]["draft"] == pytest.approx(draft_us, rel=0.005)
        assert w["phase_us_per_accepted_token"]["draft"] == pytest.approx(draft_us / accept, rel=0.005)


def test_the_diff_states_draft_us_per_accepted_token_for_both_sides(diff):
    d, text = diff
    b = statistics.median(x / a for x, a in _plain("all-index_share"))
    c = statistics.median(x / a for x, a in _plain("all"))
    assert c < b  # index_share reuses the draft's top-k: less draft GPU time per accepted token
    line = next(ln for ln in text.splitlines() if "draft GPU µs per accepted token" in ln)
    assert f"{b:,.1f} → {c:,.1f}" in line, line
