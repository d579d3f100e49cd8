"""Iteration windows on the CPU timeline (DESIGN.md "Iteration").

An iteration is one scheduler step, marked by a CPU event whose name matches the marker regex.
Its window is [marker start, next marker start); the last ends at its marker's end. The default
marker is the first of a chain that matches: SGLang's `scheduler.run_batch`, SGLang's `step[...]`
spans, vLLM's `execute_...` spans, `ProfilerStep#N`; else the whole trace is one window (warned).
SGLang's step spans are read in every form of 2026, case-insensitively (analysis/steps.py).
"""

from __future__ import annotations

import bisect
import json
import re
from dataclasses import dataclass
from typing import cast

import polars as pl

from profkit.analysis.steps import MARKER_REGEX, STEP_PREFIX, parse_step, step_form
from profkit.errors import NothingToAnalyze
from profkit.ingest import Trace

MARKER_CHAIN: tuple[tuple[str, str], ...] = (
    ("SGLang scheduler.run_batch", r"^scheduler\.run_batch$"),
    ("SGLang step[...]", MARKER_REGEX),
    ("vLLM execute_...", r"^execute_"),
    ("ProfilerStep#N", r"^ProfilerStep#\d+$"),
)
WHOLE_TRACE = "<whole trace>"
STEP_0523 = r"^step\[(DECODE|EXTEND|VERIFY|MIXED)\b"  # the step markers before the 2026 forms (SGLang 0.5.23, the proxy)

# simple annotation: execute_context_<n>(<tokens>)_generation_<n>(<tokens>); detailed
# (detailed_trace_annotation): execute_<tokens>_context_<n>(sq<tokens>sk...)_generation_<n>(sq<tokens>sk...)
_VLLM = re.compile(r"^execute_(?:\d+_)?context_(\d+)\(.*?\)_generation_(\d+)\((?:sq)?(\d+)?")
_PRIORITY = {"verify": 0, "decode": 1, "mixed": 2, "extend": 3, "empty": 4, "idle": 5}
GRAPH_CAPTURE = "graph_capture"  # an iteration that captured a CUDA/HIP graph: its launches were recorded, its kernels did not run
_CAPTURE_BEGIN = re.compile(r"^(cuda|hip)StreamBeginCapture")

ITERATIONS_SCHEMA = {
    "iteration": pl.Int64, "cpu_start_ns": pl.Int64, "cpu_end_ns": pl.Int64, "marker": pl.String,
    "kind": pl.String, "batch_size": pl.Int64, "step": pl.String,
}


@dataclass(frozen=True)
class Iterations:
    frame: pl.DataFrame  # ITERATIONS_SCHEMA, sorted by cpu_start_ns, iteration = 0..n-1
    marker: str  # the regex used (or WHOLE_TRACE)
    warnings: tuple[str, ...] = ()
    stub_markers: int = 0  # marker spans cut by the profiler's stop: dropped, not iterations


_MARKER_CATS = ("user_annotation", "cpu_op")


def _marker_candidates(cpu: pl.DataFrame) -> pl.DataFrame:
    """The events that can be markers or step spans (user annotations and cpu ops) with the columns
    find_iterations reads, in `cpu` order: filtered once, so each regex runs over these rather
    than over every Python frame."""
    cat = cpu["cat"]
    keep = ((cat == _MARKER_CATS[0]) | (cat == _MARKER_CATS[1])).arg_true()  # cheaper than is_in, or a filter
    cols = cpu.select("name", "cat", "ts_ns", "end_ns", "pid")
    return cols if len(keep) == cpu.height else cols[keep]  # no Python frames: every row, uncopied


def _markers(cpu: pl.DataFrame, regex: str, names: pl.Series | None = None) -> pl.DataFrame:
    """The marker spans among `cpu` (_marker_candidates' rows: of the marker categories already) whose name matches."""
    return cpu.filter(_name_matches(cpu, regex, names)).sort("ts_ns", "end_ns")


