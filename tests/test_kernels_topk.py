"""TopK-V2 (profkit/proxy/kernels/topk.py): exact top-k sets, ties included.

CPU: the torch twin of the kernels' algorithm against a stable descending sort (torch.topk's set
with ties to the lowest index) and torch.topk's values; the Triton kernels themselves through
Triton's interpreter (TRITON_INTERPRET=1, in a subprocess so that the flag is set before the
kernels are decorated), both launch plans with small tiles so that several programs, tiles and
refinement rounds run. GPU (marked `gpu`): the compiled kernels at the study's verify shape, plus
CUDA-graph capture and replay.

NaN policy (stated in topk.py): NaN ranks above +inf, like torch.topk / torch.sort; -0.0 == +0.0.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from profkit.proxy.kernels import topk as T  # noqa: E402
from processes import HANG_S  # noqa: E402

HAVE_TRITON = importlib.util.find_spec("triton") is not None


def make_scores(kind: str, rows: int, n: int, g: torch.Generator) -> torch.Tensor:
    if kind == "random":
        return torch.randn(rows, n, generator=g)
    if kind == "duplicates":
        return torch.randint(-4, 4, (rows, n), generator=g).float()
    if kind == "neg_inf":
        s = torch.randn(rows, n, generator=g)
        s[torch.rand(rows, n, generator=g) < 0.7] = float("-inf")
        return s
    if kind == "nan":
        s = torch.randint(-3, 3, (rows, n), generator=g).float()
        s[torch.rand(rows, n, generator=g) < 0.05] = float("nan")
        s[torch.rand(rows, n, generator=g) < 0.05] = float("inf")
        return s
    if kind == "zeros":  # +0.0 and -0.0 mixed, all tied
        s = torch.zeros(rows, n)
        s[torch.rand(rows, n, generator=g) < 0.5] = -0.0
        return s
    if kind == "narrow":  # many distinct values inside one coarse bin: exact refinement matters
        return 1.0 + torch.rand(rows, n, generator=g) * 1e-3
    if kind == "wide":  # huge magnitudes (fp16 overflow bin) and tiny ones (fp16 zero bin)
        e = torch.randint(-60, 60, (rows, n), generator=g).float()
        return torch.sign(torch.randn(rows, n, generator=g)) * torch.exp2(e)
    raise ValueError(kind)


KINDS = ["random", "duplicates", "neg_inf", "nan", "zeros", "narrow", "wide"]


def check_against_reference(scores, k, idx, slots, lengths=None, page_table=None, page_size=1):
    """Exact set equality with the stable-sort reference; -1 padding; slots = translated idx."""
    ref = T.topk_reference(scores, k, lengths)
    rows = scores.shape[0]
    assert idx.shape == (rows, k) and slots.shape == (rows, k)
    assert idx.dtype == torch.int32 and slots.dtype == torch.int32
    for r in range(rows):
        valid = idx[r] >= 0
        m = len(ref[r])
        assert int(valid.sum()) == m, (r, int(valid.sum()), m)
        got = idx[r][valid].long()
        assert len(set(got.tolist())) == m  # no duplicates
        assert set(got.tolist()) == set(ref[r].tolist()), f"row {r}"
        assert (slots[r][~valid] == -1).all()
        if page_table is not None:
            pt = page_table[r // (rows // page_table.shape[0])].long()
            want = pt[got // page_size] * page_size + got % page_size
        else:
            want = got
        assert torch.equal(slots[r][valid].long(), want)


# ----------------------------------------------------------------------------------------------
# CPU: the torch twin
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_twin_exact_sets(kind):
    g = torch.Generator().manual_seed(KINDS.index(kind))
    for _ in range(12):
        rows = int(torch.randint(1, 8, (1,), generator=g))
        n = int(torch.randint(1, 3000, (1,), generator=g))
        k = int(torch.randint(1, 300, (1,), generator=g))
        s = make_scores(kind, rows, n, g)
        lengths = None
        if bool(torch.rand(1, generator=g) < 0.5):
            lengths = torch.randint(0, n + 1, (rows,), generator=g)
        idx, slots = T.topk_v2(s, k, lengths=lengths)
        check_against_reference(s, k, idx, slots, lengths)
        # position order on CPU
        for r in range(rows):
            v = idx[r][idx[r] >= 0]
            assert torch.all(v[1:] > v[:-1])


def test_twin_values_match_torch_topk():
    g = torch.Generator().manual_seed(7)
    for n, k in [(100, 100), (5000, 2048), (4096, 1), (20000, 2048)]:
        s = torch.randn(7, n, generator=g)
        idx, _ = T.topk_v2(s, k)
        kk = min(k, n)
        got = torch.gather(s, 1, idx[:, :kk].long()).sort(1, descending=True).values
        assert torch.equal(got, torch.topk(s, kk).values)  # no ties: identical sets
        ti = torch.topk(s, kk).indices.sort(1).values
        assert torch.equal(idx[:, :kk].long().sort(1).values, ti)


def test_twin_sample_miss_falls_back_exactly():
    g = torch.Generator().manual_seed(9)
    s = adversarial_for_sample(3, 5000, 256, 1000, g)
    idx, slots = T.topk_v2(s, 1000, sample=256)
    check_against_reference(s, 1000, idx, slots)
    t = T.sample_thresholds(s, torch.full((3,), 5000), torch.full((3,), 1000), 256)
    assert bool(((T.signed_keys(s) >= t.unsqueeze(1)).sum(1) < 1000).all())  # it did miss


def test_twin_rows_shorter_than_k_and_page_table():
    g = torch.Generator().manual_seed(3)
    rows, n, ps = 6, 500, 16
    s = make_scores("duplicates", rows, n, g)
    pt = torch.randperm(200, generator=g)[: 2 * ((n + ps - 1) // ps)].view(2, -1).int()
    lengths = torch.tensor([0, 1, 37, 300, 499, 500])
    idx, slots = T.topk_v2(s, 400, pt, ps, lengths)
    check_against_reference(s, 400, idx, slots, lengths, pt, ps)
    assert (idx[0] == -1).all() and int((idx[1] >= 0).sum()) == 1


def test_twin_nan_policy():
    s = torch.tensor([[1.0, float("nan"), 3.0, float("inf"), float("nan"), -0.0, 0.0]])
    idx, _ = T.topk_v2(s, 4)
    assert set(idx[0].tolist()) == {1, 4, 3, 2}  # NaNs above +inf, then +inf, then 3
    idx, _ = T.topk_v2(s, 6)
    assert set(idx[0].tolist()) == {1, 4, 3, 2, 0, 5}  # -0.0 == +0.0: the lower index wins


def test_topk_slots_matches_proxy_contract():
    from profkit.proxy import ops

    g = torch.Generator().manual_seed(11)
    B, Q, N, k = 2, 3, 400, 64
    s = torch.randint(-5, 5, (B, Q, N), generator=g).float()
    lengths = torch.tensor([[250], [400]]).expand(B, Q)
    st = torch.randperm(5000, generator=g)[: B * N].view(B, 1, N)
    want = ops.topk_v1(s, lengths, k, st)
    got = T.topk_slots(s, lengths, k, st)
    assert got.shape == want.shape and got.dtype == torch.int64
    for b in range(B):
        for q in range(Q):
            assert set(got[b, q].tolist()) == set(want[b, q].tolist())


def test_coarse_bins_monotone():
    x = torch.cat([torch.tensor([float("-inf"), -1e30, -70000.0, -1.0, -1e-30, -0.0, 0.0, 1e-30,
                                 1e-8, 1.0, 1.0001, 70000.0, 1e30, float("inf")]),
                   torch.randn(2000).sort().values])
    x = x.sort().values
    b = T.coarse_bins(x)
    assert torch.all(b[1:] >= b[:-1])
    k = T.full_keys(x)
    assert torch.all(k[1:] >= k[:-1])
    assert T.coarse_bins(torch.tensor([float("nan")])).item() == (1 << T.LOG2NB) - 1


# ----------------------------------------------------------------------------------------------
# CPU: the Triton kernels through the interpreter
# ----------------------------------------------------------------------------------------------


def adversarial_for_sample(rows: int, n: int, sample: int, k: int, g: torch.Generator):
    """Scores whose sample (pass 1's positions) over-represents the top: fewer than k large
    values, all at sampled positions, so the sampled threshold misses (fewer candidates than k)
    and the exact whole-row fallback must run."""
    s = torch.rand(rows, n, generator=g)
    j = torch.arange(sample)
    pos = (j // 8) * max(n // (sample // 8), 8) + j % 8
    pos = pos[pos < n]
    w = min(len(pos), int(2 * k * sample / n) + 60)
    assert w < k
    s[:, pos[:w]] = 10.0
    return s


def _interp_main() -> None:  # runs in the subprocess, TRITON_INTERPRET=1
    assert os.environ.get("TRITON_INTERPRET") == "1"
    g = torch.Generator().manual_seed(5)
    knobs = dict(sample=64, block=128, block_r=128, programs=12)
    cases = 0
    for kind in KINDS:
        for path in ("sample",):
            rows = 3
            n = int(torch.randint(200, 700, (1,), generator=g))
            k = int(torch.randint(1, 200, (1,), generator=g))
            s = make_scores(kind, rows, n, g)
            lengths = torch.tensor([n, int(torch.randint(0, n, (1,), generator=g)), k // 2])
            ps = 8
            pt = torch.randperm(4000, generator=g)[: (n + ps - 1) // ps].view(1, -1).int()
            for lens, table in ((None, None), (lengths, pt)):
                idx, slots = T.topk_v2(s, k, table, ps, lens, path=path, **knobs)
                check_against_reference(s, k, idx, slots, lens, table, ps)
                cases += 1
    # the sampled threshold misses -> exact fallback over the whole row
    s = adversarial_for_sample(2, 600, 64, 150, g)
    idx, slots = T.topk_v2(s, 150, path="sample", **knobs)
    check_against_reference(s, 150, idx, slots)
    # candidates beyond the register tile -> the streamed exact select
    s = make_scores("duplicates", 2, 900, g)
    idx, slots = T.topk_v2(s, 300, path="sample", **knobs)
    check_against_reference(s, 300, idx, slots)
    # the workspace resets itself: a second call on other data is right too
    s = make_scores("random", 2, 700, g)
    for _ in range(2):
        idx, slots = T.topk_v2(s, 50, path="sample", **knobs)
        check_against_reference(s, 50, idx, slots)
        s = make_scores("duplicates", 2, 700, g)
    print(f"INTERP_OK {cases}")


@pytest.mark.skipif(not HAVE_TRITON, reason="triton not installed")
def test_triton_kernels_in_interpreter():
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=ROOT)
    code = ("import sys; sys.path.insert(0, %r); import test_kernels_topk as t; t._interp_main()"
            % os.path.dirname(os.path.abspath(__file__)))
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=HANG_S)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "INTERP_OK" in p.stdout


# ----------------------------------------------------------------------------------------------
# GPU
# ----------------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("n", [8192, 32768, 81920, 262144])
@pytest.mark.parametrize("kind", ["random", "duplicates", "nan"])
def test_gpu_exact_sets(n, kind):
    g = torch.Generator().manual_seed(n)
    s = make_scores(kind, 7, n, g)
    ps = 64
    pt = torch.randperm(1 << 16, generator=g)[: (n + ps - 1) // ps].view(1, -1).int()
    lengths = torch.tensor([n, n - 1, n // 2, 3000, 2048, 100, 0])
    for lens in (None, lengths):
        idx, slots = T.topk_v2(s.cuda(), 2048, pt.cuda(), ps,
                               None if lens is None else lens.cuda())
        check_against_reference(s, 2048, idx.cpu(), slots.cpu(), lens, pt, ps)


@pytest.mark.gpu
@pytest.mark.parametrize("path", ["sample"])
def test_gpu_sample_miss_and_big_candidate_sets(path):
    g = torch.Generator().manual_seed(1)
    for s in (adversarial_for_sample(7, 81920, T.default_plan(81920)[0], 2048, g),
              make_scores("duplicates", 7, 81920, g), make_scores("zeros", 7, 20000, g)):
        idx, slots = T.topk_v2(s.cuda(), 2048, path=path)
        check_against_reference(s, 2048, idx.cpu(), slots.cpu())


@pytest.mark.gpu
def test_gpu_cuda_graph_replay():
    n = 262144
    s = torch.randn(7, n, device="cuda")
    T.topk_v2(s, 2048)  # compile + workspace
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        idx, slots = T.topk_v2(s, 2048)
    for _ in range(3):
        s.copy_(torch.randn(7, n, device="cuda"))
        graph.replay()
        torch.cuda.synchronize()
        check_against_reference(s.cpu(), 2048, idx.cpu(), slots.cpu())


# ----------------------------------------------------------------------------------------------
# GPU: the CUDA C++ kernel (csrc/topk_v2.cu; sm_90+, built with nvcc at first use)
# ----------------------------------------------------------------------------------------------


@pytest.fixture
def cuda_topk():
    from profkit.proxy.kernels import topk_cuda

    why = topk_cuda.unavailable_reason()
    if why:
        pytest.skip(f"CUDA TopK-V2 unavailable: {why}")
    return topk_cuda


def _cuda_check(s, k, lens=None, pt=None, ps=1, cluster=None):
    dev = "cuda"
    idx, slots = T.topk_v2(s.to(dev), k, None if pt is None else pt.to(dev), ps,
                           None if lens is None else lens.to(dev), path="cuda", cluster=cluster)
    torch.cuda.synchronize()
    idx, slots = idx.cpu(), slots.cpu()
    check_against_reference(s.float(), k, idx, slots, lens, pt, ps)
    assert (idx[idx < 0] == -1).all()  # every output element written: positions or -1


@pytest.mark.gpu
@pytest.mark.parametrize("n", [1000, 8193, 81920, 262144])
@pytest.mark.parametrize("kind", KINDS)
def test_gpu_cuda_exact_sets(cuda_topk, n, kind):
    g = torch.Generator().manual_seed(1000 + n + KINDS.index(kind))
    rows = 7
    s = make_scores(kind, rows, n, g)
    for case, (k, cluster) in enumerate([(2048, None), (1, None), (int(torch.randint(2, 2049, (1,),
                                         generator=g)), None), (2048, 1), (2048, 4), (777, 16)]):
        if case >= 3 and n < 8000:
            continue
        ps = 64 if case % 2 == 0 else 1
        npages = (n + ps - 1) // ps
        dt = torch.int32 if case % 2 == 0 else torch.int64
        pt = torch.randperm(max(4 * npages, 1 << 12), generator=g)[:npages].view(1, -1).to(dt)
        lens = None
        if case % 3 == 1:
            lens = torch.tensor([n, n - 1, n // 2, 3000, 2048, 100, 0])
        elif case % 3 == 2:
            lens = torch.randint(0, n + 1, (rows,), generator=g)
        _cuda_check(s, k, lens, pt, ps, cluster)


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["random", "duplicates", "nan", "wide"])
def test_gpu_cuda_1m(cuda_topk, kind):
    g = torch.Generator().manual_seed(77)
    n = 1 << 20
    s = make_scores(kind, 7, n, g)
    pt = torch.randperm(1 << 16, generator=g)[: n // 64].view(1, -1).int()
    _cuda_check(s, 2048, None, pt, 64)
    _cuda_check(s, 2048, torch.tensor([n, 999999, 500000, 81920, 2049, 2048, 1]), pt, 64)


@pytest.mark.gpu
@pytest.mark.parametrize("stash,sample4,flags", [(0, 4, None), (8192, 4, None), (8192, 2, None),
                                                (8192, 1, None), (64, 4, None), (8192, 4, 0),
                                                (64, 4, 0), (8192, 2, 1), (256, 1, 3)])
def test_gpu_cuda_streamed_variants(cuda_topk, stash, sample4, flags):
    """The streamed chunks' variants (topk_cuda.STASH / SAMPLE4 / FLAGS): no stash (pass 2
    re-reads the chunk), the shared-memory stash with 1, 2 or 4 float4s per thread of the first
    tile counted for the lower bound, a tiny stash that overflows on random rows (the re-read
    fallback), each with the default flags, the per-score appends (0), warp-aggregated appends
    without (1) and with L2 prefetch (3), and prefetch alone (2)."""
    g = torch.Generator().manual_seed(90 + stash + sample4)
    kw = dict(stash=stash, sample4=sample4, flags=flags)
    n = 1 << 20
    pt = torch.randperm(1 << 16, generator=g)[: n // 64].view(1, -1).int()
    for kind, lens, cluster, ks in (("random", None, None, (2048, 9000)),
                                    ("nan", None, None, (2048,)),
                                    ("duplicates", None, None, (2048,)),
                                    ("wide", "mixed", None, (2048,)),
                                    ("random", "mixed", 8, (1,)), ("neg_inf", None, 4, (2048,))):
        s = make_scores(kind, 7, n, g)
        if lens == "mixed":
            lens = torch.tensor([n, n - 3, 700000, 300000, 262145, 5000, 0])
        for k in ks:
            idx, slots = cuda_topk.topk_v2_cuda(s.cuda(), k, pt.cuda(), 64,
                                                None if lens is None else lens.cuda(),
                                                cluster=cluster, **kw)
            torch.cuda.synchronize()
            check_against_reference(s, k, idx.cpu(), slots.cpu(), lens, pt, 64)
    # rows ordered ascending: the first tiles (the sample) hold the lowest scores, so the bound
    # is low and the stash overflows after the sample predicted that it fits (re-read fallback)
    s = torch.arange(n, dtype=torch.float32).mul(1e-4).expand(7, n).contiguous()
    idx, slots = cuda_topk.topk_v2_cuda(s.cuda(), 2048, **kw)
    check_against_reference(s, 2048, idx.cpu(), slots.cpu())
    # 1M-position rows not 16-byte aligned (a view on the GPU, row stride n + 1, offset 1: the
    # first vector holds scores of the row before, which the stash's position filter drops)
    xg = (torch.randn(7, n + 1, generator=g) * 4).cuda()[:, 1:]
    idx, slots = cuda_topk.topk_v2_cuda(xg, 2048, **kw)
    check_against_reference(xg.cpu(), 2048, idx.cpu(), slots.cpu())
    # streamed on one CTA (81,921 positions, misaligned) and on 4 CTAs of a 262,144 row
    big = torch.randn(7, 81925, generator=g)
    x = big[:, 2:81923]
    idx, slots = cuda_topk.topk_v2_cuda(x.cuda(), 2048, cluster=1, **kw)
    check_against_reference(x.contiguous(), 2048, idx.cpu(), slots.cpu())
    s = make_scores("random", 7, 262144, g)
    idx, slots = cuda_topk.topk_v2_cuda(s.cuda(), 777, cluster=4, **kw)
    check_against_reference(s, 777, idx.cpu(), slots.cpu())


@pytest.mark.gpu
def test_gpu_cuda_ragged_batches(cuda_topk):
    """Rows of different lengths in one launch, batch 1-16 (x 7 rows per request: one page-table
    row per request), for the planned and forced cluster sizes."""
    g = torch.Generator().manual_seed(5)
    for batch in (1, 3, 16):
        for n in (20000, 300000):
            rows = batch * 7
            s = make_scores("random" if batch != 3 else "duplicates", rows, n, g)
            lens = torch.randint(0, n + 1, (rows,), generator=g)
            lens[torch.rand(rows, generator=g) < 0.2] = n
            pt = torch.stack([torch.randperm(n, generator=g) for _ in range(batch)]).int()
            for cluster in (None, 2, 8):
                _cuda_check(s, 2048, lens, pt, 1, cluster)


@pytest.mark.gpu
def test_gpu_cuda_overflow_ties_and_misalignment(cuda_topk):
    g = torch.Generator().manual_seed(6)
    # boundary bins far beyond the 16K shared-memory candidates: the global workspace path
    for kind, n in (("narrow", 262144), ("zeros", 100000), ("duplicates", 1 << 20)):
        s = make_scores(kind, 3, n, g)
        for k in (2048, 1, 20000):
            _cuda_check(s, k)
    # rows not 16-byte aligned: odd widths, and a view with a storage offset
    for n in (8191, 81921):
        big = torch.randn(5, n + 3, generator=g)
        _cuda_check(big[:, 1:n + 1], 2048)
        _cuda_check(big[:, 3:], 1000, torch.tensor([n, 7, 0, n - 5, 4096]))
    # k larger than the row, lengths of 0 and 1, bf16 input (upcast)
    s = torch.randn(4, 3000, generator=g)
    _cuda_check(s, 2048 * 2, torch.tensor([3000, 1, 0, 2999]))
    _cuda_check(s.bfloat16(), 500)


@pytest.mark.gpu
def test_gpu_cuda_kernel_graph_replay_kinds(cuda_topk):
    n = 81920
    s = torch.randn(7, n, device="cuda")
    pt = torch.randperm(1 << 16, device="cuda")[: n // 64].view(1, -1).int()
    T.topk_v2(s, 2048, pt, 64)  # build + workspace
    assert T.backend("cuda") == "cuda"
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        idx, slots = T.topk_v2(s, 2048, pt, 64)
    for kind in ("random", "duplicates", "nan"):
        h = make_scores(kind, 7, n, torch.Generator().manual_seed(3))
        s.copy_(h.cuda())
        graph.replay()
        torch.cuda.synchronize()
        check_against_reference(h, 2048, idx.cpu(), slots.cpu(), None, pt.cpu(), 64)


@pytest.mark.gpu
def test_gpu_proxy_contract_uses_cuda(cuda_topk):
    from profkit.proxy import kernels, ops

    g = torch.Generator().manual_seed(11)
    B, Q, N, k = 2, 7, 9000, 2048
    s = torch.randint(-50, 50, (B, Q, N), generator=g).float()
    lengths = torch.tensor([[8000], [9000]]).expand(B, Q)
    st = torch.randperm(50000, generator=g)[: B * N].view(B, 1, N)
    want = ops.topk_v1(s, lengths, k, st)
    got = ops.topk_v2(s.cuda(), lengths.cuda(), k, st.cuda()).cpu()
    assert got.shape == want.shape and got.dtype == torch.int64
    for b in range(B):
        for q in range(Q):
            assert set(got[b, q].tolist()) == set(want[b, q].tolist())
    assert kernels.backends("cuda")["topk_v2"] == "cuda"
