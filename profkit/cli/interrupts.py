"""One signal, one interrupt: how the command line is stopped by Ctrl-C (SIGINT), and by SIGTERM and
SIGHUP where a command records runs.

- The first SIGINT (and, in `trace` and `sweep`, SIGTERM or SIGHUP) raises KeyboardInterrupt. Any
  later one, and one arriving while a KeyboardInterrupt a library raised is being handled, comes while
  the command unwinds (stops its servers, finishes its manifests, prints its line): it is the same
  interrupt and is let go. A second KeyboardInterrupt in the middle of that unwinding would cut it
  short: a manifest left saying "running", or profkit dead by SIGINT (exit -2) after it had printed
  its `interrupted` line.
- polars (>= 1.22) installs a SIGINT handler of its own when it is imported (signal-hook, chained in
  front of Python's): a Ctrl-C during one of its queries then raises its own KeyboardInterrupt out of
  the query, and Python's handler raises a second one a few bytecodes later, in whatever `except`
  block is handling the first (seen in a signal trial: exit -2; reproduced with one lazy group-by and
  one SIGINT). Once polars is imported, SIGINT is given back to Python's handler alone, so a Ctrl-C is
  one KeyboardInterrupt at the end of the query at hand (profkit's queries are short). signal-hook
  also asks the kernel to restart interrupted system calls, which kept a Python handler waiting on a
  blocking call (polars issue 21739); Python's own handler does not.
- Once the command has chosen its exit status, the three signals are ignored (`settle`): Python puts
  the default actions back while the interpreter shuts down, and a signal then would end profkit by
  that signal instead of with its status.

- Every exit after an interrupt is an os._exit with the chosen status (cli/common._quick_exit): a
  KeyboardInterrupt that ended a string `exec` (code a dataclass generates while a module imports)
  is remembered by CPython as unhandled, and `python -m profkit` would then die by SIGINT (exit -2)
  after printing its `interrupted` line.

`nohup` keeps its ignored SIGHUP (and an ignored SIGINT stays ignored, as a shell's `&` asks).
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import signal
import sys
import threading
from typing import Any

_TERMINATE = (signal.SIGTERM, *((signal.SIGHUP,) if hasattr(signal, "SIGHUP") else ()))
_state = {"raised": False}


def _interrupt(signum: int, frame: Any) -> None:
    first = not (_state["raised"] or _unwinding())  # else the command is already ending for the first one: the same interrupt
    _state["raised"] = True
    if first:
        raise KeyboardInterrupt


def _unwinding() -> bool:
    """Whether the code this handler interrupted is handling a KeyboardInterrupt, or an exception raised
    while one was handled (Interrupted, typer's Exit, SystemExit): one a library raised itself, as
    polars does out of a query."""
    e = sys.exc_info()[1]
    seen: set[int] = set()
    while e is not None and id(e) not in seen:
        if isinstance(e, KeyboardInterrupt):
            return True
        seen.add(id(e))
        e = e.__context__
    return False


def install(*, terminate_too: bool = False) -> None:
    """SIGINT (and with `terminate_too` SIGTERM and SIGHUP) raise one KeyboardInterrupt per command;
    polars' SIGINT handler is taken out once polars is imported. Main thread only (elsewhere: nothing)."""
    if threading.current_thread() is not threading.main_thread():
        return
    _state["raised"] = False
    for s in (signal.SIGINT, *(_TERMINATE if terminate_too else ())):
        if signal.getsignal(s) is not signal.SIG_IGN:
            signal.signal(s, _interrupt)
    if "polars" in sys.modules:
        _sigint_to_python()
    elif not any(isinstance(f, _AfterPolars) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterPolars())


def seen() -> bool:
    """Whether this command was interrupted (its first SIGINT, SIGTERM or SIGHUP raised KeyboardInterrupt)."""
    return _state["raised"]


def settle() -> None:
    """The command has ended and chosen its exit status (its servers stopped, its manifests finished):
    SIGINT, SIGTERM and SIGHUP are ignored from now on."""
    for s in (signal.SIGINT, *_TERMINATE):
        try:
            signal.signal(s, signal.SIG_IGN)
        except (ValueError, OSError):  # not the main thread: nothing to settle
            pass


def _sigint_to_python() -> None:
    """Python's own C-level SIGINT handler back in the kernel, in place of polars' (its Python-level
    handler stays what it was). Outside the main thread it cannot be set: left as it is."""
    try:
        signal.signal(signal.SIGINT, signal.getsignal(signal.SIGINT))
    except (ValueError, OSError, TypeError):
        pass


class _AfterPolars(importlib.abc.MetaPathFinder):
    """Finds nothing itself: when polars is first imported, it has the import run as usual and then
    gives SIGINT back to Python (`_sigint_to_python`). Leaves `sys.meta_path` after that one import."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != "polars":
            return None
        # a new list, not remove(): a thread importing meanwhile (the early decode's numpy) iterates
        # the old one, and removing from it under that loop skips the next finder (numpy not found)
        sys.meta_path = [f for f in sys.meta_path if f is not self]
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        run = spec.loader.exec_module

        def exec_module(module: Any) -> None:
            try:
                run(module)
            finally:  # also when a Ctrl-C cut the import short, after polars had hooked SIGINT
                _sigint_to_python()

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec
