"""Files that hold several ranks (DESIGN.md "Traces as engines write them"; ingest/processes.py).

A merged file is made here from real rank files exactly as the engines' tools make it
(tests/merge_ranks.py: SGLang's profile merger, TraceLens' TraceFuse) and must analyze as its rank
files do; the figures a merged file cannot share with its rank files (the path, the start times of
a TraceLens fusion, which drops the profiler's own span) are named where they are left out. The
public TraceLens fusion (../shared/public-traces/fused/) is checked against tests/plain_ranks.py,
an independent count over its raw events."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import support
from merge_ranks import sglang_merge, tracelens_fuse
from plain_ranks import figures as plain_figures

from profkit.analysis import analyze_trace
from profkit.analysis.parallel import analyze_runs
from profkit.analysis.summarize import SummarizeOptions, summarize
from profkit.ingest import load_ranks, load_trace, load_traces

TP2 = support.DATA / "gpu_tp2"
GPU = support.GPU_DATA
FOUR = ("eager_decode.pt.trace.json.gz", "eager_sync.pt.trace.json.gz", "graph_decode.pt.trace.json.gz", "two_streams.pt.trace.json.gz")
FUSED = "fused/hpctrainingexamples_tracelens_fused_merged_nccl_only.json.gz"


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """(a folder of the two rank files, the merged file in a folder of its own), each with the run's manifest."""
    root = tmp_path_factory.mktemp("tp2")
    folder, merged = root / "folder", root / "merged"
    folder.mkdir()
    merged.mkdir()
    ranks = sorted(TP2.glob("*.trace.json.gz"))
    for f in [*ranks, TP2 / "manifest.json"]:
        shutil.copy(f, folder / f.name)
    shutil.copy(TP2 / "manifest.json", merged / "manifest.json")
    return folder, sglang_merge(ranks, merged / "merged-tp2.trace.json.gz")


def _analyze(path: Path, out: Path, **env: str) -> tuple[dict, str]:
    r = subprocess.run([sys.executable, "-m", "profkit", "analyze", str(path), "--no-cache", "--json", str(out)],
                       capture_output=True, text=True, env={**os.environ, **env})
    assert r.returncode == 0, r.stderr
    return json.loads(out.read_text()), r.stdout


def _without_paths(s: dict) -> dict:
    """The summary less what names the input files: `inputs`, each rank's `path` and `source`."""
    out = {k: v for k, v in s.items() if k != "inputs"}
    out["ranks"] = [{k: v for k, v in r.items() if k not in ("path", "source")} for r in s["ranks"]]
    return out


def test_the_merged_file_is_written_as_sglang_writes_it(pair):
    import gzip

    _, merged = pair
    doc = json.loads(gzip.decompress(merged.read_bytes()))
    assert next(iter(doc)) == "traceEvents"  # the merger's dict: events first, the metadata after them
    pids = {e["pid"] for e in doc["traceEvents"]}
    assert {p.split("] ")[0] + "]" for p in pids} == {"[TP00]", "[TP01]"}
    assert doc["distributedInfo"]["rank"] == 0 and len(doc["deviceProperties"]) == 2 * len(
        json.loads(gzip.decompress((TP2 / "tp2-TP-0.trace.json.gz").read_bytes()))["deviceProperties"])


@pytest.mark.parametrize("scanner", ["C scanner", "msgspec"])
def test_sglang_merged_pair_summarizes_as_its_folder(pair, tmp_path, scanner):
    folder, merged = pair
    env = {"PROFKIT_NO_SCANNER": "1"} if scanner == "msgspec" else {}
    a, _ = _analyze(folder, tmp_path / "folder.json", **env)
    b, printed = _analyze(merged, tmp_path / "merged.json", **env)
    assert "([TP01] of the merged file)" in printed
    assert [r["rank"] for r in b["ranks"]] == [0, 1]
    assert [r["source"] for r in b["ranks"]] == [{"merged": "sglang merge_profiles", "process": "[TP00]"},
                                                 {"merged": "sglang merge_profiles", "process": "[TP01]"}]
    assert [len(r["iterations"]) for r in b["ranks"]] == [4, 4]
    assert b["cross_rank"]["aligned_iterations"] == 4
    # every figure: each iteration's, the rank totals, the cross-rank section (stragglers, skew), health
    assert _without_paths(b) == _without_paths(a)
    assert b["cross_rank"] == a["cross_rank"] and b["health"] == a["health"]
    assert not any("one file per rank" in w for r in b["ranks"] for w in r["warnings"])


def test_each_rank_of_the_merged_file_starts_at_its_own_first_event(pair):
    _, merged = pair
    plain = plain_figures(str(merged))
    traces = load_ranks(merged)
    assert [t.rank for t in traces] == [0, 1]
    for t, label in zip(traces, ("[TP00]", "[TP01]")):
        assert t.t0_ns == round(plain[label]["t0_us"] * 1000)
        (dev, d), = plain[label]["devices"].items()
        assert t.gpu_ops.filter(t.gpu_ops["cat"] == "kernel").height == d["kernels"]
        assert set(t.gpu_ops["device"].unique().to_list()) == {int(dev)}


