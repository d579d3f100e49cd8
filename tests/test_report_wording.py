"""Wording and units of the reports (issue 28, point 6): nothing called "ok" when nothing was judged,
a CPU-only run's own words (aten ops, CPU, tokens/s per rank), per-iteration units side by side, the
HTML decomposition in the waterfall's order."""

from __future__ import annotations

import re
from pathlib import Path

from typer.testing import CliRunner

from profkit.cli import app
from profkit.documents import diff_of, rank_of
from profkit.report.views import device_text, throughput_rows

CPU_ONLY = Path(__file__).resolve().parent / "data" / "bad" / "cpu_only.json.gz"
SAMPLE = Path(__file__).resolve().parent.parent / "traces" / "sample"
runner = CliRunner()


def test_a_diff_that_judges_nothing_says_so_and_never_ok(tmp_path):
    md = tmp_path / "c.md"
    r = runner.invoke(app, ["diff", str(CPU_ONLY), str(CPU_ONLY), "--opt", "topk_v2", "--catalog", "proxy", "--md", str(md)])
    assert r.exit_code == 0, r.output
    assert "expected effect not judged: one profile window per side" in r.output
    assert "expected effect ok" not in r.output and "beyond not judged" not in r.output
    text = md.read_text()
    assert "Expected-effect check not judged" in text and "passed" not in text


def test_cpu_only_words():
    # the trace's own device name first (tests/data/bad/cpu_only was recorded on an H200 box), then the manifest's
    assert device_text(rank_of({"device": None}), {"versions": {"gpu": "cpu"}}) == "CPU"
    assert device_text(rank_of({"device": None, "device_timeline": "cpu"})) == "CPU"
    assert device_text(rank_of({"device": "NVIDIA H200"}), {"versions": {"gpu": "cpu"}}) == "NVIDIA H200"
    assert device_text(rank_of({})) == "unknown device"
    point = {"tokens_per_s_per_gpu": {"median": 10.0, "spread": None}}
    cpu = {"baseline": {"device_timeline": "cpu"}, "candidate": {"device_timeline": "cpu"}, "throughput": {"baseline": point, "candidate": point}}
    assert [x["label"] for x in throughput_rows(diff_of(cpu))] == ["tokens/s per rank"]
    gpu = {**cpu, "baseline": {}, "candidate": {}}
    assert [x["label"] for x in throughput_rows(diff_of(gpu))] == ["tokens/s per GPU"]


def test_bubble_causes_put_per_iteration_figures_side_by_side():
    """The CPU ops beside a cause's median µs per iteration are per iteration too (their idle time summed
    over the iterations, divided by their number), never a total next to a median."""
    r = runner.invoke(app, ["analyze", str(SAMPLE / "eager_sync.pt.trace.json.gz"), "--no-cache"])
    assert r.exit_code == 0, r.output
    rows = r.output.split("bubbles by cause", 1)[1].split("largest bubbles", 1)[0]
    sync = next(line for line in rows.splitlines() if line.strip().startswith("sync "))
    median = float(sync.split()[1].replace(",", ""))
    ops = [float(x.replace(",", "")) for x in re.findall(r"\S ([\d,]+\.\d)(?:,|\s|$)", sync.split(None, 3)[3])]  # "CPU was in (µs)": "op 423.5, op 16.0"
    assert ops and sum(ops) <= median * 1.5, sync  # a total over 8 iterations was 7x the median


def test_html_decomposition_table_in_the_waterfalls_order(tmp_path):
    page = tmp_path / "d.html"
    r = runner.invoke(app, ["diff", str(SAMPLE / "eager_sync.pt.trace.json.gz"), str(SAMPLE / "graph_decode.pt.trace.json.gz"), "--html", str(page)])
    assert r.exit_code == 0, r.output
    html = page.read_text()
    sec = html.split('id="diff-decomposition"', 1)[1].split("</section>", 1)[0]
    deltas = [float(x.replace(",", "").replace("+", "").replace("−", "-")) for x in re.findall(r'<td class="r">([+-−]?[\d,]+\.\d)</td>\s*<td class="l">', sec)]
    body = [abs(d) for d in deltas[:-1]]  # the last one is the window itself
    assert len(body) > 3 and body == sorted(body, reverse=True)


