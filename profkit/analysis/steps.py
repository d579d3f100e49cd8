"""SGLang's step spans, every form of 2026 (DESIGN.md "Span grammars"; docs/span-grammars.md).

SGLang names the span around each model forward after its forward mode and batch; the form moved
between releases, and profkit reads all of them, case-insensitively:

- `step[DECODE bs=N]`, `step[EXTEND bs=N toks=T]`, `step[<MODE> bs=N]` (`TARGET_VERIFY`,
  `DRAFT_EXTEND`, `SPLIT_PREFILL`, `IDLE`, ...): `build_step_span_name` in
  `sglang/srt/utils/profile_utils.py` (the upper-case form, SGLang 0.5.23);
- `step[decode bs=N]`, `step[prefill bs=N toks=T]`, `step[mixed bs=N ext=T dec=D]`, `step[idle]`:
  sglang PR 23419, the first labelled forward steps;
- roofline suffixes after the batch (`roofline_annotations` profiles, sglang PR 24911,
  `build_roofline_suffix`): `g_sqsq= g_sqsk= g_sk=` on decode, `c_sqsq= c_sqsk= c_sk=` on extend,
  `c= g= c_sq= c_sk= c_sqsq= c_sqsk= g_sq= g_sk= g_sqsq= g_sqsk=` on mixed;
- `step[VERIFY ...]` for the target's verify and `step[DRAFT ...]` for every step of a draft runner
  (sglang PR 38630, merged 2026-09-09);
- `draft step[<MODE> ...]`: a draft runner's step of any mode (sglang PR 32212, proposed);
- `step[DRAFT_EXTEND_V2 bs=N]`: the multi-layer EAGLE draft-extend graph replay (sglang PR 32850).

`parse_step` reads one name into its mode, whether it is a draft runner's step, the kind of
iteration it makes (None for draft-side steps: they run inside the target's iteration) and its
`key=value` fields. A `step[...]` whose mode is none of these is `unrecognized` (named in a warning by
the iteration finder, never silently `unknown`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

# `draft ` (PR 32212), `step[`, the mode word, then the fields up to `]`
_STEP = re.compile(r"^(?P<draft>draft\s+)?step\[\s*(?P<mode>[A-Za-z_][A-Za-z0-9_]*)?(?P<rest>[^\]]*)", re.IGNORECASE)
_FIELD = re.compile(r"(?<![A-Za-z0-9_])([A-Za-z_][A-Za-z0-9_]*)=(\d+)")
STEP_PREFIX = r"(?i:^(?:draft\s+)?step\[)"  # a regex over span names: any step span, known form or not

# mode word (lower case) -> the iteration kind it makes; None: a draft-side step (no kind of its own)
TARGET_MODES: dict[str, str] = {
    "decode": "decode",
    "extend": "extend", "prefill": "extend", "split_prefill": "extend",
    "mixed": "mixed",
    "verify": "verify", "target_verify": "verify",
    "idle": "idle",
}
DRAFT_MODES: dict[str, str] = {  # mode word -> its phase (phases.py)
    "draft": "draft",
    "draft_extend": "draft_extend", "draft_extend_v2": "draft_extend",
}
# the iteration marker regex of the chain (iterations.MARKER_CHAIN): a target forward's step span
MARKER_REGEX = r"(?i:^step\[\s*(decode|extend|prefill|verify|target_verify|mixed|idle)\b)"


@dataclass(frozen=True)
class Step:
    mode: str  # as written (`DECODE`, `prefill`, ...)
    draft: bool  # a draft runner's step (`draft step[...]`, `step[DRAFT ...]`, `step[DRAFT_EXTEND...]`)
    kind: str | None  # the iteration kind it makes; None for draft-side steps and unrecognized modes
    batch_size: int | None
    fields: dict[str, int] = field(default_factory=dict)  # every key=value but bs: toks, ext, dec, c_*, g_*
    recognized: bool = True


def parse_step(name: str) -> Step | None:
    """The step span `name` read, or None when it is no `step[...]` span at all."""
    m = _STEP.match(name)
    if m is None:
        return None
    mode = m.group("mode") or ""
    key = mode.lower()
    vals = {k.lower(): int(v) for k, v in _FIELD.findall(m.group("rest") or "")}
    bs = vals.pop("bs", None)
    if key == "idle" and bs is None:
        bs = 0  # PR 23419's `step[idle]`: no request on this rank
    prefixed = m.group("draft") is not None
    if key in TARGET_MODES and not prefixed:
        return Step(mode, False, TARGET_MODES[key], bs, vals)
    if key in DRAFT_MODES or (prefixed and key in TARGET_MODES):
        return Step(mode, True, None, bs, vals)
    return Step(mode, prefixed, None, bs, vals, recognized=False)


def step_form(name: str) -> str:
    """A step span's name with its numbers as N: the form a warning names (`step[FOO bs=N]`)."""
    return re.sub(r"\d+", "N", name)[:80]
