"""SGLang 0.5.23 as a target: the study's presets, the registry's switches, validation with SGLang's own parser."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from profkit.errors import TargetError, UsageError
from profkit.targets.registry import registry
from profkit.targets.spec import LaunchSpec

STUDY_MODEL = "nvidia/GLM-5.2-NVFP4"

# The study's launch command (seeds/000, "Reproduction"), without host/port, the bf16 backend and the
# two env switches: those come from the registry so the baseline is explicit.
_COMMON = [
    "--quantization", "modelopt_fp4",
    "--context-length", "90000",
    "--max-running-requests", "16",
    "--max-prefill-tokens", "8192",
    "--chunked-prefill-size", "8192",
    "--cuda-graph-max-bs-decode", "16",
    "--mem-fraction-static", "0.87",
    "--trust-remote-code",
    "--kv-cache-dtype", "fp8_e4m3",
    "--reasoning-parser", "glm45",
    "--tool-call-parser", "glm47",
    "--speculative-algorithm", "EAGLE",
    "--speculative-num-steps", "5",
    "--speculative-eagle-topk", "1",
    "--speculative-num-draft-tokens", "6",
    "--enable-cache-report",
]
PRESETS: dict[str, tuple[int, list[str]]] = {
    "glm52-nvfp4-tp4": (4, ["--tensor-parallel-size", "4", *_COMMON]),
    "glm52-nvfp4-tp8": (8, ["--tensor-parallel-size", "8", *_COMMON]),
    "glm52-nvfp4-tep4": (4, ["--tensor-parallel-size", "4", "--ep-size", "4", *_COMMON]),
    "glm52-nvfp4-tep8": (8, ["--tensor-parallel-size", "8", "--ep-size", "8", *_COMMON]),
}

# Flags the registry owns: the user may not also pass them in --extra-server-args.
_OWNED = {"--disable-overlap-schedule", "--cuda-graph-backend-decode", "--cuda-graph-backend-prefill", "--bf16-gemm-backend",
          "--disable-cuda-graph", "--disable-decode-cuda-graph", "--disable-prefill-cuda-graph", "--host", "--port"}


def _tp(args: list[str]) -> int:
    for flag in ("--tensor-parallel-size", "--tp-size", "--tp"):
        if flag in args:
            i = args.index(flag)
            if i + 1 < len(args) and args[i + 1].isdigit():
                return int(args[i + 1])
    return 1


def compose(
    states: dict[str, bool], *, preset: str | None, model_path: str | None, extra_args: list[str], server_python: str | None,
    port: int, host: str = "127.0.0.1",
) -> LaunchSpec:
    """The sglang.launch_server command for one optimization state."""
    reg = registry("sglang")
    if preset is not None and preset not in PRESETS:
        raise UsageError(f"unknown preset {preset!r}", hint=f"choose one of: {', '.join(PRESETS)}")
    world, base = PRESETS[preset] if preset else (1, [])
    model = model_path or (STUDY_MODEL if preset else None)
    if model is None and "--model-path" not in extra_args:
        raise UsageError("--target sglang needs --preset or --model-path", hint="e.g. --preset glm52-nvfp4-tp8")
    for a in extra_args:
        flag = a.split("=", 1)[0]
        if flag in _OWNED:
            raise UsageError(f"--extra-server-args sets {flag}, which profkit sets itself",
                             hint="use --opt/--base to switch optimizations; host and port are chosen by profkit")
    extra = list(extra_args)
    overrides: dict[str, object] = {}
    if "--json-model-override-args" in extra:
        i = extra.index("--json-model-override-args")
        try:
            overrides.update(json.loads(extra[i + 1]))
        except (IndexError, ValueError) as e:
            raise UsageError(f"--json-model-override-args in --extra-server-args is not JSON ({e})") from None
        del extra[i : i + 2]
    args: list[str] = []
    env: dict[str, str] = {}
    for name, on in states.items():
        sw = reg[name].on if on else reg[name].off
        args.extend(sw.args)
        env.update(sw.env)
        overrides.update(sw.model_override)
    if overrides:
        args += ["--json-model-override-args", json.dumps(overrides, sort_keys=True)]
    argv = [server_python or sys.executable, "-m", "sglang.launch_server"]
    if model is not None:
        argv += ["--model-path", model]
    argv += base + args + extra + ["--host", host, "--port", str(port)]
    world = _tp(argv) if not preset else world
    return LaunchSpec(target="sglang", argv=argv, env=env, host=host, port=port, world_size=world, preset=preset, states=dict(states))


def gpu_compute_capabilities() -> list[str] | None:
    """Compute capabilities of the local GPUs from nvidia-smi (e.g. ['9.0']), or None when unknown."""
    try:
        p = subprocess.run(["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if p.returncode != 0:
        return None
    return [x.strip() for x in p.stdout.splitlines() if x.strip()]


def check_gpu(spec: LaunchSpec, caps: list[str] | None) -> None:
    """Refuse what SGLang would die on at start-up: cutedsl BF16 GEMM off SM100/SM103."""
    if spec.states.get("bf16_gemm") and caps:
        bad = [c for c in caps if c not in ("10.0", "10.3")]
        if bad:
            raise TargetError(
                f"bf16_gemm on needs an SM100/SM103 GPU (B200/B300/GB300); this machine has compute capability {', '.join(sorted(set(bad)))}",
                hint="SGLang raises ValueError for --bf16-gemm-backend cutedsl here; leave bf16_gemm off (e.g. --base off without --opt bf16_gemm)",
            )


_PARSE = r"""
import argparse, json, sys
try:
    from sglang.srt.server_args import ServerArgs
