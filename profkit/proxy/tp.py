"""Tensor parallelism for the proxy engine (`--tp N`): rank processes, torch.distributed, all-reduce.

Processes (as SGLang): rank 0's scheduler is a thread of the HTTP server process; ranks 1..N-1 are
child processes (`python -m profkit.proxy.rank_worker`, one per rank) that run the same scheduler loop
without HTTP. They die with the server: PR_SET_PDEATHSIG(SIGKILL) on Linux plus a thread that exits
when the parent pid changes; SIGINT is ignored in them (the server stops them).

Lockstep: at the top of every loop iteration rank 0 broadcasts (gloo, `broadcast_object_list`) the
requests that arrived since the last iteration plus the control latches (profile start/stop, stop)
and a digest of its running state; every rank then schedules the same batch deterministically (same
page pool, prefix cache, seeded acceptance), so all ranks run the same forward. The tokens returned
over HTTP are rank 0's; the others compute the same argmax from the same all-reduced hidden states.

Collectives per forward: one all-reduce after the attention output projection (attention heads are
split: `wq_b` column-parallel, `wo` row-parallel) and one after the MoE (routed experts sharded
across ranks = expert parallel, shared expert column/row-parallel) of every layer, the MTP layer
included. The indexer, embeddings, lm_head and KV caches are replicated.

Each all-reduce is the custom op `proxy::all_reduce` around `torch.distributed.all_reduce`, so on a
CPU trace (where profkit uses the outermost aten ops as the device timeline) the wait for the other
ranks is inside one op of category `comm` (gloo's `c10d::allreduce_` only enqueues; the wait would
otherwise be invisible). On CUDA the NCCL kernels are what the analysis sees.

TEST-ONLY switch: `PROFKIT_PROXY_RANK_DELAY="R:SECONDS[,R2:SECONDS2]"` makes rank R sleep that long
before every all-reduce (so it arrives last and the other ranks wait inside the collective). Never
set it for measurements.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
from datetime import timedelta

log = logging.getLogger("profkit.proxy")

RANK_DELAY_ENV = "PROFKIT_PROXY_RANK_DELAY"
DIST_TIMEOUT_S = 600


def parse_rank_delay(spec: str | None) -> dict[int, float]:
    """`"1:0.002,2:0.001"` -> {1: 0.002, 2: 0.001} (seconds)."""
    out: dict[int, float] = {}
    for part in (spec or "").split(","):
        part = part.strip()
        if not part:
            continue
        r, _, sec = part.partition(":")
        try:
            out[int(r)] = float(sec)
        except ValueError:
            raise ValueError(f"{RANK_DELAY_ENV}: expected RANK:SECONDS, got {part!r}") from None
    return out


_OP_REGISTERED = False


def _register_op():
    global _OP_REGISTERED
    if _OP_REGISTERED:
        return
    import torch
    import torch.distributed as dist

    def _all_reduce(x) -> None:  # sum over the default (device) group, in place
        dist.all_reduce(x)

    torch.library.custom_op("proxy::all_reduce", _all_reduce, mutates_args=("x",),
                            schema="(Tensor(a!) x) -> ()")

    _OP_REGISTERED = True


class TPState:
    """This process's place in the TP group (world 1: every method is a no-op)."""

    def __init__(self, rank: int = 0, world: int = 1, cpu_group=None, delay_s: float = 0.0):
        self.rank, self.world, self.cpu_group, self.delay_s = rank, world, cpu_group, delay_s
        self.n_collectives = 0

    @property
    def enabled(self) -> bool:
        return self.world > 1

    def all_reduce(self, x):
        """Sum `x` over the ranks in place (and return it)."""
        if self.world == 1:
            return x
        if self.delay_s > 0:  # test-only straggler (PROFKIT_PROXY_RANK_DELAY)
            time.sleep(self.delay_s)
        import torch

        torch.ops.proxy.all_reduce(x)
        self.n_collectives += 1
        return x

    def broadcast(self, obj):
        """Rank 0's `obj` on every rank (gloo CPU group)."""
        if self.world == 1:
            return obj
        import torch.distributed as dist

        box = [obj if self.rank == 0 else None]
        dist.broadcast_object_list(box, src=0, group=self.cpu_group)
        return box[0]

    def barrier(self):
        if self.world == 1:
            return
        import torch.distributed as dist

        dist.barrier(group=self.cpu_group)


def init_distributed(cfg, rank: int, init_method: str) -> TPState:
    """torch.distributed for rank `rank` of cfg.tp_size (blocks until every rank joined)."""
    import torch
    import torch.distributed as dist

    world = cfg.tp_size
    on_cuda = cfg.device.startswith("cuda")
    if on_cuda:
        os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
        torch.cuda.set_device(torch.device(cfg.rank_device(rank)))
    _register_op()
    dist.init_process_group("nccl" if on_cuda else "gloo", init_method=init_method, rank=rank,
                            world_size=world, timeout=timedelta(seconds=DIST_TIMEOUT_S))
    cpu_group = dist.new_group(backend="gloo") if on_cuda else dist.group.WORLD
    delay = parse_rank_delay(os.environ.get(RANK_DELAY_ENV)).get(rank, 0.0)
    if delay:
        log.warning("TP rank %d: %s=%s: sleeping %.4f s before every all-reduce (TEST ONLY)",
                    rank, RANK_DELAY_ENV, os.environ.get(RANK_DELAY_ENV), delay)
    return TPState(rank, world, cpu_group, delay)


# ---------------------------------------------------------------------------- rank processes ----
def spawn_workers(cfg, init_method: str, args: dict) -> list[subprocess.Popen]:
    """Start ranks 1..tp_size-1 as child processes of this one."""
    import profkit

    root = os.path.dirname(os.path.dirname(os.path.abspath(profkit.__file__)))
    env = dict(os.environ)
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    if cfg.device.startswith("cuda"):
        env.setdefault("NCCL_NVLS_ENABLE", "0")
    procs = []
    for r in range(1, cfg.tp_size):
        argv = [sys.executable, "-m", "profkit.proxy.rank_worker", "--rank", str(r), "--init-method",
                init_method, "--parent-pid", str(os.getpid()), "--config",
                json.dumps(cfg.to_dict()), "--cpu-threads", str(args.get("cpu_threads") or 0),
                "--log-level", str(args.get("log_level") or "info")]
        procs.append(subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL))
    return procs


def stop_workers(procs: list[subprocess.Popen], timeout: float = 3.0) -> None:
    """Wait up to `timeout` for the ranks to exit on their own, then SIGTERM, then SIGKILL."""
    deadline = time.monotonic() + timeout
    for p in procs:
        try:
            p.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(1.0)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
