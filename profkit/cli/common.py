"""What every command shares: the Typer app, the consoles, the options several commands declare
(declared in options.py; trace's and sweep's run options as one dataclass, `options_from`), and the one place that maps errors to a line and an exit code
(`command` for profkit's own errors, `main` for Ctrl-C and bugs). The commands live in analyze.py,
capture.py and report.py; each imports this module, none imports another."""

from __future__ import annotations

import dataclasses
import functools
import inspect
import sys
import traceback
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any, Callable, Iterator, Optional, TypeVar, get_type_hints

import typer

try:  # typer >= 0.22 carries its own copy of click
    from typer._click import exceptions as click_errors  # type: ignore[import-not-found]
except ImportError:  # pragma: no cover  (older typer, e.g. on the GPU machine: click itself)
    from click import exceptions as click_errors  # type: ignore[no-redef]
from rich.console import Console
from rich.markup import escape

from profkit import __version__
from profkit.cli import interrupts
from profkit.errors import EXIT_BUG, EXIT_INTERRUPTED, ProfkitError
from typer.core import TyperGroup


_NO_ARGS = getattr(click_errors, "NoArgsIsHelpError", ())  # click >= 8.2: `profkit trace` alone shows the help


class _Group(TyperGroup):
    """The app's click group: a usage error (an unknown option, a value out of range, a choice not
    offered, a shared option's check in options.py) is one line and exit 2, as profkit's own errors
    are, instead of click's usage block and boxed message."""

    def main(self, *args: Any, standalone_mode: bool = True, **kw: Any) -> Any:
        if not standalone_mode:
            return super().main(*args, standalone_mode=False, **kw)
        try:
            rv = super().main(*args, standalone_mode=False, **kw)
        except _NO_ARGS as e:  # `profkit` or `profkit trace` alone: the help
            e.show()
            sys.exit(e.exit_code)
        except click_errors.UsageError as e:
            where = e.ctx.command_path if e.ctx is not None else "profkit"
            err.print(f"[bold red]error:[/] {escape(e.format_message())}", soft_wrap=True)
            err.print(f"[dim]hint:[/] {escape(where)} --help", soft_wrap=True)
            sys.exit(e.exit_code)
        except click_errors.ClickException as e:
            err.print(f"[bold red]error:[/] {escape(e.format_message())}", soft_wrap=True)
            sys.exit(e.exit_code)
        except typer.Abort:
            err.print("[yellow]interrupted[/]")
            sys.exit(EXIT_INTERRUPTED)
        sys.exit(rv if isinstance(rv, int) else 0)


app = typer.Typer(
    cls=_Group,
    no_args_is_help=True,
    context_settings={"help_option_names": ["-h", "--help"]},
    help="Profile LLM serving engines: per-iteration GPU bubbles, host syncs, launches and per-optimization attribution.",
    pretty_exceptions_enable=False,
    add_completion=False,
)


def _flags_without_type() -> None:
    """--help lists a flag without a type column entry (typer prints `<bool>` for every flag)."""
    try:
        from typer.core import TyperOption
    except ImportError:  # another typer layout: leave its help as it is
        return
    shown = getattr(TyperOption, "display_type_rich", None)
    if shown is None:  # an older typer (0.12-0.2x, as on the GPU machine) shows no type there: nothing to hide
        return

    def display_type_rich(self, ctx):  # type: ignore[no-untyped-def]
        return None if getattr(self, "is_flag", False) and self.metavar is None else shown(self, ctx)

    TyperOption.display_type_rich = display_type_rich  # type: ignore[method-assign]


_flags_without_type()

NARROW_HELP = 100  # columns under which a command's --help is click's plain two-column list


