"""Issue 40 point 6, the smaller items, each as a new user meets it: an unknown --opt is refused, help says what
--window and --json do, the manual's --isl defaults are the code's, large percentages and counts of one read
right, and a warning every profile window shares is printed once."""

from __future__ import annotations

import re
import shutil

from typer.main import get_command
from typer.testing import CliRunner

from support import DATA, ROOT
from profkit.cli import app

runner = CliRunner()
LOO = DATA / "gpu_loo"


def _help(command: str, flag: str) -> str:
    cmd = get_command(app).commands[command]  # type: ignore[attr-defined]
    return next(p.help for p in cmd.params if flag in getattr(p, "opts", ()))


def test_an_unknown_optimization_is_refused_naming_the_known_ones(tmp_path):
    """`diff --opt topkv2` exited 0 with no expected-effect check and diff.json naming topkv2 the optimization."""
    out = tmp_path / "d.json"
    r = runner.invoke(app, ["diff", str(LOO / "all-topk_v2"), str(LOO / "all"), "--opt", "topkv2", "--json", str(out)])
    assert r.exit_code == 2, r.output
    text = " ".join(r.output.split())  # the error line, as the terminal may have wrapped it
    assert text.count("error:") == 1
    line = text.split("error:", 1)[1].split("hint:", 1)[0]
    assert "--opt topkv2" in line and "catalog proxy" in line
    m = re.search(r"known: ([a-z0-9_, ]+)\)", line)
    assert m, line
    known = m.group(1).split(", ")
    assert "topk_v2" in known and "indexer_fusion" in known
    assert not out.exists()
    # a catalog that declares no optimizations cannot check one: said, not ignored
    proxy = DATA / "gpu_proxy"
    r = runner.invoke(app, ["diff", str(proxy / "baseline.trace.json.gz"), str(proxy / "topk_v2.trace.json.gz"), "--opt", "topk_v2",
                            "--catalog", "generic"])
    assert r.exit_code == 2 and "catalog generic declares no optimizations" in r.output, r.output
    # the right name still runs
    r = runner.invoke(app, ["diff", str(LOO / "all-topk_v2"), str(LOO / "all"), "--opt", "topk_v2", "--json", str(out)])
    assert r.exit_code == 0 and out.exists(), r.output


def test_help_says_what_window_and_json_do():
    from profkit.analysis.summary import SCHEMA_VERSION
    from profkit.attribution.diff import DIFF_SCHEMA_VERSION

    w = _help("report", "--window")
    assert "window i only" in w and "first window" in w and "each window on its own" not in w
    assert "each window on its own" in _help("analyze", "--window")  # analyze does print each
    for command in ("analyze", "diff"):
        j = _help(command, "--json")
        assert f"summary.json, schema v{SCHEMA_VERSION}" in j and f"diff.json, schema v{DIFF_SCHEMA_VERSION}" in j
    assert ".gz" in _help("export-perfetto", "--output")


def test_the_manual_states_the_isl_defaults_of_the_code():
    from profkit.targets.proxy import TARGET as PROXY
    from profkit.targets.sglang import TARGET as SGLANG

    PROXY_ISL, SGLANG_ISL = PROXY.defaults.isl, SGLANG.defaults.isl

    doc = (ROOT / "docs" / "commands.md").read_text()
    sentence = " ".join(doc.split("a first prompt of `--isl` tokens", 1)[1].split("`--turns`", 1)[0].split())
    assert f"({SGLANG_ISL // 1000}K on sglang," in sentence and f"; {PROXY_ISL} on the proxy" in sentence, sentence


def test_percentages_and_counts_of_one():
    from profkit.report.numbers import counted, pct

    assert pct(4660.6) == "+4,660.6%" and pct(-1234.56) == "-1,234.6%" and pct(41.0, sign=False) == "41.0%" and pct(3.25) == "+3.2%"
    assert counted(1, "iteration") == "1 iteration" and counted(8, "iteration") == "8 iterations"
    assert counted(1024, "iteration") == "1,024 iterations" and counted(0, "window") == "0 windows"


def test_analyze_of_one_iteration_says_iteration():
    r = runner.invoke(app, ["analyze", str(DATA / "vllm_cpu" / "eager_chunked_ngram.pt.trace.json.gz")])
    assert r.exit_code == 0, r.output
    assert not re.search(r"\b1 iterations\b", r.output)


def test_a_warning_every_window_shares_is_printed_once(tmp_path):
    """A run folder of two profile windows of a CPU-only trace: its 'CPU-only trace' warning was printed once per window."""
    src = DATA / "vllm_cpu" / "eager_chunked_ngram.pt.trace.json.gz"
    for w in (0, 1):
        (tmp_path / "run" / f"window-{w}").mkdir(parents=True)
        shutil.copyfile(src, tmp_path / "run" / f"window-{w}" / src.name)
    r = runner.invoke(app, ["analyze", str(tmp_path / "run")])
    assert r.exit_code == 0, r.output
    lines = [ln for ln in r.output.splitlines() if ln.startswith("warning:")]
    cpu = [ln for ln in lines if "CPU-only trace" in ln]
    assert len(cpu) == 1, r.output
    assert "(all 2 profiles)" in r.output.replace("\n", " ")
    assert r.output.count("── ") == 2  # both windows still printed, each on its own
