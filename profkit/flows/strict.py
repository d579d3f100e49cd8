"""--strict (analyze, diff): a command that wrote every output still exits 5 (profkit.errors.StrictCheckFailed)
when a profile's capture health is not ok, naming each such profile and its health."""

from __future__ import annotations

from typing import Any


def check_strict(strict: bool, healths: list[tuple[str, Any]]) -> None:
    """--strict: exit 5 (profkit.errors.StrictCheckFailed) when any (label, health) is not ok."""
    if not strict:
        return
    from profkit.report.health_text import health_text
    from profkit.errors import StrictCheckFailed

    bad = [(label, h) for label, h in healths if not (isinstance(h, dict) and h.get("verdict") == "ok")]
    if bad:
        raise StrictCheckFailed("--strict: " + "; ".join(f"{label}: {health_text(h)}" for label, h in bad),
                                hint="the first line of the report names the checks; re-record, or drop --strict to read the figures with their marks")