def test_analyze_gives_a_verdict_when_the_gpu_mostly_idles():
    """tests/data/gpu_overlap/eager_long_gap (H200): the GPU idles 7,334.4 of 7,425.7 µs per iteration
    (tests/data/gpu_overlap/expected.json); the verdict names the largest cause and the op behind it."""
    trace = Path(__file__).resolve().parent / "data" / "gpu_overlap" / "eager_long_gap.trace.json.gz"
    r = runner.invoke(app, ["analyze", str(trace), "--no-cache"])
    assert r.exit_code == 0, r.output
    import json
    import statistics

    its = json.loads((trace.parent / "expected.json").read_text())["traces"][trace.name]["per_iteration"]  # check.py's, from the raw events
    idle, win = statistics.median(i["gpu_idle_us"] for i in its), statistics.median(i["gpu_window_us"] for i in its)
    line = " ".join(r.output.split("verdict: ", 1)[1].split("\nper iteration", 1)[0].split())
    assert line.startswith(f"the GPU idles {idle:,.1f} of its {win:,.1f} µs window per iteration (99%, medians); launch-bound"), line
    assert "aten::sort" in line


def test_kernel_names_demangled_and_told_apart(tmp_path):
    """aiter's kernels use a mangling libstdc++'s demangler does not read (DF16b): c++filt does; the
    report shows C++ and keeps the recorded name in the hover (title). Three Cijk_Alik_… GEMMs that
    differ in the middle of their names stay apart at 80 columns."""
    import shutil

    import pytest

    from profkit.report.fit import cut_names, demangle

    mangled = "_ZN5aiter24add_rmsnorm_quant_kernelIDF16bDF16bLi256ELi16ELb0ELb0ELb1ELi1EEEvPT0_PT_PfS4_S4_S4_diiiiiiib"
    names = ["Cijk_Alik_Bljk_BBS_BH_MT256x32x64_MI16x16x1_SN_LDSB1_AFC1_WSGRB0_WS64_WG64_4_1",
             "Cijk_Alik_Bljk_BBS_BH_MT32x32x256_MI16x16x1_SN_LDSB1_AFC1_WSGRB0_WS64_WG16_4_4",
             "Cijk_Alik_Bljk_BBS_BH_MT64x32x256_MI16x16x1_SN_LDSB1_AFC1_WSGRB0_WS64_WG16_4_4"]
    cut = cut_names(names, 32)
    assert len(set(cut)) == 3 and all(len(c) <= 32 for c in cut), cut
    if shutil.which("c++filt") is None and demangle(mangled) == mangled:
        pytest.skip("no demangler on this machine reads DF16b (binutils' c++filt does)")
    assert demangle(mangled).startswith("void aiter::add_rmsnorm_quant_kernel<std::bfloat16_t, std::bfloat16_t, 256, 16,")
    from support import public_trace

    trace = public_trace("tracelens_sglang_qwen3-8b_mi300x_decode_step.json.gz")  # third-party: ../shared, skipped when absent
    page = tmp_path / "r.html"
    r = runner.invoke(app, ["report", str(trace), "-o", str(page)])
    assert r.exit_code == 0, r.output
    # the run's table: the C++ name, cut in the middle where the instantiations differ; the whole one, then the recorded one, in the hover
    assert 'title="void aiter::add_rmsnorm_quant_kernel&lt;std::bfloat16_t, std::bfloat16_t, 256, 16, false,' in page.read_text()
    assert f'\n{mangled}">void aiter::add_rmsnor' in page.read_text()
