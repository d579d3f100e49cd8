"""The proxy's `overlap` switch orders the host's work like SGLang 0.5.23's overlap scheduler with
the Spec-V2 worker: the plan (KV slots + metadata) and forward of step N+1 are launched before step
N's result is consumed; with overlap off each step's result is consumed before the next plan.

Real scheduler runs on CPU (no mocks): the order is read from the scheduler's own log
(`Scheduler.order`) and from the profiler's CPU events; on CUDA (marked gpu) the plan's copy runs on
its own stream and the main stream waits for it by an event.
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

NO_OVERLAP = ",".join(s for s in SWITCHES if s != "overlap")


def make(opts, spec_steps=5, device="cpu", acc=3.0):
    if device == "cpu":
        torch.set_num_threads(1)
    cfg = ProxyConfig(size=CPU_SIZE, switches=parse_opts(opts), speculative_num_steps=spec_steps,
                      num_pages=256, device=device, simulate_acc_len=acc)
    return Scheduler(cfg)


def prefill(s, batch=2, max_new=200):
    reqs = [Req([(i * 13 + j) % 1000 for j in range(70 + 20 * i)], max_new) for i in range(batch)]
    s.waiting.extend(reqs)
    while any(not r.seq_len for r in s.prefilling + list(s.waiting)) or not s.running:
        s.loop_once()
    return reqs


def run(opts, spec_steps=5, steps=6, device="cpu", **prefill_kw):
    """A scheduler that prefilled its requests and then ran `steps` loop iterations: (scheduler, requests)."""
    s = make(opts, spec_steps, device=device)
    with torch.inference_mode():
        reqs = prefill(s, **prefill_kw)
        for _ in range(steps):
            s.loop_once()
    return s, reqs


def decode_steps(s):
    """Steps whose plan was logged (decode/verify steps), in order."""
    return [n for what, n in s.order if what == "plan"]


def index(s, what, n):
    return list(s.order).index((what, n))


@pytest.mark.parametrize("spec_steps", [5, 0])
def test_overlap_plans_next_step_before_consuming_result(spec_steps):
    s, _ = run("all", spec_steps)
    steps = decode_steps(s)
    assert len(steps) == 6
    for n, n1 in zip(steps, steps[1:]):
        # step N+1's plan and forward launch come before step N's result is consumed
        assert index(s, "plan", n1) < index(s, "launch", n1) < index(s, "result", n)
    for n, n2 in zip(steps, steps[2:]):
        # ... and step N's result is consumed in the next loop iteration, before step N+2's plan
        assert index(s, "result", n) < index(s, "plan", n2)
    # every plan but the first decode one was issued while the previous step was still pending
    # (the first one follows the prefill step, whose result is pending too)
    assert s.plans == 6 and s.plans_ahead == 6
    assert s.pending is not None and s.pending.step == steps[-1]  # the last result is in flight


@pytest.mark.parametrize("spec_steps", [5, 0])
def test_no_overlap_consumes_each_result_before_the_next_plan(spec_steps):
    s, _ = run(NO_OVERLAP, spec_steps)
    steps = decode_steps(s)
    assert len(steps) == 6
    for n, n1 in zip(steps, steps[1:]):
        assert index(s, "launch", n) < index(s, "result", n) < index(s, "plan", n1)
    assert s.plans_ahead == 0 and s.pending is None


@pytest.mark.parametrize("spec_steps", [5, 0])
def test_overlap_gives_the_same_tokens(spec_steps):
    """Deferring the result changes when tokens are consumed, never which: with every draft
    accepted (acc = S+1, deterministic on both paths) and greedy argmax, on == off."""
    outs = []
    for opts in ("all", NO_OVERLAP):
        s = make(opts, spec_steps, acc=spec_steps + 1.0)
        with torch.inference_mode():
            reqs = prefill(s, max_new=40)
            while s.running or s.pending is not None:
                s.loop_once()
        assert all(len(r.output_ids) == 40 and r.finished.is_set() for r in reqs)
        outs.append([r.output_ids for r in reqs])
    assert outs[0] == outs[1]


def _profile(s, tmp_path, steps=4):
    s.start_profile({"output_dir": str(tmp_path), "num_steps": steps, "activities": ["CPU", "GPU"],
                     "with_stack": False, "record_shapes": False, "profile_id": "ov"})
    for _ in range(steps):
        s.loop_once()
    assert s.prof_req is None
    doc = json.load(gzip.open(tmp_path / "ov-TP-0.trace.json.gz"))
    return [e for e in doc["traceEvents"] if e.get("ph") == "X"]


def _loop_spans(ev):
    names = ("scheduler.run_batch", "scheduler.process_batch_result", "plan")
    return sorted((e for e in ev if e.get("cat") == "user_annotation" and e["name"] in names),
                  key=lambda e: e["ts"])


def test_profiler_cpu_events_show_the_plan_ahead_of_the_result(tmp_path):
    """In the trace: each decode run_batch opens with its `plan` span (before `draft`), and the
    host sequence is run_batch(N+1) ⊃ plan(N+1), then process_batch_result, which consumed step N
    (the scheduler's log says which step each process_batch_result consumed)."""
    s = make("all")
    with torch.inference_mode():
        prefill(s)
        s.loop_once()
        s.order.clear()
        ev = _profile(s, tmp_path)
    spans = _loop_spans(ev)
    rbs = [e for e in spans if e["name"] == "scheduler.run_batch"]
    assert len(rbs) == 4
    for rb in rbs:
        inner = [e for e in ev if e.get("cat") == "user_annotation" and e.get("tid") == rb["tid"]
                 and rb["ts"] <= e["ts"] and e["ts"] + e["dur"] <= rb["ts"] + rb["dur"] and e is not rb]
        inner.sort(key=lambda e: e["ts"])
        assert [e["name"] for e in inner].count("plan") == 1
        assert inner[0]["name"] == "plan" and inner[1]["name"] == "draft"
    seq = [e["name"] for e in spans]
    assert seq == ["scheduler.run_batch", "plan", "scheduler.process_batch_result"] * 4
    # what each process_batch_result consumed: the step launched one iteration earlier
    results = [n for what, n in s.order if what == "result"]
    plans = [n for what, n in s.order if what == "plan"]
    assert results == [p - 1 for p in plans]


@pytest.mark.gpu
def test_cuda_plan_stream_and_event_wait(tmp_path):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    s = make("all", device="cuda")
    assert s.plan_stream is not None
    with torch.inference_mode():
        prefill(s)
        for _ in range(2):
            s.loop_once()
        ev = _profile(s, tmp_path)
    rbs = sorted((e for e in ev if e.get("cat") == "user_annotation" and e["name"] == "scheduler.run_batch"),
                 key=lambda e: e["ts"])
    plans = [e for e in ev if e.get("cat") == "user_annotation" and e["name"] == "plan"]
    rt = [e for e in ev if e.get("cat") in ("cuda_runtime", "cuda_driver")]
    gpu = {e["args"]["correlation"]: e for e in ev if e.get("cat") in ("kernel", "gpu_memcpy")
           and "correlation" in e.get("args", {})}
    plan_streams, main_streams = set(), set()
    for rb in rbs:
        inside = [r for r in rt if rb["ts"] <= r["ts"] < rb["ts"] + rb["dur"]]
        names = [r["name"] for r in inside]
        assert "cudaStreamWaitEvent" in names
        assert not any(n in names for n in ("cudaStreamSynchronize", "cudaDeviceSynchronize"))
        pl = [p for p in plans if rb["ts"] <= p["ts"] < rb["ts"] + rb["dur"]]
        assert len(pl) == 1
        p = pl[0]
        for r in inside:
            op = gpu.get(r.get("args", {}).get("correlation"))
            if op is None:
                continue
            if p["ts"] <= r["ts"] < p["ts"] + p["dur"]:
                plan_streams.add(op["tid"])
                if op["cat"] == "gpu_memcpy":
                    assert "HtoD" in op["name"] and "Pinned" in op["name"]
            else:
                main_streams.add(op["tid"])
    assert len(plan_streams) == 1 and not plan_streams & main_streams


@pytest.mark.gpu
@pytest.mark.parametrize("spec_steps", [5, 0])
def test_cuda_graphs_emit_what_eager_emits(spec_steps):
    """Graph mode reads its inputs from the planner's static buffers (two parities, no copies): the
    tokens it emits over many steps, crossing buckets and both parities, are eager mode's tokens."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from profkit.proxy.graphs import bucket

    assert [bucket(w) for w in (1, 256, 257, 8192, 8193, 8300, 9000)] == [256, 256, 272, 8192, 8704, 8704, 9216]
    out = {}
    for opts in ("all", ",".join(s for s in SWITCHES if s != "cuda_graph")):
        s, reqs = run(opts, spec_steps, steps=40, device="cuda", batch=2, max_new=120)
        assert (s.graphs is not None) == (opts == "all")
        torch.cuda.synchronize()
        out[opts] = [list(r.output_ids) for r in reqs]
    a, b = out.values()
    same = sum(x == y for ra, rb in zip(a, b) for x, y in zip(ra, rb))
    total = sum(min(len(ra), len(rb)) for ra, rb in zip(a, b))
    assert total > 60 and same >= 0.9 * total, (same, total)