def _name_matches(frame: pl.DataFrame, regex: str, names: pl.Series | None = None) -> pl.Expr:
    """pl.col("name").str.contains(regex) over `frame`, the regex run on its distinct names
    (`names`, when the caller has them) rather than on every row."""
    names = frame["name"].unique() if names is None else names
    return pl.col("name").is_in(names.filter(names.str.contains(regex)).implode())


def find_iterations(trace: Trace, *, marker: str | None = None) -> Iterations:
    """The iteration windows of one trace.

    `marker` (a regex) overrides the default chain; if it matches nothing, NothingToAnalyze.
    """
    warnings: list[str] = []
    cpu = _marker_candidates(trace.cpu)
    names = cpu["name"].unique()
    if marker is not None:
        try:
            re.compile(marker)
        except re.error as err:
            from profkit.errors import UsageError

            raise UsageError(f"--marker {marker!r} is not a valid regex ({err})") from None
        found = _markers(cpu, marker, names)
        if found.height == 0:
            raise NothingToAnalyze(
                f"{trace.path}: no CPU event matches the iteration marker {marker!r}",
                hint=f"list the span names that could mark iterations, with counts: `profkit analyze {trace.path} --list-markers`",
            )
        used = marker
    else:
        found, used = pl.DataFrame(), WHOLE_TRACE
        for _, regex in MARKER_CHAIN:
            found = _markers(cpu, regex, names)
            if found.height:
                used = regex
                if regex == MARKER_REGEX and _markers(cpu, STEP_0523, names).height == found.height:
                    used = STEP_0523  # the same spans (0.5.23's are a subset): the marker says so as it always did
                break
    if used == WHOLE_TRACE:
        starts = [cast(int, f["ts_ns"].min()) for f in (trace.cpu, trace.calls, trace.gpu_ops) if f.height]
        ends = [cast(int, f["end_ns"].max()) for f in (trace.cpu, trace.calls, trace.gpu_ops) if f.height]
        s, e = (min(starts), max(ends)) if starts else (0, 0)
        warnings.append(
            "no iteration marker found (scheduler.run_batch, step[...], execute_..., ProfilerStep#N): the whole trace is one window"
        )
        frame = pl.DataFrame(
            {"iteration": [0], "cpu_start_ns": [s], "cpu_end_ns": [e], "marker": [WHOLE_TRACE], "kind": ["unknown"], "batch_size": [None],
             "step": [None]},
            schema=ITERATIONS_SCHEMA,
        )
        return Iterations(frame, used, tuple(warnings))

    pids = found["pid"].unique()
    if pids.len() > 1:
        warnings.append(
            f"iteration markers on {pids.len()} processes in one file (a merged multi-rank trace?); pass one file per rank for per-rank figures"
        )
    starts = found["ts_ns"].to_list()
    ends = found["end_ns"].to_list()
    marker_names = found["name"].to_list()
    cpu_end = starts[1:] + [ends[-1]]
    kinds, sizes, fields = _kinds(cpu, marker_names, starts, cpu_end, names)
    warnings.extend(_unrecognized_steps(cpu, names))
    stubs = 0
    if marker is None and len(kinds) > 1 and kinds[-1] == "unknown" and any(k != "unknown" for k in kinds[:-1]):
        # DESIGN.md "Iteration": real SGLang 0.5.23 on CPU records num_steps + 1 scheduler.run_batch
        # spans, the last a 6-16 ms stub with no step[...] inside, cut by the profiler's stop; as an
        # iteration it would set every per-iteration minimum (busy 0). Dropped, counted and said.
        stubs = 1
        dur_us = (ends[-1] - starts[-1]) / 1000
        warnings.append(
            f"the last {marker_names[-1]!r} span ({dur_us:,.1f} µs) holds no engine step span (step[...], execute_...): "
            "cut by the profiler's stop, it is not an iteration (dropped; stub_markers: 1)"
        )
        starts, ends, marker_names, kinds, sizes, fields = starts[:-1], ends[:-1], marker_names[:-1], kinds[:-1], sizes[:-1], fields[:-1]
        cpu_end = starts[1:] + [ends[-1]]
    if marker is not None:
        # a user's marker: iterations with no engine step span inside are named after the marker
        # ("decode_step iterations"), not "unknown"
        own = marker_kind(marker_names, marker)
        kinds = [own if k == "unknown" else k for k in kinds]
    captures = _captures(trace, starts, cpu_end)
    if captures:
        kinds = [GRAPH_CAPTURE if i in captures else k for i, k in enumerate(kinds)]
        sizes = [None if i in captures else b for i, b in enumerate(sizes)]
        fields = [None if i in captures else f for i, f in enumerate(fields)]
        warnings.append(
            f"{len(captures)} of {len(starts)} iteration(s) capture a CUDA graph ({_CAPTURE_BEGIN.pattern[1:].replace('(cuda|hip)', 'cuda/hip')}): "
            "their kernel launches were recorded into the graph, the kernels did not run, so their GPU time says nothing about the step; "
            "profile a replayed step instead"
        )
    frame = pl.DataFrame(
        {
            "iteration": list(range(len(starts))), "cpu_start_ns": starts, "cpu_end_ns": cpu_end, "marker": marker_names,
            "kind": kinds, "batch_size": sizes, "step": fields,
        },
        schema=ITERATIONS_SCHEMA,
    )
    return Iterations(frame, used, tuple(warnings), stubs)


