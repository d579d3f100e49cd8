"""A Kineto trace plus profkit's findings -> a Perfetto protobuf trace (bytes), for ui.perfetto.dev.

Built with the ``perfetto`` package's protobuf trace builder. Layout:

* ``profkit``: tracks for iterations (CPU window), iterations (GPU window), bubbles (named by
  cause, with the CPU ops that ran during the gap) and host syncs (API, direction, trigger, stack);
* ``host <pid>`` / ``thread <tid>``: the trace's CPU ops, annotations, Python frames and CUDA runtime
  and driver calls;
* ``GPU <device>`` / ``stream <n>``: kernels, memcpys and memsets (with category and owning
  iteration when an iteration owns them), and GPU annotations.

Every track holds properly nested slices: events that overlap without nesting (Kineto writes some)
go to an extra lane of the same track group (``thread 7 (2)``). Launch calls are linked to their
GPU ops with flows (the correlation id). Times are the trace's own, in ns. Only complete ('X')
events of the categories profkit reads are carried; instant, counter and flow events are not.
"""

from __future__ import annotations

import heapq
import io
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import polars as pl

from profkit.analysis.rank import RankAnalysis
from profkit.errors import UsageError
from profkit.ingest import Trace
from profkit.terms import PER_ITERATION

SEQUENCE_ID = 0x50F7  # one writer sequence for the whole file
# Flow ids: the correlation id, offset so that ids from several ranks never collide.
FLOW_RANK_STRIDE = 1 << 40


@dataclass
class _Slice:
    ts: int
    end: int
    name: str
    args: dict[str, str | int | float | bool | None] = field(default_factory=dict)  # debug annotations (None: left out)
    flows: tuple[int, ...] = ()


@dataclass
class _Track:
    uuid: int
    name: str
    parent: int | None
    rank: int = 0
    slices: list[_Slice] = field(default_factory=list)


def _require_perfetto() -> Any:
    try:
        from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb
        from perfetto.trace_builder.proto_builder import StreamingTraceProtoBuilder
    except ImportError:  # pragma: no cover - exercised only without the extra
        raise UsageError(
            "export-perfetto needs the 'perfetto' package", hint="pip install 'profkit[report]' (or pip install perfetto)"
        ) from None
    return pb, StreamingTraceProtoBuilder


def _lanes(slices: Sequence[_Slice]) -> list[list[_Slice]]:
    """Split slices into lanes where each lane nests properly (a slice either contains the next or
    ends before it starts). Order: start, then longer first (a parent before its children)."""
    lanes: list[tuple[list[_Slice], list[int]]] = []
    for s in sorted(slices, key=lambda s: (s.ts, -(s.end - s.ts))):
        for lane, stack in lanes:
            while stack and stack[-1] <= s.ts:
                stack.pop()
            if not stack or s.end <= stack[-1]:
                lane.append(s)
                stack.append(s.end)
                break
        else:
            lanes.append(([s], [s.end]))
    return [lane for lane, _ in lanes]


def _events(track_uuid: int, lane: Sequence[_Slice]) -> Iterator[tuple[int, int, int, _Slice | None]]:
    """(ts, track, order, slice or None for an end) for one properly nested lane, in emission order."""
    stack: list[int] = []
    order = 0
    for s in lane:
        while stack and stack[-1] <= s.ts:
            yield (stack.pop(), track_uuid, order, None)
            order += 1
        yield (s.ts, track_uuid, order, s)
        order += 1
        stack.append(s.end)
    while stack:
        yield (stack.pop(), track_uuid, order, None)
        order += 1


def _arg_value(ann: Any, v: str | int | float | bool) -> None:
    if isinstance(v, bool):
        ann.bool_value = v
    elif isinstance(v, int):
        ann.int_value = v
    elif isinstance(v, float):
        ann.double_value = v
    else:
        ann.string_value = str(v)


