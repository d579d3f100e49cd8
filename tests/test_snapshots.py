"""Snapshots of every command's terminal output at 80 and 120 columns (tests/snapshots/).

The tables must keep every number at 80 columns: names are cut in the middle, strings a user copies
(APIs, triggers, switches, paths) are never cut. A snapshot that differs fails with a diff.

Refresh them after an intended change of the output, then read the diff before committing:

    PROFKIT_UPDATE_SNAPSHOTS=1 python -m pytest tests/test_snapshots.py
"""

from __future__ import annotations

import difflib
import os
import re
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from profkit import __version__
from profkit import cli

from support import NO_PUBLIC, PUBLIC_TRACES, ROOT, SAMPLE

SNAP = Path(__file__).resolve().parent / "snapshots"
UPDATE = bool(os.environ.get("PROFKIT_UPDATE_SNAPSHOTS"))

# paths relative to the checkout (the commands run there): the output is the same wherever it is cloned
EAGER = str((SAMPLE / "eager_sync.pt.trace.json.gz").relative_to(ROOT))
GRAPH = str((SAMPLE / "graph_decode.pt.trace.json.gz").relative_to(ROOT))
# third-party traces (never committed): ../shared/public-traces beside the checkout, spelled that way in
# the snapshots wherever $PROFKIT_PUBLIC_TRACES points
PUBLIC_REL = os.path.relpath(PUBLIC_TRACES, ROOT)
CAPTURE = os.path.join(PUBLIC_REL, "tracelens_sglang_qwen3-8b_mi300x_graph_capture_bs32.json.gz")
MIXED = os.path.join(PUBLIC_REL, "tracelens_vllm_gpt-oss-20b_mi300x_mixed_piecewise_step.json.gz")

COMMANDS = {
    "analyze-eager": ["analyze", EAGER, "--no-cache"],
    "analyze-graph-capture": ["analyze", CAPTURE, "--no-cache"],
    "analyze-vllm-mixed": ["analyze", MIXED, "--no-cache"],
    "analyze-list-markers": ["analyze", EAGER, "--no-cache", "--list-markers"],
    "diff": ["diff", EAGER, GRAPH],
    # the project's own H200 recording (tests/data/gpu_loo/README.md): 3 profile windows a side, judged against their noise
    "diff-h200-loo": ["diff", "tests/data/gpu_loo/all-topk_v2", "tests/data/gpu_loo/all"],
    "opts-proxy": ["opts", "--target", "proxy"],
    "opts-sglang": ["opts", "--target", "sglang"],
    "trace-dry-run": ["trace", "--opt", "topk_v2", "--dry-run"],
    "sweep-dry-run": ["sweep", "--opts", "overlap,topk_v2", "--mode", "ladder", "--dry-run"],
    "report": ["report", EAGER, "-o", "{tmp}/report.html"],
}


def _normalize(text: str, tmp: Path) -> str:
    # the interpreter first: it usually lives inside the checkout (.venv), which is <repo> next
    text = text.replace(sys.executable, "<python>").replace(str(tmp), "<tmp>").replace(str(ROOT), "<repo>")
    text = text.replace(__version__, "<version>").replace(PUBLIC_REL + os.sep, "../shared/public-traces/")
    text = re.sub(r"\(\d[\d,]* bytes", "(<n> bytes", text)
    return "\n".join(line.rstrip() for line in text.splitlines()) + "\n"


def _run(args: list[str], width: int, tmp: Path) -> str:
    saved = cli.out.width, cli.err.width
    cli.out.width = cli.err.width = width
    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        r = CliRunner().invoke(cli.app, [a.replace("{tmp}", str(tmp)) for a in args], env={"PROFKIT_NO_CACHE": "1"})
    finally:
        os.chdir(cwd)
        cli.out._width, cli.err._width = None, None
        del saved
    return _normalize(f"$ profkit {' '.join(args)}\n[exit {r.exit_code}]\n", tmp) + _normalize(r.output, tmp)


@pytest.mark.parametrize("width", [80, 120])
@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_snapshot(name, width, tmp_path):
    if PUBLIC_REL in " ".join(COMMANDS[name]) and not PUBLIC_TRACES.is_dir():
        pytest.skip(NO_PUBLIC)
    got = _run(COMMANDS[name], width, tmp_path)
    path = SNAP / f"{name}-{width}.txt"
    if UPDATE or not path.exists():
        SNAP.mkdir(exist_ok=True)
        path.write_text(got)
        if not UPDATE:
            pytest.skip(f"wrote new snapshot {path.name}")
        return
    want = path.read_text()
    if got != want:
        diff = "".join(difflib.unified_diff(want.splitlines(True), got.splitlines(True), f"{path.name} (stored)", "output now"))
        pytest.fail(f"output differs from {path.name}; if intended, refresh with PROFKIT_UPDATE_SNAPSHOTS=1\n{diff}")
    assert "[exit 0]" in got


