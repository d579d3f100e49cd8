"""What every command shares: the Typer app, the consoles, the global options (--debug, --version)
and the one place that maps profkit's errors to a line and an exit code. The commands live in
cli.py (analyze), cli_capture.py (trace, sweep, opts) and cli_report.py (diff, report,
export-perfetto); each imports this module, none imports another."""

from __future__ import annotations

import sys
import traceback
from contextlib import contextmanager
from typing import Annotated, Iterator, Optional

import typer
from rich.console import Console
from rich.markup import escape

from profkit import __version__
from profkit.errors import EXIT_INTERRUPTED, ProfkitError


app = typer.Typer(
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
