"""Phase: where in the iteration a GPU op ran, apart from what kind of kernel it is (DESIGN.md "Phase").

From the engine's spans (user annotations) that enclose the op's launch call on the launching
thread. SGLang 0.5.23 (`sglang/srt/utils/profile_utils.py` build_step_span_name,
`sglang/srt/speculative/eagle_worker_v2.py`): `draft` around the multi-step draft decode,
`draft_extend` around the draft-extend forward (its eager fallback holds a `step[DRAFT ...]`),
`step[VERIFY ...]` the target verify forward, `step[DECODE ...]`, `step[EXTEND|MIXED|...]`, and any
forward of a draft runner `step[DRAFT ...]`; the other 2026 forms, case-insensitively, as listed in
analysis/steps.py and docs/span-grammars.md. The proxy engine emits the same names. An op launched
under none of them (sampling helpers, metadata copies between the forwards, work outside every
iteration) is `other`; an enclosing `sample`/`sampling` span makes it `sampling`.
When spans of several phases enclose a launch, the first in PHASES' precedence wins (a
`step[DRAFT]` inside `draft_extend` is draft-extend work).
vLLM 0.32: the worker's step span `execute_context_<n>(<tokens>)_generation_<n>(<tokens>)` gives
the phase of everything in it by the step's kind (iterations.parse_kind): a speculative verify
step (`generation_1(4)`) `verify`, a decode step `decode`, a prefill or mixed step `extend`.
"""

from __future__ import annotations

import polars as pl

from profkit.analysis.iterations import parse_kind

_VLLM_SPAN = r"^execute_(\d+_)?context_"
_VLLM_PHASE = {"verify": "verify", "decode": "decode", "extend": "extend", "mixed": "extend"}

# (phase, regex over user_annotation names), in precedence order; SGLang's step spans in every form of
# 2026, case-insensitively (analysis/steps.py): `step[VERIFY|TARGET_VERIFY ...]`, `step[DRAFT ...]`
# (PR 38630), `draft step[<MODE> ...]` (PR 32212), `step[DRAFT_EXTEND_V2 ...]` (PR 32850),
# `step[decode|prefill|mixed ...]` (PR 23419). A draft-extend step is draft_extend, never draft.
_RULES: tuple[tuple[str, str], ...] = (
    ("draft_extend", r"^(draft_extend|spec\.draft_extend)\b|(?i:^(draft\s+)?step\[\s*draft_extend)"),
    # `draft` alone (\b: not draft_extend) or with no bracket after it; a draft runner's step of a
    # target mode; `step[DRAFT ...]` (\b: not DRAFT_EXTEND)
    ("draft", r"^draft\b[^\[]*$|(?i:^draft\s+step\[\s*(decode|extend|prefill|split_prefill|mixed|verify|target_verify|idle|draft)\b)"
              r"|(?i:^step\[\s*draft\b)"),
    ("verify", r"(?i:^step\[\s*(verify|target_verify)\b)"),
    ("decode", r"(?i:^step\[\s*decode\b)"),
    ("extend", r"(?i:^step\[\s*(extend|mixed|split_prefill|prefill)\b)"),
    ("sampling", r"^(sample|sampling)\b"),
)


def op_phases(ops: pl.DataFrame, cpu: pl.DataFrame) -> pl.Series:
    """The phase of each op (a String Series, ops' order) from the spans around its launch
    (ops' launch_ts_ns / launch_tid; an op without a launch call is `other`)."""
    ann = cpu.select("name", "ts_ns", "end_ns", "tid", "cat").filter(pl.col("cat") == "user_annotation").drop("cat")
    pts = ops.select(pl.int_range(0, pl.len(), dtype=pl.Int64).alias("_i"), pl.col("launch_ts_ns").alias("t"),
                     pl.col("launch_tid").cast(pl.String).alias("tid"))
    if ann.height == 0 or ops.height == 0:
        return pl.repeat("other", ops.height, dtype=pl.String, eager=True).alias("phase")
    pts = pts.filter(pl.col("t").is_not_null() & pl.col("tid").is_not_null()).sort("t")
    # launches on one thread (the common case): matched by time alone, to that thread's spans
    one_tid = pts["tid"][0] if pts.height and pts["tid"].min() == pts["tid"].max() else None
    by = None if one_tid is not None else "tid"
    if one_tid is not None:
        pts = pts.drop("tid")
    # vLLM's step spans: the phase is the step's kind, read from the numbers in the name (which a
    # regex cannot compare), once per distinct name
    vllm: dict[str, list[str]] = {}
    for n in ann.filter(pl.col("name").str.contains(_VLLM_SPAN))["name"].unique().to_list():
        ph = _VLLM_PHASE.get(parse_kind(n)[0] or "")
        if ph:
            vllm.setdefault(ph, []).append(n)
    code = pl.repeat(len(_RULES), ops.height, dtype=pl.UInt8, eager=True)  # a rule's position; len(_RULES): other
    for r, (name, regex) in enumerate(_RULES):
        spans = (
            ann.filter(pl.col("name").str.contains(regex) | pl.col("name").is_in(vllm.get(name, [])))
            .select(pl.col("ts_ns").alias("t"), "end_ns", pl.col("tid").cast(pl.String))
            .sort("t")
        )
        if one_tid is not None:
            spans = spans.filter(pl.col("tid") == one_tid).drop("tid")
        if spans.height == 0 or pts.height == 0:
            continue
        # spans of one phase do not nest on a thread: the latest one starting at or before the
        # launch encloses it when it has not ended yet
        joined = pts.join_asof(spans, on="t", by=by, strategy="backward", check_sortedness=False)
        hit = (joined["end_ns"] >= joined["t"]).fill_null(False)
        if not hit.any():
            continue
        code.scatter(pts["_i"].filter(hit), r)  # the ops a rule takes are not offered to the later ones
        pts = pts.filter(~hit)
    return pl.Series("phase", [name for name, _ in _RULES] + ["other"], dtype=pl.String).gather(code)
