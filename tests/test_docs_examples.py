"""The manual's examples run: every concrete `profkit ...` command written in README.md or docs/*.md
(no placeholders such as <run>, A B or PATH...) is run as written from the repository's root — analyze,
diff, export-perfetto, opts and report for real on the committed sample traces, trace and sweep with
--dry-run (they would start a server) — and exits 0."""

from __future__ import annotations

import re
import shlex
import shutil

import pytest
from typer.testing import CliRunner

from profkit.cli import app

from support import ROOT

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
COMMAND = re.compile(r"`(profkit [a-z-]+(?: [^`|]*)?)`|^ {4}(?:\$ )?(profkit [a-z-]+.*)$", re.M)
PLACEHOLDER = re.compile(r"<|\[|\.\.\.|\b[A-Z][A-Z_]*\b|\|")


def _inputs_exist(args: list[str]) -> bool:
    """The positional inputs (before the first option) exist in the repository: `profkit diff before.json
    after.json` in a sentence names no real file and is prose, not an example."""
    inputs = []
    for a in args[2:]:
        if a.startswith("-"):
            break
        inputs.append(a)
    required = {"trace": "--opt", "sweep": "--opts"}.get(args[1])  # a sentence naming a target, not a run
    return all((ROOT / a).exists() for a in inputs) and (required is None or required in args)


def _examples() -> list[tuple[str, str]]:
    out = []
    for page in PAGES:
        for m in COMMAND.finditer(page.read_text()):
            cmd = (m.group(1) or m.group(2)).strip()
            if not PLACEHOLDER.search(cmd) and len(shlex.split(cmd)) > 2 and _inputs_exist(shlex.split(cmd)) and (page.name, cmd) not in out:
                out.append((page.name, cmd))
    return out


EXAMPLES = _examples()


def test_the_manual_has_examples_to_run():
    names = {shlex.split(c)[1] for _, c in EXAMPLES}
    assert {"analyze", "diff", "export-perfetto", "opts", "trace", "sweep", "report"} <= names, names


@pytest.mark.parametrize(("page", "cmd"), EXAMPLES, ids=[f"{p}:{c[:60]}" for p, c in EXAMPLES])
def test_example_runs(page, cmd, tmp_path, monkeypatch):
    args = shlex.split(cmd)[1:]
    if args[0] in ("trace", "sweep"):
        args.append("--dry-run")
    for sample in ("traces", "tests"):  # the examples' inputs, relative to the root, copied beside the outputs
        if any(a.startswith(sample + "/") for a in args):
            shutil.copytree(ROOT / sample, tmp_path / sample, ignore=shutil.ignore_patterns("*.profkit-cache"))
    monkeypatch.chdir(tmp_path)
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, f"{page}: {cmd}\n{r.output}"
