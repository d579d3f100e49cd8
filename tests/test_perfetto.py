"""`profkit export-perfetto`: the trace plus profkit's tracks, loaded back with perfetto's protobuf classes."""

from __future__ import annotations

import gzip
from collections import Counter, defaultdict

import pytest
from typer.testing import CliRunner

from support import DATA

pytest.importorskip("perfetto", reason="the 'perfetto' package (profkit[report]) is not installed")
from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import Trace, TrackEvent  # noqa: E402

from factories import TraceBuilder  # noqa: E402
from profkit.analysis import analyze_trace  # noqa: E402
from profkit.analysis.catalog import load_catalog  # noqa: E402
from profkit.cli import app  # noqa: E402
from profkit.export.perfetto import build_perfetto  # noqa: E402
from profkit.ingest import load_trace  # noqa: E402
from factories import synthetic_trace as build  # noqa: E402

US = 1000
GPU_DATA = DATA / "gpu"
runner = CliRunner()


def parse(data: bytes) -> tuple[dict[int, str], dict[int, int | None], list]:
    t = Trace()
    t.ParseFromString(data)
    names = {p.track_descriptor.uuid: p.track_descriptor.name for p in t.packet if p.HasField("track_descriptor")}
    parents = {p.track_descriptor.uuid: (p.track_descriptor.parent_uuid or None) for p in t.packet if p.HasField("track_descriptor")}
    return names, parents, list(t.packet)


def slices_by_track(packets) -> dict[int, list[tuple[int, int, str]]]:
    """Rebuild (start, end, name) per track from BEGIN/END, checking that every track nests properly."""
    out: dict[int, list[tuple[int, int, str]]] = defaultdict(list)
    stacks: dict[int, list[tuple[int, str]]] = defaultdict(list)
    last: dict[int, int] = {}
    for p in packets:
        if not p.HasField("track_event"):
            continue
        e = p.track_event
        assert p.timestamp >= last.get(e.track_uuid, 0), "timestamps go back on a track"
        last[e.track_uuid] = p.timestamp
        if e.type == TrackEvent.TYPE_SLICE_BEGIN:
            stacks[e.track_uuid].append((p.timestamp, e.name))
        else:
            assert e.type == TrackEvent.TYPE_SLICE_END
            ts, name = stacks[e.track_uuid].pop()
            out[e.track_uuid].append((ts, p.timestamp, name))
    assert all(not s for s in stacks.values()), "unclosed slices"
    return out


