"""A trace file is read once for what identifies it (ingest/identity.py's TraceFile) and once to
decode it: the counts of opens and stats of the trace during one analysis, in this process.

Derived from the design, not measured: inspecting opens the file and fstat-s it (TraceFile.of: no
path stat), the run grouping, the caches' keys and the choice of workers read that value, and the
decoder opens the file once more to read it whole. Finding the inputs stats the path once
(find_trace_files). The sha256 in summary.json comes from the inspection for a file of up to
2 MiB (it is read whole then)."""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
from pathlib import Path

import pytest

from profkit.ingest import expand_inputs, load_trace
from profkit.ingest.identity import TraceFile
from profkit.ingest.runs import plan_runs, read_info

from support import DATA

TRACE = DATA / "gpu" / "eager_sync.pt.trace.json.gz"

_WATCH: dict[str, list[str]] = {}  # abspath -> the calls that touched it, while a test watches


def _audit(event: str, args: tuple) -> None:
    if event == "open" and _WATCH and args and isinstance(args[0], (str, bytes, os.PathLike)):
        p = os.path.abspath(os.fsdecode(args[0]))
        if p in _WATCH:
            _WATCH[p].append("open")


sys.addaudithook(_audit)  # audit hooks stay for the process: _audit does nothing unless a test watches


@pytest.fixture
def watch(monkeypatch: pytest.MonkeyPatch):
    """watch(path) -> the list of "open" / "stat" calls on that path from now until the test ends
    (every open in the process, builtins.open, io.open, gzip and os.open alike, through the
    interpreter's audit events; path stats through os.stat, which Path.stat/exists/is_file use)."""
    real_stat = os.stat

    def stat(p, *a, **kw):
        if _WATCH and isinstance(p, (str, bytes, os.PathLike)):
            q = os.path.abspath(os.fsdecode(p))
            if q in _WATCH:
                _WATCH[q].append("stat")
        return real_stat(p, *a, **kw)

    monkeypatch.setattr(os, "stat", stat)

    def start(path: Path) -> list[str]:
        return _WATCH.setdefault(os.path.abspath(path), [])

    yield start
    _WATCH.clear()


def _copy(tmp_path: Path, src: Path = TRACE) -> Path:
    dst = tmp_path / src.name
    shutil.copyfile(src, dst)
    return dst


def test_one_analysis_opens_the_trace_twice_and_stats_it_once(tmp_path: Path, watch) -> None:
    from profkit.analysis.parallel import analyze_runs
    from profkit.analysis.summary import build_summary

    path = _copy(tmp_path)
    calls = watch(path)
    plan = plan_runs(expand_inputs([path]))
    (run,) = analyze_runs([path], runs=plan, cache=False)
    summary = build_summary(run.analyses)
    assert calls.count("open") == 2, calls  # inspected once, decoded once
    assert calls.count("stat") == 1, calls  # found once (find_trace_files)
    assert summary["inputs"][0]["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()


def test_the_tiered_decoder_reads_a_small_file_from_its_inspection(tmp_path: Path, watch) -> None:
    """A file the fast path declines (numbers written as strings): the tiered decoder takes the
    bytes the inspection read instead of reading the file a third time."""
    path = tmp_path / "t.json"
    path.write_text('{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "a", "ts": "1.5", "dur": 1}]}')
    calls = watch(path)
    t = load_trace(TraceFile.of(path))
    assert t.cpu.height == 1 and any("non-standard types" in w for w in t.warnings)
    assert calls.count("open") == 2, calls  # TraceFile.of, and the fast path's attempt
    assert calls.count("stat") == 0, calls


def test_analyze_cli_opens_the_trace_twice(tmp_path: Path, watch) -> None:
    """`profkit analyze` end to end: the same two opens; the stats are typer's Path argument,
    finding the input, and the CLI looking for a run manifest and graph-capture profiles beside it."""
    from typer.testing import CliRunner

    from profkit.cli import app

    path = _copy(tmp_path)
    calls = watch(path)
    r = CliRunner().invoke(app, ["analyze", str(path), "--no-cache", "--json", str(tmp_path / "s.json")])
    assert r.exit_code == 0, r.output
    assert calls.count("open") == 2, calls
    assert calls.count("stat") <= 4, calls


def test_trace_file_is_what_the_caches_knew(tmp_path: Path) -> None:
    """The inspection's figures are the ones the caches' keys were made of (size, mtime_ns, the
    hash of the first and last MiB), for a file of each size class around the 1 and 2 MiB marks."""
    mib = 1 << 20
    for size in (10, mib, mib + 7, 2 * mib, 2 * mib + 7, 3 * mib):
        p = tmp_path / f"f{size}.json"
        p.write_bytes(bytes(range(256)) * (size // 256) + b"x" * (size % 256))
        f = TraceFile.of(p)
        data = p.read_bytes()
        h = hashlib.sha256(data[:mib])
        if size > 2 * mib:
            h.update(data[-mib:])
        elif size > mib:
            h.update(data[mib:])
        st = p.stat()
        assert f.source_key() == {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "head_tail_sha256": h.hexdigest()}
        assert (f.whole == data) if size <= 2 * mib else f.whole is None
        assert f.sha256 == (hashlib.sha256(data).hexdigest() if size <= 2 * mib else None)
        assert not f.gzip and f.estimated_json_bytes == size


def test_read_info_from_the_inspection_matches_reading_the_file(tmp_path: Path) -> None:
    """The run grouping's metadata (first MiB of the JSON, gunzipped from the bytes the inspection
    holds) is what reading the file through the gzip reader gives; also for a gzip of several
    members and for a trace whose head decompresses beyond the bytes held."""
    import gzip
    import json

    from profkit.ingest import runs

    doc = {"deviceProperties": [{"name": "NVIDIA H200"}], "distributedInfo": {"rank": 3, "world_size": 8},
           "trace_id": "abc", "traceEvents": [{"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "sglang::scheduler_TP3"}}]
           + [{"ph": "X", "cat": "cpu_op", "name": f"op{i}", "ts": i, "dur": 1, "pid": 1, "tid": 1} for i in range(60000)]}
    text = json.dumps(doc).encode()
    one = tmp_path / "one.json.gz"
    one.write_bytes(gzip.compress(text))
    cut = text.index(b'"traceEvents"') + 20
    several = tmp_path / "several.json.gz"
    several.write_bytes(gzip.compress(text[:cut]) + gzip.compress(text[cut:]))
    incompressible = tmp_path / "noise.json.gz"  # its first compressed MiB holds less than a MiB of JSON
    noise = doc | {"traceEvents": doc["traceEvents"][:1] + [{"ph": "i", "name": os.urandom(600).hex(), "ts": 0}] * 4000}
    incompressible.write_bytes(gzip.compress(json.dumps(noise).encode(), compresslevel=0))
    for p in (one, several, incompressible):
        with gzip.open(p) as fh:
            want = fh.read(runs.HEAD_BYTES)
        assert runs._json_head(TraceFile.of(p)) == want, p.name
        info = read_info(p)
        assert (info.devices, info.rank, info.world_size, info.trace_id, info.processes) == (
            ("NVIDIA H200",), 3, 8, "abc", ("sglang::scheduler_TP",))
