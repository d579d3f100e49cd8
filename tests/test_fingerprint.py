"""The code fingerprint every cache is keyed by (ingest/identity.code_fingerprint): it covers every
source file of the package and the kernel catalogs, found by a glob, so editing any of them (the
category mapping, the scanner, the analysis, a catalog) invalidates the tables, analysis and
summary caches."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from profkit.analysis import summary_cache
from profkit.cli import app
from profkit.ingest import cache as pcache
from profkit.ingest import identity
from profkit.ingest.identity import code_fingerprint, fingerprint_files, package_root
from processes import HANG_S

from support import DATA

COVERED = [rel for rel, _ in fingerprint_files()]
_IGNORE = shutil.ignore_patterns("__pycache__", "*.so", "*.pyd")


def _copy(dest: Path, *, wheel: bool = False, src: Path | None = None) -> Path:
    """A copy of the package (or of the copy `src`) under dest: profkit/ and, beside it, kernels/
    (a checkout), or profkit/_kernels/ inside it (an installed wheel). Returns the package folder."""
    pk = dest / "profkit"
    shutil.copytree(src or package_root(), pk, ignore=_IGNORE)
    shutil.copytree((src or package_root()).parent / "kernels", pk / "_kernels" if wheel else dest / "kernels")
    return pk


@pytest.fixture(scope="module")
def copy_root(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    pk = _copy(tmp_path_factory.mktemp("pkg"))
    return pk, code_fingerprint(pk)


def test_covers_every_source_file_and_the_catalogs() -> None:
    for rel in ("ingest/categories.py", "ingest/strings.py", "ingest/early.py", "ingest/_scan.c", "analysis/rank.py",
                "analysis/catalog.py", "apis.py", "analysis/summary_cache.py", "http.py", "__init__.py", "ingest/identity.py", "ingest/cache.py"):
        assert rel in COVERED, rel
    assert any(r.startswith("_kernels/") and r.endswith(".toml") for r in COVERED)
    assert not any("__pycache__" in r for r in COVERED)
    assert COVERED == sorted(COVERED) and len(set(COVERED)) == len(COVERED)
    on_disk = {p.relative_to(package_root()).as_posix() for ext in ("py", "c") for p in package_root().rglob(f"*.{ext}")
               if "__pycache__" not in p.parts}
    assert on_disk <= set(COVERED)


@pytest.mark.parametrize("rel", COVERED)
def test_editing_any_covered_file_changes_it(copy_root: tuple[Path, str], rel: str) -> None:
    pk, base = copy_root
    path = dict(fingerprint_files(pk))[rel]
    original = path.read_bytes()
    try:
        path.write_bytes(original + b"\n")
        assert code_fingerprint(pk) != base
    finally:
        path.write_bytes(original)
    assert code_fingerprint(pk) == base


def test_found_by_glob_not_a_list(tmp_path: Path) -> None:
    pk = _copy(tmp_path)
    base = code_fingerprint(pk)
    (pk / "__pycache__").mkdir(exist_ok=True)
    (pk / "__pycache__" / "stray.py").write_text("x = 1\n")
    (pk / "report" / "templates" / "extra.html").write_text("<p>not source</p>")
    assert code_fingerprint(pk) == base
    (pk / "ingest" / "new_module.py").write_text("x = 1\n")
    added = code_fingerprint(pk)
    assert "ingest/new_module.py" in dict(fingerprint_files(pk)) and added != base
    # the same bytes under another name are another fingerprint (each file is hashed with its path)
    (pk / "ingest" / "new_module.py").rename(pk / "ingest" / "other_module.py")
    assert code_fingerprint(pk) not in (base, added)


def test_checkout_and_wheel_layouts_agree(tmp_path: Path, copy_root: tuple[Path, str]) -> None:
    pk, base = copy_root
    wheel = _copy(tmp_path, wheel=True, src=pk)
    assert dict(fingerprint_files(wheel)).keys() == dict(fingerprint_files(pk)).keys()
    assert code_fingerprint(wheel) == base
    (wheel / "_kernels" / "generic.toml").write_bytes((wheel / "_kernels" / "generic.toml").read_bytes() + b"\n")
    assert code_fingerprint(wheel) != base


def test_running_package_is_computed_once_and_polars_free(monkeypatch: pytest.MonkeyPatch, copy_root: tuple[Path, str]) -> None:
    monkeypatch.setattr(identity, "_FINGERPRINT", None)
    fp = code_fingerprint()
    assert identity._FINGERPRINT == fp and len(fp) == 32
    monkeypatch.setattr(identity, "_FINGERPRINT", "computed before")
    assert code_fingerprint() == "computed before"  # once per process
    pk, base = copy_root
    assert code_fingerprint(pk) == base  # a given root is hashed afresh, and not kept
    assert identity._FINGERPRINT == "computed before"
    r = subprocess.run([sys.executable, "-c", "import sys; from profkit.ingest.identity import code_fingerprint as f; "
                        "print(f(), 'polars' in sys.modules)"], capture_output=True, text=True, timeout=HANG_S)
    assert r.returncode == 0, r.stderr
    got, polars_imported = r.stdout.split()
    assert len(got) == 32 and polars_imported == "False"


def test_an_edit_invalidates_a_real_cached_analyze(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   copy_root: tuple[Path, str]) -> None:
    """analyze with the caches on, then the fingerprint this process would have after an edit of
    ingest/categories.py: the tables cache, the analysis cache and the stored summary all miss."""
    monkeypatch.setattr(pcache, "MIN_BYTES", 0)
    monkeypatch.setattr(summary_cache, "_MIN_BYTES", 0)
    monkeypatch.delenv("PROFKIT_NO_CACHE", raising=False)
    src = DATA / "gpu" / "eager_sync.pt.trace.json.gz"
    t = tmp_path / src.name
    shutil.copyfile(src, t)

    def analyze(out: str) -> dict:
        r = CliRunner().invoke(app, ["analyze", str(t), "--min-bubble-us", "2", "--json", str(tmp_path / out)])
        assert r.exit_code == 0, r.output
        return json.loads((tmp_path / out).read_text())

    def stored() -> list[Path]:
        return sorted((pcache.cache_dir(t) / "summary").glob("*.json"))

    first = analyze("a.json")
    key = summary_cache.summary_key([t], marker=None, min_bubble_us=2.0, catalog=None)
    assert [p.stem for p in stored()] == [key] and pcache.read(t) is not None
    entries = sorted(p.name for p in (pcache.cache_dir(t) / "analysis").iterdir())
    assert len(entries) == 1

    pk, base = copy_root
    cat = pk / "ingest" / "categories.py"
    original = cat.read_bytes()
    try:
        cat.write_bytes(original + b"# a changed category mapping\n")
        edited = code_fingerprint(pk)
    finally:
        cat.write_bytes(original)
    assert edited != base
    monkeypatch.setattr(identity, "_FINGERPRINT", edited)

    assert pcache.read(t) is None  # the parquet tables were written by other code
    new_key = summary_cache.summary_key([t], marker=None, min_bubble_us=2.0, catalog=None)
    assert new_key != key and summary_cache.read_summary(t, new_key) is None  # the stored summary misses
    again = analyze("b.json")
    assert again == first
    # everything was computed afresh: the tables were rewritten by the new code (replacing the
    # folder drops the stale analysis entry and summary), with a new analysis entry and summary
    assert json.loads((pcache.cache_dir(t) / "manifest.json").read_text())["code"] == edited
    now = sorted(p.name for p in (pcache.cache_dir(t) / "analysis").iterdir())
    assert len(now) == 1 and now != entries
    assert [p.stem for p in stored()] == [new_key]
    assert analyze("c.json") == first and [p.stem for p in stored()] == [new_key]  # and that is reused
