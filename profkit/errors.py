"""Errors profkit expects and can explain; the CLI prints them as one line, without a traceback."""

from __future__ import annotations

# Exit codes (DESIGN.md): 0 ok, 1 nothing to analyze, 2 usage, 3 input (and files profkit cannot
# write), 4 target, 130 interrupted, 70 a bug in profkit (one line; the traceback goes to a file).
EXIT_NOTHING = 1
EXIT_USAGE = 2
EXIT_INPUT = 3
EXIT_TARGET = 4
EXIT_STRICT = 5  # a check the user asked to be strict about failed (--strict on a degraded capture)
EXIT_BUG = 70
EXIT_INTERRUPTED = 130


class ProfkitError(Exception):
    """Base class: an error with an exit code and an optional hint (what to try). Raise one of the
    subclasses below; each names its exit code. (Exit 1 belongs to NothingToAnalyze alone.)"""

    exit_code: int = EXIT_USAGE

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.hint = hint


class NothingToAnalyze(ProfkitError):
    """The analysis found nothing where the user asked for something specific."""

    exit_code = EXIT_NOTHING


class UsageError(ProfkitError):
    exit_code = EXIT_USAGE


class TraceInputError(ProfkitError):
    """A file is missing, unreadable, corrupt, or not a Kineto trace profkit can read."""

    exit_code = EXIT_INPUT


class OutputError(ProfkitError):
    """A file profkit was asked to write cannot be written (missing folder, permissions, disk full)."""

    exit_code = EXIT_INPUT


class TargetError(ProfkitError):
    """The server under test failed to start or died; the hint carries its log tail."""

    exit_code = EXIT_TARGET


class StrictCheckFailed(ProfkitError):
    """A check the user asked to be strict about failed: --strict on a capture whose health is not ok."""

    exit_code = EXIT_STRICT


class Interrupted(ProfkitError):
    exit_code = EXIT_INTERRUPTED
