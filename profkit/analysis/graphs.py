"""Graph-replayed GPU ops categorized as in eager mode, from a profile of the graph's capture.

A kernel replayed from a CUDA graph has no CPU op or range of its own: its launch is the
`cudaGraphLaunch`. The ops and ranges that launched it are in a profile of the graph *capture*
(SGLang 0.5.23 writes one per runner with SGLANG_ENABLE_CUDA_GRAPH_CAPTURE_TRACE=1:
`<SGLANG_TORCH_PROFILER_DIR>/graph_capture_profile/cuda_graph_capture-<runner>-TP-<rank>.json.gz`,
sglang/srt/utils/profile_utils.py; the proxy engine writes one per captured graph the same way).

What a capture profile holds (torch 2.11 on an H200, checked): every captured launch call
(`cudaLaunchKernel`, `cuLaunchKernelEx`, `cudaMemcpyAsync`, ...) between `cudaStreamBeginCapture` and
`cudaStreamEndCapture`, with its correlation and enclosing ranges, but no kernel record (nothing ran);
work that did run during the capture (fills, warm-up) has its kernel record and is not part of the
graph. A replay runs the captured ops in capture order, so the k-th GPU op of a replay (by start
time) is the k-th captured launch of its graph. The match is refused when the counts differ, or when
a copy/memset and a kernel would be paired. On ROCm the captured launches carry the kernel's name
(`args.kernel`): there the replay is aligned greedily by name, as TraceLens does
(TraceLens/Trace2Tree/trace_capture_merge_experimental.py).

Which graph a replay ran: the captured graph with the same number of ops whose step (from its
capture range `cuda_graph_capture[<step> bs=.. width=..]`, SGLang's `capture_<bs>_<MODE>`, or the
runner in the file name) is the replay's phase; graphs of one step with the same op count are
captures of one step function at another shape and give the same context.

Mapped ops take the innermost range of their captured launch (what eager mode would give them) for
the catalog's `annotation` rules; unmapped ones keep the name rules, and `stats` says how much GPU
time that left in "other".
"""

from __future__ import annotations

import bisect
import gzip
import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from profkit.apis import GRAPH_LAUNCH_APIS, HIP_TWINS, KERNEL_LAUNCH_APIS
from profkit.documents import UNSET, GraphCaptureStats, Refused
from profkit.errors import TraceInputError
from profkit.ingest.units import us_to_ns

COPY_APIS = frozenset({"cudaMemcpyAsync", "cudaMemsetAsync"})
_LABEL = re.compile(r"^cuda_graph_capture\[(\w+)(?: bs=(\d+))?|^capture_(\d+)_(\w+)")
_SKIP_ANN = re.compile(r"^(cuda_graph_capture\[|capture_\d+_|ProfilerStep#)")
_RANK = re.compile(r"-TP-(\d+)|_rank(\d+)")
_GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")


@dataclass(frozen=True)
class CapturedGraph:
    """One captured graph: its launches in capture order as (is_copy, kernel name or None, innermost range or None)."""

    source: str
    rank: int
    label: str | None
    phase: str | None
    batch: int | None
    ops: tuple[tuple[bool, str | None, str | None], ...]
    # per op: the CPU op around its captured launch with its shapes, (name, Input Dims, Input type) as compact
    # JSON text, for a capture recorded with shapes (analysis/shapes.py); empty otherwise
    shapes: tuple[tuple[str, str | None, str | None, int] | None, ...] = ()

    @property
    def named(self) -> bool:
        return any(n is not None for _, n, _ in self.ops)


@dataclass
class GraphCaptures:
    """Every graph of a set of capture profiles (picklable: plain data)."""

    files: list[str] = field(default_factory=list)
    graphs: list[CapturedGraph] = field(default_factory=list)
    identity: str = ""
    warnings: list[str] = field(default_factory=list)

    def for_rank(self, rank: int) -> list[CapturedGraph]:
        own = [g for g in self.graphs if g.rank == rank]
        return own or list(self.graphs)


