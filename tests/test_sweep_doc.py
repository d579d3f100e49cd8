"""sweep.json is documents.SweepDoc: the plain rows flows/sweep.py writes while recording (for a GPU box
without msgspec) hold the struct's fields in its order, and a document written from the struct reads back
as the same struct."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import msgspec

from profkit.documents import SweepDoc, SweepRun, SweepStep, sweep_values
from profkit.flows.sweep import add_run, attribution_row, new_sweep


def _fields(cls: type) -> list[str]:
    return list(cls.__struct_fields__)  # type: ignore[attr-defined]


def test_recorded_rows_are_the_structs_fields_in_order():
    doc = new_sweep("ladder", "on", "proxy", ["topk_v2"])
    assert list(doc) == [f for f in _fields(SweepDoc) if f != "pareto"]  # pareto: once attributed
    res = SimpleNamespace(run_id="r0", summary_path=Path("reports/r0/summary.json"), manifest={"throughput": None})
    add_run(doc, "baseline", {"topk_v2": False}, res)  # type: ignore[arg-type]
    assert list(doc["runs"][0]) == _fields(SweepRun)
    diff = {"throughput": {}, "counts": {"syncs": {"delta": 1}}, "expected_effect": {"flags": []}}
    row = attribution_row("+topk_v2", "topk_v2", SimpleNamespace(run_id="r0"), SimpleNamespace(run_id="r1"), diff, Path("pair"))  # type: ignore[arg-type]
    assert list(row) == _fields(SweepStep)


def test_the_struct_encodes_as_the_recorded_document():
    doc = new_sweep("one-at-a-time", "off", "sglang", ["overlap", "topk_v2"])
    res = SimpleNamespace(run_id="r0", summary_path=Path("s.json"), manifest={"throughput": [{"concurrency": 1}]})
    add_run(doc, "baseline", {"overlap": False, "topk_v2": False}, res)  # type: ignore[arg-type]
    typed = msgspec.convert(doc, SweepDoc)
    assert sweep_values(typed) == doc and list(sweep_values(typed)) == list(doc)
    typed.pareto = {"baseline": []}
    again = msgspec.json.decode(msgspec.json.encode(typed), type=SweepDoc)
    assert again == typed and list(sweep_values(again))[-1] == "pareto"


def test_an_attributed_sweep_encodes_as_its_plain_document():
    """sweep.json once attributed (rows and Pareto points added to the SweepDoc) holds what the plain
    document held: the same keys in the same order, the same numbers (an int stays an int)."""
    from profkit.flows.sweep import pareto
    from profkit.store import json_text

    point = {"concurrency": 2, "isl": 64, "tokens_per_s_per_gpu": {"median": 101.5}, "tokens_per_s_per_user_p50": {"median": 50}}
    doc = new_sweep("ladder", "on", "proxy", ["topk_v2"])
    for rid in ("r0", "r1"):
        add_run(doc, rid, {"topk_v2": rid == "r1"}, SimpleNamespace(run_id=rid, summary_path=Path(rid), manifest={"throughput": [point]}))  # type: ignore[arg-type]
    diff = {"throughput": {"baseline": {"tokens_per_s_per_user_p50": {"median": 50}}, "candidate": {"tokens_per_s_per_user_p50": {"median": 60.5}}},
            "gpu_window_us": {"baseline": 10.0, "candidate": 9, "delta": -1.0}, "decomposition": {"idle_us": -1.0, "category_us": {"topk": -2}},
            "counts": {"syncs": {"delta": 0}, "gpu_kernels": None}, "expected_effect": {"flags": ["f"]}}
    row = attribution_row("+topk_v2", "topk_v2", SimpleNamespace(run_id="r0"), SimpleNamespace(run_id="r1"), diff, Path("pair"))  # type: ignore[arg-type]
    typed = msgspec.convert(doc, SweepDoc)
    typed.attribution.append(msgspec.convert(row, SweepStep))
    typed.pareto = pareto(typed.runs)
    typed.status = "ok"
    plain = {**doc, "attribution": [row], "status": "ok",
             "pareto": {r["label"]: [{"concurrency": 2, "isl": 64, "tokens_per_s_per_gpu": 101.5, "tokens_per_s_per_user": 50}] for r in doc["runs"]}}
    assert json_text(sweep_values(typed)) == json_text(plain)
