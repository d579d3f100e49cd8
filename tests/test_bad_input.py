"""The bad-input corpus (tests/data/bad, built by make_bad.py from a real H200 fixture): every case
ends within seconds with exit 3 and one line naming the file, or a correct analysis plus a warning."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from profkit.cli import app

from support import DATA, ROOT

BAD = DATA / "bad"
sys.path.insert(0, str(BAD))
from make_bad import EXPECTED  # noqa: E402

runner = CliRunner()


def test_corpus_is_complete():
    assert sorted(EXPECTED) == sorted(p.name for p in BAD.iterdir() if p.name != "make_bad.py" and p.name != "__pycache__")


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_case(name, tmp_path):
    code, text = EXPECTED[name]
    r = runner.invoke(app, ["analyze", str(BAD / name), "--json", str(tmp_path / "s.json")])
    flat = r.output.replace("\n", " ")
    assert r.exit_code == code, r.output
    assert "Traceback" not in r.output
    assert text in flat
    if code == 3:
        assert str(BAD / name) in flat
        assert not (tmp_path / "s.json").exists()  # nothing half-written
    else:
        s = json.loads((tmp_path / "s.json").read_text())
        for rank in s["ranks"]:
            for it in rank["iterations"]:
                assert it["gpu_window_us"] == pytest.approx(it["gpu_busy_us"] + it["gpu_idle_us"], abs=5e-4)


def test_skipped_events_do_not_change_the_rest():
    """Dropping 5 kernels' durations removes exactly those 5 kernels, nothing else."""
    from profkit.analysis import analyze_trace
    from profkit.ingest import load_trace

    good = analyze_trace(load_trace(BAD.parent / "gpu" / "eager_sync.pt.trace.json.gz"))
    bad = analyze_trace(load_trace(BAD / "missing_dur.json.gz"))
    assert good.iterations["gpu_kernels"].sum() - bad.iterations["gpu_kernels"].sum() == 5
    dup = analyze_trace(load_trace(BAD / "duplicated_events.json.gz"))
    assert dup.iterations["gpu_kernels"].to_list() == good.iterations["gpu_kernels"].to_list()
    st = analyze_trace(load_trace(BAD / "string_timestamps.json.gz"))
    assert st.iterations["gpu_busy_ns"].to_list() == good.iterations["gpu_busy_ns"].to_list()


def test_missing_path_and_empty_dir(tmp_path):
    r = runner.invoke(app, ["analyze", str(tmp_path / "nope.json.gz")])
    assert r.exit_code == 3 and "no such file" in r.output
    r = runner.invoke(app, ["analyze", str(tmp_path)])
    assert r.exit_code == 3 and "no trace files" in r.output


@pytest.mark.skipif(shutil.which("setpriv") is None, reason="needs setpriv to drop root")
def test_unreadable_file():
    import tempfile

    d = Path(tempfile.mkdtemp(prefix="profkit-unreadable-", dir="/tmp"))  # a folder every user can traverse
    d.chmod(0o755)
    p = d / "secret.json"
    p.write_text(json.dumps({"traceEvents": []}))
    p.chmod(0)
    cmd = [sys.executable, "-m", "profkit", "analyze", str(p)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    if os.geteuid() == 0:  # root reads anything: run as nobody
        drop = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
        probe = subprocess.run([*drop, sys.executable, "-c", "import typer, polars, msgspec, profkit.cli"], capture_output=True, env=env, cwd="/")
        if probe.returncode != 0:
            pytest.skip("this Python's packages are not readable by an unprivileged user (e.g. installed under /root)")
        cmd = [*drop, *cmd]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd="/")
    shutil.rmtree(d)
    assert r.returncode == 3, r.stderr
    assert "permission denied" in r.stderr and str(p) in r.stderr.replace("\n", "")
    assert "Traceback" not in r.stderr


def test_hostile_names_stay_text():
    r = runner.invoke(app, ["analyze", str(BAD / "hostile_names.json.gz"), "--top", "30"])
    assert r.exit_code == 0
    assert "<script>alert(1)</script>" in r.output
    assert "[bold red]rich markup[/]" in r.output


def test_nothing_on_a_device_is_device_records_none(tmp_path):
    """A trace with no GPU activity record, no launch call and no aten op (no_device_work: the real
    fixture's annotations and its runtime calls that launch nothing) says `device_records: none`, not
    `present`, with the warning; its host-side syncs are still counted (every synchronize call of the
    file, inside the iterations or outside). A CPU-only trace stays `none` on a CPU timeline, a
    GPU-only one `present`."""
    import gzip

    raw = json.loads(gzip.decompress((BAD / "no_device_work.json.gz").read_bytes()))["traceEvents"]
    cats = {e.get("cat") for e in raw}
    assert not cats & {"kernel", "gpu_memcpy", "gpu_memset", "cpu_op"}
    syncs = sum(1 for e in raw if e.get("cat") == "cuda_runtime" and e.get("name", "").endswith("Synchronize"))
    got = {}
    for name in ("no_device_work.json.gz", "cpu_only.json.gz", "gpu_only.json.gz"):
        out = tmp_path / f"{name}.json"
        r = runner.invoke(app, ["analyze", str(BAD / name), "--json", str(out)])
        assert r.exit_code == 0, r.output
        got[name] = json.loads(out.read_text())["ranks"][0]
    rank = got["no_device_work.json.gz"]
    assert (rank["device_timeline"], rank["device_records"]) == ("gpu", "none")
    assert any("nothing ran on a device" in w for w in rank["warnings"])
    assert all(i["gpu_kernels"] == 0 and i["gpu_busy_us"] == 0 for i in rank["iterations"])
    assert sum(i["syncs"] for i in rank["iterations"]) + rank["outside_iterations"]["syncs"] == syncs > 0
    assert (got["cpu_only.json.gz"]["device_timeline"], got["cpu_only.json.gz"]["device_records"]) == ("cpu", "none")
    assert got["gpu_only.json.gz"]["device_records"] == "present"
