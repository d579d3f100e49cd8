from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))

PUBLIC_TRACES = ROOT.parent / "shared" / "public-traces"
GPU_DATA = ROOT / "tests" / "data" / "gpu"


def _has_cuda() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:
        return False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _has_cuda():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def public_traces() -> Path:
    if not PUBLIC_TRACES.exists():
        pytest.skip("../shared/public-traces is not beside this checkout")
    return PUBLIC_TRACES


@pytest.fixture(autouse=True)
def _end_started():
    """Every process a test registered (processes.started / on_teardown) is ended here, after the
    test, whether it passed or failed."""
    from processes import end_started

    yield
    end_started()


def _sigterm_is_ctrl_c(signum, frame):
    raise KeyboardInterrupt


def pytest_configure(config: pytest.Config) -> None:
    """A SIGTERM to pytest (a CI timeout, a stray kill) ends the session as Ctrl-C does, so the
    fixtures' teardown still runs and stops the servers the tests started (a plain SIGTERM would
    leave a module fixture's servers running: seen once on this machine)."""
    import signal
    import threading

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _sigterm_is_ctrl_c)