def _phase_of(step: str) -> str | None:
    s = step.lower()
    if "extend" in s and "draft" in s:
        return "draft_extend"
    if "draft" in s:
        return "draft"
    if "verify" in s:
        return "verify"
    if "decode" in s:
        return "decode"
    if "extend" in s or "prefill" in s:
        return "extend"
    return None


def _runner_phase(name: str) -> str | None:
    """SGLang's runner class in the file name: EAGLEDraftExtendCudaGraphRunner -> draft_extend, ...; the target's: None."""
    m = re.search(r"cuda_graph_capture-(.+?)-TP-\d+", name)
    runner = m.group(1) if m else ""
    if re.search(r"DraftExtend|draft_extend", runner):
        return "draft_extend"
    if re.search(r"Draft|draft", runner):
        return "draft"
    return None


def _read(path: Path) -> list[dict[str, Any]]:
    try:
        raw = path.read_bytes()
        if raw[:2] == b"\x1f\x8b":
            raw = gzip.decompress(raw)
        doc = json.loads(raw)
    except (OSError, EOFError, ValueError, gzip.BadGzipFile) as e:
        raise TraceInputError(f"{path}: not a readable capture profile ({e})", hint="pass the graph_capture_profile/*.json.gz files SGLang or the proxy wrote") from None
    ev = doc.get("traceEvents") if isinstance(doc, dict) else doc
    if not isinstance(ev, list):
        raise TraceInputError(f"{path}: no traceEvents", hint="expected a torch-profiler (Kineto) capture trace")
    return [e for e in ev if isinstance(e, dict) and e.get("ph") == "X" and isinstance(e.get("ts"), (int, float))]


def _graphs_of(path: Path) -> list[CapturedGraph]:
    ev = _read(path)
    m = _RANK.search(path.name)
    rank = int(next(g for g in m.groups() if g is not None)) if m else 0
    ran = {e["args"].get("correlation") for e in ev if e.get("cat") in _GPU_CATS and isinstance(e.get("args"), dict)}
    by_tid: dict[Any, dict[str, list]] = {}
    for e in ev:
        cat = e.get("cat")
        tid = (e.get("pid"), e.get("tid"))
        if cat in ("cuda_runtime", "cuda_driver"):
            api = HIP_TWINS.get(str(e.get("name")), e.get("name"))
            d = by_tid.setdefault(tid, {"calls": [], "ann": []})
            d["calls"].append((float(e["ts"]), api, e))
        elif cat == "user_annotation":
            by_tid.setdefault(tid, {"calls": [], "ann": []})["ann"].append((float(e["ts"]), float(e["ts"]) + float(e.get("dur") or 0), str(e.get("name"))))
    shaped = _shaped_ops(ev)
    graphs: list[CapturedGraph] = []
    for tid_key, d in by_tid.items():
        calls = sorted(d["calls"], key=lambda c: c[0])
        anns = sorted(d["ann"], key=lambda a: (a[0], -a[1]))
        launches = [(t, api, e) for t, api, e in calls
                    if (api in KERNEL_LAUNCH_APIS or api in COPY_APIS) and (e.get("args") or {}).get("correlation") not in ran]
        if not launches:
            continue
        begins = [t for t, api, _ in calls if "BeginCapture" in str(api)]
        ends = [t for t, api, _ in calls if "EndCapture" in str(api)]
        if begins and len(begins) == len(ends):
            spans = list(zip(begins, ends))
        else:  # no capture calls: the capture ranges, else the file's uncounted launches as one graph
            spans = [(a0, a1) for a0, a1, n in anns if _LABEL.match(n)] or [(launches[0][0], launches[-1][0] + 1)]
        starts = [a[0] for a in anns]
        for s0, s1 in spans:
            inside = [x for x in launches if s0 <= x[0] <= s1]
            if not inside:
                continue
            label = next((n for a0, a1, n in anns if a0 <= s0 and a1 >= s1 and _LABEL.match(n)), None)
            phase, batch = None, None
            if label is not None:
                lm = _LABEL.match(label)
                assert lm is not None  # label was picked by _LABEL.match
                if lm.group(1):
                    phase, batch = _phase_of(lm.group(1)), int(lm.group(2)) if lm.group(2) else None
                else:
                    phase, batch = _phase_of(lm.group(4)), int(lm.group(3))
            if phase is None:
                phase = _runner_phase(path.name)
            ops = []
            mine = shaped.get(tid_key)
            shapes = tuple(_launch_shape(mine, t) for t, _, _ in inside) if mine else ()
            for t, api, e in inside:
                # innermost enclosing range (ranges on one thread nest): the latest-starting one still open
                inner = None
                for j in range(bisect.bisect_right(starts, t) - 1, -1, -1):
                    a0, a1, n = anns[j]
                    if a1 >= t and not _SKIP_ANN.match(n):
                        inner = n
                        break
                kname = (e.get("args") or {}).get("kernel")
                ops.append((api in COPY_APIS, str(kname) if kname else None, inner))
            graphs.append(CapturedGraph(path.name, rank, label, phase, batch, tuple(ops), shapes))
    return graphs


