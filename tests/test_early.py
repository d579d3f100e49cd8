"""Decoding a large trace ahead of the caller (profkit/ingest/early.py): `analyze` starts it before
importing polars and passes the handle down; load_tables_fast takes it over. The tables, warnings
and errors are those of the ordinary path, whichever chunks the scanner declines and whatever is
wrong with the file."""

from __future__ import annotations

import gzip
import json
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from typer.testing import CliRunner

from profkit.cli import app
from profkit.ingest import early
from profkit.ingest.columnar import load_tables_fast
from profkit.ingest.scan import lib

from support import DATA, public_trace

BAD = DATA / "bad"
SMALL_CHUNKS = 256 << 10

pytestmark = pytest.mark.skipif(lib() is None, reason="no C compiler here: nothing is decoded early")


def _load(path: Path, *, ahead: bool, jobs: int = 2):
    handle = None
    if ahead:
        handle = early.start(path, jobs=jobs, chunk_bytes=SMALL_CHUNKS)
        assert handle is not None
    with ThreadPoolExecutor(jobs) as ex:
        got = load_tables_fast(path, executor=ex if jobs > 1 else None, jobs=jobs, chunk_bytes=SMALL_CHUNKS, early=handle)
    assert handle is None or handle.taken, "the decode was not taken over"
    return got


def _same(a, b, *, declined: bool = False) -> None:
    """Both loads gave the same tables; `declined`: both must decline (the tiered decoder's files),
    else both must have decoded (so two declines never pass as "the same")."""
    if declined:
        assert a is None and b is None
        return
    assert a is not None and b is not None
    wa: list[str] = []
    wb: list[str] = []
    for x, y in zip(a.tables(wa), b.tables(wb)):
        assert x.schema == y.schema and x.equals(y)
    assert (a.unusable, a.t0_ns, a.n_events, a.meta, wa) == (b.unusable, b.t0_ns, b.n_events, b.meta, wb)


@pytest.mark.parametrize("jobs", [1, 2])
@pytest.mark.parametrize("name", ["tracelens_sglang_qwen3-8b_mi300x_graph_capture_bs32.json.gz",
                                  "tracelens_vllm_gpt-oss-20b_mi300x_mixed_piecewise_step.json.gz"])
def test_early_decode_gives_the_same_tables(name: str, jobs: int) -> None:
    path = public_trace(name)
    _same(_load(path, ahead=True, jobs=jobs), _load(path, ahead=False, jobs=jobs))