def test_the_tiered_decoder_splits_the_same_tables(pair):
    """The fallback decoder (damaged files, schema variants) splits a merged file into the same tables."""
    from profkit.ingest.decode import decode_events, read_bytes
    from profkit.ingest.identity import trace_file
    from profkit.ingest.tables import events_frame, split_tables_ranks

    _, merged = pair
    fast = load_ranks(merged)
    events, _, w = decode_events(merged, read_bytes(trace_file(merged)))
    df, _ = events_frame(events, w)
    split, ranks = split_tables_ranks(df, w)
    assert split is not None and split.names == ["[TP00]", "[TP01]"]
    for t, (tables, _) in zip(fast, ranks):
        for mine, theirs in zip((t.gpu_ops, t.calls, t.cpu, t.gpu_annotations), tables):
            assert mine.equals(theirs)


def test_library_loaders_read_every_rank(pair):
    folder, merged = pair
    assert [t.rank for t in load_traces([merged])] == [0, 1]
    one = load_trace(merged)
    assert one.rank == 0 and any("holds 2 ranks" in w for w in one.warnings)
    by_folder = [analyze_trace(t) for t in load_traces([folder])]
    for a, b in zip(by_folder, [analyze_trace(t) for t in load_traces([merged])]):
        assert a.iterations.equals(b.iterations) and a.ops.equals(b.ops)


def test_worker_processes_split_merged_files_too(pair, tmp_path):
    """Two merged files analyzed in worker processes (the path of large inputs): each is a run of two ranks."""
    folder, merged = pair
    other = tmp_path / "merged-again.trace.json.gz"
    shutil.copy(merged, other)
    runs = analyze_runs([merged, other], jobs=2, min_parallel_bytes=0, cache=False)
    want = [a.iterations for a in analyze_runs([folder], cache=False)[0].analyses]
    assert len(runs) == 2
    for r in runs:
        assert [a.rank for a in r.analyses] == [0, 1] and len(r.files) == 2
        assert all(a.iterations.equals(w) for a, w in zip(r.analyses, want))


def test_diff_takes_a_merged_file_and_a_folder(pair, tmp_path):
    folder, merged = pair
    out = tmp_path / "diff.json"
    r = subprocess.run([sys.executable, "-m", "profkit", "diff", str(folder), str(merged), "--json", str(out)],
                       capture_output=True, text=True, env={**os.environ, "PROFKIT_NO_CACHE": "1"})
    assert r.returncode == 0, r.stderr
    d = json.loads(out.read_text())
    dec = d["decomposition"]
    assert dec["gpu_window_us"]["delta"] == 0 and dec["gpu_window_us"]["baseline"] > 0
    assert all(v == 0 for v in dec["category_us"].values()) and dec["idle_us"] == 0 and dec["overlap_us"] == 0
    assert d["baseline"] != d["candidate"]  # the two sides are the folder and the merged file


def test_tracelens_fusion_of_four_profilerstep_traces(tmp_path):
    """Four real single-GPU traces fused as TraceLens fuses four ranks (all on device 0, pids and
    correlation ids offset per rank): four ranks, each with its own ProfilerStep iterations, figure
    for figure those of its own file; only the start times differ (TraceLens drops the profiler's
    `Trace` span, from which each file's t0 is taken)."""
    fused = tracelens_fuse([GPU / n for n in FOUR], tmp_path / "fused.json.gz")
    opts = SummarizeOptions(cache=False)
    s = summarize([fused], opts).summary
    plain = plain_figures(str(fused))
    assert [r["rank"] for r in s["ranks"]] == [0, 1, 2, 3]
    for r, name in zip(s["ranks"], FOUR):
        own = summarize([GPU / name], opts).summary["ranks"][0]
        assert r["source"] == {"merged": "TraceLens TraceFusion", "process": f"rank {r['rank']}"}
        assert len(r["iterations"]) == len(own["iterations"]) == plain[f"rank {r['rank']}"]["markers"]["ProfilerStep"]
        for mine, theirs in zip(r["iterations"], own["iterations"]):
            assert {k: v for k, v in mine.items() if k not in ("start_us", "gpu_start_us")} == \
                   {k: v for k, v in theirs.items() if k not in ("start_us", "gpu_start_us")}
    for t in load_ranks(fused):
        (dev, d), = plain[f"rank {t.rank}"]["devices"].items()
        assert dev == "0" and set(t.gpu_ops["device"].unique().to_list()) == {0}
        assert t.gpu_ops.filter(t.gpu_ops["cat"] == "kernel").height == d["kernels"]
        assert t.gpu_ops.filter(t.gpu_ops["cat"] == "gpu_memset").height == d["memset"]


