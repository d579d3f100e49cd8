"""traces/<run_id>/manifest.json: what a run was. Written first, updated atomically at each stage,
so an interrupted or failed run still says how far it got and what it had written."""

from __future__ import annotations

import datetime as dt
import getpass
import platform
import subprocess
from pathlib import Path
from typing import Any

from profkit import __version__
from profkit.store import write_json_atomic

MANIFEST_SCHEMA = 1


def now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="milliseconds")


def git_revision(cwd: Path) -> str | None:
    try:
        p = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=5)
        return p.stdout.strip() or None if p.returncode == 0 else None
    except OSError:
        return None


class Manifest:
    def __init__(self, path: Path, data: dict[str, Any]) -> None:
        self.path = path
        self.data = data

    @classmethod
    def create(cls, path: Path, **fields: Any) -> "Manifest":
        data: dict[str, Any] = {
            "schema_version": MANIFEST_SCHEMA,
            "profkit_version": __version__,
            "run_id": path.parent.name,
            "status": "running",
            "stage": "starting",
            "started_at": now(),
            "ended_at": None,
            "host": {"python": platform.python_version(), "platform": platform.platform(), "user": _user()},
            "git_revision": git_revision(Path.cwd()),
            **fields,
            "trace_files": [],
            "error": None,
        }
        m = cls(path, data)
        m.write()
        return m

    def write(self) -> None:
        write_json_atomic(self.path, self.data)

    def update(self, **fields: Any) -> None:
        self.data.update(fields)
        self.write()

    def stage(self, name: str) -> None:
        self.update(stage=name)

    def finish(self, status: str, error: str | None = None) -> None:
        self.update(status=status, error=error, ended_at=now())


def _user() -> str | None:
    try:
        return getpass.getuser()
    except Exception:
        return None
