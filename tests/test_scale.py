"""Scale paths give the same answers: the chunked/parallel decoder, the parquet cache, and ranks
analyzed in parallel produce summaries identical to the uncached single-process path."""

from __future__ import annotations

import gzip
import json
import os
import shutil
from pathlib import Path

import polars as pl
import pytest

from profkit.analysis import analyze_trace
from profkit.analysis.summary import build_summary
from profkit.ingest import load_trace, load_traces
from profkit.ingest import cache as pcache
from profkit.ingest import identity
from profkit.ingest.columnar import load_tables_fast, make_executor
from profkit.ingest.decode import decode_events, read_bytes
from profkit.ingest.tables import add_unusable_warnings, events_frame, split_tables

from support import DATA, PUBLIC_TRACES, ROOT, TRACELENS_STEPS, public_trace
from support.helpers import analyze_paths

GPU = DATA / "gpu"
FIXTURES = sorted(GPU.glob("*.json.gz")) + [PUBLIC_TRACES / n for n in TRACELENS_STEPS]


@pytest.fixture(autouse=True)
def _cache_small_traces(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fixtures are small; cache them anyway (real use caches traces of 16 MB and more)."""
    monkeypatch.setattr(pcache, "MIN_BYTES", 0)
    monkeypatch.delenv("PROFKIT_NO_CACHE", raising=False)


def test_small_traces_are_not_cached(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pcache, "MIN_BYTES", 16 << 20)
    src = _copy(GPU / "eager_sync.pt.trace.json.gz", tmp_path)
    load_trace(src, cache=True)
    analyze_paths([src])
    pcache.wait_pending()
    assert not pcache.cache_dir(src).exists()


def _summary(analyses) -> dict:
    s = build_summary(analyses)
    s.pop("profkit_version", None)
    return s


def _copy(src: Path, dst_dir: Path, name: str | None = None) -> Path:
    dst = dst_dir / (name or src.name)
    shutil.copyfile(src, dst)
    return dst


def _fast_tables(load) -> tuple[tuple[pl.DataFrame, ...], list[str]]:
    """A TablesLoad's tables and warnings, as ingest.load_trace makes them."""
    w: list[str] = []
    add_unusable_warnings(load.unusable, w)
    return load.tables(w), w


def _tiered_tables(path: Path):
    """The tiered decoder's tables, t0, event count, metadata and warnings (the reference)."""
    events, meta, w = decode_events(path, read_bytes(path))
    df, t0 = events_frame(events, w)
    return split_tables(df, w), t0, len(events), meta, w


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.name)
def test_chunked_decoder_matches_tiered_decoder(path: Path) -> None:
    """Tiny chunks (hundreds of cuts) give the tiered decoder's tables, t0, metadata and warnings."""
    if path.parent == PUBLIC_TRACES:
        path = public_trace(path.name)
    fast = load_tables_fast(path, chunk_bytes=64 << 10)
    assert fast is not None, "the fast path should apply to real Kineto files"
    meta = fast.meta
    got, w_fast = _fast_tables(fast)
    want, t0, n, meta_slow, w_slow = _tiered_tables(path)
    assert all(a.equals(b) and a.schema == b.schema for a, b in zip(got, want))
    assert (fast.t0_ns, fast.n_events, meta, w_fast) == (t0, n, meta_slow, w_slow)


def test_chunked_decoder_in_worker_processes() -> None:
    """Chunks decoded in worker processes (each with ids of its own, mapped back here): the same tables."""
    path = public_trace("tracelens_sglang_qwen3-8b_mi300x_extend_step.json.gz")
    ex = make_executor(2)
    try:
        par = load_tables_fast(path, executor=ex, jobs=2, chunk_bytes=256 << 10)
    finally:
        ex.shutdown()
    ser = load_tables_fast(path)
    assert par is not None and ser is not None
    assert (par.t0_ns, par.n_events, par.meta, par.unusable) == (ser.t0_ns, ser.n_events, ser.meta, ser.unusable)
    (a, wa), (b, wb) = _fast_tables(par), _fast_tables(ser)
    assert wa == wb and all(x.equals(y) and x.schema == y.schema for x, y in zip(a, b))