@pytest.mark.parametrize("name", ["analyze-eager", "diff"])
def test_numbers_survive_80_columns(name, tmp_path):
    """Every number of the 120-column output is in the 80-column output too (nothing was cut)."""
    wide, narrow = (_run(COMMANDS[name], w, tmp_path) for w in (120, 80))
    nums = lambda s: [t for t in s.split() if re.fullmatch(r"[-+]?\d[\d,]*(\.\d+)?%?", t)]  # noqa: E731
    have = set(narrow.split())
    missing = [n for n in nums(wide) if n not in have]
    assert not missing, missing[:10]
    for copy in ("cudaStreamSynchronize", "aten::_local_scalar_dense"):
        assert copy in narrow


PROXY = ROOT / "tests" / "data" / "gpu_proxy"  # the project's own H200 recordings (README there)


def _sweep_table(width: int) -> str:
    """`sweep`'s closing table (cli.capture._render_sweep) for a one-at-a-time sweep of the H200 proxy
    recordings: baseline against +topk_v2 and against +indexer_fusion, compared as `sweep` compares them."""
    from types import SimpleNamespace

    from profkit.attribution.diff import compare_summaries

    from profkit.documents import diff_doc
    from profkit.flows.sweep import attribution_row
    from profkit.analysis.catalog import CatalogChoice, load_catalog
    from profkit.cli.capture import _render_sweep
    from profkit.analysis.summarize import SummarizeOptions, summarize

    opts = SummarizeOptions(catalog=CatalogChoice(load_catalog("proxy"), "test"), cache=False)
    s = {n: summarize([PROXY / f"{n}.trace.json.gz"], opts).summary for n in ("baseline", "topk_v2", "indexer_fusion")}
    doc = {"mode": "one-at-a-time", "attribution": []}
    diffs = []
    for opt in ("topk_v2", "indexer_fusion"):
        d = diff_doc(compare_summaries(s["baseline"], s[opt], opt=opt, catalog=load_catalog("proxy"), labels=("baseline", f"+{opt}")))
        diffs.append(d)
        doc["attribution"].append(attribution_row(f"+{opt}", opt, SimpleNamespace(run_id="baseline"), SimpleNamespace(run_id=opt), d, Path("pair")))
    saved = cli.out.width
    cli.out.width = width
    try:
        with cli.out.capture() as cap:
            _render_sweep(doc, diffs)
    finally:
        cli.out._width = None
        del saved
    return "\n".join(line.rstrip() for line in cap.get().splitlines()) + "\n"


@pytest.mark.parametrize("width", [80, 120])
def test_sweep_table_snapshot(width):
    got = _sweep_table(width)
    path = SNAP / f"sweep-table-{width}.txt"
    if UPDATE or not path.exists():
        path.write_text(got)
        if not UPDATE:
            pytest.skip(f"wrote new snapshot {path.name}")
        return
    assert got == path.read_text(), "".join(difflib.unified_diff(path.read_text().splitlines(True), got.splitlines(True), path.name, "now"))
    assert all(len(line) <= width for line in got.splitlines())  # the flag and unstable lines too: wrapped at spaces


