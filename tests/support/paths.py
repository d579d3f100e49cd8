"""The checkout's folders the tests read: the repository root, the committed fixtures, the sample traces."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent

DATA = ROOT / "tests" / "data"
GPU_DATA = DATA / "gpu"
VLLM_CPU_DATA = DATA / "vllm_cpu"
SAMPLE = ROOT / "traces" / "sample"
