"""Every command has help with an example, and the README documents every command (sqlite-utils' docs test)."""

from __future__ import annotations

from pathlib import Path


import pytest
from typer.main import get_command
from typer.testing import CliRunner

from profkit.cli import app

from support import ROOT

COMMANDS = sorted(get_command(app).commands)  # type: ignore[attr-defined]
README = (ROOT / "README.md").read_text()


def test_the_commands():
    assert COMMANDS == ["analyze", "baseline", "calibrate", "diff", "export-perfetto", "gate", "opts", "report", "sweep", "trace"]


@pytest.mark.parametrize("command", COMMANDS)
def test_help_has_an_example_and_the_readme_documents_it(command):
    r = CliRunner().invoke(app, [command, "--help"])
    assert r.exit_code == 0, r.output
    assert "Example" in r.output
    assert f"`profkit {command}" in README or f"| `{command}` |" in README


def test_readme_quickstart_has_exactly_two_commands():
    quick = README.split("## Quickstart", 1)[1].split("\n## ", 1)[0]
    commands = [ln.strip() for ln in quick.splitlines() if ln.startswith("    ") and ln.strip()]
    assert len(commands) == 2
    assert commands[0].endswith("profkit trace --opt topk_v2")
    assert commands[1].endswith("python -m pytest -q")


def test_the_vllm_doc_command_composes(tmp_path):
    """docs/vllm.md's run, as a dry run: it parses, and composes the command the doc describes."""
    import shlex

    doc = (Path(__file__).resolve().parent.parent / "docs" / "vllm.md").read_text()
    line = next(ln.strip() for ln in doc.splitlines() if ln.startswith("    ") and "profkit trace --target vllm" in ln)
    argv = shlex.split(line)
    assert argv[0] == "VLLM_CPU_KVCACHE_SPACE=1" and argv[1] == "profkit"
    (tmp_path / "llama-2l").mkdir()
    (tmp_path / "llama-2l" / "config.json").write_text("{}")
    import os

    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        r = CliRunner().invoke(app, [*argv[2:], "--dry-run"])
    finally:
        os.chdir(cwd)
    assert r.exit_code == 0, r.output
    assert "vllm.entrypoints.openai.api_server" in r.output and "--speculative-config" in r.output
    assert "--profiler-config" in r.output and "--load-format dummy" in r.output