class _Builder:
    def __init__(self) -> None:
        self.tracks: list[_Track] = []
        self._next = 1

    def track(self, name: str, parent: int | None = None, *, rank: int = 0) -> _Track:
        t = _Track(uuid=self._uuid(), name=name, parent=parent, rank=rank)
        self.tracks.append(t)
        return t

    def _uuid(self) -> int:
        self._next += 1
        return 0x7000_0000 + self._next

    def lane_tracks(self, base_name: str, parent: int, slices: list[_Slice], *, rank: int = 0) -> None:
        """One track per nesting lane of `slices` (the first keeps the base name)."""
        for i, lane in enumerate(_lanes(slices)):
            t = self.track(base_name if i == 0 else f"{base_name} ({i + 1})", parent, rank=rank * 100 + i)
            t.slices = lane

    def serialize(self) -> bytes:
        pb, Streaming = _require_perfetto()
        buf = io.BytesIO()
        out = Streaming(buf)
        first = True

        def packet() -> Any:
            nonlocal first
            p = out.create_packet()
            p.trusted_packet_sequence_id = SEQUENCE_ID
            if first:
                p.sequence_flags = pb.TracePacket.SEQ_INCREMENTAL_STATE_CLEARED
                first = False
            return p

        for t in self.tracks:
            p = packet()
            d = p.track_descriptor
            d.uuid = t.uuid
            d.name = t.name
            if t.parent is not None:
                d.parent_uuid = t.parent
            d.sibling_order_rank = t.rank
            d.child_ordering = pb.TrackDescriptor.EXPLICIT
            out.write_packet(p)

        streams: Iterable[Iterator[tuple[int, int, int, _Slice | None]]] = [_events(t.uuid, t.slices) for t in self.tracks if t.slices]
        # a trace packet's timestamp is unsigned: a capture whose events start before its own zero (an Nsight
        # Systems export's session start, say) is shifted as a whole so its first event is at 0
        shift = max(0, -min((s.ts for t in self.tracks for s in t.slices), default=0))
        for ts, track, _order, s in heapq.merge(*streams, key=lambda e: e[0]):
            p = packet()
            p.timestamp = ts + shift
            ev = p.track_event
            ev.track_uuid = track
            if s is None:
                ev.type = pb.TrackEvent.TYPE_SLICE_END
            else:
                ev.type = pb.TrackEvent.TYPE_SLICE_BEGIN
                ev.name = s.name
                for k, v in s.args.items():
                    if v is None:
                        continue
                    a = ev.debug_annotations.add()
                    a.name = k
                    _arg_value(a, v)
                if s.flows:
                    ev.flow_ids.extend(s.flows)
            out.write_packet(p)
        return buf.getvalue()


def _rows(df: pl.DataFrame, cols: Sequence[str]) -> Iterator[dict[str, Any]]:
    yield from df.select([c for c in cols if c in df.columns]).iter_rows(named=True)


def _figures(row: Mapping[str, Any], slice_: str) -> dict[str, int | float]:
    """The per-iteration figures an iteration slice carries (terms.PER_ITERATION's `perfetto`), from the per-iteration
    table's row: counts as they are, a µs figure from its nanosecond column."""
    return {f.key: row[f.key] if f.unit == "count" else row[f.key.removesuffix("_us") + "_ns"] / 1000
            for f in PER_ITERATION if f.perfetto == slice_}


