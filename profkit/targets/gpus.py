"""The local GPUs as the engines see them: their compute capabilities, from nvidia-smi, asked once."""

from __future__ import annotations

import subprocess
from functools import lru_cache


@lru_cache(maxsize=1)
def _caps_cached() -> tuple[str, ...] | None:
    try:
        p = subprocess.run(["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"], capture_output=True, text=True, timeout=20)
    except FileNotFoundError:
        return ()  # no NVIDIA driver: no GPU SGLang could use
    except (OSError, subprocess.TimeoutExpired):
        return None
    if p.returncode != 0:
        # "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver", or no device
        return () if "driver" in (p.stdout + p.stderr).lower() or "no devices" in (p.stdout + p.stderr).lower() else None
    return tuple(x.strip() for x in p.stdout.splitlines() if x.strip())


def gpu_compute_capabilities() -> list[str] | None:
    """Compute capabilities of the local GPUs from nvidia-smi (e.g. ['9.0']); [] when this machine
    has no NVIDIA GPU (no nvidia-smi, or it finds no device); None when nvidia-smi cannot say."""
    caps = _caps_cached()
    return None if caps is None else list(caps)
