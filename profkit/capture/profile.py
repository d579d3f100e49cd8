"""The profiler window: POST /start_profile with explicit fields, poll until every rank's file is complete."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

from profkit.capture.http import HTTPFailure, request
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


def wait_for_traces(base_url: str, output_dir: Path, profile_id: str, world_size: int, *, timeout_s: float,
                    alive: Callable[[], bool] = lambda: True, idle: Callable[[], bool] = lambda: False) -> list[Path]:
    """Poll until `world_size` rank files exist and their sizes stopped changing.

    /start_profile returns at once and schedulers write later (SGLang §0 #9); if the window never
    closes (an idle server never auto-stops), /stop_profile is called once, then polling resumes.
    """
    deadline = time.monotonic() + timeout_s
    stopped = False
    last: dict[Path, int] = {}
    stable = 0
    half = time.monotonic() + timeout_s / 2
    while time.monotonic() < deadline:
        files = rank_files(output_dir, profile_id)
        sizes = {p: p.stat().st_size for p in files if p.exists()}
        if len(files) >= world_size and sizes == last and all(sizes.values()):
            stable += 1
            if stable >= 2:
                return files
        else:
            stable = 0
        last = sizes
        if not alive():
            raise TargetError("the server died while profiling")
        if not stopped and (time.monotonic() > half or idle()):
            stopped = True
            try:
                request(base_url + "/stop_profile", {}, timeout=max(5.0, deadline - time.monotonic()))
            except HTTPFailure:
                pass
        time.sleep(0.3)
    found = rank_files(output_dir, profile_id)
    raise TargetError(
        f"profile files never appeared: {len(found)} of {world_size} '{profile_id}-TP-*.trace.json.gz' in {output_dir} after {timeout_s:.0f} s",
        hint="the server may not have run enough batches to close the window; raise --profile-timeout or lower --num-steps",
    )
