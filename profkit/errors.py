"""Errors profkit expects and can explain; the CLI prints them as one line, without a traceback."""

from __future__ import annotations

# Exit codes (DESIGN.md): 0 ok, 1 nothing to analyze, 2 usage, 3 input, 4 target, 130 interrupted.
EXIT_OK = 0
EXIT_NOTHING = 1
EXIT_USAGE = 2
EXIT_INPUT = 3
EXIT_TARGET = 4
EXIT_INTERRUPTED = 130


class ProfkitError(Exception):
    """Base class: an error with an exit code and an optional hint (what to try)."""

    exit_code: int = EXIT_NOTHING

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


class TargetError(ProfkitError):
    """The server under test failed to start or died; the hint carries its log tail."""

    exit_code = EXIT_TARGET


class Interrupted(ProfkitError):
    exit_code = EXIT_INTERRUPTED
