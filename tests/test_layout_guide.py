"""docs/layout.md's "Where to add" recipes hold on the tree: every file a step names exists, every name after
it is defined in that file, and the engine the guide writes out is a Target that the registry
(targets/engines.py) finds by its name and whose catalog a run's manifest implies (issue 38 item 7)."""

from __future__ import annotations

import ast
import json
import os
import re

import pytest

from support import ROOT

GUIDE = (ROOT / "docs" / "layout.md").read_text().split("## Where to add", 1)[1]
# a numbered step: "1. `path`: `Name`, `Name` — what changes there" (the names are optional)
STEP = re.compile(r"^\d+\. `([^`]+)`(?:: ((?:`[\w.]+`(?:, )?)+))?", re.M)
PATH = re.compile(r"`((?:profkit|kernels|tests)/[^`]*)`")
ENGINE = "vllm"  # <engine> in a path: the guide's recipe, checked on an engine the tree has


def _steps() -> list[tuple[str, list[str]]]:
    return [(m.group(1).replace("<engine>", ENGINE), re.findall(r"`([\w.]+)`", m.group(2) or "")) for m in STEP.finditer(GUIDE)]


def _defined(path: str) -> set[str]:
    """The names a module defines at its top level (classes, functions, assignments)."""
    names: set[str] = set()
    for node in ast.parse((ROOT / path).read_text()).body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return names


def _engine_block() -> str:
    return GUIDE.split("```python\n", 1)[1].split("```", 1)[0]


def test_the_guide_has_its_three_recipes():
    paths = [p for p, _ in _steps()]
    assert paths[0] == "profkit/terms.py" and f"profkit/targets/{ENGINE}.py" in paths and "profkit/report/html.py" in paths, paths
    assert len(paths) >= 12, paths


@pytest.mark.parametrize(("path", "names"), _steps(), ids=[p for p, _ in _steps()])
def test_each_step_names_what_is_there(path, names):
    assert (ROOT / path).exists(), path
    if names:
        missing = set(names) - _defined(path)
        assert not missing, f"{path} defines none of {sorted(missing)}"


def test_every_path_in_the_guide_exists():
    for p in PATH.findall(GUIDE):
        assert (ROOT / p.replace("<engine>", ENGINE)).exists(), p


def test_each_engine_ships_its_catalog_and_its_line():
    from profkit.targets.engines import TARGETS

    for name, t in TARGETS.items():
        assert (ROOT / "profkit" / "targets" / f"{name}.py").exists(), name
        implied = t.catalog({"target": name, "model": "glm-5.2"})
        assert implied is not None and (ROOT / "kernels" / f"{implied}.toml").exists(), (name, implied)


def test_the_guides_engine_is_a_target_found_by_its_name(monkeypatch, tmp_path):
    from profkit.analysis.catalog import manifest_catalog
    from profkit.targets import engines
    from profkit.targets.target import Launch, Target

    ns: dict[str, object] = {}
    exec(compile(_engine_block(), "docs/layout.md", "exec"), ns)
    echo = ns["TARGET"]
    members = {n for n in vars(Target) if not n.startswith("_")} | set(getattr(Target, "__annotations__", {}))
    assert members and not [n for n in members if not hasattr(echo, n)], members
    # every member the protocol calls a method is one on the guide's class, and the attributes have the protocol's types
    methods = {n for n in members if callable(getattr(Target, n, None)) and not isinstance(vars(Target).get(n), property)}
    assert methods and all(callable(getattr(echo, n)) for n in methods), methods

    monkeypatch.setitem(engines.TARGETS, "echo", echo)
    t: Target = engines.target("echo")
    assert t is echo
    spec = t.compose(Launch(states={"cuda_graph": True}, port=31000))
    assert spec.target == "echo" and spec.port == 31000 and spec.argv[-2:] == ["--port", "31000"]
    assert t.validate(spec) == {} and t.dry_run_checks(spec) == [] and t.capabilities() is None
    (tmp_path / "manifest.json").write_text(json.dumps({"target": "echo"}))
    assert manifest_catalog([tmp_path]) == "echo"  # the analysis asks the target, not its name


# A fresh interpreter: the guide's engine, registered by its line in engines.TARGETS (the dict that line builds) before
# the command line is imported, is a --target choice, its table is what `opts` lists, and trace composes with its switches
_REGISTER = """
import sys
from profkit.targets import engines
ns = {}
exec(compile(open(sys.argv[1]).read(), "docs/layout.md", "exec"), ns)
engines.TARGETS["echo"] = ns["TARGET"]
sys.argv = ["profkit", *sys.argv[2:]]
from profkit.cli import main
main()
"""


def _profkit_with_echo(tmp_path, *args: str):
    import subprocess
    import sys

    block = tmp_path / "echo.py"
    block.write_text(_engine_block())
    return subprocess.run([sys.executable, "-c", _REGISTER, str(block), *args], capture_output=True, text=True, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}, timeout=120)


def test_the_guides_engine_is_a_command_line_target_by_its_line_alone(tmp_path):
    """A new engine touches its module, its catalog and its line in targets/engines.py: nothing in the registry, the
    flows or the command line names it (issue 38, "Done when")."""
    h = _profkit_with_echo(tmp_path, "opts", "--help")
    assert h.returncode == 0 and "proxy|sglang|vllm|echo" in h.stdout and "sglang, vllm or echo." in " ".join(h.stdout.split()), h.stdout
    o = _profkit_with_echo(tmp_path, "opts", "--target", "echo")
    assert o.returncode == 0, o.stderr
    assert "optimizations for --target echo" in o.stdout and "cuda_graph: CUDA graphs for decode" in o.stdout
    assert "--disable-cuda-graph" in o.stdout and "requires: cuda_graph (echo drafts only inside its decode graph)" in o.stdout
    r = _profkit_with_echo(tmp_path, "trace", "--target", "echo", "--opt", "cuda_graph", "--dry-run", "--port", "31000")
    assert r.returncode == 0, r.stderr
    assert "python -m echo.server --disable-cuda-graph --port 31000" in r.stdout and "ECHO_SPEC=1" in r.stdout, r.stdout
    bad = _profkit_with_echo(tmp_path, "trace", "--target", "echo", "--opt", "spec", "--base", "off", "--dry-run")
    assert bad.returncode == 2 and "spec would be a no-op here: cuda_graph is off in both runs" in bad.stderr, bad.stderr
    unknown = _profkit_with_echo(tmp_path, "trace", "--target", "echo", "--opt", "topk_v2", "--dry-run")
    assert unknown.returncode == 2 and "unknown optimization 'topk_v2' for target echo" in unknown.stderr, unknown.stderr


def test_an_unregistered_engine_is_refused_with_the_known_names():
    from profkit.errors import UsageError
    from profkit.targets.engines import TARGETS, target

    with pytest.raises(UsageError) as e:
        target("echo")
    assert e.value.hint == f"choose one of: {', '.join(TARGETS)}"