@support.needs_public
def test_public_tracelens_fused_file_is_four_ranks_with_their_own_busy():
    path = support.public_trace(FUSED)
    plain = {k: v for k, v in plain_figures(str(path)).items() if v["devices"]}
    s = summarize([path], SummarizeOptions(cache=False)).summary
    assert [r["rank"] for r in s["ranks"]] == [0, 1, 2, 3] and len(plain) == 4
    for r in s["ranks"]:
        (dev, d), = plain[f"rank {r['rank']}"]["devices"].items()
        (it,) = r["iterations"]  # GPU-only, no markers: each rank's whole trace is one window of its own
        assert it["gpu_kernels"] == d["kernels"] == 21
        assert round(it["gpu_busy_us"], 3) == d["busy_us"]
    # the union over the four devices is not any rank's busy: each device is counted on its own
    assert sum(r["iterations"][0]["gpu_busy_us"] for r in s["ranks"]) == pytest.approx(sum(
        v["devices"][k]["busy_us"] for v in plain.values() for k in v["devices"]), abs=1e-6)
    assert "cross_rank" in s and len(s["cross_rank"]["ranks"]) == 4


def test_a_merged_file_is_not_cached_but_its_summary_is(pair, tmp_path, monkeypatch):
    """Caching on (for files of any size): no tables or per-rank results are stored for a merged
    file (their rows are split when read), its summary is, and reads back the same."""
    from profkit.analysis import summary_cache
    from profkit.ingest import cache as pcache

    monkeypatch.setattr(pcache, "MIN_BYTES", 0)
    monkeypatch.setattr(summary_cache, "_MIN_BYTES", 0)
    monkeypatch.delenv("PROFKIT_NO_CACHE", raising=False)
    _, merged = pair
    mine = tmp_path / merged.name
    shutil.copy(merged, mine)
    first = summarize([mine], SummarizeOptions())
    d = pcache.cache_dir(mine)
    assert first.analyses is not None and len(first.analyses) == 2
    assert not (d / "manifest.json").exists() and not (d / "analysis").exists()
    again = summarize([mine], SummarizeOptions())
    assert again.analyses is None and again.summary == first.summary  # the stored summary, nothing decoded


def test_what_is_not_a_merged_file():
    """One process stays one rank: two GPUs of one process (GPU pid = device), a GPU pid that is no
    per-rank offset (its CPU pid would fall in no rank), one label-free process."""
    from profkit.ingest.processes import plan_split

    assert plan_split({("0", 0), ("1", 1)}, {"0", "1", "1307"}) is None
    assert plan_split({("10", 0)}, {"10", "1234"}) is None
    assert plan_split({("0", 0)}, {"0", "1307", "[1307]"}) is None
    got = plan_split({("0", 0), ("100001", 1)}, {"0", "100001", "1307", "101347"})  # TraceFuse, M = 10^5
    assert got is not None and got.names == ["rank 0", "rank 1"]
    assert [got.locate(p) for p in ("1307", "101347", "100001")] == [(0, "1307"), (1, "1347"), (1, "1")]


def test_a_folder_with_the_rank_files_and_their_merge_reads_the_rank_files(pair, tmp_path):
    """SGLang writes merged-<id>.trace.json.gz beside the <id>-TP-<r> files it merged: the folder is
    one run of two ranks, the merged file named as skipped."""
    folder, merged = pair
    both = tmp_path / "both"
    shutil.copytree(folder, both)
    shutil.copy(merged, both / merged.name)
    r = subprocess.run([sys.executable, "-m", "profkit", "analyze", str(both), "--no-cache", "--json", str(tmp_path / "s.json")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert f"skipped {merged.name} (SGLang's merge of the rank files beside it" in r.stderr
    s = json.loads((tmp_path / "s.json").read_text())
    assert [Path(i["path"]).name for i in s["inputs"]] == ["tp2-TP-0.trace.json.gz", "tp2-TP-1.trace.json.gz"]


@pytest.mark.parametrize("how", ["tiny chunks", "worker processes"])
def test_chunked_decodes_split_the_same(pair, how):
    """Cut into many chunks (each rank's events spread over several, the cut between the ranks inside
    one), or decoded in worker processes with ids of their own: the same ranks, tables and first events."""
    from profkit.ingest.columnar import load_tables_fast, make_executor

    _, merged = pair
    whole = load_tables_fast(merged)
    ex = make_executor(2) if how == "worker processes" else None
    try:
        cut = load_tables_fast(merged, chunk_bytes=64 << 10, executor=ex, jobs=2 if ex else 1)
    finally:
        if ex is not None:
            ex.shutdown()
    assert whole is not None and cut is not None
    assert cut.strings.labelled_min_ts == whole.strings.labelled_min_ts and len(whole.strings.labelled_min_ts) > 2
    (s1, r1), (s2, r2) = whole.ranks([]), cut.ranks([])
    assert s1 is not None and s2 is not None and s1.names == s2.names == ["[TP00]", "[TP01]"]
    for (a, wa), (b, wb) in zip(r1, r2):
        assert wa == wb and all(x.equals(y) for x, y in zip(a, b))
