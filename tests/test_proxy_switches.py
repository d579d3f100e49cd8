"""Each proxy-engine switch has an observable effect in a recorded trace (CPU, in-process).

Traces are read with plain json (no profkit.analysis): events are counted by name inside the
`scheduler.run_batch` windows of decode iterations (those holding a step[VERIFY]/step[DECODE]).
"""

import gzip
import json
import os
import sys

import pytest

torch = pytest.importorskip("torch")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from profkit.proxy.config import CPU_SIZE, SWITCHES, ProxyConfig, parse_opts  # noqa: E402
from profkit.proxy.scheduler import Req, Scheduler  # noqa: E402

NUM_STEPS = 4


def record(out_dir, opts: str, spec_steps: int = 5, batch: int = 2, device="cpu") -> list[dict]:
    """Prefill `batch` requests, then profile NUM_STEPS decode iterations; return the windows."""
    if device == "cpu":
        torch.set_num_threads(1)
    cfg = ProxyConfig(size=CPU_SIZE, switches=parse_opts(opts), speculative_num_steps=spec_steps,
                      num_pages=256, device=device)
    s = Scheduler(cfg)
    with torch.inference_mode():
        for i in range(batch):
            s.waiting.append(Req([(i * 13 + j) % 1000 for j in range(70 + 20 * i)], 200))
        while any(not r.seq_len for r in s.prefilling + list(s.waiting)) or not s.running:
            s.loop_once()
        # decode iterations before the window (overlap: a result in flight); on CUDA two, so that both
        # plan parities have captured their graphs (profkit.proxy.graphs) before the window opens
        for _ in range(2 if device == "cuda" else 1):
            s.loop_once()
        pid = opts.replace(",", "+") + f"-s{spec_steps}"
        s.start_profile({"output_dir": str(out_dir), "num_steps": NUM_STEPS,
                         "activities": ["CPU", "GPU"],
                         "with_stack": False, "record_shapes": False, "profile_id": pid})
        for _ in range(NUM_STEPS):
            s.loop_once()
    assert s.prof_req is None, "profile window did not close"
    trace = json.load(gzip.open(out_dir / f"{pid}-TP-0.trace.json.gz"))
    return windows(trace)


def windows(trace) -> list[dict]:
    ev = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    ev.sort(key=lambda e: (e["ts"], -e.get("dur", 0)))
    rbs = [e for e in ev if e["name"] == "scheduler.run_batch" and e.get("cat") == "user_annotation"]
    out = []
    for w in rbs:
        end = w["ts"] + w["dur"]
        inner = [e for e in ev if e is not w and w["ts"] <= e["ts"] and e["ts"] + e["dur"] <= end
                 and e.get("tid") == w.get("tid")]
        out.append({"run_batch": w, "events": inner,
                    "steps": [e["name"] for e in inner if e["name"].startswith("step[")]})
    return out


def count(win, name, inside=None) -> int:
    """Events called `name` in the window, optionally only those inside ranges called `inside`."""
    evs = win["events"]
    if inside is None:
        return sum(e["name"] == name for e in evs)
    rs = [e for e in evs if e["name"] == inside]
    return sum(e["name"] == name and any(r["ts"] <= e["ts"] and e["ts"] + e["dur"] <= r["ts"] +
                                         r["dur"] for r in rs) for e in evs)


def ops_inside(win, inside) -> int:
    rs = [e for e in win["events"] if e["name"] == inside]
    return sum(e.get("cat") == "cpu_op" and any(
        r["ts"] <= e["ts"] and e["ts"] + e["dur"] <= r["ts"] + r["dur"] for r in rs)
        for e in win["events"])


_cache = {}


@pytest.fixture(scope="module")
def rec(tmp_path_factory):
    def get(opts, spec_steps=5):
        key = (opts, spec_steps)
        if key not in _cache:
            _cache[key] = record(tmp_path_factory.mktemp("sw"), opts, spec_steps)
        return _cache[key]
    return get


def without(name):
    return ",".join(s for s in SWITCHES if s != name)


def decode_windows(ws):
    d = [w for w in ws if any(s.startswith(("step[VERIFY", "step[DECODE")) for s in w["steps"])]
    assert len(d) == NUM_STEPS, [w["steps"] for w in ws]
    return d


