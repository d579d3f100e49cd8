"""Issue 38: summary.json's newer sections are read by field (documents.Health, OverlapSlack, SpecCost, CrossRank,
RunSection, Manifest), worded in report/ only, and a loaded summary is never changed in place."""

from __future__ import annotations

import copy

from profkit.documents import CrossRank, Health, OverlapSlack, SpecCost, manifest_of, run_of, summary_of
from profkit.flows.inputs import with_manifest
from profkit.report.capture_view import slack_line, summary_lines
from profkit.report.health_text import doubted, health_diff_line, health_text

HEALTH = {"verdict": "degraded", "metrics": ["category_us", "wall_us"],
          "findings": [{"check": "profiler_overhead", "status": "degraded", "metrics": ["wall_us"],
                        "detail": "the profiled window ran 3.10x slower per token than the unprofiled passes"}],
          "cut_markers_dropped": 0}
SLACK = {"transitions": [{"from": 0, "to": 1, "kind": "decode", "slack_us": -12.5, "exposed_host_us": 12.5,
                          "broken_by": [{"kind": "cpu", "name": "aten::nonzero", "us": 12.5}]}],
         "count": 1, "median_us": -12.5, "p10_us": -12.5, "p1_us": -12.5, "exposed_share": 1.0, "exposed_us": 12.5,
         "exposed_us_mean": 12.5, "exposed_us_by_breaker": [{"breaker": "cpu aten::nonzero", "us": 12.5}]}
SPEC = {"verify_iterations": 4, "owned_phase_us": {"draft": 40.0, "verify": 60.0, "draft_extend": 10.0, "other": 2.0}, "wall_us": 300.0,
        "accept_length": 2.0, "accept_source": "window", "window": 0,
        "phase_us_per_accepted_token": {"draft": 20.0, "verify": 30.0, "draft_extend": 5.0, "other": 1.0},
        "gpu_us_per_accepted_token": 56.0, "wall_us_per_accepted_token": 150.0}
CROSS = {"ranks": [0, 1], "aligned_iterations": 1, "clock_offsets_us": {"0": 0.0, "1": 0.1}, "iterations": [{"index": 0, "spread_us": 2.0}],
         "stragglers": [{"rank": 1, "times_straggler": 1, "mean_wait_caused_us": 2.0, "mean_comm_wait_us": 0.5}], "warnings": ["w"]}


def _summary() -> dict:
    return {"schema_version": 3, "ranks": [{"rank": 0, "iterations": [], "overlap_slack": SLACK}, {"rank": 1, "iterations": []}],
            "health": HEALTH, "speculative": SPEC, "cross_rank": CROSS,
            "run": {"run_id": "r1", "label": "+overlap", "window": 0, "versions": {"gpu": "H200"}}}


def test_the_sections_decode_to_their_types():
    s = summary_of(_summary())
    assert isinstance(s.health, Health) and isinstance(s.speculative, SpecCost) and isinstance(s.cross_rank, CrossRank)
    assert isinstance(s.ranks[0].overlap_slack, OverlapSlack) and s.ranks[1].overlap_slack is None
    assert s.ranks[0].overlap_slack.transitions[0].from_ == 0 and s.ranks[0].overlap_slack.transitions[0].broken_by[0].name == "aten::nonzero"
    assert s.health.doubts("category_us.gemm") and s.health.doubts("wall_us") and not s.health.doubts("gpu_kernels")
    run = run_of(s.run)
    assert run is not None and (run.run_id, run.label, run.window) == ("r1", "+overlap", 0)
    m = manifest_of({"versions": {"gpu": "H200"}, "anything": [1, 2]})
    assert m is not None and m.versions is not None and m.versions.gpu == "H200"
    assert run_of("not a section") is None and manifest_of(None) is None


def test_health_in_words_is_the_same_for_a_summary_and_a_diff_side():
    typed = summary_of(_summary()).health
    assert health_text(typed) == health_text(HEALTH) == ("capture health degraded: the profiler slowed this run 3.1×; host-side idle "
                                                         "terms (†) carry its cost")
    assert health_diff_line(typed, HEALTH) == health_diff_line(HEALTH, HEALTH)
    assert doubted(HEALTH, "wall_us") and doubted(typed, "wall_us") and not doubted(None, "wall_us")
    assert health_text(None).startswith("health: unchecked")


def test_the_capture_lines_read_the_typed_sections():
    s = summary_of(_summary())
    line = slack_line(s.ranks[0].overlap_slack)
    assert line is not None and "exposed by cpu aten::nonzero 12.5 µs" in line and slack_line(None) is None
    lines = summary_lines(s)
    assert any(x.startswith("rank 0: Overlap slack") for x in lines)
    assert any(x.startswith("Speculative cost per accepted token (accept length 2.00)") for x in lines)


def test_a_loaded_summary_is_not_changed_in_place():
    doc = _summary()
    before = copy.deepcopy(doc)
    got = with_manifest(doc, {"run_id": "r1"})
    assert doc == before and got is not doc and got["manifest"] == {"run_id": "r1"} and list(got)[-1] == "manifest"
    assert with_manifest(got, {"run_id": "other"}) is got and with_manifest(doc, None) is doc
