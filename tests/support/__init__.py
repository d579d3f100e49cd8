"""What several test modules share and is no part of profkit (profkit keeps no test-only code): the
fixture folders (paths.py), the third-party traces and how a test skips without them (public.py),
and trace helpers (helpers.py). Fixtures and pytest hooks stay in tests/conftest.py; test modules
import from here, never from conftest (pytest puts tests/ on sys.path: `tests/` has no __init__.py)."""

from support.paths import DATA, GPU_DATA, ROOT, SAMPLE, VLLM_CPU_DATA
from support.public import NO_PUBLIC, PUBLIC_EXPECTED, PUBLIC_TRACES, TRACELENS_STEPS, needs_public, public_steps, public_trace

__all__ = ["DATA", "GPU_DATA", "NO_PUBLIC", "PUBLIC_EXPECTED", "PUBLIC_TRACES", "ROOT", "SAMPLE", "TRACELENS_STEPS", "VLLM_CPU_DATA",
           "needs_public", "public_steps", "public_trace"]