def test_sweep_flags_and_unstable_runs_at_80_columns():
    """The lines under the sweep's table wrap at spaces within 80 columns (they were printed unwrapped and a
    terminal folded them mid-number), and a run shared by two steps is listed as unstable once, with both steps."""
    from types import SimpleNamespace

    from profkit.attribution.diff import compare_summaries

    from profkit.documents import diff_doc
    from profkit.flows.sweep import attribution_row
    from profkit.analysis.catalog import CatalogChoice, load_catalog
    from profkit.cli.capture import _render_sweep
    from profkit.analysis.summarize import SummarizeOptions, summarize

    opts = SummarizeOptions(catalog=CatalogChoice(load_catalog("proxy"), "test"), cache=False)
    s = {n: summarize([PROXY / f"{n}.trace.json.gz"], opts).summary for n in ("baseline", "topk_v2", "all")}
    doc = {"mode": "ladder", "attribution": [], "runs": [{"run_id": "r0", "label": "baseline"}, {"run_id": "r1", "label": "+topk_v2"},
                                                         {"run_id": "r2", "label": "+topk_v2+all"}]}
    diffs = []
    for a, b, label in (("baseline", "topk_v2", "+topk_v2"), ("topk_v2", "all", "+topk_v2+all")):
        d = diff_doc(compare_summaries(s[a], s[b], opt="topk_v2", catalog=load_catalog("proxy"), labels=(a, b)))
        diffs.append(d)
        run = {"baseline": "r0", "topk_v2": "r1", "all": "r2"}
        doc["attribution"].append(attribution_row(label, "topk_v2", SimpleNamespace(run_id=run[a]), SimpleNamespace(run_id=run[b]), d, Path("pair")))
    # what an unstable middle run of a ladder looks like in the diffs (diff.json's stability), and a long flag
    swing = "profile window 0: GPU window 26,771–138,605 µs; profile window 1: GPU window 42,799–127,812 µs"
    diffs[0]["stability"], diffs[1]["stability"] = {"candidate": swing}, {"baseline": swing}
    doc["attribution"][1]["flags"] = ["topk_v2 changed indexer time by +37.2%, outside its categories (+3,376.3 µs per iteration)"]
    saved = cli.out.width
    cli.out.width = 80
    try:
        with cli.out.capture() as cap:
            _render_sweep(doc, diffs)
    finally:
        cli.out._width = None
        del saved
    got = cap.get()
    assert all(len(line) <= 80 for line in got.splitlines()), got
    flat = " ".join(got.split())  # a number folded across two lines would read "26,771–13 8,605" here
    for n in ("26,771–138,605", "42,799–127,812", "+3,376.3", "+37.2%"):
        assert n in flat, n
    assert got.count("unstable:") == 1 and "unstable: +topk_v2: " in got and "steps +topk_v2, +topk_v2+all:" in " ".join(got.split())


def test_sweep_table_keeps_its_numbers_at_80_columns():
    wide, narrow = _sweep_table(120), _sweep_table(80)
    nums = [t for t in wide.split() if re.fullmatch(r"[-+]?\d[\d,]*(\.\d+)?%?", t)]
    assert nums and all(n in narrow.split() for n in nums), [n for n in nums if n not in narrow.split()]
    assert "+topk_v2" in narrow and "+indexer_fusion" in narrow


def _in_pty(args: list[str], cols: int) -> str:
    """`profkit ARGS` in a real pseudo-terminal of `cols` columns (rich sees a terminal and asks it
    its size, as in tmux): its output as the terminal received it, colour codes removed."""
    import fcntl
    import pty
    import struct
    import termios

    pid, fd = pty.fork()
    if pid == 0:  # the child: a terminal of cols x 50, no COLUMNS/LINES to override it
        fcntl.ioctl(0, termios.TIOCSWINSZ, struct.pack("HHHH", 50, cols, 0, 0))
        env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES", "NO_COLOR", "TERM")}
        env.update(TERM="xterm-256color", PROFKIT_NO_CACHE="1")
        os.chdir(ROOT)
        os.execve(sys.executable, [sys.executable, "-m", "profkit", *args], env)
    text = _drain(fd, pid).replace("\r\n", "\n")
    return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07", "", text)


@pytest.mark.skipif(sys.platform == "win32", reason="needs a POSIX pseudo-terminal")
@pytest.mark.parametrize("name", ["diff", "analyze-eager", "diff-h200-loo"])
def test_a_real_80_column_terminal_cuts_no_number(name, tmp_path):
    """In a real 80-column pseudo-terminal no line is wider than 80 cells (a wider one would wrap and
    split a number across lines) and every number of the 120-column output is there whole."""
    from rich.cells import cell_len

    narrow = _in_pty(COMMANDS[name], 80)
    assert "[exit" not in narrow and narrow.strip(), narrow[:500]
    long = [ln for ln in narrow.splitlines() if cell_len(ln) > 80]
    assert not long, long[:5]  # the headline and warnings wrap at spaces too: the terminal never folds a number
    wide = _in_pty(COMMANDS[name], 120)
    nums = [t for t in wide.split() if re.fullmatch(r"[-+]?\d[\d,]*\.\d+%?|[-+]?\d{1,3}(,\d{3})+", t)]
    have = set(narrow.split())
    assert nums and not [n for n in nums if n not in have]