def _narrow_help() -> None:
    """Under NARROW_HELP columns a command's --help is click's plain list (the option, then its help wrapped beside or
    under it): typer's rich panel gives every column its share, and at 80 columns the flag pairs (--warmup/--no-warmup,
    --alternate/--sequential) and the types left the help text 17 columns, one word a line."""
    import shutil

    try:
        from typer.core import TyperCommand
    except ImportError:
        return
    rich_help = TyperCommand.format_help

    def format_help(self, ctx, formatter):  # type: ignore[no-untyped-def]
        if shutil.get_terminal_size().columns >= NARROW_HELP:
            return rich_help(self, ctx, formatter)
        super(TyperCommand, self).format_help(ctx, formatter)
        # the help strings are written for rich markup, where a literal "[" is "\["
        formatter.buffer[:] = [x.replace("\\[", "[") for x in formatter.buffer]

    TyperCommand.format_help = format_help  # type: ignore[method-assign]


_narrow_help()
err = Console(stderr=True, highlight=False)
out = Console(highlight=False)


def _reader_left() -> None:
    """stdout's reader went away (`profkit diff ... | head -3`): not an error. Every file the
    command writes is written before it prints, so stop quietly with 0."""
    import os

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
    raise SystemExit(0)


out.on_broken_pipe = err.on_broken_pipe = _reader_left  # type: ignore[method-assign]  (rich's default exits 1)
_state = {"debug": False}


# --- options that several commands declare, defined once ---------------------------------------

def option(*flags: str, help: str, **typer_kw: Any) -> dict[str, Any]:
    """A dataclass field's command-line option, for `options_from`: its flags, its help text and
    any other typer.Option keyword (min=, ...). Use as `field(default=..., metadata=option(...))`."""
    return {"flags": flags, "help": help, "typer": typer_kw}


F = TypeVar("F", bound=Callable[..., Any])


def options_from(cls: type, *, exclude: tuple[str, ...] = (), help: dict[str, str] | None = None) -> Callable[[F], F]:
    """A command takes the fields of the dataclass `cls` as options (in field order, where the
    command's parameter `options: cls` stands) and receives them as one `cls` value. A field the
    command declares itself (a parameter of the same name: its own help, its own place in --help)
    is still passed into the dataclass; `exclude`d fields keep their defaults; `help` replaces a
    field's help text for this command."""
    hints = get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = set(exclude) | set(help or {})
    if unknown - set(fields):
        raise TypeError(f"options_from: {sorted(unknown - set(fields))} are not fields of {cls.__name__}")

    def deco(fn: F) -> F:
        sig = inspect.signature(fn)
        own = get_type_hints(fn, include_extras=True)
        params: list[inspect.Parameter] = []
        for p in sig.parameters.values():
            if p.name != "options":
                params.append(p.replace(annotation=own[p.name]))
                continue
            for f in fields.values():
                if f.name in exclude or f.name in sig.parameters:
                    continue
                m = f.metadata
                opt = typer.Option(*m["flags"], help=(help or {}).get(f.name, m["help"]), **m["typer"])
                params.append(inspect.Parameter(f.name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=f.default,
                                                annotation=Annotated[hints[f.name], opt]))

        @functools.wraps(fn)
        def wrapper(**kw: Any) -> Any:
            values = {k: kw[k] for k in fields if k in kw}
            for k in values:
                if k not in sig.parameters:
                    del kw[k]
            return fn(options=cls(**values), **kw)

        wrapper.__signature__ = sig.replace(parameters=params)  # type: ignore[attr-defined]
        wrapper.__annotations__ = {p.name: p.annotation for p in params}
        return wrapper  # type: ignore[return-value]

    return deco


# --- errors -> a line and an exit code: the one place ----------------------------------------

@contextmanager
def user_errors() -> Iterator[None]:
    """Map expected errors to one line and an exit code; tracebacks only with --debug."""
    try:
        yield
    except ProfkitError as e:
        if _state["debug"]:
            traceback.print_exc()
        err.print(f"[bold red]error:[/] {escape(str(e))}", soft_wrap=True)
        if e.hint:
            err.print(f"[dim]hint:[/] {escape(e.hint)}", soft_wrap=True)
        raise typer.Exit(code=e.exit_code) from None
    except KeyboardInterrupt:
        err.print("[yellow]interrupted[/]")
        raise typer.Exit(code=EXIT_INTERRUPTED) from None