def _shaped_ops(ev: list[dict[str, Any]]) -> dict[Any, tuple[list[float], list[tuple[float, float, str, str | None, str | None]]]]:
    """(pid, tid) -> its CPU ops ordered by (ts, -end), with their starts, where the capture was recorded with
    shapes (some op has `Input Dims`); empty otherwise."""
    import msgspec

    ops: dict[Any, list[tuple[float, float, str, str | None, str | None]]] = {}
    any_dims = False
    for e in ev:
        if e.get("cat") != "cpu_op":
            continue
        a = e.get("args")
        if not isinstance(a, dict):
            a = {}
        dims, types = a.get("Input Dims"), a.get("Input type")
        any_dims = any_dims or dims is not None
        t0 = float(e["ts"])
        ops.setdefault((e.get("pid"), e.get("tid")), []).append((
            t0, t0 + float(e.get("dur") or 0), str(e.get("name")),
            msgspec.json.encode(dims).decode() if isinstance(dims, list) else None,
            msgspec.json.encode(types).decode() if isinstance(types, list) else None))
    if not any_dims:
        return {}
    out = {}
    for k, v in ops.items():
        v.sort(key=lambda o: (o[0], -o[1]))
        out[k] = ([o[0] for o in v], v)
    return out


def _launch_shape(mine: tuple[list[float], list[tuple[float, float, str, str | None, str | None]]],
                  t: float) -> tuple[str, str | None, str | None, int] | None:
    """The innermost CPU op around a launch at t (the latest in (ts, -end) order that holds t): (name, dims, types, its
    start in ns)."""
    starts, ops = mine
    for j in range(bisect.bisect_right(starts, t) - 1, -1, -1):
        o = ops[j]
        if o[1] >= t:
            return o[2], o[3], o[4], us_to_ns(o[0])
    return None


def load_captures(paths: list[Path]) -> GraphCaptures | None:
    """Capture profiles -> GraphCaptures (None for no paths). Unreadable files raise TraceInputError."""
    files = sorted({Path(p) for p in paths})
    if not files:
        return None
    out = GraphCaptures(files=[str(p) for p in files])
    h = hashlib.sha256()
    for p in files:
        st = p.stat()
        h.update(f"{p.name}:{st.st_size}:{st.st_mtime_ns}\n".encode())
        got = _graphs_of(p)
        if not got:
            out.warnings.append(f"{p.name}: no captured launches (not a graph-capture profile?)")
        out.graphs.extend(got)
    out.identity = h.hexdigest()[:16]
    return out


def find_capture_files(paths: list[Path]) -> list[Path]:
    """The capture profiles that go with run folders or trace files: `graph_capture_profile/` beside them
    or one level up (a profile window's folder)."""
    found: list[Path] = []
    for p in paths:
        p = Path(p)
        base = p if p.is_dir() else p.parent
        for d in (base / "graph_capture_profile", base.parent / "graph_capture_profile"):
            if d.is_dir():
                found += sorted(x for x in d.glob("*.json.gz") if not x.name.startswith(".") and ".tmp" not in x.name)
                break
    return sorted(set(found))


# ------------------------------------------------------------------------------------------------
# matching replays to captured graphs


def _norm(name: str | None) -> str:
    return re.sub(r"\s+", " ", name or "").strip()