def parse_kind(name: str) -> tuple[str | None, int | None]:
    """(kind, batch size) from an SGLang `step[...]` (any form of analysis/steps.py: a draft runner's
    step makes no kind) or vLLM `execute_...` span name. vLLM's
    ``execute_context_<n>(<tokens>)_generation_<m>(<tokens>)`` with no context request is a
    speculative verify when its generation requests carry more tokens than one each (vLLM 0.32 with
    n-gram or EAGLE drafts: ``generation_1(4)``), else decode; with no generation request it is
    prefill (extend), with both mixed, with neither (``generation_0(0)``) an empty step. Its batch
    size counts both kinds of request."""
    st = parse_step(name)
    if st is not None:
        return st.kind, st.batch_size
    m = _VLLM.match(name)
    if m:
        ctx, gen = int(m.group(1)), int(m.group(2))
        gen_tokens = int(m.group(3)) if m.group(3) else gen  # no token count: not told apart from decode
        if ctx == 0 and gen == 0:
            return "empty", 0
        if ctx == 0:
            return ("verify" if gen_tokens > gen else "decode"), gen
        return ("extend" if gen == 0 else "mixed"), ctx + gen
    return None, None


def marker_kind(names: list[str], marker: str) -> str:
    """A name for iterations of a user's marker: the marked span's name with its numbers as N when
    every marked span has the same such name (``decode_step``, ``ProfilerStep#N``), else the regex
    without its anchors."""
    forms = {re.sub(r"\d+", "N", n) for n in names}
    if len(forms) == 1:
        return next(iter(forms))[:60]
    return marker.strip("^$")[:60] or "marked"


def _captures(trace: Trace, starts: list[int], ends: list[int]) -> set[int]:
    """Iterations whose window holds a graph-capture call (cudaStreamBeginCapture, hipStreamBeginCapture)."""
    calls = trace.calls
    if not calls.height:
        return set()
    ts = calls.filter(_name_matches(calls, _CAPTURE_BEGIN.pattern))["ts_ns"].to_list()
    out = set()
    for t in ts:
        i = bisect.bisect_right(starts, t) - 1
        if 0 <= i < len(starts) and t < ends[i]:
            out.add(i)
    return out


