"""What reports are made from (issue 17, points 3, 6, 11): two single-rank sides compare whatever
their ranks, sides without a common shape need --allow-shape-mismatch (warned first), the catalog
comes from the run manifest's target, and a reader that leaves early (`| head`) costs neither the
exit status nor the files."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

from profkit.cli import app
from processes import HANG_S

from support import DATA, ROOT, public_trace

SAMPLE = ROOT / "traces" / "sample"
runner = CliRunner()


def _with_rank(src: Path, rank: int, dst: Path) -> Path:
    doc = json.loads(gzip.decompress(src.read_bytes()))
    doc["distributedInfo"] = {"rank": rank, "world_size": 8}
    dst.write_bytes(gzip.compress(json.dumps(doc).encode()))
    return dst


def test_single_rank_sides_compare_whatever_their_ranks(tmp_path):
    b = _with_rank(SAMPLE / "eager_sync.pt.trace.json.gz", 3, tmp_path / "b.pt.trace.json.gz")
    c = _with_rank(SAMPLE / "graph_decode.pt.trace.json.gz", 1, tmp_path / "c.pt.trace.json.gz")
    r = runner.invoke(app, ["diff", str(b), str(c), "--json", "-"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert any("rank 3 of the baseline compared with rank 1 of the candidate" in w for w in d["warnings"])
    assert r.stderr.splitlines()[0].startswith("warning: single-rank sides")


def test_sides_without_a_common_shape_need_the_flag_and_warn_first():
    dec, ext = (str(public_trace(f"tracelens_sglang_qwen3-8b_mi300x_{k}_step.json.gz")) for k in ("decode", "extend"))
    r = runner.invoke(app, ["diff", dec, ext])
    assert r.exit_code == 2
    assert "share no iteration shape" in r.output and "--allow-shape-mismatch" in r.output
    r = runner.invoke(app, ["diff", dec, ext, "--allow-shape-mismatch"])
    assert r.exit_code == 0, r.output
    assert r.output.splitlines()[0].startswith("warning: the two sides share no iteration shape")


def test_catalog_from_the_run_manifest_and_an_auto_pick_is_said(tmp_path):
    data = DATA / "gpu_proxy"
    for name in ("baseline", "topk_v2"):
        r = runner.invoke(app, ["analyze", str(data / f"{name}.trace.json.gz"), "--no-cache", "--json", str(tmp_path / f"{name}.json")])
        assert r.exit_code == 0, r.output
        assert "catalog proxy: from the run manifest's target" in r.output
        assert json.loads((tmp_path / f"{name}.json").read_text())["ranks"][0]["catalog"] == "proxy"
    r = runner.invoke(app, ["analyze", str(SAMPLE / "eager_sync.pt.trace.json.gz"), "--no-cache"])
    assert "picked from the kernel names" in r.output


def test_a_reader_that_leaves_early_costs_neither_exit_status_nor_files(tmp_path):
    out = {k: tmp_path / f"d.{k}" for k in ("json", "md", "html")}
    cmd = [sys.executable, "-m", "profkit", "diff", str(SAMPLE / "eager_sync.pt.trace.json.gz"), str(SAMPLE / "graph_decode.pt.trace.json.gz"),
           "--json", str(out["json"]), "--md", str(out["md"]), "--html", str(out["html"]), "--cdn"]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, cwd=tmp_path)
    p.stdout.close()  # the reader is gone before the first line: every write to stdout is EPIPE
    assert p.wait(timeout=HANG_S) == 0
    for f in out.values():
        assert f.stat().st_size > 0, f


def test_cpu_only_diff_says_cpu_op_window_everywhere(tmp_path):
    trace = DATA / "bad" / "cpu_only.json.gz"
    md = tmp_path / "c.md"
    r = runner.invoke(app, ["diff", str(trace), str(trace), "--md", str(md)])
    assert r.exit_code == 0, r.output
    assert "CPU-only run" in r.stdout and "CPU-op window" in r.stdout and "gpu kernels" not in r.stdout.lower()
    text = md.read_text()
    assert text.index("CPU-only run") < text.index("####")  # the banner before the first table
    assert "CPU-op window" in text and "GPU kernels" not in text and "aten ops" in text
    # the headline too (it said "GPU window" and "GPU-bound" for a CPU-only diff, the quickstart's first line)
    assert "GPU window" not in text and "GPU window" not in r.stdout and "GPU-bound" not in text


def test_cpu_only_diff_html_counts_aten_ops(tmp_path):
    """The HTML counts table words a CPU-only diff as the terminal and Markdown do (it had said "GPU kernels")."""
    trace = DATA / "bad" / "cpu_only.json.gz"
    html = tmp_path / "c.html"
    r = runner.invoke(app, ["diff", str(trace), str(trace), "--html", str(html)])
    assert r.exit_code == 0, r.output
    text = html.read_text()
    assert "aten ops" in text and "GPU kernels" not in text
    # the figures too: the timeline's titles and axis, time by category, idle by cause (they said "GPU ...")
    assert not [w for w in ("GPU window", "GPU time", "GPU idle", "GPU-bound") if w in text]
    assert "CPU-op time by category" in text and "CPU-op idle time by bubble cause" in text


def test_json_to_stdout_is_the_file_json(tmp_path):
    """`--json -` prints exactly what `--json FILE` writes (it printed the stdlib's text, non-ASCII escaped: µ as \\u00b5)."""
    loo = DATA / "gpu_loo"  # its expected-effect threshold and warnings say µs
    b, c = str(loo / "all-overlap"), str(loo / "all")
    f = tmp_path / "d.json"
    assert runner.invoke(app, ["diff", b, c, "--opt", "overlap", "--json", str(f)]).exit_code == 0
    r = runner.invoke(app, ["diff", b, c, "--opt", "overlap", "--json", "-"])
    assert r.exit_code == 0, r.output
    assert r.stdout == f.read_text()
    assert "µ" in r.stdout and "\\u00b5" not in r.stdout


def test_a_field_of_the_wrong_type_is_the_files_fault(tmp_path):
    """summary.json and diff.json are decoded into typed documents where they are read (profkit/documents.py):
    a field of the wrong type is a one-line input error naming the file, not a crash in attribution or a renderer."""
    from profkit.errors import EXIT_INPUT

    good = DATA / "v1" / "eager_decode.summary.json"
    doc = json.loads(good.read_text())
    doc["ranks"][0]["iterations"][0]["batch_size"] = "four"
    bad = tmp_path / "bad.summary.json"
    bad.write_text(json.dumps(doc))
    r = runner.invoke(app, ["diff", str(good), str(bad)])
    assert r.exit_code == EXIT_INPUT, r.output
    assert f"{bad}: not a valid summary.json" in r.output and "batch_size" in r.output and "Traceback" not in r.output
    d = tmp_path / "d.json"
    assert runner.invoke(app, ["diff", str(good), str(good), "--json", str(d)]).exit_code == 0
    diff = json.loads(d.read_text())
    diff["decomposition"]["gpu_window_us"] = [1, 2]
    d.write_text(json.dumps(diff))
    r = runner.invoke(app, ["report", str(d), "-o", str(tmp_path / "r.html")])
    assert r.exit_code == EXIT_INPUT, r.output
    assert f"{d}: not a valid diff.json" in r.output and "gpu_window_us" in r.output and not (tmp_path / "r.html").exists()
