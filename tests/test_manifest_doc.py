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


def test_every_recorded_manifest_decodes_typed():
    """documents.Manifest reads each recorded manifest (its profile request, profiler overhead per window and
    throughput points typed), and a manifest written before those keys existed decodes with their defaults."""
    from profkit.attribution.diff import profiler_slowdowns
    from profkit.documents import manifest_of, throughput_of

    for f in sorted(DATA.glob("**/manifest.json")):
        doc = json.loads(f.read_text())
        m = manifest_of(doc)
        assert m is not None, f
        assert len(throughput_of(doc)) == len(doc.get("throughput") or []), f
        oh = doc.get("profiler_overhead") or {}
        want = [w["slowdown"] for w in oh.get("windows") or [oh] if isinstance(w.get("slowdown"), (int, float)) and w["slowdown"] > 0]
        assert profiler_slowdowns(doc) == want, f
        assert (m.profile.windows if m.profile is not None else None) == (doc.get("profile") or {}).get("windows"), f
    old = manifest_of({"run_id": "r", "target": "proxy"})
    assert old is not None and (old.profile, old.profiler_overhead, old.throughput) == (None, None, None)
    assert throughput_of({"run_id": "r"}) == [] and profiler_slowdowns({"run_id": "r"}, None) == []
