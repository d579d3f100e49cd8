"""The server's process tree: how Ctrl-C and SIGTERM are held off while it is spawned and torn down,
and how every process it started is found again, even one that left its process group.

Why not only `pthread_sigmask` around the spawn: the mask is per thread. profkit has other threads
while it spawns (rich's progress refresh, HTTP drivers); a SIGINT/SIGTERM sent to the process is
delivered to one of them, and CPython then runs the Python handler in the main thread at its next
bytecode, mask or not, so a KeyboardInterrupt could still land inside `subprocess.Popen` after the
fork and before the Popen object was returned: a server running with no pid recorded anywhere.
`held_signals` instead swaps the Python-level handlers of SIGINT and SIGTERM for ones that only note
the signal; the noted signal is delivered to the previous handler when the block ends, so the spawn
and the recording of its pid happen as one step, and a teardown is never cut short.

Every process of the tree carries `PROFKIT_SERVER_TAG=<unique>` in its environment (inherited through
fork and exec unless a program clears its environment): `tagged` finds them all, including helpers
that started sessions of their own and were reparented to init when their parent died.
"""

from __future__ import annotations

import os
import signal
import threading
import uuid
from typing import Any, Callable

import psutil

HELD = (signal.SIGINT, signal.SIGTERM, *((signal.SIGHUP,) if hasattr(signal, "SIGHUP") else ()))
TAG_ENV = "PROFKIT_SERVER_TAG"


class held_signals:
    """SIGINT and SIGTERM are noted, not acted upon, from `__enter__` (or `hold()`) until `__exit__`
    (or `release()`); then the previous handlers are back and each noted signal, each kind once (two
    Ctrl-C while held are one interrupt), is handed to them: KeyboardInterrupt for Ctrl-C, whatever
    the command installed for SIGTERM. `arrived` is set at the first, for a loop that should hurry.
    Holds nest: an inner one hands its signals to the outer one. `deliver=False` drops them instead
    (the block is itself the answer to a signal: a second Ctrl-C meanwhile is the same interrupt).
    Outside the main thread (where handlers cannot be set) it holds nothing."""

    def __init__(self, *, deliver: bool = True) -> None:
        self.deliver = deliver
        self.signals: list[int] = []
        self.arrived = Flag()
        self._previous: dict[int, Any] = {}

    def _note(self, signum: int, frame: Any) -> None:
        self.signals.append(signum)
        self.arrived.set()

    def hold(self) -> "held_signals":
        if threading.current_thread() is threading.main_thread():
            for s in HELD:
                self._previous[s] = signal.signal(s, self._note)
        return self

    def release(self) -> None:
        previous, self._previous = self._previous, {}
        for s, h in previous.items():
            signal.signal(s, h)
        noted, self.signals = list(dict.fromkeys(self.signals)), []
        for s in noted if self.deliver else ():
            _deliver(s, previous.get(s, signal.SIG_DFL))

    def __enter__(self) -> "held_signals":
        return self.hold()

    def __exit__(self, *exc: object) -> None:
        self.release()


class Flag:
    """Set by a signal handler, read by the loop it interrupted; takes no lock. Not a threading.Event:
    CPython runs a Python handler in the main thread between two bytecodes, and if those are inside
    `Event.wait` (which holds the Event's lock around its checks), the handler's `Event.set` waits
    for that lock, held by the very thread it runs on: the process hangs for good (a signal trial:
    a SIGINT during the server's teardown, 900 s without a line; tests/test_process.py)."""

    def __init__(self) -> None:
        self._set = False

    def set(self) -> None:
        self._set = True

    def is_set(self) -> bool:
        return self._set


def _deliver(signum: int, handler: Any) -> None:
    if callable(handler):
        handler(signum, None)
    elif handler == signal.SIG_DFL:
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        os.kill(os.getpid(), signum)  # the default action (SIGTERM: the process ends)
    # SIG_IGN (or a handler set outside Python): nothing


def new_tag() -> str:
    return uuid.uuid4().hex


def tagged(tag: str) -> list[psutil.Process]:
    """Live processes (not zombies) whose environment carries this tag: the server's whole tree."""
    out = []
    me = os.getpid()
    for p in psutil.process_iter():
        if p.pid == me:
            continue
        try:
            if p.environ().get(TAG_ENV) == tag and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except (psutil.Error, OSError):  # gone, another user's, or a kernel thread
            continue
    return out


def kill_all(procs: list[psutil.Process], *, timeout_s: float = 10.0, on_gone: Callable[[psutil.Process], None] | None = None) -> list[psutil.Process]:
    """SIGKILL each and wait for them; the ones still alive after `timeout_s`."""
    for p in procs:
        try:
            p.kill()
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(procs, timeout=timeout_s, callback=on_gone)
    return alive


def describe_exit(returncode: int | None, *, sent: str | None, killed: bool) -> str:
    """How the server ended, in words, for the manifest."""
    if returncode is None:
        return "still running (could not be stopped)"
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        by = " (sent by profkit)" if killed and name == "SIGKILL" or sent == name else ""
        return f"killed by {name}{by}"
    if sent:
        return f"exited with code {returncode} after {sent}"
    return f"exited by itself with code {returncode}"
