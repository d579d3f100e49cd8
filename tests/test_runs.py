"""A folder of traces holds runs, not always one multi-GPU run (issue 17, point 2): files whose device
names, world size, trace id, process names or iteration shapes disagree are separate runs, analyzed
separately by `analyze` and refused by `diff`; straggler analysis only across the ranks of one run;
a duplicate-rank warning names only the files concerned."""

from __future__ import annotations

import gzip
import json
import shutil
import subprocess
import sys
from pathlib import Path

from profkit.analysis.parallel import analyze_runs
from profkit.ingest import load_traces
from profkit.ingest.runs import plan_runs, read_info
from profkit.flows.inputs import check_summary

from support import DATA, TRACELENS_STEPS, needs_public, public_trace

GPU, TP2 = DATA / "gpu", DATA / "gpu_tp2"


def rewrite(src: Path, dst: Path, *, device: str | None = None, trace_id: str | None = None, dist: dict | None = None) -> Path:
    """A copy of a fixture with other metadata (device names, trace id, distributedInfo)."""
    doc = json.loads(gzip.decompress(src.read_bytes()))
    if device is not None:
        for p in doc["deviceProperties"]:
            p["name"] = device
    if trace_id is not None:
        doc["trace_id"] = trace_id
    if dist is not None:
        doc["distributedInfo"] = dist
    head = {k: v for k, v in doc.items() if k != "traceEvents"}  # metadata first, as Kineto writes it
    dst.write_bytes(gzip.compress(json.dumps({**head, "traceEvents": doc["traceEvents"]}).encode(), compresslevel=1))
    return dst


def profkit(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "profkit", *args], capture_output=True, text=True, cwd=cwd,
                          env={"PATH": "/usr/bin:/bin", "COLUMNS": "120", "PROFKIT_NO_CACHE": "1"})


@needs_public
def test_public_traces_are_six_runs_from_their_headers():
    files = [public_trace(n) for n in TRACELENS_STEPS]
    runs = plan_runs(files)
    assert [len(r.files) for r in runs] == [1] * 6  # MI300X and B200, world sizes 1 and 8: never "ranks 0-5"
    b200 = read_info(public_trace("tracelens_vllm_gpt-oss-120b_b200_tp8_eager_prefill_step.json.gz"))
    assert b200.devices == ("NVIDIA B200",) and b200.world_size == 8 and b200.trace_id == "77C6C16CEF784657A94763DE3FE086C3"
    tp = [read_info(f) for f in sorted(TP2.glob("*.trace.json.gz"))]
    assert [(i.rank, i.world_size) for i in tp] == [(0, 2), (1, 2)]
    assert len(plan_runs([i.path for i in tp])) == 1


def test_two_single_gpu_runs_are_analyzed_separately_without_stragglers(tmp_path):
    d = tmp_path / "sample"
    d.mkdir()
    for f in ("eager_sync.pt.trace.json.gz", "graph_decode.pt.trace.json.gz"):
        shutil.copy(GPU / f, d / f)
    p = profkit("analyze", str(d))
    assert p.returncode == 0, p.stderr
    assert p.stderr.count("2 separate runs") == 1 and "each is analyzed on its own" in p.stderr
    assert "run 1 of 2: eager_sync" in p.stdout and "run 2 of 2: graph_decode" in p.stdout
    assert "straggler" not in p.stdout.lower() and "rank 1" not in p.stdout
    # one summary.json is one run (schema v2): --json FILE is refused naming the runs, --json DIR/ writes one per run
    bad = profkit("analyze", str(d), "--json", str(tmp_path / "s.json"))
    assert bad.returncode == 2 and not (tmp_path / "s.json").exists()
    assert "2 separate runs" in bad.stderr and "eager_sync.pt.trace.json.gz" in bad.stderr and "--json DIR/" in bad.stderr
    ok = profkit("analyze", str(d), "--json", str(tmp_path / "out") + "/")
    assert ok.returncode == 0, ok.stderr
    for name in ("eager_sync", "graph_decode"):
        s = check_summary(json.loads((tmp_path / "out" / f"{name}.summary.json").read_text()), Path(name))
        assert s["schema_version"] == 3 and [r["rank"] for r in s["ranks"]] == [0] and "cross_rank" not in s
        assert not any("appears in several inputs" in w for w in s["ranks"][0]["warnings"])