def test_spans_like_sglang(rec):
    ws = decode_windows(rec("all"))
    for w in ws:
        assert w["steps"] == ["step[VERIFY bs=2]"]
        for name in ("draft", "draft_extend", "copy_result_to_cpu", "proxy.indexer.prologue",
                     "proxy.indexer.topk", "proxy.attention", "proxy.moe", "proxy.mtp"):
            assert count(w, name) >= 1, name
        # order inside run_batch: draft, verify, draft_extend, copy
        first = {}
        for e in w["events"]:
            first.setdefault(e["name"], e["ts"])
        assert (first["draft"] < first["step[VERIFY bs=2]"] < first["draft_extend"]
                < first["copy_result_to_cpu"])
    ws0 = decode_windows(rec("all", spec_steps=0))
    assert all(w["steps"] == ["step[DECODE bs=2]"] and count(w, "draft") == 0 for w in ws0)


@pytest.mark.parametrize("spec_steps", [5, 0])
def test_overlap_removes_host_readback(rec, spec_steps):
    def syncs(w):
        return count(w, "aten::item") + count(w, "aten::_local_scalar_dense")
    off = decode_windows(rec(without("overlap"), spec_steps))
    on = decode_windows(rec("all", spec_steps))
    assert all(syncs(w) >= 1 for w in off)
    assert all(syncs(w) == 0 for w in on)


def test_topk_v2_removes_sort(rec):
    off = decode_windows(rec(without("topk_v2")))
    on = decode_windows(rec("all"))
    assert all(count(w, "aten::sort", "proxy.indexer.topk") >= 1 for w in off)
    assert all(count(w, "aten::sort", "proxy.indexer.topk") == 0 for w in on)
    assert all(count(w, "aten::sort") == 0 for w in on)


def test_indexer_fusion_changes_prologue_op_count(rec):
    off = decode_windows(rec(without("indexer_fusion")))
    on = decode_windows(rec("all"))
    for a, b in zip(off, on):
        n_ranges = count(a, "proxy.indexer.prologue")
        assert n_ranges == count(b, "proxy.indexer.prologue")
        assert ops_inside(b, "proxy.indexer.prologue") < ops_inside(a, "proxy.indexer.prologue")
        # one GEMM fewer per prologue (wk + weights_proj -> wk_weights_proj), no Hadamard matmul
        assert (count(a, "aten::linear", "proxy.indexer.prologue")
                - count(b, "aten::linear", "proxy.indexer.prologue")) == n_ranges
        # GEMMs: wk, weights_proj, wq_b + 2 Hadamard matmuls (unfused) vs wk_weights_proj, wq_b
        assert count(a, "aten::matmul", "proxy.indexer.prologue") == 5 * n_ranges
        assert count(b, "aten::matmul", "proxy.indexer.prologue") == 2 * n_ranges


def test_index_share_reduces_topk_in_draft(rec):
    off = decode_windows(rec(without("index_share")))
    on = decode_windows(rec("all"))
    for a, b in zip(off, on):
        assert count(a, "proxy.indexer.topk", "draft") == 4  # 4 MTP steps in `draft`
        assert count(b, "proxy.indexer.topk", "draft") == 1  # only draft step 0
        assert count(a, "proxy.mtp", "draft") == count(b, "proxy.mtp", "draft") == 4


def test_moe_deferred_finalize_removes_an_add(rec):
    off = decode_windows(rec(without("moe_deferred_finalize")))
    on = decode_windows(rec("all"))
    for a, b in zip(off, on):
        n = count(a, "proxy.moe")
        assert n == count(b, "proxy.moe") and n > 0
        assert count(a, "aten::add", "proxy.moe") - count(b, "aten::add", "proxy.moe") == n
        assert count(b, "aten::addmm_", "proxy.moe") == n


@pytest.mark.gpu
@pytest.mark.parametrize("graph", [True, False])
def test_cuda_graph_replays_decode(tmp_path, graph):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    opts = "all" if graph else without("cuda_graph")
    ws = decode_windows(record(tmp_path, opts, device="cuda"))
    for w in ws:
        graphs = count(w, "cudaGraphLaunch")
        launches = count(w, "cudaLaunchKernel") + count(w, "cuLaunchKernel")
        if graph:  # draft, verify, draft_extend replayed; only glue kernels launched eagerly
            assert graphs == 3 and launches < 100
            assert count(w, "proxy.indexer.topk") == 0  # inner ranges not re-run on replay
        else:
            assert graphs == 0 and launches > 100
        assert count(w, "aten::item") == 0 and count(w, "cudaStreamSynchronize") == 0
