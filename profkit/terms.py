"""The names of the decomposition's terms that analysis, catalogs, attribution and the renderers share (no
profkit imports: a catalog checks its optimizations' phases and idle causes against these without loading
polars): the phases, the bubble causes, a slack breaker's name and a kernel shape's, written by analysis
into summary.json and read back as keys by attribution and the renderers."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

# where in the iteration an op ran (DESIGN.md "Phase"), in precedence order (profkit.analysis.phases)
PHASES = ("draft_extend", "draft", "verify", "decode", "extend", "sampling", "other")
# what a bubble waited for (DESIGN.md "Bubble"; profkit.analysis.bubbles). "python" only on a CPU-only
# timeline (analysis/rank.cpu_as_device): a gap between two aten ops inside an iteration is host time in
# Python (model glue, the sampler's bookkeeping, the scheduler), never a kernel launch
CAUSES = ("sync", "launch", "iteration_boundary", "gpu_wait", "python")

# an overlap-slack breaker that no recorded op covers (analysis/slack.py): Python between ops the trace did not record
UNCOVERED = "host code outside recorded ops"


def breaker_key(b: Mapping[str, Any] | Any) -> str:
    """One slack breaker (a dict as analysis/slack.py finds it, or a documents.Breaker) as its key:
    `sync cudaStreamSynchronize d2h (aten::item)`, `cpu aten::nonzero`; a step number (`ProfilerStep#7`) as N,
    so one span is one breaker across transitions."""
    get = b.get if isinstance(b, Mapping) else (lambda k: getattr(b, k, None))
    kind, name = get("kind"), get("name")
    if kind in ("sync", "sync_copy"):
        trigger = get("trigger")
        extra = " ".join(x for x in (get("direction"), f"({trigger})" if trigger else None) if x)
        return f"{kind} {name}{' ' + extra if extra else ''}"
    if kind == "host":
        return str(name)
    return f"{kind} {re.sub(r'#[0-9]+', '#N', name)}"


# Kineto's type names (c10's C++ spellings) -> the short ones a table shows
_DTYPES = {"c10::BFloat16": "bf16", "c10::Half": "f16", "float": "f32", "double": "f64", "c10::Float8_e4m3fn": "fp8e4m3",
           "c10::Float8_e5m2": "fp8e5m2", "long int": "i64", "int": "i32", "short int": "i16", "signed char": "i8",
           "unsigned char": "u8", "bool": "bool"}


def shape_text(op: str | None, dims: str | None, dtypes: str | None) -> str:
    """A kernel's launching op and shape as a table shows it and the movers are keyed by (analysis/shapes.py
    records them): the op, its tensor inputs' dims joined by x and their types,
    `aten::mm [1,2048]x[2048,32000] bf16` ("" without one)."""
    if not op or dims is None:
        return ""
    try:
        d, t = json.loads(dims), json.loads(dtypes) if dtypes else []
    except ValueError:
        return f"{op} {dims}"
    tensors = [i for i, x in enumerate(d) if isinstance(x, list) and x]
    ds = "x".join("[" + ",".join(str(v) for v in d[i]) + "]" for i in tensors)
    ts = list(dict.fromkeys(_DTYPES.get(t[i], t[i]) for i in tensors if i < len(t) and isinstance(t[i], str) and t[i]))
    return " ".join(x for x in (op, ds, "/".join(ts)) if x)
