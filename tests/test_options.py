"""Each option that several commands take is declared once (profkit/cli/options.py, or RunOptions for
what trace and sweep share) and refused the same way by every command: the same bad value gives
every command that takes the option the same one-line error and exit 2 (issue 25)."""

from __future__ import annotations

from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from profkit.cli import app
from profkit.cli import options as O
from profkit.cli.capture import RunOptions

TRACE = Path(__file__).parent / "data" / "gpu" / "eager_sync.pt.trace.json.gz"
# what each command needs besides the option under test (nothing is started: the option is refused first)
REQUIRED = {
    "trace": ["--opt", "topk_v2", "--dry-run"],
    "sweep": ["--opts", "topk_v2", "--dry-run"],
    "analyze": [str(TRACE)],
    "diff": [str(TRACE), str(TRACE)],
    "report": [str(TRACE)],
    "export-perfetto": [str(TRACE)],
    "opts": [],
    "gate": [str(TRACE), str(TRACE)],
    "calibrate": ["--dry-run"],
}
BAD = {
    "--min-bubble-us": "-5",
    "--marker": "(",
    "--catalog": "no-such-catalog",
    "--target": "nope",
    "--base": "maybe",
    "--top": "0",
}
runner = CliRunner()


def _commands() -> dict[str, dict[str, object]]:
    """command name -> {flag: click parameter}"""
    group = typer.main.get_command(app)
    out = {}
    for name, cmd in group.commands.items():  # type: ignore[attr-defined]
        out[name] = {flag: p for p in cmd.params for flag in getattr(p, "opts", [])}
    return out


def _taking(flag: str) -> list[str]:
    return sorted(name for name, params in _commands().items() if flag in params)


def test_every_option_several_commands_take_is_declared_once():
    shared = {f for decl in vars(O).values() if isinstance(decl, O.Shared) for f in decl.flags}
    run_options = {f for field in RunOptions.__dataclass_fields__.values() for fl in field.metadata["flags"] for f in fl.split("/")}
    counts: dict[str, list[str]] = {}
    for name, params in _commands().items():
        for flag in params:
            if flag.startswith("--") and flag not in ("--help",):
                counts.setdefault(flag, []).append(name)
    several = {f: cmds for f, cmds in counts.items() if len(cmds) > 1}
    assert several, "no option is shared: the test would prove nothing"
    undeclared = {f: cmds for f, cmds in several.items() if f not in shared and not (f in run_options and set(cmds) <= {"trace", "sweep", "calibrate"})}
    # --opt: trace's optimizations to switch (a list) and diff's one to check: two meanings, two declarations
    assert set(undeclared) <= {"--opt"}, undeclared


@pytest.mark.parametrize("flag", sorted(BAD))
def test_the_same_bad_value_is_refused_alike_by_every_command(flag):
    cmds = _taking(flag)
    assert len(cmds) >= 2, (flag, cmds)
    lines = {}
    for name in cmds:
        r = runner.invoke(app, [name, *REQUIRED[name], flag, BAD[flag]], env={"COLUMNS": "400"})
        assert r.exit_code == 2, (name, r.output)
        errors = [x for x in r.output.splitlines() if x.startswith("error:")]
        assert len(errors) == 1, (name, r.output)
        assert "Traceback" not in r.output and "Usage:" not in r.output, (name, r.output)
        lines[name] = errors[0]
    assert len(set(lines.values())) == 1, lines  # word for word the same
    assert flag in next(iter(lines.values()))


def test_a_good_value_passes_where_the_bad_one_was_refused():
    """The refusals above come from the value, not from the command lines around it."""
    for name, extra in (("trace", ["--min-bubble-us", "0", "--marker", "step", "--catalog", "proxy", "--base", "off"]),
                        ("sweep", ["--catalog", "proxy", "--target", "proxy"]),
                        ("opts", ["--target", "sglang"])):
        r = runner.invoke(app, [name, *REQUIRED[name], *extra], env={"COLUMNS": "400"})
        assert r.exit_code == 0, (name, r.output)
