"""The composed SGLang command lines pass a real sglang release's own parser (ServerArgs.add_cli_args).

Needs a Python where `sglang` imports (CI: .ci/run installs the sglang 0.5.23 wheel with --no-deps plus
the small packages it imports while parsing); PROFKIT_SGLANG_PYTHON may point at another
environment's python. Skipped cleanly when neither is available.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest

from profkit.errors import UsageError
from profkit.targets import sglang
from profkit.targets.registry import opt_states, registry

SGLANG = sglang.TARGET

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
    """Every preset x every optimization on/off under both baselines, every run of every sweep mode
    on the study's six, and bf16_gemm's Hopper spelling (one parser process for all)."""
    from profkit.capture.sweep import sweep_plan

    names = list(registry(SGLANG))
    states = [opt_states(SGLANG, [o], base=b, candidate=c) for o in names for b in ("off", "on") for c in (False, True)]
    six = ["overlap", "index_share", "topk_v2", "indexer_fusion", "bf16_gemm", "moe_deferred_finalize"]
    states += [st for mode in ("one-at-a-time", "ladder", "leave-one-out") for b in ("on", "off") for _, st, _, _ in sweep_plan("sglang", six, mode, b)]
    specs = [sglang.compose(st, preset=preset, model_path=None, extra_args=["--load-format", "dummy"], server_python=PY, port=30000, caps=caps)
             for preset in sorted(sglang.PRESETS) for st in states for caps in (None, ["9.0"])]
    results = sglang.validate_many(specs)
    assert isinstance(results, list) and len(results) == len(specs)
    assert [(sp.shell(), r) for sp, r in zip(specs, results) if r is not None] == []


def test_dry_run_uses_the_parser():
    r = subprocess.run([sys.executable, "-m", "profkit", "trace", "--target", "sglang", "--preset", "glm52-nvfp4-tp8", "--opt", "topk_v2",
                        "--dry-run", "--server-python", PY], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("# SGLang's parser: the arguments parse") == 2
    assert "SGLANG_OPT_USE_TOPK_V2=0" in r.stdout and "SGLANG_OPT_USE_TOPK_V2=1" in r.stdout


def test_parser_rejects_a_bad_flag():
    spec = sglang.compose({n: True for n in registry(SGLANG)}, preset="glm52-nvfp4-tp4", model_path=None,
                          extra_args=["--no-such-sglang-flag", "1"], server_python=PY, port=30000)
    with pytest.raises(UsageError, match="parser rejects"):
        sglang.validate(spec)


def test_bf16_gemm_on_hopper_is_auto_and_cutedsl_is_refused_off_sm10x():
    """SGLang accepts cutedsl on compute capability major 10 (unquant.py: platform.is_sm100 =
    major 10); "on" is the study's cutedsl where the GPU is SM10x or unknown, auto elsewhere, so
    --base on can run on Hopper (where bf16_gemm is then a no-op, and profkit says so)."""
    from profkit.errors import TargetError
    from profkit.targets.sglang import flag_value

    allon = {n: True for n in registry(SGLANG)}
    study = sglang.compose(allon, preset="glm52-nvfp4-tp8", model_path=None, extra_args=[], server_python=PY, port=30000)
    assert flag_value(study.argv, "--bf16-gemm-backend") == "cutedsl"
    with pytest.raises(TargetError, match="SM10x"):
        sglang.check_gpu(study, ["9.0"])
    for cap in ("10.0", "10.3", "10.1"):
        sglang.check_gpu(study, [cap])
    sglang.check_gpu(study, None)  # unknown GPU: SGLang decides
    hopper = sglang.compose(allon, preset="glm52-nvfp4-tp8", model_path=None, extra_args=[], server_python=PY, port=30000, caps=["9.0"])
    assert flag_value(hopper.argv, "--bf16-gemm-backend") == "auto" and hopper.argv.count("--bf16-gemm-backend") == 1
    sglang.check_gpu(hopper, ["9.0"])
    assert any("bf16_gemm does nothing on compute capability 9.0" in n for n in hopper.notes)