def test_chunks_the_scanner_declines_are_decoded_by_msgspec(tmp_path: Path) -> None:
    """An escaped key in a few events: their chunks go to msgspec later, the rest is scanned early."""
    src = json.loads(gzip.decompress((public_trace("tracelens_sglang_qwen3-8b_mi300x_graph_capture_bs32.json.gz")).read_bytes()))
    text = json.dumps(src)
    n = text.count('"ph": "X"')
    text = text.replace('"ph": "X"', '"\\u0070h": "X"', n // 50)  # msgspec reads the key; the scanner declines
    path = tmp_path / "declined.json.gz"
    path.write_bytes(gzip.compress(text.encode()))
    handle = early.start(path, jobs=2, chunk_bytes=SMALL_CHUNKS)
    run = handle.take(path)
    assert run is not None and run.result is not None
    kinds = {type(item).__name__ for item in run.result[0]}
    assert kinds == {"bytes", "Rows"}, kinds  # some chunks declined, some scanned
    from profkit.ingest.columnar import _from_early

    a, b = _from_early(run), _load(path, ahead=False)
    _same(a, b)
    assert a is not None and a.n_events == len(src["traceEvents"])


@pytest.mark.parametrize("name", ["truncated.json.gz", "gzip_of_truncated_json.json.gz", "not_gzip.json.gz",
                                  "plain_json_named_gz.json.gz", "duplicated_events.json.gz", "negative_dur.json.gz"])
def test_bad_files_take_the_same_path(name: str) -> None:
    """What sends a file to the tiered decoder (a broken gzip, a cut document) does so early too."""
    a, b = _load(BAD / name, ahead=True), _load(BAD / name, ahead=False)
    _same(a, b, declined=b is None)  # which files decline is the ordinary path's verdict; early must match it
    if name in ("truncated.json.gz", "gzip_of_truncated_json.json.gz", "not_gzip.json.gz"):
        assert b is None  # a broken gzip or a cut document always goes to the tiered decoder


def test_analyze_decodes_early_and_says_the_same(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI path: a trace over the size threshold is decoded early; the summary is the same."""
    import profkit.ingest as ingest

    path = tmp_path / "t.json.gz"
    shutil.copy(public_trace("tracelens_sglang_qwen3-8b_mi300x_graph_capture_bs32.json.gz"), path)
    runner = CliRunner()
    r = runner.invoke(app, ["analyze", str(path), "--no-cache", "--json", str(tmp_path / "plain.json")])
    assert r.exit_code == 0, r.output
    started: list = []
    real_start = early.start
    monkeypatch.setattr(ingest, "PARALLEL_MIN_BYTES", 0)
    monkeypatch.setattr(early, "start", lambda f, **kw: started.append(real_start(f, **kw)) or started[-1])
    r = runner.invoke(app, ["analyze", str(path), "--no-cache", "--json", str(tmp_path / "early.json")])
    assert r.exit_code == 0, r.output
    assert len(started) == 1 and started[0].file.path == path and started[0].taken

    def strip(d):
        drop = ("generated_at", "timings")
        return {k: strip(v) for k, v in d.items() if k not in drop} if isinstance(d, dict) else d

    assert strip(json.loads((tmp_path / "early.json").read_text())) == strip(json.loads((tmp_path / "plain.json").read_text()))


def test_a_run_nobody_takes_is_stopped() -> None:
    """stop() (analyze's exit path) stops a decode nobody took; a later load decodes the file itself."""
    path = public_trace("tracelens_sglang_qwen3-8b_mi300x_graph_capture_bs32.json.gz")
    handle = early.start(path, jobs=2, chunk_bytes=SMALL_CHUNKS)
    handle.stop()
    assert handle._stop and handle.take(path) is None
    handle.wait()
    assert _load(path, ahead=False) is not None


def test_a_decode_of_another_file_is_not_taken() -> None:
    """The handle goes only to the load of its own file; another file's load decodes that file."""
    path = public_trace("tracelens_sglang_qwen3-8b_mi300x_graph_capture_bs32.json.gz")
    other = public_trace("tracelens_vllm_gpt-oss-20b_mi300x_mixed_piecewise_step.json.gz")
    handle = early.start(path, jobs=2, chunk_bytes=SMALL_CHUNKS)
    got = load_tables_fast(other, chunk_bytes=SMALL_CHUNKS, early=handle)
    assert not handle.taken
    _same(got, load_tables_fast(other, chunk_bytes=SMALL_CHUNKS))
    handle.stop()
    handle.wait()


def test_the_cli_begins_the_decode_ahead_and_analyze_takes_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """flows/ahead.py (what `profkit analyze BIG` runs before the CLI's imports) begins the decode; the
    command takes that very decode, and says the same as without it."""
    import profkit.ingest as ingest
    from profkit.flows.ahead import decode_ahead

    path = tmp_path / "t.json.gz"
    shutil.copy(public_trace("tracelens_sglang_qwen3-8b_mi300x_graph_capture_bs32.json.gz"), path)
    runner = CliRunner()
    r = runner.invoke(app, ["analyze", str(path), "--no-cache", "--json", str(tmp_path / "plain.json")])
    assert r.exit_code == 0, r.output
    monkeypatch.setattr(ingest, "PARALLEL_MIN_BYTES", 0)
    args = ["analyze", str(path), "--no-cache", "--json", str(tmp_path / "ahead.json")]
    decode_ahead(["profkit", *args])
    began = early._AHEAD
    assert began is not None and not began.taken
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    assert began.taken and early._AHEAD is None
    assert json.loads((tmp_path / "ahead.json").read_text()) == json.loads((tmp_path / "plain.json").read_text())


@pytest.mark.parametrize("case", ["list-markers", "jobs", "two files", "folder", "cached", "other command", "small"])
def test_the_decode_begins_ahead_only_in_the_plain_case(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: str) -> None:
    """Anything but `analyze` of one large trace, no --jobs, no folder, no tables cache to read: nothing begins."""
    import profkit.ingest as ingest
    from profkit.flows.ahead import decode_ahead

    path = tmp_path / "t.json.gz"
    shutil.copy(public_trace("tracelens_sglang_qwen3-8b_mi300x_graph_capture_bs32.json.gz"), path)
    if case != "small":
        monkeypatch.setattr(ingest, "PARALLEL_MIN_BYTES", 0)
    args = {"list-markers": ["analyze", str(path), "--list-markers"], "jobs": ["analyze", str(path), "--jobs", "1"],
            "two files": ["analyze", str(path), str(path)], "folder": ["analyze", str(path), "--tables", str(tmp_path)],
            "cached": ["analyze", str(path)], "other command": ["diff", str(path), str(path)], "small": ["analyze", str(path)]}[case]
    if case == "cached":
        (tmp_path / ("t.json.gz" + ingest.cache.CACHE_SUFFIX)).mkdir()
    decode_ahead(["profkit", *args])
    assert early._AHEAD is None


def test_a_decode_begun_ahead_for_other_jobs_stops() -> None:
    """`start` for the same file with other jobs (analyze --jobs, read after the decode began) stops the one
    begun ahead and begins its own; drop_ahead stops one nobody asked for."""
    path = public_trace("tracelens_sglang_qwen3-8b_mi300x_graph_capture_bs32.json.gz")
    f = __import__("profkit.ingest.identity", fromlist=["trace_file"]).trace_file(path)
    early.ahead(f, jobs=2)
    began = early._AHEAD
    mine = early.start(path, jobs=1)
    assert began is not None and mine is not None and mine is not began and began._stop
    mine.stop()
    early.ahead(f, jobs=2)
    began = early._AHEAD
    early.drop_ahead()
    assert began is not None and began._stop and early._AHEAD is None
    began.wait()
    mine.wait()


def test_the_decode_begins_ahead_only_in_profkits_own_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A program that imports profkit.cli with `analyze` among its own arguments begins nothing; the console
    script and `python -m profkit` (whose argv[0] is profkit/__main__.py) do."""
    import profkit.ingest as ingest
    from profkit.flows.ahead import decode_ahead

    path = tmp_path / "t.json.gz"
    shutil.copy(public_trace("tracelens_sglang_qwen3-8b_mi300x_graph_capture_bs32.json.gz"), path)
    monkeypatch.setattr(ingest, "PARALLEL_MIN_BYTES", 0)
    decode_ahead(["myscript.py", "analyze", str(path), "--no-cache"])
    assert early._AHEAD is None
    for argv0 in ("/venv/bin/profkit", str(Path(ingest.__file__).parent.parent / "__main__.py")):
        decode_ahead([argv0, "analyze", str(path), "--no-cache"])
        assert early._AHEAD is not None
        early.drop_ahead()
