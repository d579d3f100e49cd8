"""flows/outputs.py: the names a command picks when it is not given one."""

from __future__ import annotations

from pathlib import Path

from profkit.flows import outputs as O


def test_report_default_names():
    diff = {"baseline": {"label": "a b"}, "candidate": {"label": "c/d"}}
    assert O.report_html([diff], []) == Path("reports") / "diff__a_b__c_d.html"
    assert O.report_html([], [("run 1", {})]) == Path("reports") / "run_1" / "report.html"
    assert O.report_html([diff], [("run 1", {})]) == Path("reports") / "report.html"
    assert O.report_html([], []) == Path("reports") / "report.html"


def test_json_dir_and_summary_names(tmp_path: Path):
    assert O.is_json_dir("out/") and O.is_json_dir(str(tmp_path)) and not O.is_json_dir("-") and not O.is_json_dir("a.json")
    assert O.summary_in(tmp_path, "w 0 · r") == tmp_path / "w_0_r.summary.json"
    assert O.safe_name("///") == "run"


def test_perfetto_names(tmp_path: Path):
    trace = tmp_path / "x.pt.trace.json.gz"
    assert O.perfetto_file(trace, trace, None, False) == tmp_path / "x.perfetto-trace.gz"
    assert O.perfetto_file(tmp_path, tmp_path / "window-0", None, True) == tmp_path / f"{tmp_path.name}.perfetto-trace.gz"
    assert O.perfetto_file(trace, trace, Path("o.pb.gz"), False) == Path("o.pb.gz")
    assert O.perfetto_file(tmp_path, tmp_path / "window-1", Path("o.pb.gz"), True) == Path("o.window-1.pb.gz")
    assert O.perfetto_file(tmp_path, tmp_path / "window-1", Path("o"), True) == Path("o.window-1.perfetto-trace")


def test_run_folders(tmp_path: Path):
    assert O.trace_run_ids("S", "proxy", "on", "topk") == ("S-proxy-baseon-topk-before", "S-proxy-baseon-topk-after")
    assert O.trace_folder(tmp_path, "S", "proxy", "topk") == tmp_path / "S-proxy-topk"
    assert O.sweep_folder(tmp_path, "S", "proxy", "ladder") == tmp_path / "S-proxy-sweep-ladder"
    assert O.calibrate_run_id("S", "proxy", "2", "b") == "S-proxy-calibrate-2b"
    (tmp_path / "sweep.json").write_text("{}")
    assert O.written(tmp_path, O.SWEEP_FILES) == [tmp_path / "sweep.json"]
