"""vLLM's profile window: POST /start_profile with an iteration budget, /stop_profile, the worker's files by name.

vLLM 0.32 (entrypoints/serve/profile/api_router.py, profiler/wrapper.py):
- `/start_profile` takes `{"profile_prefix", "delay_iterations", "max_iterations"}` (other keys ignored)
  and returns once every worker started its profiler;
- each worker's profiler counts engine steps; after `max_iterations` profiled steps it stops by
  itself and exports inside the next step (that step then takes seconds);
- `/stop_profile` is a utility call the engine runs between steps: it returns after the export of
  the window (stopping it first when it is still running; a window that stopped itself is ignored,
  HTTP 200 either way), so once it has answered, the files are complete;
- the worker writes `<prefix>_<rank suffix>.<time_ns>.pt.trace.json.gz` into the profiler dir of
  `--profiler-config` (the front end's `...async_llm...` file is off: ignore_frontend).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Callable

from profkit.capture.manifest import Accept
from profkit.http import HTTPFailure, request
from profkit.errors import TargetError


def start(base_url: str, *, prefix: str, num_steps: int, delay_steps: int = 0) -> dict[str, object]:
    """Open a window of `num_steps` engine steps, `delay_steps` steps from now."""
    body = {"profile_prefix": prefix, "delay_iterations": delay_steps, "max_iterations": num_steps}
    status, data = request(base_url + "/start_profile", body, timeout=300)
    if status != 200:
        raise TargetError(f"vLLM's /start_profile answered HTTP {status}: {data[:200].decode(errors='replace')}",
                          hint="the server needs --profiler-config with a torch profiler (profkit passes it)")
    return body


def worker_files(trace_dir: Path, prefix: str) -> list[Path]:
    """The worker traces of one window (never the front end's `async_llm` trace)."""
    return sorted(p for p in trace_dir.glob(f"{prefix}_*.pt.trace.json*") if ".async_llm." not in p.name and not p.name.startswith("."))


def finish(base_url: str, trace_dir: Path, prefix: str, world_size: int, *, timeout_s: float, alive: Callable[[], bool],
           idle: Callable[[], bool]) -> list[Path]:
    """Wait until the window has closed itself (its first file appears) or the workload went idle,
    then /stop_profile, which returns once every export is written; the worker files."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and not worker_files(trace_dir, prefix) and not idle():
        if not alive():
            raise TargetError("the vLLM server died while profiling")
        time.sleep(0.2)
    try:
        status, data = request(base_url + "/stop_profile", {}, timeout=max(30.0, deadline - time.monotonic()))
    except HTTPFailure as e:
        raise TargetError(f"vLLM's /stop_profile did not answer: {e}", hint="raise --profile-timeout; exports take a while with --with-stack") from None
    if status != 200:
        raise TargetError(f"vLLM's /stop_profile answered HTTP {status}: {data[:200].decode(errors='replace')}", hint="see server.log")
    files = worker_files(trace_dir, prefix)
    if len(files) < world_size:
        raise TargetError(f"vLLM wrote {len(files)} of {world_size} worker trace(s) '{prefix}_*.pt.trace.json.gz' in {trace_dir}",
                          hint="the window held no engine step (no request was running?); see server.log")
    for f in files:
        if not _holds_a_step(f):
            raise TargetError(f"{f}: the profile window holds no engine step (no execute_... span): the profiled turn ended "
                              "before /start_profile took effect", hint="raise --output-tokens (a longer decode) or --concurrency")
    return files


def _holds_a_step(path: Path) -> bool:
    """Whether a worker trace names at least one engine step span (a byte search of the decompressed file)."""
    import gzip

    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rb") as f:
        tail = b""
        while chunk := f.read(1 << 20):
            if b'"execute_' in tail + chunk:
                return True
            tail = chunk[-16:]
    return False


def into_window(files: list[Path], out_dir: Path) -> list[Path]:
    """Move one window's files into its window-<i>/ folder (vLLM's profiler dir is fixed at launch)."""
    if all(f.parent == out_dir for f in files):
        return files
    out_dir.mkdir(parents=True, exist_ok=True)
    moved = []
    for f in files:
        dst = out_dir / f.name
        os.replace(f, dst)
        moved.append(dst)
    return moved


# --- speculative decoding counters (the window's accepted length) ------------------------------------

SPEC_COUNTERS = {"drafts": "vllm:spec_decode_num_drafts", "draft_tokens": "vllm:spec_decode_num_draft_tokens",
                 "accepted": "vllm:spec_decode_num_accepted_tokens"}


def parse_spec_counters(text: str) -> dict[str, float] | None:
    """vLLM's speculative-decoding counters from its Prometheus /metrics text, summed over label sets
    (one per engine): drafts, draft_tokens, accepted. The exposition names a counter `<name>_total`;
    None when the server exports none (not speculative)."""
    got: dict[str, float] = {}
    names = {f"{v}_total": k for k, v in SPEC_COUNTERS.items()} | {v: k for k, v in SPEC_COUNTERS.items()}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        head, _, value = line.rpartition(" ")
        key = names.get(head.split("{", 1)[0].strip())
        if key is None:
            continue
        try:
            got[key] = got.get(key, 0.0) + float(value)
        except ValueError:
            continue
    return got if "drafts" in got and "accepted" in got else None


def spec_counters(base_url: str) -> dict[str, float] | None:
    """GET /metrics and parse_spec_counters; None when it does not answer or exports none."""
    try:
        status, data = request(base_url + "/metrics", timeout=30, method="GET")
    except HTTPFailure:
        return None
    return parse_spec_counters(data.decode(errors="replace")) if status == 200 else None


def window_accept(before: dict[str, float] | None, after: dict[str, float] | None) -> Accept | None:
    """The window's accepted length from the counters' change across it: 1 + accepted / drafts (each
    verify step emits its accepted drafts and one token of its own; vLLM's own 'Mean acceptance
    length'), in the manifest's `accept` shape. None without drafts in the window."""
    if not before or not after:
        return None
    d = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in SPEC_COUNTERS}
    if d["drafts"] <= 0:
        return None
    return {"accept_length": 1 + d["accepted"] / d["drafts"], "spec_verify_ct": int(d["drafts"]), "accepted_drafts": int(d["accepted"]),
            "draft_tokens": int(d["draft_tokens"]),
            "source": "server: vLLM's spec_decode counters (/metrics), their change across the window"}


def accept_length(before: dict[str, float] | None, after: dict[str, float] | None) -> float | None:
    """Tokens per verify step per request between two spec_counters readings (an unprofiled repeat's):
    window_accept's accept_length; None without drafts."""
    got = window_accept(before, after)
    return got["accept_length"] if got else None
