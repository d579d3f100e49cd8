"""Start the server under test in its own process group, wait for /health, always stop it.

Stop = SIGTERM to the server, as long as the engine's own teardown needs (SGLang: ~90 s, see
targets/sglang.TEARDOWN_S), then SIGKILL to its process group and to every descendant seen while
it ran (psutil, polled during the teardown too) and to every process carrying the server's tag in
its environment (capture/process.py): a server that forks schedulers, whose children start JIT
compilers in sessions of their own, must leave no orphans. Spawn and teardown hold off Ctrl-C and
SIGTERM (capture/process.py says why a signal mask is not enough), so the pid is recorded before a
signal can act and a teardown is never cut short.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Callable

import psutil

from profkit.http import HTTPFailure, port_free, request
from profkit.capture.process import TAG_ENV, Flag, describe_exit, held_signals, kill_all, new_tag, tagged
from profkit.errors import TargetError
from profkit.targets.spec import LaunchSpec


EXIT_SEEN_S = 5.0  # how long a server whose stream broke has to be seen exiting before it is called alive but silent


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
        self.tag = new_tag()  # in every process of the tree's environment (process.tagged finds them)
        self.ended: dict[str, object] | None = None  # how it ended (pid, exit code, in words), for the manifest

    def start(self, on_spawn: Callable[[int], None] | None = None) -> None:
        """Spawn the server in a session (process group) of its own and call `on_spawn(pid)` (the
        manifest records it) before a Ctrl-C or SIGTERM can act: both are held from before the fork
        until the pid is recorded (process.held_signals), then delivered."""
        if not port_free(self.spec.host, self.spec.port):
            raise TargetError(f"port {self.spec.port} on {self.spec.host} is already in use", hint="pass another --port, or stop whatever listens there")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = {k: v for k, v in os.environ.items() if k not in self.spec.unset}
        env.update({**self.spec.env, "PYTHONUNBUFFERED": "1", TAG_ENV: self.tag})
        with open(self.log_path, "ab") as log:
            log.write(f"# profkit: {self.spec.shell()}\n".encode())
            log.flush()
            with held_signals():
                try:
                    self.proc = subprocess.Popen(self.spec.argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                                 env=env, start_new_session=True)
                except OSError as e:
                    raise TargetError(f"cannot start {self.spec.argv[0]}: {e.strerror}", hint="check --server-python / the engine's install") from None
                self._remember()
                if on_spawn is not None:
                    on_spawn(self.proc.pid)

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

    def exited(self, within_s: float = EXIT_SEEN_S) -> bool:
        """Whether the server has exited, waiting up to `within_s` for it: a killed server's sockets close
        before the kernel makes it a zombie that poll() sees, and on a loaded host that gap is long enough
        for a cut-off stream to be read first. The wait ends the moment it exits."""
        if self.proc is None:
            return False
        try:
            self.proc.wait(timeout=within_s)
        except subprocess.TimeoutExpired:
            return False
        return True

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
        descendant, then SIGKILL the group, every descendant seen and every process carrying the
        tag. A Ctrl-C or SIGTERM meanwhile does not cut it short: it shortens the grace to
        INTERRUPTED_GRACE_S and is delivered once the tree is gone. Idempotent."""
        if self.proc is None:
            return
        with held_signals() as held:
            self._stop(self.proc, self.spec.teardown_s if grace_s is None else grace_s, held.arrived)

    def _stop(self, proc: subprocess.Popen[bytes], grace: float, hurry: Flag) -> None:
        self._remember()
        sent: str | None = None
        if proc.poll() is None:
            try:
                proc.send_signal(signal.SIGTERM)
                sent = "SIGTERM"
            except ProcessLookupError:
                pass
            deadline = time.monotonic() + grace
            while proc.poll() is None and time.monotonic() < deadline:
                if hurry.is_set():
                    deadline = min(deadline, time.monotonic() + INTERRUPTED_GRACE_S)
                self._remember()
                time.sleep(0.1)  # also once hurried: the shorter deadline is the hurry, not a spinning loop
        killed = proc.poll() is None
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        for p in list(self._seen.values()):
            try:
                if p.is_running():
                    for c in p.children(recursive=True):
                        self._seen.setdefault(c.pid, c)
            except psutil.Error:
                pass
        for p in tagged(self.tag):
            self._seen.setdefault(p.pid, p)
        if killed:
            try:
                proc.kill()  # also when its group could not be signalled
            except ProcessLookupError:
                pass
        # the server itself is reaped by its Popen, never by psutil: psutil's wait reaps a child it is given, and
        # Popen, finding it gone (ECHILD), says exit code 0: "exited with code 0 after SIGTERM" for a server
        # profkit had SIGKILLed (7 of 40 teardowns of a server ignoring SIGTERM, beside 4 busy loops)
        kill_all([p for p in self._seen.values() if p.pid != proc.pid and _running(p)])
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        rc = proc.poll()
        if self.ended is None or self.ended.get("returncode") is None:
            self.ended = {"pid": proc.pid, "returncode": rc, "how": describe_exit(rc, sent=sent, killed=killed)}

    def leftovers(self) -> list[int]:
        """Pids of processes this server started that still run (should be empty after stop): the
        descendants seen and every process carrying its tag."""
        out = {p.pid for p in self._seen.values() if _running(p)}
        out |= {p.pid for p in tagged(self.tag)}
        return sorted(out)

    def __enter__(self) -> "Server":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


INTERRUPTED_GRACE_S = 5.0  # the engine's own teardown, when the user has asked to stop


def _running(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
