"""`profkit analyze` as a user runs it: exit codes, one-line errors, JSON and timeline outputs."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys

import polars as pl
import pytest
from typer.testing import CliRunner

from factories import TraceBuilder
from profkit.cli import app
from factories import synthetic_trace as build

runner = CliRunner()


def run(*args: str):
    return runner.invoke(app, list(args))


def test_help_has_example():
    r = run("analyze", "--help")
    assert r.exit_code == 0
    assert "Example" in r.output


def test_json_and_timeline(tmp_path):
    t = build().write(tmp_path / "t.pt.trace.json.gz")
    r = run("analyze", str(t), "--json", str(tmp_path / "s.json"), "--timeline", str(tmp_path / "tl.parquet"))
    assert r.exit_code == 0, r.output
    s = json.loads((tmp_path / "s.json").read_text())
    assert s["ranks"][0]["iterations"][1]["syncs"] == 1
    tl = pl.read_parquet(tmp_path / "tl.parquet")
    assert tl.height == 10
    assert set(tl.columns) >= {"iteration", "rank", "stream", "name", "category", "start_us", "dur_us", "launch_api", "launch_latency_us"}
    # start is relative to the iteration's GPU window: each iteration's first op starts at 0
    assert tl.group_by("iteration").agg(pl.col("start_us").min())["start_us"].to_list() == [0.0, 0.0, 0.0]
    r = run("analyze", str(t), "--timeline", str(tmp_path / "tl.csv"))
    assert r.exit_code == 0
    assert pl.read_csv(tmp_path / "tl.csv").height == 10


def test_json_to_stdout_is_pure_json(tmp_path):
    t = build().write(tmp_path / "t.json")
    p = subprocess.run([sys.executable, "-m", "profkit", "analyze", str(t), "--json", "-"], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["schema_version"] == 3
    assert "per iteration" in p.stderr


def test_hostile_names_print_as_text(tmp_path):
    b = TraceBuilder()
    b.cpu("scheduler.run_batch", 0, 100_000)
    b.kernel("[bold red]x[/]<script>alert(1)</script>", 1000, 5000, 2000)
    r = run("analyze", str(b.write(tmp_path / "h.json")))
    assert r.exit_code == 0, r.output
    assert "[bold red]x[/]<script>alert(1)</script>" in r.output.replace("\n", "")


@pytest.mark.parametrize(
    "content, expect",
    [
        (b"", "empty file"),
        (b"\x00\x01\x02garbage\xff", "not JSON"),
        (b"[1, 2, 3]", "JSON"),
        (b'{"foo": []}', "traceEvents"),
        (b'{"traceEvents": []}', "no events"),
        (b'{"traceEvents": [{"ph": "X", "na', "not valid JSON"),
    ],
)
def test_bad_input_is_one_line_exit_3(tmp_path, content, expect):
    p = tmp_path / "bad.json"
    p.write_bytes(content)
    r = run("analyze", str(p))
    assert r.exit_code == 3, r.output
    assert "Traceback" not in r.output
    assert str(p) in r.output.replace("\n", "")
    assert expect in r.output


def test_truncated_gzip(tmp_path):
    data = gzip.compress(json.dumps(build().doc()).encode())
    p = tmp_path / "cut.json.gz"
    p.write_bytes(data[: len(data) // 2])
    r = run("analyze", str(p))
    assert r.exit_code == 3
    assert "truncated or corrupt gzip" in r.output


def test_missing_path_and_empty_dir(tmp_path):
    assert run("analyze", str(tmp_path / "nope.json")).exit_code == 3
    r = run("analyze", str(tmp_path))
    assert r.exit_code == 3
    assert "no trace files" in r.output


def test_marker_not_found_exit_1(tmp_path):
    t = build().write(tmp_path / "t.json")
    r = run("analyze", str(t), "--marker", "^no_such_span$")
    assert r.exit_code == 1
    assert "no CPU event matches" in r.output


def test_bad_timeline_suffix_and_catalog(tmp_path):
    t = build().write(tmp_path / "t.json")
    assert run("analyze", str(t), "--timeline", str(tmp_path / "x.xlsx")).exit_code != 0
    r = run("analyze", str(t), "--catalog", "no-such-catalog")
    assert r.exit_code == 2
    assert "Traceback" not in r.output


def test_debug_shows_traceback(tmp_path):
    p = tmp_path / "bad.json"
    p.write_bytes(b"[1,2]")
    r = subprocess.run([sys.executable, "-m", "profkit", "--debug", "analyze", str(p)], capture_output=True, text=True)
    assert r.returncode == 3
    assert "Traceback" in r.stderr


def test_folder_with_sidecar_manifests_is_read_and_says_what_it_skipped():
    """tests/data/gpu_proxy holds <run>.manifest.json beside each trace and a README: they are not
    read as traces (they failed the whole folder before), and the output says they were skipped."""
    from pathlib import Path

    folder = Path(__file__).parent / "data" / "gpu_proxy"
    r = subprocess.run([sys.executable, "-m", "profkit", "analyze", str(folder), "--no-cache", "--top", "1"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "skipped README.md, all.manifest.json" in r.stderr
    assert "run 7 of 7: topk_v2" in r.stdout
