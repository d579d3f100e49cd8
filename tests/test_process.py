"""capture/process.py: Ctrl-C and SIGTERM held off while the server is spawned and recorded, and while it
is torn down, in a process with other threads (as profkit has: rich's progress refresh), where a
per-thread signal mask does not stop CPython from running the handler in the main thread."""

from __future__ import annotations

import subprocess
import sys

import pytest

from processes import HANG_S

PROLOGUE = """
import os, signal, subprocess, sys, threading, time
threading.Thread(target=time.sleep, args=(60,), daemon=True).start()  # another thread, as rich's refresh
signal.signal(signal.SIGTERM, lambda *a: (_ for _ in ()).throw(KeyboardInterrupt()))  # as trace and sweep do
sig = getattr(signal, sys.argv[1])

def kill_me(until=lambda: False):  # from another process: the kernel picks a thread that does not block it
    subprocess.run(["kill", "-" + sys.argv[1][3:], str(os.getpid())], check=True)
    # bytecodes, chances for a pending Python handler to run, until `until()` says it has (or it raises):
    # on a loaded host the thread that takes the signal may wait long to run; 120 s is a hang guard
    deadline = time.monotonic() + 120
    while not until() and time.monotonic() < deadline:
        pass
"""


def _run(body: str, sig: str) -> list[str]:
    p = subprocess.run([sys.executable, "-c", PROLOGUE + body, sig], capture_output=True, text=True, timeout=HANG_S)
    assert p.returncode == 0, p.stderr
    return p.stdout.split()


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_a_held_signal_waits_for_the_end_of_the_block(sig):
    out = _run("""
from profkit.capture.process import held_signals
try:
    with held_signals() as h:
        kill_me(h.arrived.is_set)
        print("block-finished", h.arrived.is_set())
except KeyboardInterrupt:
    print("interrupted-after")
""", sig)
    assert out == ["block-finished", "True", "interrupted-after"]


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_a_signal_mask_alone_does_not_hold_it(sig):
    """Why held_signals swaps handlers: with another thread alive, the main thread's mask lets the
    KeyboardInterrupt through in the middle of the block (here: where Popen would have forked)."""
    out = _run("""
old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
try:
    kill_me()
    print("block-finished")
except KeyboardInterrupt:
    print("interrupted-inside")
finally:
    signal.pthread_sigmask(signal.SIG_SETMASK, old)
""", sig)
    assert out == ["interrupted-inside"]


def test_deliver_false_drops_what_came_during_the_block():
    out = _run("""
from profkit.capture.process import held_signals
with held_signals(deliver=False) as h:
    kill_me(h.arrived.is_set)
print("no-interrupt")
""", "SIGINT")
    assert out == ["no-interrupt"]
