"""What else the machine was doing while a run recorded: the CPU time that processes outside profkit's
own tree (profkit, its servers and their workers) used during each unprofiled repeat and profile window,
in CPUs (1.0: one core busy all along). A gate compares it between baseline and candidate (DESIGN.md
"A gate for CI": nothing in a trace tells a slower machine from slower code).

Measured, not estimated: the system's busy CPU time (`psutil.cpu_times()`: every state but idle and
iowait) less the CPU time of this process and of every descendant alive at both ends of the interval,
over the interval's wall time. A descendant that exits inside the interval takes its CPU time with it
and counts as "other" (an over-estimate; the servers live through a whole run)."""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass
from typing import Any

import psutil

from profkit.capture.manifest import HostLoadDoc, HostLoadStep


@dataclass(frozen=True)
class Sample:
    wall_s: float
    system_busy_s: float
    own: dict[int, float]  # pid -> user + system CPU seconds (this process: its reaped children's too)


def _busy(t: Any) -> float:
    return float(sum(getattr(t, f) for f in t._fields if f not in ("idle", "iowait", "guest", "guest_nice")))


def _own() -> dict[int, float]:
    me = psutil.Process()
    out: dict[int, float] = {}
    try:
        c = me.cpu_times()
        out[me.pid] = c.user + c.system + c.children_user + c.children_system
    except psutil.Error:  # pragma: no cover - this process always answers
        pass
    for p in me.children(recursive=True):
        try:
            c = p.cpu_times()
            out[p.pid] = c.user + c.system
        except psutil.Error:  # gone meanwhile
            continue
    return out


def sample() -> Sample:
    return Sample(time.monotonic(), _busy(psutil.cpu_times()), _own())


def other_cpus(a: Sample, b: Sample) -> float | None:
    """CPUs that processes outside profkit's tree kept busy between two samples (None: too short to say)."""
    wall = b.wall_s - a.wall_s
    if wall < 0.05:
        return None
    own = sum(b.own[p] - a.own[p] for p in b.own if p in a.own) + sum(v for p, v in b.own.items() if p not in a.own)
    return max(0.0, (b.system_busy_s - a.system_busy_s - own) / wall)


class HostLoad:
    """The run's `host_load` section: one entry per measured step, and their median and maximum."""

    def __init__(self) -> None:
        self.steps: list[HostLoadStep] = []

    def measure(self, step: str, a: Sample, b: Sample) -> None:
        v = other_cpus(a, b)
        if v is not None:
            self.steps.append({"step": step, "seconds": round(b.wall_s - a.wall_s, 3), "other_cpus": round(v, 3)})

    def doc(self) -> HostLoadDoc:
        vals = [s["other_cpus"] for s in self.steps]
        return {"cpus": os.cpu_count(), "other_cpus_median": round(statistics.median(vals), 3) if vals else None,
                "other_cpus_max": max(vals) if vals else None, "steps": list(self.steps)}