def list_markers(trace: Trace, *, limit: int = 25) -> list[dict[str, object]]:
    """The CPU spans that could mark iterations, most frequent first: user annotations (any name)
    and cpu ops that match the default chain, grouped with their numbers as N. Each: name (as
    grouped), count, regex (for --marker), default (the chain's pick for this trace)."""
    cpu = _marker_candidates(trace.cpu)
    chain = "|".join(f"(?:{r})" for _, r in MARKER_CHAIN)
    cand = cpu.filter((pl.col("cat") == "user_annotation") | pl.col("name").str.contains(chain))
    groups: dict[tuple[str, ...], int] = {}
    for n in cand["name"].to_list():
        base = n.split("(")[0].split(" ")[0] if n.startswith(("step[", "execute_")) else n
        parts = tuple(re.split(r"\d+", base))
        groups[parts] = groups.get(parts, 0) + 1
    picked = None
    for _, regex in MARKER_CHAIN:
        if _markers(cpu, regex).height:
            picked = regex
            break
    out = []
    for parts, n in sorted(groups.items(), key=lambda kv: (-kv[1], "N".join(kv[0])))[:limit]:
        prefix = parts[0].startswith(("step[", "execute_"))
        regex = "^" + r"\d+".join(re.escape(p).replace("\\#", "#") for p in parts) + ("" if prefix else "$")
        example = "1".join(parts)
        out.append({"name": "N".join(parts), "count": n, "regex": regex, "default": bool(picked and re.search(picked, example))})
    return out


def _kinds(cpu: pl.DataFrame, marker_names: list[str], starts: list[int], ends: list[int],
           names: pl.Series | None = None) -> tuple[list[str], list[int | None], list[str | None]]:
    """Kind, batch size and step fields (JSON of the step span's `key=value` fields but bs, e.g.
    toks, ext, dec and the roofline g_*/c_* values; None when it has none) per window: from the
    marker itself or the step span inside it that gives the window its kind (`cpu`: _marker_candidates'
    rows; `names`: their distinct names, when the caller has them)."""
    steps = cpu.filter(_name_matches(cpu, STEP_PREFIX + "|^execute_", names)).select("ts_ns", "name")
    step_ts = steps["ts_ns"].to_list()
    step_names = steps["name"].to_list()
    kinds: list[str] = []
    sizes: list[int | None] = []
    fields: list[str | None] = []
    for name, s, e in zip(marker_names, starts, ends):
        best: tuple[str, int | None, str] | None = None
        k, b = parse_kind(name)
        if k is not None:
            best = (k, b, name)
        else:
            lo = bisect.bisect_left(step_ts, s)
            hi = bisect.bisect_left(step_ts, e)
            for nm in step_names[lo:hi]:
                k, b = parse_kind(nm)
                if k is not None and (best is None or _PRIORITY[k] < _PRIORITY[best[0]]):
                    best = (k, b, nm)
        kinds.append(best[0] if best else "unknown")
        sizes.append(best[1] if best else None)
        st = parse_step(best[2]) if best else None
        fields.append(json.dumps(st.fields, sort_keys=True) if st is not None and st.fields else None)
    return kinds, sizes, fields


def _unrecognized_steps(cpu: pl.DataFrame, names: pl.Series) -> list[str]:
    """One warning naming the `step[...]` span forms of no grammar profkit knows (analysis/steps.py),
    with their counts: their iterations would otherwise read as `unknown` without a word."""
    cand = names.filter(names.str.contains(STEP_PREFIX))
    odd = [n for n in cand.to_list() if (st := parse_step(n)) is not None and not st.recognized]
    if not odd:
        return []
    counts: dict[str, int] = {}
    rows = cpu.filter(pl.col("name").is_in(odd))["name"].to_list()  # cpu: _marker_candidates' rows
    for n in rows:
        counts[step_form(n)] = counts.get(step_form(n), 0) + 1
    if not counts:
        return []
    forms = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    listed = ", ".join(f"{f!r} ({c}x)" for f, c in forms[:3]) + (f" and {len(forms) - 3} more" if len(forms) > 3 else "")
    return [
        f"step spans of a form profkit does not know: {listed}; they give no iteration kind or phase (iterations "
        "holding only them are 'unknown', their GPU ops phase 'other'). Known forms: docs/span-grammars.md; "
        "--marker REGEX picks the iterations by another span"
    ]
