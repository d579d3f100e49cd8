"""cli/interrupts.py: one signal is one KeyboardInterrupt, in a fresh interpreter as `profkit` runs.

polars installs a SIGINT handler of its own on import; one SIGINT during one of its lazy queries then
raised two KeyboardInterrupts (its own out of the query, then Python's a few bytecodes later, inside
the `except` handling the first): a CI run's signal trial died by SIGINT (exit -2) after printing its
`interrupted` line, and a trial beside it left a manifest saying "running"."""

from __future__ import annotations

import subprocess
import sys

import pytest

from processes import HANG_S

pytest.importorskip("polars")

SCRIPT = """
import os, signal, subprocess, sys, time
if sys.argv[1] == "profkit":
    from profkit.cli import interrupts
    interrupts.install()  # as profkit's main does, before anything imports polars
import polars as pl

df = pl.DataFrame({"a": [float(i % 9973) for i in range(2_000_000)]})
query = df.lazy().with_columns((pl.col("a") * 1000).cast(pl.Int64).alias("k")).group_by("k").agg(pl.col("a").sum()).sort("k")
counts = []
for trial in range(5):
    if sys.argv[1] == "profkit":
        interrupts._state["raised"] = False  # as a new command: its one interrupt not used yet
    n = 0
    killer = subprocess.Popen(["sh", "-c", f"sleep 0.3; kill -INT {os.getpid()}"])
    try:
        while True:  # polars' queries back to back: the signal lands in one of them
            query.collect()
    except KeyboardInterrupt:
        n += 1
        try:
            for _ in range(200_000):  # bytecodes, and calls: chances for a pending Python handler to run
                len(str(_))
        except KeyboardInterrupt:
            n += 1
    killer.wait()
    counts.append(n)
print(" ".join(map(str, counts)))
"""


def _counts(mode: str) -> list[int]:
    p = subprocess.run([sys.executable, "-c", SCRIPT, mode], capture_output=True, text=True, timeout=HANG_S)
    assert p.returncode == 0, p.stderr[-2000:]
    return [int(x) for x in p.stdout.split()]


def test_one_sigint_during_a_polars_query_is_one_interrupt():
    """Five SIGINTs, each landing during a polars lazy group-by in a process set up as profkit's main
    sets itself up: each raises exactly one KeyboardInterrupt. Two guards make it so, each enough
    alone here (checked by removing one, then the other): polars' hook taken out at its import (the
    next test) and a signal let go while a KeyboardInterrupt is handled (the last test). Without the
    set-up polars 2.1 gives two for each of five: the control below."""
    assert _counts("profkit") == [1] * 5


def test_polars_alone_still_doubles_an_interrupt():
    """The control: the same five signals without profkit's set-up. If polars stops raising its own
    KeyboardInterrupt beside Python's, this fails, and interrupts._AfterPolars can go."""
    counts = _counts("plain")
    assert 2 in counts, counts


TWICE = """
import os, signal, sys, time
from profkit.cli import interrupts
interrupts.install(terminate_too=True)
caught = []
def spin():  # bytecodes and calls: chances for a pending Python handler to run
    for _ in range(100_000):
        len(str(_))
try:
    if sys.argv[1] == "raised":  # a KeyboardInterrupt a library raised itself, as polars does out of a query
        raise KeyboardInterrupt
    os.kill(os.getpid(), getattr(signal, sys.argv[1]))
    spin()
except KeyboardInterrupt:
    caught.append(1)
    try:
        os.kill(os.getpid(), getattr(signal, sys.argv[2]))  # while the first is being handled
        spin()
        caught.append("let go")
    except KeyboardInterrupt:
        caught.append(2)
print(caught)
"""


@pytest.mark.parametrize("first,second", [("SIGINT", "SIGINT"), ("SIGTERM", "SIGINT"), ("SIGINT", "SIGHUP"), ("raised", "SIGINT")])
def test_a_second_signal_while_the_first_unwinds_is_let_go(first, second):
    """The second of two signals (Ctrl-C pressed twice; SIGTERM then Ctrl-C), or a signal arriving
    while a KeyboardInterrupt raised by a library is handled, comes while profkit unwinds from the
    first: one KeyboardInterrupt, the second let go. (Python's own handler raised again in the middle
    of the unwinding: a manifest left "running", or exit -2.)"""
    p = subprocess.run([sys.executable, "-c", TWICE, first, second], capture_output=True, text=True, timeout=HANG_S)
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.strip() == "[1, 'let go']"


HANDLER = """
import ctypes, signal, sys
libc = ctypes.CDLL(None, use_errno=True)

class Action(ctypes.Structure):  # struct sigaction on Linux x86-64/aarch64: the handler comes first
    _fields_ = [("handler", ctypes.c_void_p), ("rest", ctypes.c_byte * 152)]

def kernel_handler():
    a = Action()
    assert libc.sigaction(signal.SIGINT, None, ctypes.byref(a)) == 0
    return a.handler

signal.signal(signal.SIGINT, signal.default_int_handler)
python_handler = kernel_handler()  # Python's own C-level handler
if sys.argv[1] == "profkit":
    from profkit.cli import interrupts
    interrupts.install()
import polars
print(kernel_handler() == python_handler)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads struct sigaction as Linux lays it out")
def test_polars_import_leaves_sigint_to_python():
    """After `import polars` in a process set up as profkit's main sets itself up, the kernel calls
    Python's own SIGINT handler, not polars' (signal-hook's, which asks for restarted system calls and
    raises polars' own KeyboardInterrupt); without the set-up, polars' is there."""
    got = {}
    for mode in ("profkit", "plain"):
        p = subprocess.run([sys.executable, "-c", HANDLER, mode], capture_output=True, text=True, timeout=HANG_S)
        assert p.returncode == 0, p.stderr[-2000:]
        got[mode] = p.stdout.strip()
    assert got == {"profkit": "True", "plain": "False"}


KI_IN_EXEC = '''
import sys
from profkit.cli import common
from profkit.cli.common import command


@command("ki-in-exec")
def _ki_in_exec() -> None:
    exec("raise KeyboardInterrupt")  # a Ctrl-C that lands in string-exec'd code (a dataclass's generated __init__ while a module imports)


sys.argv = ["profkit", "ki-in-exec"]
common.main()
'''


def test_an_interrupt_inside_a_string_exec_still_exits_130(tmp_path):
    """CPython marks a KeyboardInterrupt that ends a string `exec` as unhandled even when it is caught, and
    under `python -m` then ends the process by SIGINT after its teardown (-2 instead of the chosen 130;
    a signal trial under load printed its `interrupted` line and died so). profkit leaves by its status."""
    (tmp_path / "ki_in_exec.py").write_text(KI_IN_EXEC)
    r = subprocess.run([sys.executable, "-m", "ki_in_exec"], cwd=tmp_path, capture_output=True, text=True, timeout=HANG_S)
    assert "interrupted" in r.stderr
    assert r.returncode == 130, (r.returncode, r.stderr)
