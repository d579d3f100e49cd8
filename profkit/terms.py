"""The names of the decomposition's terms and per-iteration figures that analysis, catalogs, attribution and the
renderers share (no profkit imports: a catalog checks its optimizations' phases and idle causes against these without
loading polars): the phases, the bubble causes, the per-iteration figures, a slack breaker's name and a kernel shape's,
written by analysis into summary.json and read back as keys by attribution and the renderers."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any, NamedTuple

# where in the iteration an op ran (DESIGN.md "Phase"), in precedence order (profkit.analysis.phases)
PHASES = ("draft_extend", "draft", "verify", "decode", "extend", "sampling", "other")
# what a bubble waited for (DESIGN.md "Bubble"; profkit.analysis.bubbles). "python" only on a CPU-only
# timeline (analysis/rank.cpu_as_device): a gap between two aten ops inside an iteration is host time in
# Python (model glue, the sampler's bookkeeping, the scheduler), never a kernel launch
CAUSES = ("sync", "launch", "iteration_boundary", "gpu_wait", "python")


class PerIteration(NamedTuple):
    """A per-iteration figure, declared once: summary.json's iteration field (``memcpy_d2h`` is memcpy["d2h"]) and
    diff.json's key under `counts` or `timings`. The diff (attribution/diff.py), its renderers (terminal, HTML,
    Markdown, the figures), a single run's table (RUN_TABLE), the Perfetto export's iteration slices and diff.json's
    `series` iterate PER_ITERATION, so a new count is one line here (and its key in RUN_TABLE to be in a run's table)
    plus its computation (analysis/rank.py, analysis/summary.py) and its field on documents.Iteration."""
    key: str
    unit: str  # "count" or "µs"
    label: str  # in words, as a diff's tables say it (a GPU timeline's; report/vocab.py words gpu_kernels per timeline)
    kind: str  # "count": diff.json's counts (the median per iteration); "timing": its timings (the median µs)
    gpu_only: bool = False  # a CPU-only timeline never has it (the banner says it is 0): not listed for one
    series: bool = False  # in diff.json's `series` (every iteration, for the per-iteration figure)
    panel: int | None = None  # the per-iteration figure's panel: 1 launches, 2 syncs and bubbles; None: not drawn
    card: bool = False  # a headline card of the HTML diff
    md_label: str | None = None  # a timing's label in the Markdown diff; None: not in its table
    run_label: str | None = None  # its words in a single run's "per iteration" table (None: `label`); RUN_TABLE orders that table
    perfetto: str | None = None  # the iteration slice of a Perfetto export that carries it as an argument: "cpu" or "gpu" (None: neither)


PER_ITERATION = (
    PerIteration("gpu_kernels", "count", "GPU kernels", "count", series=True, perfetto="gpu"),
    PerIteration("kernel_launches", "count", "kernel launches", "count", gpu_only=True, series=True, panel=1, card=True, perfetto="cpu"),
    PerIteration("graph_launches", "count", "graph launches", "count", gpu_only=True, series=True, panel=1, perfetto="cpu"),
    PerIteration("syncs", "count", "host syncs", "count", gpu_only=True, series=True, panel=2, card=True, run_label="syncs", perfetto="cpu"),
    PerIteration("sync_copies", "count", "blocking copies", "count", gpu_only=True, series=True, panel=2, run_label="sync copies",
                 perfetto="cpu"),
    PerIteration("memcpy_d2h", "count", "D2H copies", "count", gpu_only=True),
    PerIteration("memcpy_h2d", "count", "H2D copies", "count", gpu_only=True),
    PerIteration("bubble_count", "count", "bubbles", "count", series=True, panel=2, card=True, perfetto="gpu"),
    PerIteration("launch_us", "µs", "launch host µs", "timing", md_label="launch host µs"),
    PerIteration("launch_latency_us_p50", "µs", "launch latency p50 µs", "timing"),
    PerIteration("sync_us", "µs", "sync µs", "timing", md_label="sync blocked µs"),
    PerIteration("sync_copy_us", "µs", "sync copy µs", "timing"),
    PerIteration("bubble_us", "µs", "bubble µs", "timing", md_label="bubble µs", perfetto="gpu"),
)
# a single run's "per iteration" table (report/terminal.py), after its window rows: these figures, in this order (the
# memcpy counts follow, by direction)
RUN_TABLE = ("gpu_kernels", "kernel_launches", "graph_launches", "launch_us", "launch_latency_us_p50", "syncs", "sync_us",
             "sync_copies", "bubble_count", "bubble_us")
RUN_ROWS = tuple(next(f for f in PER_ITERATION if f.key == k) for k in RUN_TABLE)
COUNT_KEYS = tuple(f.key for f in PER_ITERATION if f.kind == "count")
TIMING_KEYS = tuple(f.key for f in PER_ITERATION if f.kind == "timing")
# diff.json's `series`: each iteration's wall and window, then the counts drawn per iteration
SERIES_FIELDS = ("wall_us", "gpu_window_us", *(f.key for f in PER_ITERATION if f.series))
GPU_ONLY_COUNTS = tuple(f.key for f in PER_ITERATION if f.gpu_only)


def term_label(key: str) -> str:
    """A decomposition term's key in words: category_us.topk -> topk, phase_us.draft -> draft phase,
    idle_us_by_cause.sync -> sync idle."""
    group, _, name = key.partition(".")
    if not name:
        return key.removesuffix("_us")  # backlog_us -> backlog
    return {"phase_us": f"{name} phase", "idle_us_by_cause": f"{name.replace('_', ' ')} idle"}.get(group, name)


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
    return f"{kind} {re.sub(r'#[0-9]+', '#N', str(name))}"


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
