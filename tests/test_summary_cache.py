"""The summary cache: a repeated `analyze` of unchanged traces with the same options prints and
writes the stored summary without importing polars; anything that changes the answer misses."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from profkit.analysis import summary_cache
from profkit.cli import app
from profkit.ingest import cache as pcache
from processes import HANG_S

from support import DATA

SRC = DATA / "gpu" / "eager_sync.pt.trace.json.gz"
runner = CliRunner()


@pytest.fixture(autouse=True)
def _cache_small(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pcache, "MIN_BYTES", 0)
    monkeypatch.setattr(summary_cache, "_MIN_BYTES", 0)
    monkeypatch.delenv("PROFKIT_NO_CACHE", raising=False)


def _analyze(*args: str) -> tuple[str, dict]:
    out = Path(args[-1])
    r = runner.invoke(app, ["analyze", *args[:-1], "--json", str(out)])
    assert r.exit_code == 0, r.output
    return r.output, json.loads(out.read_text())


def _python(code: str) -> subprocess.CompletedProcess:
    """`python -c code` in a fresh process, with the cache on."""
    env = {k: v for k, v in os.environ.items() if k != "PROFKIT_NO_CACHE"}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=HANG_S)


def _stored(trace: Path) -> list[Path]:
    return sorted((pcache.cache_dir(trace) / "summary").glob("*.json"))


def test_second_run_reads_the_stored_summary(tmp_path: Path) -> None:
    t = tmp_path / SRC.name
    shutil.copyfile(SRC, t)
    out1, s1 = _analyze(str(t), str(tmp_path / "a.json"))
    assert len(_stored(t)) == 1
    out2, s2 = _analyze(str(t), str(tmp_path / "b.json"))
    assert s1 == s2 and (tmp_path / "a.json").read_bytes() == (tmp_path / "b.json").read_bytes()
    assert out1.replace("a.json", "b.json") == out2
    # the same answer as a run that uses no cache at all
    _, s3 = _analyze(str(t), "--no-cache", str(tmp_path / "c.json"))
    assert s3 == s1


def test_cached_run_does_not_import_polars(tmp_path: Path) -> None:
    t = tmp_path / SRC.name
    shutil.copyfile(SRC, t)
    _analyze(str(t), str(tmp_path / "a.json"))
    code = (
        "import sys; import profkit.analysis.summary_cache as s; s._MIN_BYTES = 0\n"
        "from profkit.cli import app\n"
        f"sys.argv = ['profkit', 'analyze', {str(t)!r}, '--json', {str(tmp_path / 'b.json')!r}]\n"
        "try:\n    app()\nexcept SystemExit as e:\n    assert not e.code, e.code\n"
        "print('POLARS' if 'polars' in sys.modules else 'NO-POLARS')\n"
    )
    r = _python(code)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().endswith("NO-POLARS"), r.stdout + r.stderr
    assert (tmp_path / "a.json").read_bytes() == (tmp_path / "b.json").read_bytes()


def test_changed_trace_options_or_damage_miss(tmp_path: Path) -> None:
    t = tmp_path / SRC.name
    shutil.copyfile(SRC, t)
    _, base = _analyze(str(t), str(tmp_path / "a.json"))
    # other options: another entry, another answer where the option matters
    _, big = _analyze(str(t), "--min-bubble-us", "1000000", str(tmp_path / "b.json"))
    assert len(_stored(t)) == 2 and big != base
    # a damaged stored summary is never used: the answer is recomputed (and stored again)
    for p in _stored(t):
        doc = json.loads(p.read_text())  # the stored text is the summary as --json writes it
        doc["ranks"][0]["iterations"][0]["wall_us"] = -1.0
        p.write_text(json.dumps(doc))
    _, again = _analyze(str(t), str(tmp_path / "c.json"))
    assert again == base
    # another trace under the same name: a miss
    other = DATA / "gpu" / "eager_decode.pt.trace.json.gz"
    shutil.copyfile(other, t)
    _, s_other = _analyze(str(t), str(tmp_path / "d.json"))
    _, fresh = _analyze(str(t), "--no-cache", str(tmp_path / "e.json"))
    assert s_other == fresh and s_other != base


def test_no_cache_and_timeline_bypass(tmp_path: Path) -> None:
    t = tmp_path / SRC.name
    shutil.copyfile(SRC, t)
    _analyze(str(t), "--no-cache", str(tmp_path / "a.json"))
    assert not pcache.cache_dir(t).exists()
    r = runner.invoke(app, ["analyze", str(t), "--timeline", str(tmp_path / "tl.csv")])
    assert r.exit_code == 0, r.output
    assert (tmp_path / "tl.csv").stat().st_size > 0
    assert _stored(t) == []  # --timeline needs the frames: it never uses (or writes) the stored summary


def test_quick_exit_keeps_every_write(tmp_path: Path) -> None:
    """`python -m profkit analyze` leaves with os._exit: output, --json, the tables cache written in
    the background and the stored summary must all be complete when it returns."""
    t = tmp_path / SRC.name
    shutil.copyfile(SRC, t)
    code = (
        "import sys, runpy; import profkit.analysis.summary_cache as s; s._MIN_BYTES = 0\n"
        "import profkit.ingest.cache as c; c.MIN_BYTES = 0\n"
        f"sys.argv = ['profkit', 'analyze', {str(t)!r}, '--json', {str(tmp_path / 'a.json')!r}]\n"
        "runpy.run_module('profkit', run_name='__main__')\n"
        "print('NOT REACHED')\n"
    )
    r = _python(code)
    assert r.returncode == 0, r.stderr
    assert "NOT REACHED" not in r.stdout and "per iteration" in r.stdout and "wrote" in r.stderr
    assert json.loads((tmp_path / "a.json").read_text())["schema_version"] == 3
    assert (pcache.cache_dir(t) / "manifest.json").is_file() and len(_stored(t)) == 1
    assert pcache.read(t) is not None  # the tables cache is complete and valid
    bad = subprocess.run([sys.executable, "-m", "profkit", "analyze", str(tmp_path / "missing.json")], capture_output=True, text=True)
    assert bad.returncode == 3 and "missing.json" in bad.stderr


def test_cached_json_is_the_uncached_bytes_as_stored(tmp_path: Path) -> None:
    t = tmp_path / SRC.name
    shutil.copyfile(SRC, t)
    _analyze(str(t), "--no-cache", str(tmp_path / "fresh.json"))
    _analyze(str(t), str(tmp_path / "first.json"))  # writes the cache
    _analyze(str(t), str(tmp_path / "cached.json"))  # reads it
    fresh = (tmp_path / "fresh.json").read_bytes()
    assert (tmp_path / "first.json").read_bytes() == fresh == (tmp_path / "cached.json").read_bytes()
    assert _stored(t)[0].read_bytes() == fresh  # written once, at the first run; printed as stored afterwards


def test_diff_and_report_of_traces_read_the_stored_summaries(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 15: diff and report summarize traces as analyze does (profkit/analysis/summarize.py), so a second
    diff of two traces reads both stored summaries: nothing is analyzed, and what it writes is
    byte-identical to a diff that uses no cache at all."""
    import profkit.analysis.parallel as parallel

    proxy = DATA / "gpu_proxy"
    a, b = tmp_path / "baseline.trace.json.gz", tmp_path / "topk_v2.trace.json.gz"
    shutil.copyfile(proxy / a.name, a)
    shutil.copyfile(proxy / b.name, b)

    def diff(tag: str, **env: str) -> tuple[bytes, bytes]:
        j, m = tmp_path / f"{tag}.json", tmp_path / f"{tag}.md"
        r = runner.invoke(app, ["diff", str(a), str(b), "--opt", "topk_v2", "--json", str(j), "--md", str(m)], env=env)
        assert r.exit_code == 0, r.output
        return j.read_bytes(), m.read_bytes()

    uncached = diff("uncached", PROFKIT_NO_CACHE="1")
    assert not pcache.cache_dir(a).exists() and not pcache.cache_dir(b).exists()
    first = diff("first")  # analyzes both sides and stores their summaries
    # the sides' own picks by kernel names differ (generic, proxy): diff summarizes the baseline again under
    # the more specific one (picked per rank; the proxy catalog) and keeps the candidate, which picked it
    assert len(_stored(a)) == 2 and len(_stored(b)) == 1
    r = runner.invoke(app, ["report", str(a), "-o", str(tmp_path / "first.html")])
    assert r.exit_code == 0, r.output

    def no_analysis(*args: object, **kw: object) -> None:
        raise AssertionError("analyzed again: the stored summary was not read")

    monkeypatch.setattr(parallel, "analyze_runs", no_analysis)
    second = diff("second")
    assert second == first == uncached
    r = runner.invoke(app, ["report", str(a), "-o", str(tmp_path / "second.html")])
    assert r.exit_code == 0, r.output
    assert (tmp_path / "second.html").read_bytes() == (tmp_path / "first.html").read_bytes()
