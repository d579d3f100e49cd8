"""SGLang's step-span grammars of 2026 (issue 36, DESIGN.md "Span grammars", docs/span-grammars.md).

A real H200 speculative-decoding trace (tests/data/gpu_spec: `scheduler.run_batch` windows holding
`draft`, `step[VERIFY bs=1]`, `draft_extend`) has its step spans rewritten here, on the fly, in each
form SGLang emitted in 2026, upper and lower case: every iteration keeps its kind, batch size and
every figure (phases included), the rank its catalog and speculative cost. A real eager decode
trace (tests/data/gpu) rewritten in the decode / prefill / mixed / idle forms, with roofline
suffixes, gets each form's kind and its fields per iteration. An unknown `step[...]` form is named
in one warning.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Callable

import pytest

from profkit.analysis.summarize import SummarizeOptions, summarize
from support.helpers import load_trace_json, save_trace_json

DATA = Path(__file__).parent / "data"
SPEC = next((DATA / "gpu_spec" / "all" / "window-0").glob("*.trace.json.gz"))
EAGER = DATA / "gpu" / "eager_decode.pt.trace.json.gz"
ANNOTATIONS = ("user_annotation", "gpu_user_annotation")  # Kineto writes each record_function on both sides


load, save = load_trace_json, save_trace_json


def rename(doc: dict, fn: Callable[[str], str]) -> dict:
    """A copy of the trace with every annotation named `n` renamed fn(n), CPU and GPU side alike."""
    out = copy.deepcopy(doc)
    for e in out["traceEvents"]:
        if e.get("cat") in ANNOTATIONS and isinstance(e.get("name"), str):
            e["name"] = fn(e["name"])
    return out


def summary_of(doc: dict, path: Path) -> dict:
    return summarize([save(doc, path)], SummarizeOptions(cache=False)).summary


def bs_of(name: str) -> str:
    m = re.search(r"bs=(\d+)", name)
    assert m, name
    return m.group(1)


# each 2026 grammar as a rewrite of the proxy's names (`draft`, `step[VERIFY bs=N]`, `draft_extend`),
# with the sglang source that emits it
def _g(verify: str, draft: str | None = None, draft_extend: str | None = None) -> Callable[[str], str]:
    def fn(n: str) -> str:
        if n.startswith("step[VERIFY "):
            return verify.format(bs=bs_of(n))
        if n == "draft" and draft is not None:
            return draft
        if n == "draft_extend" and draft_extend is not None:
            return draft_extend
        return n
    return fn


SPEC_GRAMMARS = {
    # build_step_span_name's mode name (sglang/srt/utils/profile_utils.py, 0.5.23): the target verify forward
    "TARGET_VERIFY": _g("step[TARGET_VERIFY bs={bs}]"),
    # PR 23419's lower-case forms: `step[<mode> bs=N]` for the other modes
    "target_verify lower case": _g("step[target_verify bs={bs}]"),
    "verify lower case": _g("step[verify bs={bs}]"),
    # PR 38630: the draft runner's steps are step[DRAFT ...], the target's verify step[VERIFY ...]; PR 32850's
    # draft-extend graph replay step[DRAFT_EXTEND_V2 bs=N]
    "PR 38630 + PR 32850": _g("step[VERIFY bs={bs}]", "step[DRAFT bs=1]", "step[DRAFT_EXTEND_V2 bs=1]"),
    "PR 38630 + PR 32850 lower case": _g("step[verify bs={bs}]", "step[draft bs=1]", "step[draft_extend_v2 bs=1]"),
    # PR 32212: a draft runner's step keeps its mode behind a `draft ` prefix (EAGLE drafts in DECODE mode)
    "PR 32212": _g("step[TARGET_VERIFY bs={bs}]", "draft step[DECODE bs=1]", "draft step[DRAFT_EXTEND bs=1]"),
    "PR 32212 lower case": _g("step[target_verify bs={bs}]", "draft step[decode bs=1]", "draft step[draft_extend bs=1]"),
    # PR 24911's roofline suffix after the batch (generation-side fields, as on an MTP decode step)
    "roofline suffix": _g("step[VERIFY bs={bs} g_sq=4 g_sk=8196 g_sqsq=16 g_sqsk=32784]", "draft step[DECODE bs=1 g_sqsq=1 g_sqsk=8193 g_sk=8193]"),
}


def _without_step_fields(summary: dict) -> list[dict]:
    return [{k: v for k, v in it.items() if k != "step"} for it in summary["ranks"][0]["iterations"]]


@pytest.fixture(scope="module")
def spec_doc() -> dict:
    return load(SPEC)


@pytest.fixture(scope="module")
def spec_original(spec_doc, tmp_path_factory) -> dict:
    return summary_of(spec_doc, tmp_path_factory.mktemp("orig") / "t.trace.json.gz")


def test_the_original_spec_trace_is_what_the_rewrites_are_held_to(spec_original):
    r = spec_original["ranks"][0]
    assert [(it["kind"], it["batch_size"]) for it in r["iterations"]] == [("verify", 1)] * 8
    assert all(set(it["owned_phase_us"]) >= {"draft", "verify", "draft_extend"} for it in r["iterations"])
    assert r["catalog"] == "proxy" and all("step" not in it for it in r["iterations"])


@pytest.mark.parametrize("grammar", list(SPEC_GRAMMARS))
def test_each_2026_grammar_gives_the_same_iterations_phases_and_catalog(grammar, spec_doc, spec_original, tmp_path):
    doc = rename(spec_doc, SPEC_GRAMMARS[grammar])
    names = {e["name"] for e in doc["traceEvents"] if e.get("cat") == "user_annotation"}
    assert "step[VERIFY bs=1]" not in names or grammar.startswith("PR 38630") or grammar == "roofline suffix"
    got = summary_of(doc, tmp_path / "t.trace.json.gz")
    a, b = spec_original["ranks"][0], got["ranks"][0]
    assert _without_step_fields(got) == _without_step_fields(spec_original)  # kinds, sizes, phases, every figure
    assert (b["catalog"], b["marker"]) == (a["catalog"], a["marker"])
    assert b.get("speculative") == a.get("speculative")
    assert got.get("speculative") == spec_original.get("speculative")
    assert not [w for w in b.get("warnings") or [] if "does not know" in w], b["warnings"]
    if grammar == "roofline suffix":
        # the verify step's fields per iteration (the draft steps' are not the iteration's)
        assert [it["step"] for it in b["iterations"]] == [{"g_sq": 4, "g_sk": 8196, "g_sqsq": 16, "g_sqsk": 32784}] * 8


@pytest.mark.parametrize("grammar", ["PR 38630 + PR 32850 lower case", "PR 32212 lower case"])
def test_step_spans_as_markers_without_run_batch(grammar, spec_doc, tmp_path):
    """Without `scheduler.run_batch` the target's step spans are the iterations; a draft runner's steps
    (step[DRAFT], draft step[...], step[DRAFT_EXTEND_V2]) are never iterations of their own."""
    bare = copy.deepcopy(spec_doc)
    bare["traceEvents"] = [e for e in bare["traceEvents"] if not (e.get("cat") in ANNOTATIONS and e.get("name") == "scheduler.run_batch")]
    want = summary_of(bare, tmp_path / "a" / "t.trace.json.gz")
    got = summary_of(rename(bare, SPEC_GRAMMARS[grammar]), tmp_path / "b" / "t.trace.json.gz")
    assert [(it["kind"], it["batch_size"]) for it in want["ranks"][0]["iterations"]] == [("verify", 1)] * 8
    assert _without_step_fields(got) == _without_step_fields(want)
    assert got["ranks"][0]["catalog"] == want["ranks"][0]["catalog"]


# --------------------------------------------------------------------------- decode / prefill / mixed / idle

@pytest.fixture(scope="module")
def eager_doc() -> dict:
    return load(EAGER)


EAGER_FORMS = {
    # name written for `step[DECODE bs=N]` -> (kind, batch size, step fields) per iteration
    "step[decode bs={bs}]": ("decode", None, None),  # PR 23419
    "step[DECODE bs={bs} g_sqsq={bs} g_sqsk=1234 g_sk=1234]": ("decode", None, {"g_sqsq": None, "g_sqsk": 1234, "g_sk": 1234}),  # PR 24911
    "step[prefill bs={bs} toks=777]": ("extend", None, {"toks": 777}),  # PR 23419
    "step[EXTEND bs={bs} toks=777 c_sqsq=603729 c_sqsk=603729 c_sk=777]": ("extend", None, {"toks": 777, "c_sqsq": 603729, "c_sqsk": 603729, "c_sk": 777}),
    "step[mixed bs={bs} ext=300 dec=3]": ("mixed", None, {"ext": 300, "dec": 3}),  # PR 23419
    "step[MIXED bs={bs} c=1 g=3 c_sq=300 c_sk=300 c_sqsq=90000 c_sqsk=90000 g_sq=3 g_sk=30 g_sqsq=3 g_sqsk=30]":
        ("mixed", None, {"c": 1, "g": 3, "c_sq": 300, "c_sk": 300, "c_sqsq": 90000, "c_sqsk": 90000, "g_sq": 3, "g_sk": 30, "g_sqsq": 3, "g_sqsk": 30}),
    "step[idle]": ("idle", 0, None),  # PR 23419
    "step[IDLE bs=0]": ("idle", 0, None),
}


@pytest.fixture(scope="module")
def eager_original(eager_doc, tmp_path_factory) -> dict:
    return summary_of(eager_doc, tmp_path_factory.mktemp("eager") / "t.trace.json.gz")


@pytest.mark.parametrize("form", list(EAGER_FORMS))
def test_decode_prefill_mixed_idle_forms_and_their_fields(form, eager_doc, eager_original, tmp_path):
    kind, bs, fields = EAGER_FORMS[form]
    doc = rename(eager_doc, lambda n: form.format(bs=bs_of(n)) if n.startswith("step[DECODE ") else n)
    got = summary_of(doc, tmp_path / "t.trace.json.gz")
    orig = eager_original["ranks"][0]["iterations"]
    its = got["ranks"][0]["iterations"]
    assert [it["kind"] for it in orig] == ["decode"] * len(orig) and len(its) == len(orig)
    assert [it["kind"] for it in its] == [kind] * len(orig)
    assert [it["batch_size"] for it in its] == [it["batch_size"] if bs is None else bs for it in orig]
    want = [None if fields is None else {k: (o["batch_size"] if v is None else v) for k, v in fields.items()} for o in orig]
    assert [it.get("step") for it in its] == want
    # every figure but the kind (and the phase it names) is the original's
    skip = {"kind", "batch_size", "step", "phase_us", "owned_phase_us"}
    assert [{k: v for k, v in it.items() if k not in skip} for it in its] == [{k: v for k, v in it.items() if k not in skip} for it in orig]
    phase = {"decode": "decode", "extend": "extend", "mixed": "extend", "idle": "other"}[kind]
    assert [set(it["owned_phase_us"]) for it in its] == [{phase if p == "decode" else p for p in o["owned_phase_us"]} for o in orig]


def test_an_unknown_step_form_is_named_in_one_warning(eager_doc, tmp_path):
    doc = rename(eager_doc, lambda n: f"step[FROBNICATE bs={bs_of(n)}]" if n.startswith("step[DECODE ") else n)
    got = summary_of(doc, tmp_path / "t.trace.json.gz")
    warns = [w for w in got["ranks"][0]["warnings"] if "does not know" in w]
    assert len(warns) == 1, got["ranks"][0]["warnings"]  # once for the trace, not per window or iteration
    assert "'step[FROBNICATE bs=N]' (8x)" in warns[0] and "docs/span-grammars.md" in warns[0]
    assert {it["kind"] for it in got["ranks"][0]["iterations"]} == {"unknown"}