def test_multi_rank_run_beside_unrelated_traces(tmp_path):
    """2 H200 ranks of one job, the same job's ranks on another GPU (device names differ), and a
    single-process trace: three runs; cross-rank figures only across each job's own ranks."""
    d = tmp_path / "mixed"
    d.mkdir()
    for f in TP2.glob("*.trace.json.gz"):
        shutil.copy(f, d / f.name)
        rewrite(f, d / f.name.replace("tp2", "other"), device="NVIDIA GeForce RTX 2080 Ti", trace_id="X" + f.name)
    shutil.copy(GPU / "eager_sync.pt.trace.json.gz", d / "eager_sync.pt.trace.json.gz")
    runs = plan_runs(sorted(p for p in d.iterdir()))
    assert sorted(len(r.files) for r in runs) == [1, 2, 2]
    assert any("device names" in r.why for r in runs)
    p = profkit("analyze", str(d), "--json", str(tmp_path / "out") + "/")
    assert p.returncode == 0, p.stderr
    assert p.stderr.count("3 separate runs") == 1
    tp2 = json.loads((tmp_path / "out" / "tp2.summary.json").read_text())
    other = json.loads((tmp_path / "out" / "other.summary.json").read_text())
    assert tp2["cross_rank"]["ranks"] == [0, 1] and other["cross_rank"]["ranks"] == [0, 1]
    assert {r["device"] for r in other["ranks"]} == {"NVIDIA GeForce RTX 2080 Ti"}
    single = json.loads((tmp_path / "out" / "eager_sync.summary.json").read_text())
    assert "cross_rank" not in single and len(single["ranks"]) == 1
    # diff refuses a side that holds several runs, with one message naming them
    r = profkit("diff", str(d), str(GPU / "eager_sync.pt.trace.json.gz"))
    assert r.returncode == 2
    lines = [x for x in r.stderr.splitlines() if x.startswith("error:")]
    assert len(lines) == 1 and "3 separate runs" in lines[0] and "tp2-TP-0.trace.json.gz" in lines[0]


def test_iteration_shapes_that_disagree_split_a_run(tmp_path):
    """Two files that claim ranks 0 and 1 of one 2-GPU job but ran different steps: two runs."""
    a = rewrite(GPU / "eager_sync.pt.trace.json.gz", tmp_path / "job-TP-0.trace.json.gz", trace_id="A", dist={"rank": 0, "world_size": 2})
    b = rewrite(DATA / "gpu_overlap" / "overlap_construction.trace.json.gz", tmp_path / "job-TP-1.trace.json.gz", trace_id="B",
                dist={"rank": 1, "world_size": 2})  # decode bs=1 against bs=4
    assert len(plan_runs([a, b])) == 1  # the headers agree
    runs = analyze_runs([a, b], cache=False)
    assert len(runs) == 2 and all("iteration shapes" in r.why for r in runs)
    assert [[x.rank for x in r.analyses] for r in runs] == [[0], [1]]


def test_duplicate_rank_warns_only_the_files_concerned(tmp_path):
    src = GPU / "eager_sync.pt.trace.json.gz"
    files = [rewrite(src, tmp_path / f"{n}.trace.json.gz", trace_id=n, dist={"rank": r, "world_size": 3})
             for n, r in (("a", 0), ("b", 0), ("c", 1))]
    runs = analyze_runs(files, cache=False)
    assert len(runs) == 1
    by_name = {Path(x.path).name: x for x in runs[0].analyses}
    assert {n: x.rank for n, x in by_name.items()} == {"a.trace.json.gz": 0, "b.trace.json.gz": 2, "c.trace.json.gz": 1}
    for n in ("a.trace.json.gz", "b.trace.json.gz"):
        w = [w for w in by_name[n].warnings if "appears in several inputs" in w]
        assert w == ["rank 0 appears in several inputs (a.trace.json.gz, b.trace.json.gz); b.trace.json.gz is numbered 2"]
    assert not any("appears in several inputs" in w for w in by_name["c.trace.json.gz"].warnings)
    traces = {t.path.name: t for t in load_traces(files)}  # the loader alone says the same
    assert {n: t.rank for n, t in traces.items()} == {n: x.rank for n, x in by_name.items()}
    assert not any("appears" in w for w in traces["c.trace.json.gz"].warnings)
