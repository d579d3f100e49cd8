"""capture/manifest.ManifestDoc declares what a run manifest holds: every key (and every throughput point's and
profiler overhead's key) of the manifests recorded on GPUs under tests/data is one of its fields."""

from __future__ import annotations

import json

from profkit.capture.manifest import ManifestDoc, Overhead, Point
from support import DATA


def test_every_recorded_manifest_key_is_declared():
    found = sorted(DATA.glob("**/manifest.json")) + sorted(DATA.glob("**/*.manifest.json"))
    assert found
    for f in found:
        doc = json.loads(f.read_text())
        assert set(doc) <= set(ManifestDoc.__annotations__), (f, set(doc) - set(ManifestDoc.__annotations__))
        for p in doc.get("throughput") or []:
            assert set(p) <= set(Point.__annotations__), (f, set(p) - set(Point.__annotations__))
        oh = doc.get("profiler_overhead") or {}
        for o in [oh, *oh.get("windows", [])]:
            assert set(o) <= set(Overhead.__annotations__), (f, set(o) - set(Overhead.__annotations__))
