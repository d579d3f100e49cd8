"""Is the GPU memory a server is about to claim actually free? NVML (nvidia-ml-py) or nvidia-smi.

SGLang claims `--mem-fraction-static` (0.87 in the study) of each GPU at start-up; a server that
starts while the previous one's schedulers still hold their memory fails or gets a smaller KV pool.
So before each server of a sweep starts, the devices it will use must be free.
"""

from __future__ import annotations

import os
import subprocess
import time
from dataclasses import dataclass

from profkit.errors import TargetError

# An idle GPU still shows a few hundred MiB (driver, ECC, a display context); anything under this
# fraction of the total and no compute process counts as free.
FREE_FRACTION = 0.05


@dataclass(frozen=True)
class GpuMemory:
    index: str  # as NVML / nvidia-smi number it, or the UUID given in CUDA_VISIBLE_DEVICES
    used_mib: float
    total_mib: float
    pids: tuple[int, ...]  # compute processes holding memory on it

    @property
    def free(self) -> bool:
        return not self.pids and self.used_mib <= FREE_FRACTION * self.total_mib


def _visible(world_size: int) -> list[str] | None:
    cvd = os.environ.get("CUDA_VISIBLE_DEVICES")
    if cvd is None:
        return None
    ids = [x.strip() for x in cvd.split(",") if x.strip()]
    return ids[:world_size] if world_size else ids


def _nvml(devices: list[str] | None, world_size: int) -> list[GpuMemory] | None:
    try:
        import pynvml  # nvidia-ml-py
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:  # no driver / no GPU: the library is there but cannot answer
        return None
    try:
        if devices is None:
            devices = [str(i) for i in range(min(world_size or 10**6, pynvml.nvmlDeviceGetCount()))]
        out = []
        for d in devices:
            h = pynvml.nvmlDeviceGetHandleByIndex(int(d)) if d.isdigit() else pynvml.nvmlDeviceGetHandleByUUID(d)
            mem = pynvml.nvmlDeviceGetMemoryInfo(h)
            procs = pynvml.nvmlDeviceGetComputeRunningProcesses(h)
            out.append(GpuMemory(d, mem.used / 2**20, mem.total / 2**20, tuple(p.pid for p in procs)))
        return out
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass


def _smi(devices: list[str] | None, world_size: int) -> list[GpuMemory] | None:
    try:
        g = subprocess.run(["nvidia-smi", "--query-gpu=index,uuid,memory.used,memory.total", "--format=csv,noheader,nounits"],
                           capture_output=True, text=True, timeout=30)
        a = subprocess.run(["nvidia-smi", "--query-compute-apps=gpu_uuid,pid", "--format=csv,noheader"],
                           capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if g.returncode != 0:
        return None
    pids: dict[str, list[int]] = {}
    for line in a.stdout.splitlines() if a.returncode == 0 else []:
        parts = [x.strip() for x in line.split(",")]
        if len(parts) == 2 and parts[1].isdigit():
            pids.setdefault(parts[0], []).append(int(parts[1]))
    rows = []
    for line in g.stdout.splitlines():
        parts = [x.strip() for x in line.split(",")]
        if len(parts) != 4:
            continue
        try:
            rows.append((parts[0], parts[1], float(parts[2]), float(parts[3])))
        except ValueError:
            continue
    if devices is None:
        chosen = rows[:world_size] if world_size else rows
    else:
        chosen = [r for d in devices for r in rows if d in (r[0], r[1])]
    return [GpuMemory(idx, used, total, tuple(pids.get(uuid, ()))) for idx, uuid, used, total in chosen]


def gpu_memory(world_size: int) -> list[GpuMemory] | None:
    """Memory of the devices a server of `world_size` ranks will use (CUDA_VISIBLE_DEVICES order,
    else the first ones), or None where neither NVML nor nvidia-smi can say."""
    devices = _visible(world_size)
    res = _nvml(devices, world_size)
    return res if res is not None else _smi(devices, world_size)


def wait_gpus_free(world_size: int, *, timeout_s: float = 120.0, poll_s: float = 2.0) -> str:
    """Wait until the devices are free; return a note for the manifest, raise TargetError if not.

    The previous server of a sweep has exited by now, but the driver releases a process's memory
    only once it is reaped, so give it a while."""
    deadline = time.monotonic() + timeout_s
    while True:
        mem = gpu_memory(world_size)
        if mem is None:
            return "GPU memory not checked: neither NVML (nvidia-ml-py) nor nvidia-smi is available"
        busy = [m for m in mem if not m.free]
        if not busy:
            return f"GPU memory free on {len(mem)} device(s) before start"
        if time.monotonic() > deadline:
            desc = "; ".join(f"GPU {m.index}: {m.used_mib:.0f} of {m.total_mib:.0f} MiB in use"
                             + (f" by pid {', '.join(map(str, m.pids))}" if m.pids else "") for m in busy)
            raise TargetError(f"GPU memory is still held before the server starts ({desc})",
                              hint="a previous server (or another job) still holds it; stop it, or pick other GPUs with CUDA_VISIBLE_DEVICES")
        time.sleep(poll_s)