@pytest.mark.parametrize(
    "text",
    [
        '[{"ph": "X", "name": "a", "ts": 1, "dur": 1}]',  # a top-level array
        '{"traceEvents": [{"ph": "X", "name": "a", "ts": "1.5", "dur": 1}]}',  # numbers as strings
        '{"traceEvents": [{"name": "no phase", "ts": 1}]}',  # no ph
        '{"traceEvents": [{"ph": "X", "name": "a", "ts": 1, "dur": 1}',  # truncated
        '{"other": 1}',
        # a non-'X' event the strict decoder rejects: the tiered path decides (and warns)
        '{"traceEvents": [{"ph": "X", "name": "a", "ts": 1, "dur": 1}, {"ph": "i", "name": "b", "ts": 2, "tid": null}]}',
        '{"traceEvents": [{"ph": "X", "name": "a", "ts": 1, "dur": 1}, {"ph": "s", "id": 1, "ts": 2, "cat": 7}]}',
    ],
)
def test_fast_path_declines_what_it_does_not_handle(tmp_path: Path, text: str) -> None:
    p = tmp_path / "t.json"
    p.write_text(text)
    assert load_tables_fast(p) is None


def test_cut_inside_a_string_falls_back(tmp_path: Path) -> None:
    """A name holding '}, {' that lands on a cut: the chunk fails to decode, the tiered path answers."""
    evs = [{"ph": "X", "cat": "cpu_op", "name": "x}, {" * 50 + str(i), "ts": i, "dur": 1, "pid": 1, "tid": 1} for i in range(2000)]
    p = tmp_path / "t.json"
    p.write_text(json.dumps({"traceEvents": evs}))
    want = _tiered_tables(p)[0]
    for chunk in (4 << 10, 7 << 10, 64 << 10):
        fast = load_tables_fast(p, chunk_bytes=chunk)
        if fast is not None:  # when every cut happened to be right, the tables are still exact
            assert all(a.equals(b) for a, b in zip(_fast_tables(fast)[0], want))
    t = load_trace(p, cache=False)
    assert t.cpu.height == 2000


def test_cache_roundtrip_and_summary_identity(tmp_path: Path) -> None:
    src = _copy(GPU / "eager_sync.pt.trace.json.gz", tmp_path)
    plain = _summary([analyze_trace(load_trace(src, cache=False))])
    assert not pcache.cache_dir(src).exists()
    first = _summary([analyze_trace(load_trace(src, cache=True))])  # writes (in the background)
    pcache.wait_pending()
    assert (pcache.cache_dir(src) / "manifest.json").exists()
    hit = pcache.read(src)
    assert hit is not None
    second = _summary([analyze_trace(load_trace(src, cache=True))])  # reads
    assert plain == first == second
    for name in pcache.TABLES:
        assert (pcache.cache_dir(src) / f"{name}.parquet").exists()
    assert not list(pcache.cache_dir(src).glob("*.pkl")) and not list(pcache.cache_dir(src).glob("*.pickle"))


def test_cached_tables_are_the_ingested_tables(tmp_path: Path) -> None:
    src = _copy(public_trace("tracelens_vllm_gpt-oss-20b_mi300x_mixed_piecewise_step.json.gz"), tmp_path)
    a = load_trace(src, cache=True)
    b = load_trace(src, cache=True)
    for name in ("gpu_ops", "calls", "cpu", "gpu_annotations"):
        assert getattr(a, name).equals(getattr(b, name)), name
        assert getattr(a, name).schema == getattr(b, name).schema
    assert (a.t0_ns, a.n_events, a.meta, a.warnings, a.rank, a.device) == (b.t0_ns, b.n_events, b.meta, b.warnings, b.rank, b.device)
    assert b.sha256 == pcache.file_sha256(src)


