"""The composed SGLang command lines pass a real sglang release's own parser (ServerArgs.add_cli_args).

Needs a Python where `sglang` imports (CI: .ci/run installs the sglang 0.5.23 wheel with --no-deps plus
the small packages it imports while parsing); PROFKIT_SGLANG_PYTHON may point at another
environment's python. Skipped cleanly when neither is available.
"""

from __future__ import annotations

import importlib.util
import itertools
import os
import subprocess
import sys

import pytest

from profkit.errors import UsageError
from profkit.targets import sglang
from profkit.targets.registry import opt_states, registry

PY = os.environ.get("PROFKIT_SGLANG_PYTHON") or (sys.executable if importlib.util.find_spec("sglang") else None)


def _sglang_version() -> str | None:
    if PY is None:
        return None
    p = subprocess.run([PY, "-c", "import sglang; print(sglang.__version__)"], capture_output=True, text=True)
    return p.stdout.strip() if p.returncode == 0 else None


VERSION = _sglang_version()
pytestmark = pytest.mark.skipif(VERSION is None, reason="no Python with the sglang package (set PROFKIT_SGLANG_PYTHON)")


def test_release_under_test():
    assert VERSION == "0.5.23"


def test_every_preset_and_switch_state_parses():
    """Every preset x every optimization on/off under both baselines (one parser process for all)."""
    names = list(registry("sglang"))
    states = [opt_states("sglang", [o], base=b, candidate=c) for o in names for b in ("off", "on") for c in (False, True)]
    specs = [sglang.compose(st, preset=preset, model_path=None, extra_args=["--load-format", "dummy"], server_python=PY, port=30000)
             for preset in sorted(sglang.PRESETS) for st in states]
    results = sglang.validate_many(specs)
    assert isinstance(results, list) and len(results) == len(specs) == 4 * len(names) * 4
    assert [(sp.shell(), r) for sp, r in zip(specs, results) if r is not None] == []


def test_dry_run_uses_the_parser():
    r = subprocess.run([sys.executable, "-m", "profkit", "trace", "--target", "sglang", "--preset", "glm52-nvfp4-tp8", "--opt", "topk_v2",
                        "--dry-run", "--server-python", PY], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("# SGLang's parser: the arguments parse") == 2
    assert "SGLANG_OPT_USE_TOPK_V2=0" in r.stdout and "SGLANG_OPT_USE_TOPK_V2=1" in r.stdout


def test_parser_rejects_a_bad_flag():
    spec = sglang.compose({n: True for n in registry("sglang")}, preset="glm52-nvfp4-tp4", model_path=None,
                          extra_args=["--no-such-sglang-flag", "1"], server_python=PY, port=30000)
    with pytest.raises(UsageError, match="parser rejects"):
        sglang.validate(spec)


def test_bf16_gemm_refused_before_launch_off_blackwell():
    spec = sglang.compose({n: True for n in registry("sglang")}, preset="glm52-nvfp4-tp8", model_path=None, extra_args=[],
                          server_python=PY, port=30000)
    from profkit.errors import TargetError

    with pytest.raises(TargetError, match="SM100/SM103"):
        sglang.check_gpu(spec, ["9.0"])
    sglang.check_gpu(spec, ["10.0"])  # B200/B300: fine
    sglang.check_gpu(spec, None)  # unknown GPU: SGLang decides
    assert list(itertools.chain(spec.argv)).count("--bf16-gemm-backend") == 1
