"""One TP rank (> 0) of the proxy engine as a process of its own: started by the server
(`tp.spawn_workers`), it joins torch.distributed, runs the scheduler loop without HTTP in lockstep
with rank 0 (see tp.py), and dies with its parent."""

from __future__ import annotations

import argparse
import ctypes
import json
import logging
import os
import signal
import sys
import threading
import time

from .tp import init_distributed


def _die_with_parent(parent_pid: int) -> None:
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
        except Exception:  # pragma: no cover
            pass
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(1)

    def watch():
        while True:
            time.sleep(0.5)
            if os.getppid() != parent_pid:
                os._exit(1)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def worker_main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m profkit.proxy.rank_worker",
                                description="one TP rank (>0) of the proxy engine; started by "
                                "`python -m profkit.proxy.server --tp N`, not by hand")
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--init-method", required=True)
    p.add_argument("--parent-pid", type=int, required=True)
    p.add_argument("--config", required=True, help="ProxyConfig.to_dict() as JSON")
    p.add_argument("--cpu-threads", type=int, default=0)
    p.add_argument("--log-level", default="info")
    ns = p.parse_args(argv)
    _die_with_parent(ns.parent_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the server stops us
    signal.signal(signal.SIGTERM, lambda *a: os._exit(0))
    level = getattr(logging, ns.log_level.upper(), logging.INFO)
    # like SGLang, only TP0 logs the batch lines; the others warnings and up
    logging.basicConfig(level=max(level, logging.WARNING),
                        format=f"[%(asctime)s TP{ns.rank}] %(message)s", stream=sys.stderr)
    from .config import ProxyConfig

    cfg = ProxyConfig.from_dict(json.loads(ns.config))
    import torch

    if ns.cpu_threads and not cfg.device.startswith("cuda"):
        torch.set_num_threads(ns.cpu_threads)
    tp = init_distributed(cfg, ns.rank, ns.init_method)
    from .scheduler import Scheduler

    torch.manual_seed(cfg.seed)
    sched = Scheduler(cfg, tp=tp)
    sched._run()  # until rank 0 broadcasts the stop (or a collective fails)
    code = 0 if sched.crashed is None else 1
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # no process-group / interpreter teardown: the server waits for us


if __name__ == "__main__":
    sys.exit(worker_main())