def test_stale_cache_is_rebuilt(tmp_path: Path) -> None:
    src = _copy(GPU / "eager_sync.pt.trace.json.gz", tmp_path, "t.pt.trace.json.gz")
    load_trace(src, cache=True)
    pcache.wait_pending()
    # replace the trace by another one: size, mtime and content change
    shutil.copyfile(GPU / "graph_decode.pt.trace.json.gz", src)
    assert pcache.read(src) is None
    got = _summary([analyze_trace(load_trace(src, cache=True))])
    want = _summary([analyze_trace(load_trace(src, cache=False))])
    assert got == want
    assert pcache.read(src) is not None  # rewritten for the new content


def test_same_size_and_mtime_but_other_content_is_a_miss(tmp_path: Path) -> None:
    src = _copy(GPU / "eager_sync.pt.trace.json.gz", tmp_path)
    load_trace(src, cache=True)
    pcache.wait_pending()
    st = src.stat()
    data = bytearray(src.read_bytes())
    data[-100] ^= 0xFF  # same size; the last MiB differs
    src.write_bytes(bytes(data))
    os.utime(src, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert pcache.read(src) is None


@pytest.mark.parametrize("damage", ["truncate_parquet", "garbage_parquet", "bad_manifest", "edited_manifest", "missing_file"])
def test_corrupt_cache_is_never_used(tmp_path: Path, damage: str) -> None:
    src = _copy(GPU / "eager_sync.pt.trace.json.gz", tmp_path)
    want = _summary([analyze_trace(load_trace(src, cache=False))])
    load_trace(src, cache=True)
    pcache.wait_pending()
    d = pcache.cache_dir(src)
    if damage == "truncate_parquet":
        p = d / "cpu.parquet"
        p.write_bytes(p.read_bytes()[:-50])
    elif damage == "garbage_parquet":
        p = d / "gpu_ops.parquet"
        data = bytearray(p.read_bytes())
        data[len(data) // 2] ^= 0xFF
        p.write_bytes(bytes(data))
    elif damage == "bad_manifest":
        (d / "manifest.json").write_text("{not json")
    elif damage == "edited_manifest":
        man = json.loads((d / "manifest.json").read_text())
        man["t0_ns"] += 1000
        man["files"]["cpu"]["rows"] += 1
        (d / "manifest.json").write_text(json.dumps(man))
    else:
        (d / "calls.parquet").unlink()
    assert pcache.read(src) is None
    assert _summary([analyze_trace(load_trace(src, cache=True))]) == want
    assert pcache.read(src) is not None  # rebuilt


def test_other_code_version_is_a_miss(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = _copy(GPU / "eager_sync.pt.trace.json.gz", tmp_path)
    load_trace(src, cache=True)
    pcache.wait_pending()
    assert pcache.read(src) is not None
    monkeypatch.setattr(identity, "_FINGERPRINT", "another profkit")
    assert pcache.read(src) is None


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores directory permissions")
def test_read_only_folder_skips_the_cache(tmp_path: Path) -> None:
    d = tmp_path / "ro"
    d.mkdir()
    src = _copy(GPU / "eager_sync.pt.trace.json.gz", d)
    d.chmod(0o555)
    try:
        t = load_trace(src, cache=True)
        pcache.wait_pending()
        assert t.gpu_ops.height > 0
        assert not pcache.cache_dir(src).exists()
    finally:
        d.chmod(0o755)


def test_permission_denied_skips_the_cache_silently(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """As root the chmod test above cannot run; here creating the cache folder is refused."""
    src = _copy(GPU / "eager_sync.pt.trace.json.gz", tmp_path)
    want = _summary([analyze_trace(load_trace(src, cache=False))])

    def refuse(self, *a, **k):
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "mkdir", refuse)
    got = _summary([analyze_trace(load_trace(src, cache=True))])
    pcache.wait_pending()
    monkeypatch.undo()
    assert got == want
    assert not pcache.cache_dir(src).exists()


def test_unwritable_cache_location_is_silent(tmp_path: Path) -> None:
    src = _copy(GPU / "eager_sync.pt.trace.json.gz", tmp_path)
    pcache.cache_dir(src).write_text("a file where the cache folder would go")
    t = load_trace(src, cache=True)  # cannot write, cannot read: no error
    assert t.gpu_ops.height > 0
    assert pcache.read(src) is None
    assert pcache.cache_dir(src).read_text().startswith("a file")  # left alone


def test_env_switch_disables_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = _copy(GPU / "eager_sync.pt.trace.json.gz", tmp_path)
    load_trace(src)  # library default: no cache
    pcache.wait_pending()
    assert not pcache.cache_dir(src).exists()
    monkeypatch.setenv("PROFKIT_NO_CACHE", "1")
    load_trace(src, cache=None)
    analyze_paths([src])
    pcache.wait_pending()
    assert not pcache.cache_dir(src).exists()
    monkeypatch.delenv("PROFKIT_NO_CACHE")
    load_trace(src, cache=None)
    pcache.wait_pending()
    assert pcache.cache_dir(src).exists()


def _rank_files(tmp_path: Path) -> list[Path]:
    """Three rank files (SGLang naming), from real fixtures; two share a distributedInfo-less rank."""
    files = []
    for r, src in enumerate([GPU / "eager_sync.pt.trace.json.gz", GPU / "graph_decode.pt.trace.json.gz", GPU / "two_streams.pt.trace.json.gz"]):
        files.append(_copy(src, tmp_path, f"run-TP-{r}.trace.json.gz"))
    return files


def test_parallel_ranks_identical_to_serial(tmp_path: Path) -> None:
    files = _rank_files(tmp_path)
    serial = _summary([analyze_trace(t) for t in load_traces(files, cache=False, jobs=1)])
    par = _summary(analyze_paths(files, cache=False, jobs=2, min_parallel_bytes=0))
    cached_first = _summary(analyze_paths(files, cache=True, jobs=2, min_parallel_bytes=0))
    cached = _summary(analyze_paths(files, cache=True, jobs=2, min_parallel_bytes=0))
    assert serial == par == cached_first == cached
    assert [r["rank"] for r in serial["ranks"]] == [0, 1, 2]


def test_parallel_duplicate_ranks_warn_like_serial(tmp_path: Path) -> None:
    a = _copy(GPU / "eager_sync.pt.trace.json.gz", tmp_path, "a-TP-0.trace.json.gz")
    b = _copy(GPU / "graph_decode.pt.trace.json.gz", tmp_path, "b-TP-0.trace.json.gz")
    serial = _summary([analyze_trace(t) for t in load_traces([a, b], cache=False, jobs=1)])
    par = _summary(analyze_paths([a, b], cache=False, jobs=2, min_parallel_bytes=0))
    assert serial == par
    assert any("appears in several inputs" in w for w in par["ranks"][0]["warnings"])


def test_single_file_chunk_parallel_identical(tmp_path: Path) -> None:
    src = _copy(public_trace("tracelens_sglang_qwen3-8b_mi300x_extend_step.json.gz"), tmp_path)
    serial = _summary([analyze_trace(t) for t in load_traces([src], cache=False, jobs=1)])
    par = _summary([analyze_trace(t) for t in load_traces([src], cache=False, jobs=2, min_parallel_bytes=0)])
    assert serial == par


def test_repeated_trace_parses_like_the_original(tmp_path: Path) -> None:
    """The benchmark's builder: a multi-member gzip of a repeated trace decodes on both paths alike."""
    import sys

    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        from bench_ingest import TEMPLATES, assemble, build_body
    finally:
        sys.path.pop(0)
    body = build_body(TEMPLATES["eager_sync"], 1_200_000, tmp_path / "body.gz")
    info = assemble(body, tmp_path / "big-TP-3.trace.json.gz", rank=3)
    p = Path(info["path"])
    assert body["copies"] >= 3
    fast = load_trace(p, cache=False)
    events, meta, _ = decode_events(p, read_bytes(p))
    assert fast.n_events == len(events) == info["events"] and meta["rank"] == 3 == fast.rank
    one = analyze_trace(load_trace(GPU / "eager_sync.pt.trace.json.gz", cache=False))
    many = analyze_trace(fast)
    # each copy's iterations are the original's: same kernels per iteration, ids stayed unique
    assert many.iterations.height == one.iterations.height * body["copies"]
    assert many.ops.height == one.ops.height * body["copies"]
    assert sorted(set(many.iterations["gpu_kernels"].to_list())) == sorted(set(one.iterations["gpu_kernels"].to_list()))


def test_cli_analyze_no_cache_and_jobs(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from profkit.cli import app

    files = _rank_files(tmp_path)
    runner = CliRunner()
    outs = []
    for extra in (["--no-cache", "--jobs", "1"], ["--jobs", "2"], ["--jobs", "2"]):
        o = tmp_path / f"s{len(outs)}.json"
        r = runner.invoke(app, ["analyze", *map(str, files), "--json", str(o), *extra])
        assert r.exit_code == 0, r.output
        d = json.loads(o.read_text())
        d.pop("profkit_version")
        outs.append(d)
    assert outs[0] == outs[1] == outs[2]
    assert all(pcache.cache_dir(f).exists() for f in files)
    r = runner.invoke(app, ["analyze", str(files[0]), "--jobs", "0"])
    assert r.exit_code == 2


def test_gzip_of_plain_json_same_result(tmp_path: Path) -> None:
    src = GPU / "eager_sync.pt.trace.json.gz"
    plain = tmp_path / "x.pt.trace.json"
    plain.write_bytes(gzip.decompress(src.read_bytes()))
    a = load_trace(plain, cache=False)
    b = load_trace(src, cache=False)
    assert a.gpu_ops.equals(b.gpu_ops) and a.cpu.equals(b.cpu) and a.calls.equals(b.calls)
    assert pl.concat([a.gpu_ops, b.gpu_ops]).height == 2 * a.gpu_ops.height


def test_analysis_cache_roundtrip_is_exact(tmp_path: Path) -> None:
    """Re-running with the same options reads the per-rank results back: every frame, dtype and field."""
    files = [_copy(f, tmp_path) for f in (GPU / "eager_sync.pt.trace.json.gz", public_trace("tracelens_sglang_qwen3-8b_mi300x_decode_step.json.gz"))]
    fresh = analyze_paths(files, cache=False, jobs=1)
    analyze_paths(files, cache=True, jobs=1)  # writes
    assert all((pcache.cache_dir(f) / "analysis").is_dir() for f in files)
    cached = analyze_paths(files, cache=True, jobs=1)  # reads
    for a, b in zip(fresh, cached):
        for name in pcache.ANALYSIS_FRAMES:
            fa, fb = getattr(a, name), getattr(b, name)
            assert fa.schema == fb.schema and fa.equals(fb), name
        # a trace recorded with shapes (the TraceLens one) keeps every GPU op's work too (issue 41)
        assert (a.device_work is None) == (b.device_work is None)
        if a.device_work is not None:
            assert a.device_work.schema == b.device_work.schema and a.device_work.equals(b.device_work)
        for f in ("rank", "device", "path", "marker", "catalog", "t0_ns", "warnings", "device_timeline"):
            assert getattr(a, f) == getattr(b, f), f
    assert _summary(fresh) == _summary(cached)


def test_analysis_cache_is_keyed_by_options(tmp_path: Path) -> None:
    src = _copy(GPU / "eager_sync.pt.trace.json.gz", tmp_path)
    for mb in (2.0, 50.0, 2.0):
        got = _summary(analyze_paths([src], cache=True, min_bubble_us=mb))
        want = _summary(analyze_paths([src], cache=False, min_bubble_us=mb))
        assert got == want
    from profkit.analysis.catalog import load_catalog

    cat = load_catalog("generic")
    assert _summary(analyze_paths([src], cache=True, catalog=cat)) == _summary(analyze_paths([src], cache=False, catalog=cat))
    assert len([p for p in (pcache.cache_dir(src) / "analysis").iterdir() if p.is_dir()]) == 3


def test_analysis_cache_stale_when_trace_changes(tmp_path: Path) -> None:
    src = _copy(GPU / "eager_sync.pt.trace.json.gz", tmp_path, "x-TP-0.trace.json.gz")
    analyze_paths([src], cache=True)
    shutil.copyfile(GPU / "graph_decode.pt.trace.json.gz", src)
    assert _summary(analyze_paths([src], cache=True)) == _summary(analyze_paths([src], cache=False))


def test_analysis_cache_corrupt_entry_is_ignored(tmp_path: Path) -> None:
    src = _copy(GPU / "eager_sync.pt.trace.json.gz", tmp_path)
    want = _summary(analyze_paths([src], cache=False))
    analyze_paths([src], cache=True)
    entry = next(p for p in (pcache.cache_dir(src) / "analysis").iterdir() if p.is_dir())
    f = entry / "bubbles.parquet"
    data = bytearray(f.read_bytes())
    data[len(data) // 2] ^= 0x55
    f.write_bytes(bytes(data))
    assert _summary(analyze_paths([src], cache=True)) == want


def test_stdlib_gzip_fallback_same_tables(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without isal and zlib-ng the stdlib decompresses: same tables."""
    import sys

    from support.helpers import gzip_library
    from profkit.ingest.columnar import load_tables_fast

    path = public_trace("tracelens_vllm_gpt-oss-20b_mi300x_mixed_piecewise_step.json.gz")
    fast = load_tables_fast(path)
    monkeypatch.setitem(sys.modules, "isal", None)
    monkeypatch.setitem(sys.modules, "zlib_ng", None)
    assert gzip_library() == "zlib"
    slow = load_tables_fast(path)
    assert fast is not None and slow is not None
    assert all(a.equals(b) for a, b in zip(fast.tables([]), slow.tables([])))


def test_chunked_tables_in_worker_processes_identical() -> None:
    """Tables decoded by the workers (sent back as Arrow IPC) equal the ones decoded here."""
    from profkit.ingest.columnar import load_tables_fast

    path = public_trace("tracelens_sglang_qwen3-8b_mi300x_graph_capture_bs32.json.gz")
    ex = make_executor(2)
    try:
        par = load_tables_fast(path, executor=ex, jobs=2, chunk_bytes=512 << 10)
    finally:
        ex.shutdown()
    ser = load_tables_fast(path, chunk_bytes=512 << 10)
    assert par is not None and ser is not None
    for a, b in zip(par.tables([]), ser.tables([])):
        assert a.schema == b.schema and a.equals(b)
    assert (par.unusable, par.t0_ns, par.n_events, par.meta) == (ser.unusable, ser.t0_ns, ser.n_events, ser.meta)


def test_parallel_decode_without_room_in_dev_shm(monkeypatch: pytest.MonkeyPatch) -> None:
    """A small /dev/shm (containers): the slots go to the temp folder instead, same result."""
    import profkit.ingest.columnar as col

    import profkit.ingest.reading as reading

    monkeypatch.setattr(reading, "_room_in", lambda folder, need: False)
    path = public_trace("tracelens_vllm_gpt-oss-20b_mi300x_mixed_piecewise_step.json.gz")
    ex = make_executor(2)
    try:
        par = col.load_tables_fast(path, executor=ex, jobs=2, chunk_bytes=256 << 10)
    finally:
        ex.shutdown()
    ser = col.load_tables_fast(path)
    assert par is not None and ser is not None
    assert all(a.equals(b) for a, b in zip(par.tables([]), ser.tables([])))