def test_synthetic_export_has_findings_and_every_event(tmp_path):
    b = build()
    # two host events that overlap without nesting: the second must go to another lane
    b.cpu("overlap_a", 150 * US, 20 * US, cat="cpu_op")
    b.cpu("overlap_b", 160 * US, 20 * US, cat="cpu_op")
    trace = load_trace(b.write(tmp_path / "t.pt.trace.json.gz"))
    a = analyze_trace(trace, catalog=load_catalog("generic"))
    names, parents, packets = parse(build_perfetto([(trace, a)]))
    tracks = {v: k for k, v in names.items()}
    for n in ("iterations (CPU window)", "iterations (GPU window)", "bubbles (by cause)", "host syncs (with trigger)", "thread 100",
              "thread 100 (2)", "stream 7", "stream 8"):
        assert n in tracks, n
    sl = slices_by_track(packets)
    assert len(sl[tracks["iterations (CPU window)"]]) == a.iterations.height == 3
    bubbles = sl[tracks["bubbles (by cause)"]]
    assert sorted(n for _, _, n in bubbles) == sorted(f"bubble: {c}" for c in a.bubbles["cause"].to_list())
    assert [(s // US - trace.t0_ns // US, (e - s) // US) for s, e, n in sorted(bubbles) if n == "bubble: sync"] == [(240, 25)]
    syncs = sl[tracks["host syncs (with trigger)"]]
    assert {n for *_, n in syncs} == {"cudaMemcpyAsync (d2h)", "cudaStreamSynchronize (d2h)"}
    # every original event is there once
    originals = sum(len(v) for k, v in sl.items() if names[k].startswith(("thread", "stream")))
    assert originals == trace.cpu.height + trace.calls.height + trace.gpu_ops.height + trace.gpu_annotations.height
    # the trigger travels as an annotation, and launches link to their kernels by flows
    sync_events = [p.track_event for p in packets if p.HasField("track_event") and p.track_event.name == "cudaStreamSynchronize (d2h)"
                   and p.track_event.track_uuid == tracks["host syncs (with trigger)"]]
    ann = {d.name: d.string_value for d in sync_events[0].debug_annotations}
    assert ann["trigger"] == "aten::_local_scalar_dense"
    flows = Counter(f for p in packets if p.HasField("track_event") for f in p.track_event.flow_ids)
    assert flows and all(n >= 2 for n in flows.values())
    # parents: findings under the profkit group, threads under their host
    assert names[parents[tracks["bubbles (by cause)"]]].startswith("profkit")
    assert names[parents[tracks["thread 100"]]] == "host 100"


def test_hostile_names_survive_as_strings(tmp_path):
    b = TraceBuilder()
    b.cpu("scheduler.run_batch", 0, 100 * US)
    b.kernel("<script>alert(1)</script>", 1 * US, 5 * US, 2 * US)
    trace = load_trace(b.write(tmp_path / "h.json"))
    _, _, packets = parse(build_perfetto([(trace, analyze_trace(trace, catalog=load_catalog("generic")))]))
    assert "<script>alert(1)</script>" in {p.track_event.name for p in packets if p.HasField("track_event")}


def test_cli_export_perfetto(tmp_path):
    """Issue 40: gzip by default (<trace>.perfetto-trace.gz, which the Perfetto UI opens); a name without .gz is written
    plain; either parses back with perfetto's protobuf classes to the same packets."""
    src = build().write(tmp_path / "run.pt.trace.json.gz")
    r = runner.invoke(app, ["export-perfetto", str(src)])
    assert r.exit_code == 0, r.output
    out = tmp_path / "run.perfetto-trace.gz"
    assert not (tmp_path / "run.perfetto-trace").exists()
    raw = out.read_bytes()
    assert raw[:2] == b"\x1f\x8b" and "gzip of" in r.output, r.output
    names, _, packets = parse(gzip.decompress(raw))
    assert "bubbles (by cause)" in names.values() and len(packets) > 20
    r = runner.invoke(app, ["export-perfetto", str(src), "-o", str(tmp_path / "x" / "y.perfetto-trace")])
    assert r.exit_code == 0 and (tmp_path / "x" / "y.perfetto-trace").exists()
    plain = (tmp_path / "x" / "y.perfetto-trace").read_bytes()
    assert plain[:2] != b"\x1f\x8b" and len(plain) > len(raw)
    again, _, same = parse(plain)
    assert again == names and same == packets  # the same packets, compressed or not
    r = runner.invoke(app, ["export-perfetto", str(src), "-o", str(tmp_path / "z.pftrace.gz")])
    assert r.exit_code == 0 and gzip.decompress((tmp_path / "z.pftrace.gz").read_bytes()) == plain
    (tmp_path / "bad.json").write_text("[1, 2, 3]")
    r = runner.invoke(app, ["export-perfetto", str(tmp_path / "bad.json")])
    assert r.exit_code == 3 and "bad.json" in r.output and "Traceback" not in r.output


@pytest.mark.parametrize("name", ["eager_sync", "graph_decode", "two_streams"])
def test_fixture_exports(name):
    p = GPU_DATA / f"{name}.pt.trace.json.gz"
    if not p.exists():
        pytest.skip(f"{p.name} not recorded yet (tests/data/gpu/)")
    trace = load_trace(p)
    a = analyze_trace(trace)
    names, _, packets = parse(build_perfetto([(trace, a)]))
    sl = slices_by_track(packets)
    tracks = {v: k for k, v in names.items()}
    assert len(sl[tracks["iterations (GPU window)"]]) == a.iterations.filter(a.iterations["gpu_start_ns"].is_not_null()).height
    assert sum(len(v) for k, v in sl.items() if names[k].startswith("bubbles")) == a.bubbles.height
    assert sum(len(v) for k, v in sl.items() if names[k].startswith("host syncs")) == a.syncs.height
    if name == "eager_sync":
        assert a.syncs.height > 0
    if name == "two_streams":
        assert sum(1 for n in names.values() if n.startswith("stream ")) >= 2