def _align_by_name(names: list[str], g: CapturedGraph) -> list[int | None]:
    """Greedy in-order alignment by kernel name (TraceLens): replay op i -> captured op index or None."""
    out: list[int | None] = []
    j = 0
    cap = [_norm(n) for _, n, _ in g.ops]
    for nm in names:
        k = j
        while k < len(cap) and cap[k] != nm:
            k += 1
        if k < len(cap):
            out.append(k)
            j = k + 1
        else:
            out.append(None)
    return out


def _shape_key(g: CapturedGraph) -> tuple[Any, ...]:
    """A captured graph's launching ops' shapes without their start times (which differ from one capture to the next)."""
    return tuple(None if x is None else x[:3] for x in (g.shapes or ()))


@dataclass
class ReplayStats:
    """The replays of one rank against the captured graphs, in ns, as they are counted (finish_stats: in µs)."""
    graphs: int = 0
    replays: int = 0
    replays_mapped: int = 0
    replays_refused: int = 0
    ops: int = 0
    ops_mapped: int = 0
    replayed_ns: int = 0
    mapped_ns: int = 0
    refused: dict[str, int] = field(default_factory=dict)  # why -> replays
    replays_shape_ambiguous: int = 0
    shapes: dict[int, Any] = field(default_factory=dict)  # position -> (op, dims, types, start): analysis/shapes.py

    def refuse(self, why: str) -> None:
        self.refused[why] = self.refused.get(why, 0) + 1


def map_replays(rows: list[tuple[int, int, str, str, int]], phases: dict[int, str], captures: GraphCaptures,
                rank: int, shapes: dict[int, Any] | None = None) -> tuple[dict[int, str | None], ReplayStats]:
    """Replayed ops -> their capture-time innermost range.

    rows: (position, correlation, name, cat, dur_ns) of every op replayed from a graph launch, in start
    order; phases: correlation -> the replay's phase. Returns {position: range or None} for the mapped
    ops and the statistics (replays, mapped, refused, ops and GPU ns of each). `shapes`, when given, gets
    {position: (op name, Input Dims, Input type, op start ns)} of the mapped ops whose graph was captured with shapes.
    """
    graphs = captures.for_rank(rank)
    groups: dict[int, list[tuple[int, int, str, str, int]]] = {}
    for r in rows:
        groups.setdefault(r[1], []).append(r)
    mapped: dict[int, str | None] = {}
    st = ReplayStats(graphs=len(graphs), replays=len(groups), ops=len(rows), replayed_ns=sum(r[4] for r in rows))
    for corr, ops in groups.items():
        ph = phases.get(corr)
        n = len(ops)
        pool = [g for g in graphs if g.phase is None or ph is None or g.phase == ph] or graphs
        named = [g for g in pool if g.named]
        if named:  # ROCm: align by name, the graph that matches most
            names = [_norm(o[2]) for o in ops]
            best, best_al = None, None
            for g in named:
                al = _align_by_name(names, g)
                if best_al is None or sum(a is not None for a in al) > sum(a is not None for a in best_al):
                    best, best_al = g, al
            assert best is not None and best_al is not None
            hit = 0
            for o, a in zip(ops, best_al):
                if a is not None:
                    mapped[o[0]] = best.ops[a][2]
                    if shapes is not None and best.shapes and best.shapes[a] is not None:
                        shapes[o[0]] = best.shapes[a]
                    st.mapped_ns += o[4]
                    hit += 1
            st.ops_mapped += hit
            if hit == n:
                st.replays_mapped += 1
            else:
                st.replays_refused += 1
                st.refuse(f"{ph or '?'}: {n - hit} of {n} ops unmatched by name")
            continue
        same = [g for g in pool if len(g.ops) == n]
        same.sort(key=lambda g: (g.phase != ph,))
        chosen = None
        for g in same:
            if all(g.ops[k][0] == (ops[k][3] != "kernel") for k in range(n)):
                chosen = g
                break
        if chosen is None:
            counts = sorted({len(g.ops) for g in pool})
            why = (f"{ph or '?'}: {n} ops replayed, captured graphs hold {', '.join(map(str, counts[:6]))}" if not same
                   else f"{ph or '?'}: copies and kernels in another order than captured")
            st.refuse(why)
            st.replays_refused += 1
            continue
        st.replays_mapped += 1
        st.ops_mapped += n
        # graphs of one step with as many ops are captures of one step function at other shapes (context-width buckets):
        # the same ranges, so the categories hold; but the launch count cannot say which one ran, so where their shapes
        # differ the replay takes none (its work is not modeled) rather than another bucket's
        shaped = shapes is not None and bool(chosen.shapes)
        if shaped and any(g is not chosen and g.phase == chosen.phase and _shape_key(g) != _shape_key(chosen)
                          and all(g.ops[k][0] == (ops[k][3] != "kernel") for k in range(n)) for g in same):
            shaped = False
            st.replays_shape_ambiguous += 1
        for k, o in enumerate(ops):
            mapped[o[0]] = chosen.ops[k][2]
            if shaped and chosen.shapes[k] is not None:
                shapes[o[0]] = chosen.shapes[k]  # type: ignore[index]
            st.mapped_ns += o[4]
    return mapped, st