def build_perfetto(pairs: Sequence[tuple[Trace, RankAnalysis]]) -> bytes:
    """The Perfetto trace (protobuf bytes) of one or more ranks with profkit's findings."""
    b = _Builder()
    for trace, a in pairs:
        flow_base = trace.rank * FLOW_RANK_STRIDE
        label = f"rank {trace.rank}" if len(pairs) > 1 else ""
        root = b.track(f"profkit{(' ' + label) if label else ''}: iterations, bubbles, syncs", rank=0)
        its = a.iterations
        cpu_sl, gpu_sl = [], []
        for r in its.iter_rows(named=True):
            shape = r["kind"] + (f" bs={r['batch_size']}" if r["batch_size"] is not None else "")
            cpu_sl.append(_Slice(r["cpu_start_ns"], r["cpu_end_ns"], f"iteration {r['iteration']} ({shape})", {
                "iteration": r["iteration"], "wall_us": r["wall_ns"] / 1000, **_figures(r, "cpu"),
            }))
            if r["gpu_start_ns"] is not None and r["gpu_end_ns"] is not None:
                gpu_sl.append(_Slice(r["gpu_start_ns"], r["gpu_end_ns"], f"iteration {r['iteration']} GPU window", {
                    "iteration": r["iteration"], "gpu_window_us": r["gpu_window_ns"] / 1000, "gpu_busy_us": r["gpu_busy_ns"] / 1000,
                    "gpu_idle_us": r["gpu_idle_ns"] / 1000, "overlap_us": r["overlap_ns"] / 1000, **_figures(r, "gpu"),
                }))
        b.lane_tracks("iterations (CPU window)", root.uuid, cpu_sl, rank=1)
        b.lane_tracks("iterations (GPU window)", root.uuid, gpu_sl, rank=2)
        bub = [
            _Slice(r["start_ns"], r["start_ns"] + r["dur_ns"], f"bubble: {r['cause']}", {
                "cause": r["cause"], "iteration": r["iteration"], "dur_us": r["dur_ns"] / 1000, "cpu_ops": ", ".join(r["cpu_ops"] or []),
            })
            for r in _rows(a.bubbles, ("iteration", "start_ns", "dur_ns", "cause", "cpu_ops"))
        ]
        b.lane_tracks("bubbles (by cause)", root.uuid, bub, rank=3)
        sy = [
            _Slice(r["ts_ns"], r["end_ns"], f"{r.get('name') or r['api']} ({r['direction']})", {  # the call as the trace spells it
                "kind": r["kind"], "trigger": r["trigger"], "stack": r["stack"], "direction": r["direction"],
                "blocked_us": r["blocked_ns"] / 1000, "iteration": r["iteration"],
            })
            for r in _rows(a.syncs, ("iteration", "api", "name", "kind", "direction", "ts_ns", "end_ns", "blocked_ns", "trigger", "stack"))
        ]
        b.lane_tracks("host syncs (with trigger)", root.uuid, sy, rank=4)

        # the original events: host threads
        host_events: dict[str, dict[str, list[_Slice]]] = {}
        for r in _rows(trace.cpu, ("name", "cat", "ts_ns", "end_ns", "pid", "tid", "external_id")):
            host_events.setdefault(r["pid"], {}).setdefault(r["tid"], []).append(
                _Slice(r["ts_ns"], r["end_ns"], r["name"] or "", {"cat": r["cat"], "external_id": r["external_id"]}))
        # flows only where both ends exist: a sync call has a correlation id but no GPU op
        linked = set(trace.gpu_ops["correlation"].drop_nulls().to_list()) & set(trace.calls["correlation"].drop_nulls().to_list())
        for r in _rows(trace.calls, ("name", "ts_ns", "end_ns", "pid", "tid", "correlation", "external_id")):
            corr = r["correlation"]
            host_events.setdefault(r["pid"], {}).setdefault(r["tid"], []).append(_Slice(
                r["ts_ns"], r["end_ns"], r["name"] or "", {"cat": "cuda_runtime", "correlation": corr, "external_id": r["external_id"]},
                flows=(flow_base + corr,) if corr in linked else ()))
        for pi, pid in enumerate(sorted(host_events)):
            proc = b.track(f"host {pid}{(' ' + label) if label else ''}", rank=10 + pi)
            for ti, tid in enumerate(sorted(host_events[pid], key=lambda x: (len(x), x))):
                b.lane_tracks(f"thread {tid}", proc.uuid, host_events[pid][tid], rank=ti)

        # GPU ops with their owner and category
        owned = a.ops.select("name", "ts_ns", "stream", "correlation", pl.col("iteration").alias("_it"), pl.col("category").alias("_cat"))
        ops = trace.gpu_ops.join(owned, on=["name", "ts_ns", "stream", "correlation"], how="left", nulls_equal=True)
        ops = ops.unique(subset=["name", "ts_ns", "dur_ns", "stream", "correlation"], keep="first", maintain_order=True)
        gpu_events: dict[int | None, dict[int | None, list[_Slice]]] = {}
        for r in _rows(ops, ("name", "cat", "ts_ns", "end_ns", "device", "stream", "correlation", "bytes", "_it", "_cat")):
            corr = r["correlation"]
            gpu_events.setdefault(r["device"], {}).setdefault(r["stream"], []).append(_Slice(
                r["ts_ns"], r["end_ns"], r["name"] or "",
                {"cat": r["cat"], "correlation": corr, "category": r["_cat"], "iteration": r["_it"], "bytes": r["bytes"]},
                flows=(flow_base + corr,) if corr in linked else ()))
        for r in _rows(trace.gpu_annotations, ("name", "ts_ns", "end_ns", "pid", "tid")):
            dev = int(r["pid"]) if str(r["pid"]).isdigit() else None
            stream = int(r["tid"]) if str(r["tid"]).isdigit() else None
            gpu_events.setdefault(dev, {}).setdefault(stream, []).append(_Slice(r["ts_ns"], r["end_ns"], r["name"] or "", {"cat": "gpu_user_annotation"}))
        for di, dev in enumerate(sorted(gpu_events, key=lambda d: (d is None, d or 0))):
            gpu = b.track(f"GPU {dev if dev is not None else '?'}{(' ' + label) if label else ''}", rank=50 + di)
            for si, stream in enumerate(sorted(gpu_events[dev], key=lambda s: (s is None, s or 0))):
                b.lane_tracks(f"stream {stream if stream is not None else '?'}", gpu.uuid, gpu_events[dev][stream], rank=si)
    return b.serialize()
