"""Issue 38: each document is decoded once per command. `profkit diff` of two summary.json files, counting every
decode of a summary.json or diff.json (text -> a dict, or a dict -> its profkit.documents struct) on the way."""

from __future__ import annotations

import json
from collections import Counter

import msgspec
import pytest
from typer.testing import CliRunner

from support import DATA
from profkit.cli import app
from profkit import store
from profkit.documents import Diff, Summary
from profkit.report import jsonout

BASE, CAND = DATA / "v1" / "eager_decode.summary.json", DATA / "v1" / "eager_sync.summary.json"


def _kind(obj: object, type_: object = None) -> str | None:
    """The document a decode produced: "summary", "diff", or None (something else: a manifest, a catalog)."""
    if type_ is Summary or isinstance(obj, Summary):
        return "summary"
    if type_ is Diff or isinstance(obj, Diff):
        return "diff"
    if isinstance(obj, dict) and "ranks" in obj and "schema_version" in obj:
        return "summary"
    if isinstance(obj, dict) and "decomposition" in obj and "baseline" in obj:
        return "diff"
    return None


@pytest.fixture
def decodes(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """Every decode of a summary.json or diff.json, by document: json.loads and msgspec.json.decode of its text,
    msgspec.convert of its dict into a struct. The writer's own check of the text it encoded (store.json_text reads it
    back for NaN) is writing, not a decode."""
    seen: Counter[str] = Counter()
    loads, decode, convert, json_text = json.loads, msgspec.json.decode, msgspec.convert, store.json_text
    writing = [False]

    def written(obj):
        writing[0] = True
        try:
            return json_text(obj)
        finally:
            writing[0] = False

    def counted(real, typed_kw: str | None = None, typed_pos: int | None = None):
        def wrapper(*a, **kw):
            out = real(*a, **kw)
            t = kw.get(typed_kw) if typed_kw else None
            if t is None and typed_pos is not None and len(a) > typed_pos:
                t = a[typed_pos]
            kind = None if writing[0] else _kind(out, t)
            if kind:
                seen[kind] += 1
            return out
        return wrapper

    monkeypatch.setattr(json, "loads", counted(loads))
    monkeypatch.setattr(msgspec.json, "decode", counted(decode, "type"))
    monkeypatch.setattr(msgspec, "convert", counted(convert, "type", 1))
    monkeypatch.setattr(store, "json_text", written)
    monkeypatch.setattr(jsonout, "json_text", written)  # the diff.json renderer's
    return seen


def _diff(tmp_path) -> None:
    r = CliRunner().invoke(app, ["diff", str(BASE), str(CAND), "--json", str(tmp_path / "diff.json"), "--md", str(tmp_path / "diff.md")],
                           env={"PROFKIT_NO_CACHE": "1"})
    assert r.exit_code == 0, r.output
    assert json.loads((tmp_path / "diff.json").read_text())["schema_version"] == 1


def test_profkit_diff_never_decodes_the_diff_it_builds(decodes, tmp_path):
    """compare_summaries returns the Diff the renderers read: encoded once for diff.json, decoded never."""
    _diff(tmp_path)
    decodes["diff"] -= 1  # the assertion's own read of diff.json above
    assert decodes["diff"] == 0, decodes


def test_profkit_diff_decodes_each_summary_once(decodes, tmp_path):
    _diff(tmp_path)
    assert decodes["summary"] == 2, decodes  # two sides, once each


def test_profkit_report_decodes_a_diff_once(decodes, tmp_path):
    """`profkit report diff.json`: the file is decoded once, into the Diff the renderers read."""
    _diff(tmp_path)
    decodes.clear()
    r = CliRunner().invoke(app, ["report", str(tmp_path / "diff.json"), "-o", str(tmp_path / "r.html"), "--md", str(tmp_path / "r.md")],
                           env={"PROFKIT_NO_CACHE": "1"})
    assert r.exit_code == 0, r.output
    assert decodes["diff"] == 1 and decodes["summary"] == 0, decodes


def test_profkit_report_decodes_each_summary_once(decodes, tmp_path):
    r = CliRunner().invoke(app, ["report", str(BASE), str(CAND), "-o", str(tmp_path / "r.html")], env={"PROFKIT_NO_CACHE": "1"})
    assert r.exit_code == 0, r.output
    assert decodes["summary"] == 2, decodes
