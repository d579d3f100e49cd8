"""Start the server under test in its own process group, wait for /health, always stop it.

Stop = SIGTERM to the server, as long as the engine's own teardown needs (SGLang: ~90 s, see
targets/sglang.TEARDOWN_S), then SIGKILL to its process group and to every descendant seen while
it ran (psutil, polled during the teardown too): a server that forks schedulers, whose children
start JIT compilers in sessions of their own, must leave no orphans.
"""

from __future__ import annotations

import os
import signal
import threading
import subprocess
import time
from pathlib import Path
from typing import Callable

import psutil

from profkit.capture.http import HTTPFailure, port_free, request
from profkit.errors import TargetError
from profkit.targets.spec import LaunchSpec


def log_tail(path: Path, lines: int = 25) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    return "\n".join(text[-lines:]) or "(log is empty)"


class Server:
    def __init__(self, spec: LaunchSpec, log_path: Path) -> None:
        self.spec = spec
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None
        self._seen: dict[int, psutil.Process] = {}

    def start(self) -> None:
        if not port_free(self.spec.host, self.spec.port):
            raise TargetError(f"port {self.spec.port} on {self.spec.host} is already in use", hint="pass another --port, or stop whatever listens there")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = {k: v for k, v in os.environ.items() if k not in self.spec.unset}
        env.update({**self.spec.env, "PYTHONUNBUFFERED": "1"})
        with open(self.log_path, "ab") as log:
            log.write(f"# profkit: {self.spec.shell()}\n".encode())
            log.flush()
            # Ctrl-C/SIGTERM between fork and `self.proc = ...` would orphan the server: defer them
            # until the child is recorded (the child unblocks them for itself).
            # The mask only covers this thread: a signal another thread takes (a progress bar's) still makes Python raise
            # KeyboardInterrupt here between two bytecodes, e.g. after Popen returned and before its result is stored.
            # So the Python-level handlers are deferred too (main thread only), and run once the child is recorded.
            sigs = {signal.SIGINT, signal.SIGTERM}
            got: list[int] = []
            handlers = {}
            if threading.current_thread() is threading.main_thread():
                handlers = {s: signal.signal(s, lambda n, _f: got.append(n)) for s in sigs}
            old = signal.pthread_sigmask(signal.SIG_BLOCK, sigs)
            try:
                self.proc = subprocess.Popen(self.spec.argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                             env=env, start_new_session=True,
                                             preexec_fn=lambda: signal.pthread_sigmask(signal.SIG_UNBLOCK, sigs))
            except OSError as e:
                signal.pthread_sigmask(signal.SIG_SETMASK, old)
                for sg, h in handlers.items():
                    signal.signal(sg, h)
                raise TargetError(f"cannot start {self.spec.argv[0]}: {e.strerror}", hint="check --server-python / the engine's install") from None
            self._remember()
            signal.pthread_sigmask(signal.SIG_SETMASK, old)
            for sg, h in handlers.items():
                signal.signal(sg, h)
            for n in got[:1]:  # what arrived meanwhile, now that the child is known (stop() will find it): its own handler
                signal.raise_signal(n)

    def _remember(self) -> None:
        if self.proc is None:
            return
        try:
            p = psutil.Process(self.proc.pid)
            self._seen[p.pid] = p
            for c in p.children(recursive=True):
                self._seen[c.pid] = c
        except psutil.Error:
            pass

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def died(self, what: str) -> TargetError:
        rc = self.proc.poll() if self.proc else None
        return TargetError(f"the {self.spec.target} server {what} (exit code {rc}); last lines of {self.log_path}:\n{log_tail(self.log_path)}")

    def wait_healthy(self, timeout_s: float, *, tick: Callable[[], None] | None = None) -> None:
        deadline = time.monotonic() + timeout_s
        url = self.spec.base_url + "/health"
        while True:
            if not self.alive():
                raise self.died("exited before it became healthy")
            try:
                status, _ = request(url, timeout=10)
                if status == 200:
                    self._remember()
                    return
            except HTTPFailure:
                pass
            if time.monotonic() > deadline:
                raise TargetError(f"the {self.spec.target} server did not become healthy within {timeout_s:.0f} s; last lines of {self.log_path}:\n{log_tail(self.log_path)}",
                                  hint="raise --health-timeout for big models, or read the server log")
            if tick:
                tick()
            self._remember()
            time.sleep(0.25)

    def stop(self, grace_s: float | None = None) -> None:
        """SIGTERM, wait up to `grace_s` (default: the engine's teardown time) while noting every
        descendant, then SIGKILL the group and every descendant seen. Idempotent."""
        if self.proc is None:
            return
        grace = self.spec.teardown_s if grace_s is None else grace_s
        self._remember()
        if self.proc.poll() is None:
            try:
                self.proc.send_signal(signal.SIGTERM)
            except ProcessLookupError:
                pass
            deadline = time.monotonic() + grace
            while self.proc.poll() is None and time.monotonic() < deadline:
                self._remember()
                time.sleep(0.1)
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        for p in list(self._seen.values()):
            try:
                if p.is_running():
                    for c in p.children(recursive=True):
                        self._seen.setdefault(c.pid, c)
            except psutil.Error:
                pass
        for p in list(self._seen.values()):
            try:
                if p.is_running():
                    p.kill()
            except psutil.Error:
                pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        psutil.wait_procs([p for p in self._seen.values()], timeout=10)

    def leftovers(self) -> list[int]:
        """Pids of processes this server started that still run (should be empty after stop)."""
        out = []
        for p in self._seen.values():
            try:
                if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                    out.append(p.pid)
            except psutil.Error:
                pass
        return out

    def __enter__(self) -> "Server":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
