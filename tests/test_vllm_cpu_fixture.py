"""A real vLLM 0.32 CPU trace (tests/data/vllm_cpu: vllm-cpu 0.32.0, eager, chunked prefill at 48 tokens,
n-gram speculative decoding), checked against expected.json, which a plain stdlib script
(tests/data/vllm_cpu/expected.py) computed from the raw events: every step found with its kind
(speculative verify told from decode by generation_<n>(<tokens>)), the CPU op time of every step
accounted exactly, and "other" at most 10% of it (issue 27: it was ~80% with the generic catalog)."""

from __future__ import annotations

import json

import pytest

from support import VLLM_CPU_DATA
from profkit.analysis import analyze_trace
from profkit.analysis.summary import build_summary
from profkit.analysis.catalog import load_catalog
from profkit.ingest import load_trace

TRACE = VLLM_CPU_DATA / "eager_chunked_ngram.pt.trace.json.gz"
EXPECTED = json.loads((VLLM_CPU_DATA / "expected.json").read_text())[TRACE.name]


@pytest.fixture(scope="module")
def rank() -> dict:
    return build_summary([analyze_trace(load_trace(TRACE))])["ranks"][0]


def test_every_step_is_an_iteration_of_its_kind(rank):
    its = rank["iterations"]
    assert len(its) == EXPECTED["steps"] == 12
    assert [i["kind"] for i in its] == EXPECTED["kinds"]
    assert [i["batch_size"] for i in its] == [e["batch_size"] for e in EXPECTED["iterations"]]
    assert "verify" in EXPECTED["kinds"] and "mixed" in EXPECTED["kinds"] and "extend" in EXPECTED["kinds"]


def test_cpu_op_time_is_accounted_and_other_is_at_most_a_tenth(rank):
    """The vLLM catalog is picked by its op names; the categories of each step sum to the plain
    script's outermost-op time inside the step's window; "other" holds <= 10% of all of it."""
    assert rank["catalog"] == "vllm" and rank["device_timeline"] == "cpu"
    total = other = 0.0
    for it, exp in zip(rank["iterations"], EXPECTED["iterations"]):
        cats = it["category_us"]
        assert sum(cats.values()) == pytest.approx(exp["op_ns"] / 1000, abs=0.01)
        total += sum(cats.values())
        other += cats.get("other", 0.0)
    assert total > 0 and other / total <= 0.10


def test_the_op_names_that_dominate_are_categorized_by_name():
    """The top names of the plain count (by time), each in the category a reader expects."""
    names: dict[str, int] = {}
    for it in EXPECTED["iterations"]:
        for n, t in it["op_ns_by_name"].items():
            names[n] = names.get(n, 0) + t
    top = sorted(names, key=lambda n: -names[n])[:6]
    assert {"_C::weight_packed_linear", "_C::onednn_mm", "vllm::unified_attention_with_output", "vllm::unified_kv_cache_update"} <= set(top)
    cat = load_catalog("vllm")
    want = {"_C::weight_packed_linear": "gemm", "_C::onednn_mm": "gemm", "vllm::unified_attention_with_output": "attention",
            "vllm::unified_kv_cache_update": "attention", "aten::mean": "norm", "_C::greedy_argmax": "sampling",
            "_C::rejection_greedy_sample_kernel_impl": "sampling", "_C::rotary_embedding": "rope"}
    for n, c in want.items():
        assert n in names and cat.classify(n, "kernel", None)[0] == c, n


def test_gaps_between_cpu_ops_have_cpu_causes(rank):
    """No kernel was launched: a gap on a CPU-op timeline is Python (or the scheduler between steps),
    never "launch" or "gpu_wait"."""
    by = rank["bubbles_by_cause"]
    assert by["launch"]["count"] == 0 and by["gpu_wait"]["count"] == 0
    assert by["python"]["count"] > 0 and by["iteration_boundary"]["count"] > 0
    assert all(i["kernel_launches"] == 0 for i in rank["iterations"])


def test_verify_steps_are_the_verify_phase(rank):
    """The phase of every op comes from its step's kind: verify steps hold verify-phase time."""
    for it, kind in zip(rank["iterations"], EXPECTED["kinds"]):
        phases = {k: v for k, v in it["phase_us"].items() if v}
        if kind == "verify":
            assert phases.get("verify", 0) > 0 and "decode" not in phases
        if kind in ("extend", "mixed"):
            assert phases.get("extend", 0) > 0