except Exception as e:
    print("IMPORT-FAILED:", type(e).__name__, e); sys.exit(3)
results = []
for args in json.load(sys.stdin):
    p = argparse.ArgumentParser(prog="sglang.launch_server", exit_on_error=False)
    ServerArgs.add_cli_args(p)
    try:
        ns, unknown = p.parse_known_args(args)
        results.append(None if not unknown else "unrecognized arguments: " + " ".join(unknown))
    except (argparse.ArgumentError, SystemExit) as e:
        results.append(str(e) or "rejected")
print("RESULTS:" + json.dumps(results))
"""


def validate_many(specs: list[LaunchSpec], python: str | None = None) -> list[str | None] | str:
    """Parse several composed command lines with the sglang package's own parser, in one process.

    Returns one entry per spec (None: parses; else the parser's message), or "skipped: ..." when
    sglang is not importable in `python` (default: the specs' own server python).
    """
    import json as _json

    py = python or specs[0].argv[0]
    payload = _json.dumps([sp.argv[sp.argv.index("sglang.launch_server") + 1 :] for sp in specs])
    try:
        p = subprocess.run([py, "-c", _PARSE], input=payload, capture_output=True, text=True, timeout=600)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"skipped: could not run {py} ({e})"
    if p.returncode == 3 or "IMPORT-FAILED" in p.stdout:
        return f"skipped: sglang is not importable with {py}"
    line = next((ln for ln in p.stdout.splitlines() if ln.startswith("RESULTS:")), None)
    if p.returncode != 0 or line is None:
        msg = (p.stderr.strip().splitlines() or ["(no message)"])[-1]
        return [f"the parser failed: {msg}"] * len(specs)
    return _json.loads(line[len("RESULTS:"):])


def validate(spec: LaunchSpec, python: str | None = None) -> str | None:
    """Parse the composed arguments with the sglang package's own parser in `python`.

    Returns None when they parse, "skipped: ..." when sglang is not importable there; raises
    UsageError with the parser's message when an argument is rejected.
    """
    res = validate_many([spec], python)
    if isinstance(res, str):
        return res
    if res[0] is not None:
        raise UsageError(f"SGLang's parser rejects the composed arguments: {res[0]}", hint="check --extra-server-args and the preset")
    return None


def sglang_python_exists(path: str | None) -> bool:
    return path is None or Path(path).exists()