def command(name: str | None = None) -> Callable[[F], F]:
    """Register a command on the app; profkit's errors inside it become one line and their exit code."""
    def deco(fn: F) -> F:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kw: Any) -> Any:
            with user_errors():
                return fn(*args, **kw)

        app.command(name)(wrapper)
        return fn

    return deco


def _version(value: bool) -> None:
    if value:
        out.print(f"profkit {__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks for errors.")] = False,
    version: Annotated[Optional[bool], typer.Option("--version", callback=_version, is_eager=True, help="Print the version.")] = None,
) -> None:
    _state["debug"] = debug


def main() -> None:
    """Console-script entry point: run the app; unexpected errors are one line unless --debug."""
    interrupts.install()
    try:
        app()
    except SystemExit as e:
        interrupts.settle()
        if _state.get("quick_exit") or e.code == EXIT_INTERRUPTED or interrupts.seen():
            _quick_exit(e.code)  # after an interrupt: see _quick_exit on `python -m profkit`'s exit status
        raise
    except KeyboardInterrupt:
        interrupts.settle()
        err.print("[yellow]interrupted[/]")
        _quick_exit(EXIT_INTERRUPTED)
    except Exception as e:  # a bug: one line and the traceback in a file; --debug prints it
        if _state["debug"] or "--debug" in sys.argv:
            traceback.print_exc()
        else:
            where = _write_crash_report()
            err.print(f"[bold red]internal error (a bug in profkit):[/] {escape(type(e).__name__)}: {escape(str(e))}"
                      + (f"; traceback in {escape(str(where))}" if where else " (run with --debug for the traceback)"), soft_wrap=True)
        sys.exit(EXIT_BUG)


def _write_crash_report() -> Path | None:
    """The current exception's traceback, with profkit's version and the command line, in a new
    file under the temporary folder; its path, or None when it cannot be written."""
    import os
    import tempfile
    import time

    try:
        fd, name = tempfile.mkstemp(prefix=f"profkit-crash-{time.strftime('%Y%m%d-%H%M%S')}-", suffix=".txt")
        with os.fdopen(fd, "w") as f:
            f.write(f"profkit {__version__}\ncommand: {' '.join(sys.argv)}\n\n")
            traceback.print_exc(file=f)
        return Path(name)
    except OSError:
        return None


def _quick_exit(code: object) -> None:
    """Leave without tearing down the interpreter's objects: freeing the tables of a gigabyte trace
    one by one takes a third of a second. Everything a normal exit does for the outside world still
    happens first: output flushed, pending cache writes and other threads joined, atexit handlers run.
    (`analyze` asks for it: _state["quick_exit"].)

    Every exit after an interrupt leaves this way too. A KeyboardInterrupt that ends a string `exec`
    (a dataclass's or namedtuple's generated code, while a module is imported: a Ctrl-C during a
    slow import) makes CPython remember it as unhandled, even once profkit has caught it; under
    `python -m profkit` the interpreter then ends itself by SIGINT after its teardown, whatever exit
    status was chosen: exit -2 after the `interrupted` line (a signal trial under load; reproduced in
    tests/test_interrupts.py). os._exit ends with the status chosen."""
    import atexit
    import os
    import threading

    if code is None:
        status = 0
    elif isinstance(code, int):
        status = code
    else:
        print(code, file=sys.stderr)
        status = 1
    cache = sys.modules.get("profkit.ingest.cache")
    if cache is not None:
        cache.wait_pending()
    me = threading.current_thread()
    for t in threading.enumerate():
        if t is not me and not t.daemon:
            t.join()
    atexit._run_exitfuncs()
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
    os._exit(status)


def check_strict(strict: bool, healths: list[tuple[str, Any]]) -> None:
    """--strict: exit 5 when any (label, health) is not ok (flows/strict.py)."""
    from profkit.flows.strict import check_strict as check

    check(strict, healths)
