"""CUDA-graph capture and replay of the decode-side steps (the `cuda_graph` switch).

Each step function (draft loop, verify forward, draft_extend, plain decode forward) is captured
once per (step, batch size, context-width bucket) into a torch.cuda.CUDAGraph and replayed with
its inputs copied into the captured static buffers. The step functions only read their tensor
arguments and the scheduler's persistent device buffers and write the persistent buffers/caches,
so running one eagerly for warm-up and then replaying it is idempotent. Captured lazily, the first
time a shape is seen (SGLang captures a fixed batch-size list at start-up instead).

Inputs that live in the runner's static buffers (`buffer`: the step's plan, written there by the
planner) or that are another graph's outputs are captured as they are and never copied again; only
the few inputs computed eagerly between graphs are copied into the graph's own clones. The plan
alternates between two buffer sets (`parity`), so the plan of step N+1 can be written while step
N's graphs still read theirs; each parity has its own graphs, and a plan waits for the event its
parity's last graph recorded (`release`/`wait_free`). Graph mode thus copies no more than eager
mode does, and its width buckets (`bucket`: 16 per octave) pad the context by at most 1/16.
"""

from __future__ import annotations

import logging
import os
import time

import torch

from .model import FwdBatch, rng

log = logging.getLogger("profkit.proxy")


def _flatten(args):
    out = []
    for a in args:
        if isinstance(a, FwdBatch):
            out += [a.positions, a.out_slots, a.slot_table]
        else:
            out.append(a)
    return out


def _rebuild(args, flat):
    it = iter(flat)
    out = []
    for a in args:
        if isinstance(a, FwdBatch):
            out.append(FwdBatch(next(it), next(it), next(it)))
        else:
            out.append(next(it))
    return out


class _Entry:
    __slots__ = ("graph", "inputs", "outputs")


def bucket(width: int) -> int:
    """The captured context width for `width` positions: at least 256, else `width` rounded up to
    a multiple of 1/16 of its power-of-two octave (8,300 -> 8,704), so padding stays under 6.25%."""
    step = 1 << max(0, (width - 1).bit_length() - 5)
    return max(256, -(-width // step) * step)


def _tensors(out):
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (tuple, list)):
        return [t for o in out for t in _tensors(o)]
    return []


class GraphRunner:
    def __init__(self, sched):
        self.sched = sched
        self.entries: dict[tuple, _Entry] = {}
        self.mempool = torch.cuda.graph_pool_handle()
        self.capture_s = 0.0
        self.buffers: dict[tuple, torch.Tensor] = {}
        self._static: set[int] = set()  # storages of static buffers and graph outputs
        self._free: dict[int, torch.cuda.Event] = {}

    def buffer(self, key: tuple, shape, dtype) -> torch.Tensor:
        """A persistent device buffer (the planner writes graph inputs here)."""
        b = self.buffers.get(key)
        if b is None:
            b = self.buffers[key] = torch.zeros(shape, dtype=dtype, device=self.sched.dev)
            self._static.add(b.untyped_storage().data_ptr())
        return b

    def release(self, parity: int) -> None:
        """The last graph reading `parity`'s buffers in this step is launched: record when it ends."""
        ev = torch.cuda.Event()
        ev.record()
        self._free[parity] = ev

    def wait_free(self, parity: int, stream) -> None:
        ev = self._free.get(parity)
        if ev is not None:
            stream.wait_event(ev)

    def run(self, name: str, batch: int, width: int, parity: int, fn, *args):
        key = (name, batch, width, parity)
        e = self.entries.get(key)
        flat = _flatten(args)
        if e is None:
            return self._capture(key, fn, args, flat)
        for dst, src in zip(e.inputs, flat):
            if dst.data_ptr() != src.data_ptr():
                dst.copy_(src, non_blocking=True)
        e.graph.replay()
        return e.outputs

    def _is_static(self, x) -> bool:
        return isinstance(x, torch.Tensor) and x.untyped_storage().data_ptr() in self._static

    def _capture(self, key, fn, args, flat):
        t = time.perf_counter()
        e = _Entry()
        e.inputs = [x if self._is_static(x) else x.clone() for x in flat]
        static_args = _rebuild(args, e.inputs)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            fn(*static_args)  # warm-up (also allocator warm-up); idempotent
        torch.cuda.current_stream().wait_stream(side)
        e.graph = torch.cuda.CUDAGraph()
        name, batch, width, parity = key
        prof = self._capture_profiler()
        if prof is not None:
            try:
                prof.start()
            except Exception:  # pragma: no cover - a profiler that cannot start must not stop serving
                log.exception("the capture profiler did not start; capturing unprofiled")
                prof = None
        try:
            with rng(f"cuda_graph_capture[{name} bs={batch} width={width}]"):
                with torch.cuda.graph(e.graph, pool=self.mempool):
                    e.outputs = fn(*static_args)
        finally:
            if prof is not None:
                prof.stop()
        if prof is not None:
            self._export_capture(prof, f"Proxy{name}_bs{batch}_w{width}_p{parity}")
        self._static.update(t.untyped_storage().data_ptr() for t in _tensors(e.outputs))
        self.entries[key] = e
        e.graph.replay()  # the real run of this step
        dt = time.perf_counter() - t
        self.capture_s += dt
        log.info("captured CUDA graph %s bs=%d width=%d parity=%d in %.2fs", *key, dt)
        return e.outputs

    def _capture_profiler(self):
        if os.environ.get("SGLANG_ENABLE_CUDA_GRAPH_CAPTURE_TRACE", "").lower() not in ("1", "true", "yes", "on"):
            return None
        if getattr(self.sched, "prof", None) is not None:
            return None  # the serving window's profiler records this capture itself
        from torch.profiler import ProfilerActivity, profile

        return profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True)

    def _export_capture(self, prof, runner: str) -> None:
        out = os.path.join(os.environ.get("SGLANG_TORCH_PROFILER_DIR") or "/tmp", "graph_capture_profile")
        rank = getattr(self.sched, "rank", 0)
        path = os.path.join(out, f"cuda_graph_capture-{runner}-TP-{rank}.json.gz")
        try:
            os.makedirs(out, exist_ok=True)
            tmp = path + f".tmp{os.getpid()}.json.gz"
            prof.export_chrome_trace(tmp)
            os.replace(tmp, path)
            log.info("CUDA graph capture trace saved to: %s", path)
        except Exception:  # a capture profile is optional: serving goes on without it
            log.exception("writing the capture trace %s failed", path)
