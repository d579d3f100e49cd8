"""The profiler window: POST /start_profile with explicit fields, poll until every rank's file is complete."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

from profkit.http import HTTPFailure, request
from profkit.errors import TargetError


def start_profile(base_url: str, *, output_dir: Path, profile_id: str, num_steps: int, with_stack: bool = False,
                  record_shapes: bool = False, activities: tuple[str, ...] = ("CPU", "GPU")) -> dict[str, object]:
    """Ask the server to profile the next `num_steps` run_batch calls. Every field explicit: SGLang
    defaults with_stack and record_shapes to true and silently ignores unknown keys (§0 #8, #10)."""
    body = {"output_dir": str(output_dir.resolve()), "num_steps": num_steps, "activities": list(activities),
            "with_stack": with_stack, "record_shapes": record_shapes, "profile_id": profile_id}
    status, data = request(base_url + "/start_profile", body, timeout=120)
    if status != 200:
        raise TargetError(f"/start_profile answered HTTP {status}: {data[:200].decode(errors='replace')}")
    return body


def rank_files(output_dir: Path, profile_id: str) -> list[Path]:
    return sorted(p for p in output_dir.glob(f"{profile_id}-TP-*.trace.json.gz") if not p.name.startswith("."))


DONE_LINE = "Profiling done. Traces are saved to:"


def log_size(path: Path | None) -> int:
    try:
        return path.stat().st_size if path is not None else 0
    except OSError:
        return 0


def _done_lines(log_path: Path | None, offset: int, output_dir: Path) -> int:
    """How many `Profiling done. Traces are saved to: <output_dir>...` lines the server logged after `offset`."""
    if log_path is None:
        return 0
    try:
        with open(log_path, "rb") as f:
            f.seek(offset)
            text = f.read().decode(errors="replace")
    except OSError:
        return 0
    want = str(output_dir.resolve())
    return sum(1 for ln in text.splitlines() if DONE_LINE in ln and want in ln.split(DONE_LINE, 1)[1])


def wait_for_traces(base_url: str, output_dir: Path, profile_id: str, world_size: int, *, timeout_s: float,
                    alive: Callable[[], bool] = lambda: True, idle: Callable[[], bool] = lambda: False,
                    log_path: Path | None = None, log_offset: int = 0, notes: list[str] | None = None) -> list[Path]:
    """Wait until the server says the window's traces are written, then return the rank files.

    torch exports gzip straight into the final file name, so a file's existence or a pause in its
    growth says nothing. SGLang's schedulers log `Profiling done. Traces are saved to: <dir>` after
    every rank exported and passed a barrier across the TP group (profiler_manager._stop_profile),
    so that line in the server log (after `log_offset`) plus `world_size` files is the signal.
    /start_profile returns at once (SGLang §0 #9); if the window never closes (an idle server never
    auto-stops), /stop_profile is called once, then waiting resumes. A window that closed itself
    (num_steps reached) while that call was on its way makes SGLang answer HTTP 500 ("Profiling is
    not in progress", seen on a real 0.5.23 server): that is said in `notes` and waiting goes on for
    the export it started; any other answer but 200 fails the window.
    """
    deadline = time.monotonic() + timeout_s
    stopped = False
    half = time.monotonic() + timeout_s / 2
    reported_at: float | None = None
    while time.monotonic() < deadline:
        files = rank_files(output_dir, profile_id)
        if _done_lines(log_path, log_offset, output_dir):
            if len(files) >= world_size:
                return files
            reported_at = reported_at or time.monotonic()
            if time.monotonic() - reported_at > 30:
                raise TargetError(f"the server logged '{DONE_LINE} {output_dir}' but only {len(files)} of {world_size} "
                                  f"'{profile_id}-TP-*.trace.json.gz' files are there",
                                  hint="a rank failed to export its trace; see the server log")
        if not alive():
            raise TargetError("the server died while profiling")
        if not stopped and (time.monotonic() > half or idle()):
            stopped = True
            try:
                status, body = request(base_url + "/stop_profile", {}, timeout=max(5.0, deadline - time.monotonic()))
            except HTTPFailure as e:
                status, body = None, str(e).encode()
            if status == 500:
                (notes if notes is not None else []).append(
                    "/stop_profile answered HTTP 500: the window had closed itself after its num_steps (SGLang: 'Profiling is not "
                    "in progress'); waiting for its export")
            elif status not in (200, None):
                raise TargetError(f"/stop_profile answered HTTP {status}: {body[:200].decode(errors='replace')}",
                                  hint="see the server log")
        time.sleep(0.2)
    found = rank_files(output_dir, profile_id)
    raise TargetError(
        f"profile files never appeared: {len(found)} of {world_size} '{profile_id}-TP-*.trace.json.gz' in {output_dir} after {timeout_s:.0f} s"
        + f" (no '{DONE_LINE}' line in the server log)",
        hint="the server may not have run enough batches to close the window; raise --profile-timeout or lower --num-steps",
    )
