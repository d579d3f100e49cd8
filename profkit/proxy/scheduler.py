"""The scheduler thread: continuous batching, chunked prefill, MTP speculative decoding,
overlap (sync-free) or synchronous result handling, and the profiler window.

Loop (spans named like SGLang's, see README.md):
  scheduler.recv_requests -> scheduler.process_input_requests -> scheduler.get_next_batch_to_run
  -> scheduler.run_batch -> scheduler.process_batch_result

Every decode step starts with its `plan` (span `plan`, inside `scheduler.run_batch`): the step's
KV slots (`out_slots`, gathered from the page table whose pages were reserved at admission, as
SGLang's over-allocation does) and metadata (pool indices, sequence lengths -> positions, the page
table -> slot table, and with overlap the host-decided accept lengths) staged in ONE pinned host
buffer, copied to the device with one H2D copy, and turned into the forward's tensors by a few
kernels.

`overlap` ON (SGLang 0.5.23's event_loop_overlap with the Spec-V2 worker and its plan stream):
  * the plan runs on a separate CUDA **plan stream**; the main (forward) stream waits for it with
    `wait_event`, never with a host sync. The CPU reaches run_batch(N+1) while forward N still
    runs on the GPU, so plan N+1 executes on the GPU concurrently with forward N;
  * the CPU runs one step ahead: run_batch(N+1) (plan and forward launched) comes before
    process_batch_result(N), which is when step N's tokens are consumed;
  * nothing in the decode loop reads a device value back; the only host wait is
    process_batch_result's `cudaEventSynchronize` on the previous step's D2H copy, which has
    (nearly always) finished by then.
  On CPU there is no stream: the same plan runs in line and the ordering is the same.
`overlap` OFF (event_loop_normal): the plan runs on the main stream, and every decode step reads
accept lengths and sequence lengths back (.tolist()/.item()) and processes its own result before
the next step is planned.
`Scheduler.order` records ("plan" | "launch" | "result", step) in the order the host did them.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import math
import os
import queue
import random
import threading
import time
import uuid

import torch

from .config import ProxyConfig
from .graphs import GraphRunner, bucket as graph_bucket
from .kvcache import OutOfPages, PagedKVPool
from .model import FwdBatch, ProxyModel, rng
from .tp import TPState

log = logging.getLogger("profkit.proxy")


def _complete_trace(path: str) -> bool:
    """A whole gzip stream (CRC checked) whose JSON starts with '{' and ends with '}'."""
    import gzip as _gzip

    try:
        first = last = b""
        with _gzip.open(path, "rb") as f:
            while chunk := f.read(1 << 20):
                if not first:
                    first = chunk.lstrip()[:1]
                last = (last + chunk)[-64:]
        return first == b"{" and last.rstrip().endswith(b"}")
    except (OSError, EOFError):
        return False


class Req:
    def __init__(self, input_ids, max_new_tokens: int, rid: str | None = None):
        self.rid = rid or uuid.uuid4().hex
        self.input_ids = list(input_ids)
        self.max_new = max(int(max_new_tokens), 1)
        self.output_ids: list[int] = []
        self.pages: list[int] = []
        self.page_row: torch.Tensor | None = None  # host int64 copy of `pages` (for the plan)
        self.locked: list = []
        self.cached_len = 0
        self.prefill_pos = 0  # next prompt position to compute
        self.seq_len = 0  # positions whose KV is valid (host bookkeeping)
        self.n_out = 0  # output tokens decided at launch time
        self.pool_idx = -1
        self.verify_ct = 0
        self.done = False  # all output tokens decided (launched)
        self.error: str | None = None
        self.t_start = time.perf_counter()
        self.latency = 0.0
        self.finished = threading.Event()
        self.stream: queue.Queue | None = None  # streaming: new output ids per step, then None

    def fail(self, msg: str):
        self.error = msg
        self.finished.set()
        if self.stream is not None:
            self.stream.put(None)

    def meta_info(self, spec: bool) -> dict:
        m = {
            "id": self.rid,
            "finish_reason": {"type": "length", "length": len(self.output_ids)},
            "prompt_tokens": len(self.input_ids),
            "completion_tokens": len(self.output_ids),
            "cached_tokens": self.cached_len,
            "e2e_latency": self.latency,
        }
        if self.cached_len:
            m["cached_tokens_details"] = {"device": self.cached_len, "host": 0}
        if spec:
            m["spec_verify_ct"] = self.verify_ct
            if self.verify_ct:
                m["spec_accept_length"] = len(self.output_ids) / self.verify_ct
        return m


class Result:
    """One step's outcome. `keep` holds the step's plan (device tensors made on the plan stream
    and read by the forward on the main stream) until the result is consumed, i.e. until the
    event sync has shown that the main stream is past them; only then may the allocator reuse
    their memory."""

    __slots__ = ("reqs", "takes", "host", "event", "acc", "step", "keep")

    def __init__(self, reqs, takes, host, event=None, acc=None, keep=None):
        self.reqs, self.takes, self.host, self.event, self.acc = reqs, takes, host, event, acc
        self.step = 0
        self.keep = keep


class Plan:
    """The device-side inputs of one decode step (see `Scheduler._plan_decode`)."""

    __slots__ = ("step", "pool", "fb", "acc", "event", "parity")

    def __init__(self, step, pool, fb, acc, event, parity=0):
        self.step, self.pool, self.fb, self.acc, self.event = step, pool, fb, acc, event
        self.parity = parity  # which of the graph runner's two static buffer sets it was written to


class ProfileError(Exception):
    pass


class Scheduler:
    """One per TP rank. Rank 0 takes requests from `submit` (HTTP threads) and broadcasts them,
    with the profile/stop latches, at the top of every loop iteration; every rank then makes the
    same scheduling decisions (see tp.py), so the ranks run the same forwards in lockstep."""

    def __init__(self, cfg: ProxyConfig, model: ProxyModel | None = None, tp: TPState | None = None):
        self.cfg = cfg
        self.tp = tp or TPState()
        self.rank = self.tp.rank
        self.model = model or ProxyModel(cfg, tp if self.tp.enabled else None)
        self.dev = self.model.device
        self.cuda = self.dev.type == "cuda"
        self.S = cfg.speculative_num_steps
        self.overlap = cfg.on("overlap")
        # SGLang's Spec-V2 plan stream: next-step metadata prepared beside the running forward
        self.plan_stream = torch.cuda.Stream(self.dev) if self.cuda and self.overlap else None
        self.order: collections.deque = collections.deque(maxlen=4096)
        self.plans = 0
        self.plans_ahead = 0  # plans issued while the previous step's result was still pending
        self.index_share = cfg.on("index_share")
        self.pool = PagedKVPool(cfg.num_pages, cfg.page_size)
        R = cfg.max_running_requests
        self.free_slots = list(range(R - 1, -1, -1))
        H = cfg.size.hidden_size
        self.tok_buf = torch.zeros(R, dtype=torch.int64, device=self.dev)  # next input token
        self.d1_buf = torch.zeros(R, dtype=torch.int64, device=self.dev)  # first draft token
        self.hid_buf = torch.zeros(R, H, dtype=self.model.dtype, device=self.dev)  # MTP hidden
        self.inbox: queue.Queue = queue.Queue()
        self.waiting: collections.deque[Req] = collections.deque()
        self.prefilling: list[Req] = []
        self.running: list[Req] = []
        self.pending: Result | None = None
        self.host_rng = random.Random(cfg.seed)
        self.dev_gen = torch.Generator(device=self.dev).manual_seed(cfg.seed)
        self.forward_ct = 0
        self.stop_flag = threading.Event()
        self.thread: threading.Thread | None = None
        self.crashed: BaseException | None = None
        # stats
        self.spec_accept_tokens = 0
        self.spec_verify_ct = 0
        self.gen_tokens = 0
        self.last_seq_lens_max = 0
        self.log_interval = int(os.environ.get("PROFKIT_PROXY_DECODE_LOG_INTERVAL", "40"))
        self._decode_ct = 0
        self._log_tokens = 0
        self._log_t = time.perf_counter()
        # profiler
        self.plock = threading.Lock()
        self.prof_req: dict | None = None
        self.prof = None
        self.prof_steps = 0
        self.prof_stop = False
        self.prof_done: threading.Event | None = None
        # rank 0: commands from the HTTP threads, latched (and broadcast) at the loop's top
        self._carry: list[Req] = []
        self._prof_cmd: dict | None = None
        self._prof_stop_cmd = False
        # fault injection (ProxyConfig.fault_*): the extra op's operands, made once
        n = cfg.fault_gpu_op
        self._fault_a = torch.ones(n, n, dtype=self.model.dtype, device=self.dev) / max(n, 1) if n > 0 else None
        self.graphs = None
        if cfg.on("cuda_graph"):
            self.graphs = GraphRunner(self)

    # ---------------------------------------------------------------- thread & API ----------
    def start(self):
        self.thread = threading.Thread(target=self._run, name="proxy-scheduler", daemon=True)
        self.thread.start()

    def alive(self) -> bool:
        return self.thread is not None and self.thread.is_alive() and self.crashed is None

    def submit(self, req: Req):
        need = math.ceil((len(req.input_ids) + req.max_new + self.S + 1) / self.cfg.page_size)
        if need > self.cfg.num_pages - 1:
            raise ValueError(f"request needs {need} KV pages, the pool has "
                             f"{self.cfg.num_pages - 1}; raise --num-pages")
        if not self.alive():
            raise RuntimeError("scheduler is not running")
        self.inbox.put(req)

    def shutdown(self, timeout=5.0):
        """Stop the loop (with TP: at the next loop top, broadcasting the stop to every rank)."""
        self.stop_flag.set()
        self.inbox.put(None)
        if self.thread is not None:
            self.thread.join(timeout)
        for r in self._carry + list(self.waiting) + self.prefilling + self.running + self._drain_inbox():
            r.fail("server shutting down")

    def _drain_inbox(self) -> list:
        """Every request queued so far (None entries are wake-ups, not requests)."""
        got = []
        while True:
            try:
                r = self.inbox.get_nowait()
            except queue.Empty:
                return got
            if r is not None:
                got.append(r)

    def _run(self):
        try:
            with torch.inference_mode():
                while not self.loop_once():
                    pass
        except BaseException as e:  # pragma: no cover - reported via /health
            self.crashed = e
            log.exception("scheduler crashed (TP rank %d)", self.rank)
            for r in self._carry + list(self.waiting) + self.prefilling + self.running:
                r.fail(f"scheduler crashed: {e!r}")

    # ---------------------------------------------------------------- profiler --------------
    def _profiling(self) -> bool:
        return self._prof_cmd is not None or self.prof_req is not None or self.prof is not None

    def start_profile(self, req: dict):
        """(rank 0, any thread) Every rank starts its profiler before the same run_batch."""
        with self.plock:
            if self._profiling():
                raise ProfileError("Profiling is already in progress. Call /stop_profile first.")
            self._prof_cmd = req
            self._prof_stop_cmd = False
            self.prof_done = threading.Event()
        self.inbox.put(None)  # wake the loop

    def stop_profile(self, timeout=300.0):
        """(rank 0, any thread) Stop every rank's window now; returns once all ranks wrote."""
        with self.plock:
            if not self._profiling():
                raise ProfileError("Profiling is not in progress")
            self._prof_stop_cmd = True
            done = self.prof_done
        self.inbox.put(None)
        if not done.wait(timeout):
            raise ProfileError("timed out waiting for the trace to be written")

    def _prof_start(self):
        from torch.profiler import ProfilerActivity, profile
        r = self.prof_req
        acts = []
        for a in r.get("activities") or ["CPU", "GPU"]:
            if a == "CPU":
                acts.append(ProfilerActivity.CPU)
            elif a == "GPU" and self.cuda:
                acts.append(ProfilerActivity.CUDA)
        if not acts:
            acts = [ProfilerActivity.CPU]
        self.prof = profile(activities=acts, with_stack=bool(r["with_stack"]),
                            record_shapes=bool(r["record_shapes"]))
        self.prof.start()
        self.prof_steps = 0
        log.info("Profiling starts. Traces will be saved to: %s (profile_id %s)",
                 r["output_dir"], r["profile_id"])

    def _prof_maybe_stop(self):
        with self.plock:
            if self.prof_req is None:
                return
            n = self.prof_req.get("num_steps")
            if not self.prof_stop and (n is None or self.prof_steps < n):
                return
            r, prof, done = self.prof_req, self.prof, self.prof_done
        if prof is None:  # stop before any batch ran: capture an empty window
            self._prof_start()
            prof = self.prof
        if self.cuda:
            torch.cuda.synchronize(self.dev)
        prof.stop()
        out = os.path.expanduser(r["output_dir"])
        os.makedirs(out, exist_ok=True)
        rk = self.rank
        final = os.path.join(out, f"{r['profile_id']}-TP-{rk}.trace.json.gz")
        tmp = os.path.join(out, f".tmp-{r['profile_id']}-TP-{rk}.{os.getpid()}.json.gz")
        try:
            prof.export_chrome_trace(tmp)
            # torch's exporter ignores write errors (a full disk gives an empty or cut file): only a
            # complete gzip of a JSON object is published under the final name
            if not _complete_trace(tmp):
                raise OSError(f"the exported trace {tmp} is empty or incomplete (disk full?)")
            os.replace(tmp, final)
            log.info("Profiling done. Traces are saved to: %s", final)
        except Exception:
            log.exception("writing the trace failed")
            try:
                os.unlink(tmp)
            except OSError:
                pass
        self.tp.barrier()  # every rank's file is written
        with self.plock:
            self.prof_req = None
            self.prof = None
            self.prof_stop = False
        if done is not None:
            done.set()

    # ---------------------------------------------------------------- the loop ---------------
    def _digest(self):
        """Scheduling state that must be equal on every rank at the top of each loop."""
        return (self.forward_ct, len(self.waiting), len(self.prefilling), len(self.running),
                sum(r.seq_len for r in self.running), self.pool.stats().get("free_pages"))

    def _recv(self):
        """Rank 0: new requests + control latches (broadcast with TP). Others: receive them."""
        if self.rank == 0:
            got, self._carry = self._carry + self._drain_inbox(), []
            with self.plock:
                prof, self._prof_cmd = self._prof_cmd, None
                pstop, self._prof_stop_cmd = self._prof_stop_cmd, False
                if prof is not None:
                    self.prof_req, self.prof_stop = prof, False
            stop = self.stop_flag.is_set()
            if self.tp.enabled:
                self.tp.broadcast({"reqs": [(r.rid, r.input_ids, r.max_new) for r in got],
                                   "prof": prof, "pstop": pstop, "stop": stop,
                                   "digest": self._digest()})
            return got, pstop, stop
        msg = self.tp.broadcast(None)
        mine = self._digest()
        if msg["digest"] != mine:
            raise RuntimeError(f"TP rank {self.rank} diverged from rank 0: state {mine} vs "
                               f"{msg['digest']}")
        with self.plock:
            if msg["prof"] is not None:
                self.prof_req, self.prof_stop = msg["prof"], False
        got = [Req(ids, n, rid=rid) for rid, ids, n in msg["reqs"]]
        return got, msg["pstop"], msg["stop"]

    def loop_once(self) -> bool:
        """One scheduler iteration; True when the loop must stop."""
        with rng("scheduler.recv_requests"):
            got, pstop, stop = self._recv()
        if stop:
            self._carry = got + self._carry  # failed by shutdown()
            return True
        with rng("scheduler.process_input_requests"):
            self.waiting.extend(got)
            if pstop and self.prof_req is not None:
                self.prof_stop = True
        with rng("scheduler.get_next_batch_to_run"):
            batch = self.get_next_batch()
        if batch is None:
            if self.pending is not None:
                with rng("scheduler.process_batch_result"):
                    self.process_result(self.pending)
                self.pending = None
            self._prof_maybe_stop()
            if self.rank == 0 and self.pending is None and not self.waiting:
                try:  # idle: block until something arrives (picked up at the next loop top)
                    r = self.inbox.get(timeout=0.05)
                    if r is not None:
                        self._carry.append(r)
                except queue.Empty:
                    pass
            return False
        with self.plock:
            want_start = self.prof_req is not None and self.prof is None
        if want_start:
            self._prof_start()
        with rng("scheduler.run_batch"):
            self.forward_ct += 1
            result = self.run_batch(batch)
            result.step = self.forward_ct
            self.order.append(("launch", self.forward_ct))
        if self.prof is not None:
            self.prof_steps += 1
        with rng("scheduler.process_batch_result"):
            if self.overlap:
                prev, self.pending = self.pending, result
                if prev is not None:
                    self.process_result(prev)
            else:
                self.process_result(result)
        self._prof_maybe_stop()
        return False

    # ---------------------------------------------------------------- batching ---------------
    def get_next_batch(self):
        chunks = self._schedule_prefill()
        if chunks:
            return ("extend", chunks)
        reqs = [r for r in self.running if not r.done]
        if reqs:
            return ("decode", reqs)
        return None

    def _schedule_prefill(self):
        ps = self.cfg.page_size
        budget = self.cfg.chunked_prefill_size
        chunks = []
        for r in self.prefilling:
            if budget <= 0:
                break
            n = min(budget, len(r.input_ids) - r.prefill_pos)
            chunks.append((r, r.prefill_pos, n))
            budget -= n
        while (self.waiting and budget > 0 and
               len(self.running) + len(self.prefilling) < self.cfg.max_running_requests):
            r = self.waiting[0]
            pages, path = self.pool.match_prefix(r.input_ids)
            need = math.ceil((len(r.input_ids) + r.max_new + self.S + 1) / ps) - len(pages)
            try:
                own = self.pool.alloc(need)
            except OutOfPages:
                self.pool.unlock(path)
                break
            self.waiting.popleft()
            r.pages, r.locked = pages + own, path
            r.cached_len = r.prefill_pos = len(pages) * ps
            r.pool_idx = self.free_slots.pop()
            self.prefilling.append(r)
            n = min(budget, len(r.input_ids) - r.prefill_pos)
            chunks.append((r, r.prefill_pos, n))
            budget -= n
        return chunks

    # ---------------------------------------------------------------- helpers ----------------
    def h2d(self, data, dtype=torch.int64):
        t = torch.tensor(data, dtype=dtype)
        if self.cuda:
            return t.pin_memory().to(self.dev, non_blocking=True)
        return t

    def slot_table(self, reqs, width: int) -> torch.Tensor:
        """[B, width] logical position -> cache slot, from the host page tables (pad: page 0)."""
        ps = self.cfg.page_size
        npg = max(1, math.ceil(width / ps))
        pt = self.h2d([(r.pages + [0] * npg)[:npg] for r in reqs])
        pos = torch.arange(width, device=self.dev)
        return pt[:, pos // ps] * ps + pos % ps

    # ---------------------------------------------------------------- run_batch --------------
    def run_batch(self, batch):
        kind, items = batch
        if kind == "extend":
            return self._run_extend(items)
        self._fault()
        if self.S > 0:
            return self._run_spec_decode(items)
        return self._run_decode(items)

    def _fault(self):
        """The fault-injection knob (docs/proxy.md): a fixed host delay and/or a fixed extra device op in
        every decode step, before its forward. The delay busy-waits (a sleep's wake-up is late by tens of µs,
        more on a loaded host): the step's host time grows by that much, and the device idles while it lasts."""
        us = self.cfg.fault_host_delay_us
        if us > 0:
            with rng("proxy.fault.host_delay"):
                end = time.perf_counter() + us / 1e6
                while time.perf_counter() < end:
                    pass
        if self._fault_a is not None:
            with rng("proxy.fault.gpu_op"):
                torch.mm(self._fault_a, self._fault_a)

    def _run_extend(self, chunks):
        m = self.model
        B = len(chunks)
        Q = max(n for _, _, n in chunks)
        T = sum(n for _, _, n in chunks)
        width = max(s + n for _, s, n in chunks)
        toks, poss, nxt, last, final, is_end = [], [], [], [], [], []
        for r, s, n in chunks:
            ids = r.input_ids
            toks.append(ids[s:s + n] + [0] * (Q - n))
            poss.append(list(range(s, s + n)) + [0] * (Q - n))
            fin = s + n == len(ids)
            # draft-extend input: the next token of each position (the sampled one at the end)
            nxt.append(ids[s + 1:s + n + 1] + [0] * (Q - n + (1 if fin else 0)))
            is_end.append([fin and q == n - 1 for q in range(Q)])
            last.append(n - 1)
            final.append(fin)
        st = self.slot_table([r for r, _, _ in chunks], width)
        pos = self.h2d(poss)
        valid = self.h2d([[q < n for q in range(Q)] for _, _, n in chunks], torch.bool)
        out = torch.where(valid, st.gather(1, pos), 0)
        fb = FwdBatch(pos, out, st)
        tok = self.h2d(toks)
        with rng(f"step[EXTEND bs={B} toks={T}]"):
            hidden = m.target(tok, fb)
        ar = torch.arange(B, device=self.dev)
        li = self.h2d(last)
        t1 = m.logits(hidden[ar, li]).argmax(-1)
        fin_rows = [i for i, f in enumerate(final) if f]
        fin_reqs = [chunks[i][0] for i in fin_rows]
        if fin_rows:
            fr = self.h2d(fin_rows)
            slots = self.h2d([r.pool_idx for r in fin_reqs])
            self.tok_buf.index_copy_(0, slots, t1[fr])
        if self.S > 0:
            with rng("draft_extend"):
                nx = torch.where(self.h2d(is_end, torch.bool), t1.unsqueeze(1), self.h2d(nxt))
                mh, ml, _ = m.mtp_forward(nx, hidden, fb)
                if fin_rows:
                    self.d1_buf.index_copy_(0, slots, ml[ar, li].argmax(-1)[fr])
                    self.hid_buf.index_copy_(0, slots, mh[ar, li][fr])
        for (r, s, n), fin in zip(chunks, final):
            r.prefill_pos = s + n
            if fin:
                self.prefilling.remove(r)
                self.running.append(r)
                r.seq_len = len(r.input_ids)
                r.n_out = 1
                r.done = r.max_new <= 1
        new_tok = T
        cached = sum(r.cached_len for r, s0, _ in chunks if s0 == r.cached_len)
        log.info("Prefill batch. #new-seq: %d, #new-token: %d, #cached-token: %d, #running-req: %d, "
                 "#queue-req: %d", B, new_tok, cached, len(self.running), len(self.waiting))
        return self._finish_launch(fin_reqs, [1] * len(fin_reqs),
                                   t1[fr].unsqueeze(1) if fin_rows else None, None)

    def _sim_accept_host(self, n):
        a = self.cfg.simulate_acc_len
        base = int(math.floor(a))
        frac = a - base
        return [min(base + (1 if self.host_rng.random() < frac else 0), self.S + 1)
                for _ in range(n)]

    def _sim_accept_device(self, n):
        a = self.cfg.simulate_acc_len
        base = int(math.floor(a))
        u = torch.rand(n, generator=self.dev_gen, device=self.dev)
        return (base + (u < a - base).to(torch.int64)).clamp(1, self.S + 1)

    def _page_row(self, r: Req) -> torch.Tensor:
        """The request's page list as a host tensor (pages are fixed from admission to finish)."""
        if r.page_row is None or r.page_row.numel() != len(r.pages):
            r.page_row = torch.tensor(r.pages, dtype=torch.int64)
        return r.page_row

    def _plan_decode(self, reqs, q: int, bucket: bool = False, acc_host=None) -> Plan:
        """KV slots and metadata of a decode/verify step over q tokens per request.

        Host side: one pinned staging buffer [pool idx | seq lens | accept lens | page table].
        Device side (the plan stream with overlap on CUDA, else the current stream): one H2D copy,
        then positions = seq_len + arange(q), slot table = page table expanded to cache slots over
        `width` positions (bucketed for CUDA graphs), out_slots = the slots this step's tokens
        write (their pages were reserved at admission). With a plan stream the main stream waits
        for the plan's event (a device-side dependency, no host sync)."""
        ps = self.cfg.page_size
        B = len(reqs)
        p = [r.seq_len for r in reqs]
        width = max(p) + q
        graphs = self.graphs if bucket else None
        if graphs is not None:
            width = graph_bucket(width)
        npg = max(1, math.ceil(width / ps))
        head = [r.pool_idx for r in reqs] + p + list(acc_host or [])
        n0 = len(head)
        parity = self.plans % 2

        def out(name, shape):
            """Graph mode: the parity's static buffer the graphs read (no copy into them); eager: a new tensor."""
            return None if graphs is None else graphs.buffer((name, parity, *shape), shape, torch.int64)

        with rng("plan"):
            self.plans += 1
            if self.pending is not None and self.pending.reqs:
                self.plans_ahead += 1
            self.order.append(("plan", self.forward_ct))
            stage = torch.zeros(n0 + B * npg, dtype=torch.int64, pin_memory=self.cuda)
            stage[:n0] = torch.tensor(head, dtype=torch.int64)
            for i, r in enumerate(reqs):
                row = self._page_row(r)
                k = min(npg, row.numel())
                stage[n0 + i * npg:n0 + i * npg + k] = row[:k]
            stream = self.plan_stream
            with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
                if graphs is not None:
                    graphs.wait_free(parity, torch.cuda.current_stream(self.dev))
                    d = out("plan", (stage.numel(),))
                    d.copy_(stage, non_blocking=True)
                else:
                    d = stage.to(self.dev, non_blocking=True) if self.cuda else stage
                pool, seq = d[:B], d[B:2 * B]
                acc = d[2 * B:n0] if acc_host is not None else None
                pt = d[n0:].view(B, npg)
                ar = torch.arange(width, device=self.dev)
                st = torch.add(pt[:, ar // ps] * ps, ar % ps, out=out("slot_table", (B, width)))
                pos = torch.add(seq.unsqueeze(1), torch.arange(q, device=self.dev), out=out("positions", (B, q)))
                slots = torch.gather(st, 1, pos, out=out("out_slots", (B, q)))
                ev = None
                if stream is not None:
                    ev = torch.cuda.Event()
                    ev.record(stream)
            if ev is not None:
                torch.cuda.current_stream(self.dev).wait_event(ev)
        return Plan(self.forward_ct, pool, FwdBatch(pos, slots, st), acc, ev, parity)

    def _run_spec_decode(self, reqs):
        S, B = self.S, len(reqs)
        acc_host = self._sim_accept_host(B) if self.overlap else None
        plan = self._plan_decode(reqs, S + 1, bucket=self.graphs is not None, acc_host=acc_host)
        pool, fbv = plan.pool, plan.fb
        st = fbv.slot_table
        with rng("draft"):
            if self.graphs is not None:
                draft = self.graphs.run("draft", B, st.shape[1], plan.parity, self._draft, pool, fbv)
            else:
                draft = self._draft(pool, fbv)
        with rng(f"step[VERIFY bs={B}]"):
            if self.graphs is not None:
                hidden, g = self.graphs.run("verify", B, st.shape[1], plan.parity, self._verify, pool,
                                            draft, fbv)
            else:
                hidden, g = self._verify(pool, draft, fbv)
        # accept (simulated; like SGLang's verify kernels it runs between verify and draft_extend)
        acc = plan.acc if self.overlap else self._sim_accept_device(B)
        ar = torch.arange(S + 1, device=self.dev)
        gsel = g.gather(1, (acc - 1).unsqueeze(1))
        dpad = torch.cat([draft, draft[:, :1]], 1)
        em = None if self.graphs is None else self.graphs.buffer(("emitted", plan.parity, B, S + 1), (B, S + 1), dpad.dtype)
        emitted = torch.where(ar < (acc - 1).unsqueeze(1), dpad, gsel, out=em)
        self.tok_buf.index_copy_(0, pool, gsel.squeeze(1))
        with rng("draft_extend"):
            if self.graphs is not None:
                self.graphs.run("draft_extend", B, st.shape[1], plan.parity, self._draft_extend, pool,
                                emitted, hidden, acc, fbv)
                self.graphs.release(plan.parity)
            else:
                self._draft_extend(pool, emitted, hidden, acc, fbv)
        if not self.overlap:
            with rng("copy_result_to_cpu"):
                host = emitted.to("cpu")
                acc_host = acc.tolist()  # D2H + sync on CUDA
                # next step's metadata (seq_lens_cpu) read back from the device
                seq = self.h2d([r.seq_len for r in reqs]) + acc
                self.last_seq_lens_max = int(seq.max().item())
            takes = self._account(reqs, acc_host)
            return Result(reqs, takes, host, keep=plan)
        takes = self._account(reqs, acc_host)
        return self._finish_launch(reqs, takes, emitted, acc_host, keep=plan)

    def _draft(self, pool, fbv: FwdBatch):
        """S-1 MTP steps (the first draft token came from the previous draft_extend)."""
        m = self.model
        tok, hid = self.d1_buf[pool], self.hid_buf[pool]
        drafts, shared = [tok], None
        for j in range(self.S - 1):
            fb = FwdBatch(fbv.positions[:, j:j + 1], fbv.out_slots[:, j:j + 1], fbv.slot_table)
            reuse = shared if (self.index_share and j > 0) else None
            h, lg, tk = m.mtp_forward(tok.unsqueeze(1), hid.unsqueeze(1), fb, reuse)
            if j == 0:
                shared = tk
            tok, hid = lg[:, 0].argmax(-1), h[:, 0]
            drafts.append(tok)
        return torch.stack(drafts, 1)

    def _verify(self, pool, draft, fbv: FwdBatch):
        m = self.model
        vt = torch.cat([self.tok_buf[pool].unsqueeze(1), draft], 1)
        hidden = m.target(vt, fbv)
        return hidden, m.logits(hidden).argmax(-1)

    def _draft_extend(self, pool, emitted, hidden, acc, fbv: FwdBatch):
        m = self.model
        mh, ml, _ = m.mtp_forward(emitted, hidden, fbv)
        ar = torch.arange(emitted.shape[0], device=self.dev)
        self.d1_buf.index_copy_(0, pool, ml[ar, acc - 1].argmax(-1))
        self.hid_buf.index_copy_(0, pool, mh[ar, acc - 1])

    def _run_decode(self, reqs):
        B = len(reqs)
        plan = self._plan_decode(reqs, 1, bucket=self.graphs is not None)
        pool, fb = plan.pool, plan.fb
        st = fb.slot_table
        with rng(f"step[DECODE bs={B}]"):
            if self.graphs is not None:
                logits = self.graphs.run("decode", B, st.shape[1], plan.parity, self._decode_fwd, pool, fb)
            else:
                logits = self._decode_fwd(pool, fb)
        nt = logits.argmax(-1)
        self.tok_buf.index_copy_(0, pool, nt)
        if self.graphs is not None:
            self.graphs.release(plan.parity)  # after the last reader of the plan's buffers (pool)
        if not self.overlap:
            with rng("copy_result_to_cpu"):
                host = nt.unsqueeze(1).to("cpu")
                seq = self.h2d([r.seq_len for r in reqs]) + 1
                self.last_seq_lens_max = int(seq.max().item())
            takes = self._account(reqs, [1] * B)
            return Result(reqs, takes, host, keep=plan)
        takes = self._account(reqs, [1] * B)
        return self._finish_launch(reqs, takes, nt.unsqueeze(1), None, keep=plan)

    def _decode_fwd(self, pool, fb):
        m = self.model
        h = m.target(self.tok_buf[pool].unsqueeze(1), fb)
        return m.logits(h[:, 0])

    def _account(self, reqs, acc):
        """Host bookkeeping after a decode launch: positions advance by the accept length."""
        self._decode_ct += 1
        self._log_tokens += sum(acc)
        if self._decode_ct % self.log_interval == 0:
            now = time.perf_counter()
            dt = now - self._log_t
            al = (f", accept len: {self._log_tokens / (self.log_interval * len(reqs)):.2f}"
                  if self.S > 0 else "")
            log.info("Decode batch. #running-req: %d, #token: %d%s, gen throughput (token/s): "
                     "%.2f, #queue-req: %d", len(reqs), sum(r.seq_len for r in reqs), al,
                     self._log_tokens / dt if dt > 0 else 0.0, len(self.waiting))
            self._log_t, self._log_tokens = now, 0
        takes = []
        for r, a in zip(reqs, acc):
            r.seq_len += a
            t = min(a, r.max_new - r.n_out)
            r.n_out += t
            takes.append(t)
            if self.S > 0:
                r.verify_ct += 1
                self.spec_verify_ct += 1
                self.spec_accept_tokens += a
            if r.n_out >= r.max_new:
                r.done = True
        return takes

    def _finish_launch(self, reqs, takes, dev_tokens, acc, keep=None):
        """Copy the sampled tokens to the host: blocking when overlap is off, otherwise
        non_blocking into pinned memory (an event recorded after the copy on the main stream),
        consumed one iteration later."""
        if dev_tokens is None:
            return Result(reqs, takes, None, keep=keep)
        with rng("copy_result_to_cpu"):
            if self.overlap:
                host = torch.empty(dev_tokens.shape, dtype=dev_tokens.dtype,
                                   pin_memory=self.cuda)
                host.copy_(dev_tokens, non_blocking=True)
                ev = None
                if self.cuda:
                    ev = torch.cuda.Event()
                    ev.record()
                return Result(reqs, takes, host, ev, acc, keep=keep)
            return Result(reqs, takes, dev_tokens.to("cpu"), keep=keep)

    # ---------------------------------------------------------------- results ----------------
    def process_result(self, res: Result):
        """Consume a step's tokens. With overlap this is step N-1's result, after run_batch(N)
        was launched; its event sync waits for a copy the GPU has (nearly always) finished."""
        self.order.append(("result", res.step))
        if res.event is not None:
            res.event.synchronize()
        res.keep = None
        rows = res.host.tolist() if res.host is not None else []
        for i, r in enumerate(res.reqs):
            if i < len(rows):
                new = rows[i][:res.takes[i]]
                r.output_ids.extend(new)
                self.gen_tokens += res.takes[i]
                if r.stream is not None and new:
                    r.stream.put(new)
            if r.done and len(r.output_ids) >= r.max_new:
                self._finalize(r)

    def _finalize(self, r: Req):
        self.running.remove(r)
        self.pool.insert_and_release(r.input_ids + r.output_ids, r.pages, r.seq_len, r.locked)
        r.pages, r.locked, r.page_row = [], [], None
        self.free_slots.append(r.pool_idx)
        r.latency = time.perf_counter() - r.t_start
        r.finished.set()
        if r.stream is not None:
            r.stream.put(None)

    def internal_state(self) -> dict:
        st = self.pool.stats()
        al = (self.spec_accept_tokens / self.spec_verify_ct) if self.spec_verify_ct else None
        return {"avg_spec_accept_length": al, "forward_ct": self.forward_ct,
                "generated_tokens": self.gen_tokens, "running": len(self.running),
                "plans": self.plans, "plans_ahead": self.plans_ahead,
                "waiting": len(self.waiting) + len(self.prefilling), **st}