@pytest.mark.skipif(sys.platform == "win32", reason="needs a POSIX pseudo-terminal")
def test_the_h200_diff_reads_at_80_columns():
    """issue 28, in a real 80-column terminal: the decomposition's verdicts stay on their row (they took two lines
    each, 'beyond' then 'noise'), a bubble's CPU-op figure stays beside its name (no 'µs' alone on a line), the
    kernels removed are listed one a line (no 'void' alone at a line's end), and the headline judges the window."""
    out = _in_pty(COMMANDS["diff-h200-loo"], 80)
    lines = [ln.strip() for ln in out.splitlines()]
    table = out[out.index("change in GPU window per iteration"):out.index("Each term is the median")]
    assert [ln for ln in table.splitlines()[2:] if ln.strip() in ("noise", "beyond", "within")] == []
    assert "±7.2 beyond noise" in table and "±1,714.8 within noise" in table
    assert not [ln for ln in lines if ln in ("µs", "void") or ln.endswith(" void") or ln.startswith("µs,")]
    assert "GPU window -885.0 µs per iteration, ±1,714.8 within noise" in " ".join(out.split())


@pytest.mark.skipif(sys.platform == "win32", reason="needs a POSIX pseudo-terminal")
@pytest.mark.parametrize("command", ["trace", "sweep"])
def test_help_reads_at_80_columns(command):
    """In a real 80-column terminal an option's help runs beside it on one line of ~45 columns (rich's panel
    shared the width among seven columns: the flag pairs and the types left the help 17 columns, one or two
    words a line); at 120 columns it is rich's panel."""
    from rich.cells import cell_len

    narrow = _in_pty([command, "--help"], 80)
    assert not [ln for ln in narrow.splitlines() if cell_len(ln) > 80]
    flat = " ".join(narrow.split())
    assert "--opt" in flat and "--warmup / --no-warmup" in flat
    assert "Before each workload point's repeats, one" in narrow  # one line, not a word a line
    assert "[[ids...], ...]" in narrow and "\\[" not in narrow  # the markup escapes are not shown
    wide = _in_pty([command, "--help"], 120)
    assert "╭─ Options" in wide


@pytest.mark.skipif(sys.platform == "win32", reason="needs a POSIX pseudo-terminal")
def test_the_progress_line_keeps_its_elapsed_time_at_80_columns():
    """A long run's live line in an 80-column terminal: the elapsed time whole (rich shrank every column alike and the time
    read '0:…'), and the step folded onto the next lines, never cut (issue 40: it lost its end, "analyzing profile windo…")."""
    import fcntl
    import pty
    import struct
    import termios

    code = ("import time; from profkit.cli.capture import _Steps\n"
            "s = _Steps(1)\n"
            "with s:\n"
            "    t = s.live.add_task('runs 1-2/2, alternating: candidate (topk_v2): profile window 1/3: 20 iterations; ' * 3, total=None)\n"
            "    time.sleep(0.6)\n")
    pid, fd = pty.fork()
    if pid == 0:
        fcntl.ioctl(0, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 80, 0, 0))
        env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES", "NO_COLOR", "TERM")}
        env["TERM"] = "xterm-256color"
        os.execve(sys.executable, [sys.executable, "-c", code], env)
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", _drain(fd, pid))
    frames = [f for f in re.split(r"[\r\n]+", text) if "runs 1-2/2" in f]
    assert frames, text[:300]
    firsts = [f for f in frames if re.search(r"\d:\d\d:\d\d", f)]
    assert firsts and all(re.search(r"\d:\d\d:\d\d runs 1-2/2", f) for f in firsts), frames[:3]
    assert not any(f.rstrip().endswith("…") for f in frames), frames[:3]


@pytest.mark.skipif(sys.platform == "win32", reason="needs a POSIX pseudo-terminal")
def test_a_long_trace_path_is_printed_whole_at_80_columns(tmp_path):
    """analyze's rank line gives the trace's path whole (the terminal wraps it and a copy joins it back); rich folded a
    run folder's window path with a newline inside it at 80 columns."""
    import shutil

    deep = tmp_path / ("run-" + "x" * 40) / "window-0"
    deep.mkdir(parents=True)
    trace = deep / ("20261202-022808-proxy-baseon-topk_v2-after-TP-0-" + "y" * 20 + ".pt.trace.json.gz")
    shutil.copy(SAMPLE / "eager_sync.pt.trace.json.gz", trace)
    out = _in_pty(["analyze", str(trace)], 80)
    assert str(trace) in out, out[:600]


def _drain(fd: int, pid: int) -> str:
    """Everything the child wrote to the pseudo-terminal until it closed, once the child has exited."""
    chunks = []
    while True:
        try:
            data = os.read(fd, 65536)
        except OSError:  # EIO: the child closed its side
            break
        if not data:
            break
        chunks.append(data)
    os.waitpid(pid, 0)
    return b"".join(chunks).decode("utf-8", "replace")