def apply(owned: Any, trace: Any, captures: GraphCaptures, ann: list[str | None]) -> tuple[list[str | None], list[bool], ReplayStats]:
    """rank.py's hook: the annotations of graph-replayed ops from their capture (see the module doc).

    owned: the GPU ops frame (launch_api, correlation, ts_ns, name, cat, dur_ns, launch_ts_ns, launch_tid);
    ann: the replay-time innermost ranges. Returns the new annotations, which ops were mapped, and stats."""
    import polars as pl

    from profkit.analysis.phases import op_phases

    is_graph = owned["launch_api"].is_in(list(GRAPH_LAUNCH_APIS)).fill_null(False)
    pos = is_graph.arg_true().to_list()
    mask = [False] * owned.height
    if not pos:
        return ann, mask, ReplayStats(graphs=len(captures.graphs))
    sub = owned.with_row_index("_pos").filter(is_graph).sort("ts_ns", "_pos")
    ph = op_phases(sub, trace.cpu)
    phases = dict(zip(sub["correlation"].to_list(), ph.to_list()))
    rows = list(zip(sub["_pos"].to_list(), sub["correlation"].to_list(), sub["name"].to_list(), sub["cat"].to_list(),
                    sub["dur_ns"].fill_null(0).to_list()))
    shapes: dict[int, Any] = {}
    m, stats = map_replays(rows, phases, captures, int(getattr(trace, "rank", 0) or 0), shapes)
    stats.shapes = shapes
    out = list(ann)
    for p, a in m.items():
        mask[p] = True
        if a is not None:
            out[p] = a
    del pl
    return out, mask, stats


def finish_stats(stats: ReplayStats, classified: Any, mask: list[bool], captures: GraphCaptures) -> GraphCaptureStats:
    """Add the GPU time of unmapped replayed ops that the name rules left in "other"; µs figures."""
    import polars as pl

    df = classified.with_columns(pl.Series("_m", mask, dtype=pl.Boolean))
    rest = df.filter(pl.col("launch_api").is_in(list(GRAPH_LAUNCH_APIS)).fill_null(False) & ~pl.col("_m"))
    other_ns = int(rest.filter(pl.col("category").fill_null("other") == "other")["dur_ns"].sum() or 0)
    return GraphCaptureStats(
        files=[Path(f).name for f in captures.files], graphs=stats.graphs, replays=stats.replays,
        replays_mapped=stats.replays_mapped, replays_refused=stats.replays_refused, ops=stats.ops,
        ops_mapped=stats.ops_mapped, replayed_us=stats.replayed_ns / 1000, mapped_us=stats.mapped_ns / 1000,
        unmapped_us=(stats.replayed_ns - stats.mapped_ns) / 1000, unmapped_other_us=other_ns / 1000,
        refused=[Refused(why=k, replays=v) for k, v in sorted(stats.refused.items(), key=lambda kv: -kv[1])],
        # (a new optional key) replays whose step was captured at several shapes with as many ops: no shapes taken
        replays_shape_ambiguous=stats.replays_shape_ambiguous or UNSET,
    )
