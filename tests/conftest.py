from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from support.public import NO_PUBLIC, PUBLIC_TRACES  # noqa: E402  (tests/ on sys.path first: support, processes, factories)


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
    if not PUBLIC_TRACES.is_dir():
        pytest.skip(NO_PUBLIC)
    return PUBLIC_TRACES


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session: pytest.Session) -> None:
    """Under `--dist loadgroup` every test with an xdist_group must have been given its group (its node id
    ends in @<group>); pytest 9.2 with pytest-xdist 3.8 drops the groups without a word, and the grouped
    tests then run in every worker at once (pyproject.toml pins pytest below 9.2)."""
    if not getattr(session.config.option, "loadgroup", False):
        return
    lost = [i.nodeid for i in session.items if i.get_closest_marker("xdist_group") and "@" not in i.nodeid]
    if lost:
        raise pytest.UsageError(f"pytest {pytest.__version__} with pytest-xdist: --dist loadgroup ignored the xdist_group of "
                                f"{len(lost)} tests (first: {lost[0]}); install the test extra's pytest (pip install -e '.[test]')")


@pytest.fixture(autouse=True)
def _end_started():
    """Every process a test registered (processes.started / on_teardown) is ended here, after the
    test, whether it passed or failed."""
    from processes import end_started

    yield
    end_started()


@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    """A diff of synthetic summaries whose kernel names and manifest are hostile strings (the report tests)."""
    from factories import BASE, CATALOG, HOSTILE, HOSTILE_MANIFEST, decode_trace, summarize
    from profkit.attribution.diff import compare_summaries
    from profkit.documents import diff_doc

    tmp = tmp_path_factory.mktemp("hostile")
    base = summarize(decode_trace(BASE), tmp, "base")
    cand = summarize(decode_trace([(n, 20 if n == "topk_select" else d) for n, d in BASE] + HOSTILE, sync=True), tmp, "cand")
    cand["manifest"] = HOSTILE_MANIFEST
    d = diff_doc(compare_summaries(base, cand, opt="topk_v2", catalog=CATALOG, labels=("base", "cand <i>")))
    return base, cand, d


@pytest.fixture
def replica_python(tmp_path: Path) -> Path:
    """A `python` that runs the SGLang replica (tests/sglang_replica) as `sglang`: profkit's --server-python."""
    from processes import REPLICA

    w = tmp_path / "replica-bin" / "python"
    w.parent.mkdir()
    w.write_text(f'#!/bin/sh\nPYTHONPATH="{REPLICA}${{PYTHONPATH:+:$PYTHONPATH}}" exec "{sys.executable}" "$@"\n')
    w.chmod(0o755)
    return w


def _sigterm_is_ctrl_c(signum, frame):
    raise KeyboardInterrupt


_sighup_is_ctrl_c = _sigterm_is_ctrl_c  # the terminal closed: the same end, fixtures' teardown included


def pytest_configure(config: pytest.Config) -> None:
    """A SIGTERM to pytest (a CI timeout, a stray kill) ends the session as Ctrl-C does, so the
    fixtures' teardown still runs and stops the servers the tests started (a plain SIGTERM would
    leave a module fixture's servers running: seen once on this machine).

    The processes the tests start (profkit, whose interrupts the tests send) get a terminal's signal
    dispositions, not the runner's: under `nohup` SIGHUP comes ignored, and a job sent to the background
    by a shell without job control has SIGINT ignored; profkit keeps an ignored signal ignored (as nohup
    asks), so the trials of those signals would test nothing (a busy CI run started under nohup: the
    SIGHUP trial ran to the end, exit 0). pytest itself takes them back: a caught signal is default
    again in a child after exec, an ignored one would stay ignored."""
    import signal
    import threading

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _sigterm_is_ctrl_c)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGHUP, _sighup_is_ctrl_c)
