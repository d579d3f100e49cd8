"""The device's peaks: memory bandwidth and dense matrix rates by dtype (DESIGN.md "Work and the hardware floor").

Datasheet figures per device are data, in `kernels/peaks/datasheet.toml` (each with its source); measured ones
come in a file of the same shape given with `--peaks FILE` (benchmarks/gpu_peaks.py writes one:
benchmarks/results/peaks_h200_2026-12-04.toml). A device is matched by the first entry any of whose `match`
substrings is in the name the trace reports (`NVIDIA H200`, `NVIDIA H100 80GB HBM3`); a `--peaks` file's
entries are tried first, then the datasheet's. No match: no peaks, no floor (said once, never a zero).
"""

from __future__ import annotations

import hashlib
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from profkit.documents import FloorPeaks
from profkit.errors import UsageError

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: the same parser, as a package (pyproject's tomli)
    import tomli as tomllib


@dataclass(frozen=True)
class Peaks:
    """One device's peaks: bytes per ns and FLOPs per ns by dtype key (bf16, fp16, fp32, tf32, fp8, fp4)."""

    name: str
    memory_tb_s: float
    dense_tflop_s: dict[str, float] = field(default_factory=dict)
    source: str = ""  # "datasheet: <its name>" or "measured: <file>"

    def as_doc(self) -> FloorPeaks:
        return FloorPeaks(device=self.name, memory_tb_s=self.memory_tb_s, dense_tflop_s=dict(self.dense_tflop_s), source=self.source)


def datasheet_path() -> Path:
    from profkit.analysis.catalog import catalog_dir

    return catalog_dir() / "peaks" / "datasheet.toml"


def _entries(path: Path) -> list[dict[str, Any]]:
    try:
        doc = tomllib.loads(path.read_text())
    except OSError as e:
        raise UsageError(f"--peaks {path}: cannot read it ({e.strerror or e})", hint="give a TOML file as benchmarks/gpu_peaks.py writes") from e
    except tomllib.TOMLDecodeError as e:
        raise UsageError(f"--peaks {path}: not valid TOML ({e})", hint="give a TOML file as benchmarks/gpu_peaks.py writes") from e
    devices = doc.get("devices")
    if not isinstance(devices, dict) or not all(isinstance(v, dict) for v in devices.values()):
        raise UsageError(f"--peaks {path}: no [devices.<name>] tables", hint="see kernels/peaks/datasheet.toml for the shape")
    return list(devices.values())


def _peaks(entry: dict[str, Any], origin: str) -> Peaks | None:
    bw = entry.get("memory_tb_s")
    rates = entry.get("dense_tflop_s") or {}
    if not isinstance(bw, (int, float)) or bw <= 0 or not isinstance(rates, dict):
        return None
    src = entry.get("source")
    what = src.get("name") if isinstance(src, dict) else src
    return Peaks(str(entry.get("name", "?")), float(bw), {str(k): float(v) for k, v in rates.items() if isinstance(v, (int, float)) and v > 0},
                 f"{origin}: {what}" if what else origin)


def peaks_identity(path: Path | None) -> str | None:
    """What the summary cache keys a --peaks file by: its content's hash (None: the datasheet)."""
    if path is None:
        return None
    try:
        return hashlib.blake2b(Path(path).read_bytes(), digest_size=16).hexdigest()
    except OSError:
        return str(path)


def load_peaks_file(path: Path) -> list[dict[str, Any]]:
    """A --peaks file's entries, checked (a UsageError names what is wrong)."""
    return _entries(Path(path))


def peaks_for(device: str | None, peaks_file: Path | None = None) -> Peaks | None:
    """The peaks of a device by its reported name: a --peaks file's entry first, then the datasheet's."""
    if not device:
        return None
    tables = []
    if peaks_file is not None:
        tables.append((_entries(Path(peaks_file)), f"measured ({Path(peaks_file).name})"))
    try:
        tables.append((_entries(datasheet_path()), "datasheet"))
    except UsageError:
        pass
    for entries, origin in tables:
        for e in entries:
            match = e.get("match") or []
            if isinstance(match, str):
                match = [match]
            if any(isinstance(m, str) and m and m in device for m in match):
                p = _peaks(e, origin)
                if p is not None:
                    return p
    return None
