"""Unit tests of the proxy engine's switchable ops and its KV/prefix bookkeeping (CPU)."""

import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from profkit.proxy import ops  # noqa: E402
from profkit.proxy.kvcache import OutOfPages, PagedKVPool  # noqa: E402


def _ref_set(scores, length, k):
    """Reference: torch.topk's set with ties broken by lowest index."""
    row = scores[:length]
    kk = min(k, length)
    if kk == 0:
        return set()
    _, order = torch.sort(row, descending=True, stable=True)
    ref = set(order[:kk].tolist())
    if len(set(row.tolist())) == length and not torch.isinf(row).any():  # no ties
        assert ref == set(torch.topk(row, kk).indices.tolist())
    return ref


@pytest.mark.parametrize("kind", ["random", "duplicates", "neg_inf", "short", "zeros"])
def test_topk_v2_same_set_as_torch_topk(kind):
    g = torch.Generator().manual_seed(hash(kind) % 1000)
    for trial in range(40):
        n = int(torch.randint(1, 700, (1,), generator=g))
        k = int(torch.randint(1, 96, (1,), generator=g))
        s = torch.randn(4, n, generator=g)
        if kind == "duplicates":
            s = torch.randint(-3, 3, (4, n), generator=g).float()
        elif kind == "neg_inf":
            s[:, ::2] = float("-inf")
        elif kind == "zeros":
            s = torch.zeros(4, n)
            s[:, n // 2:] = -0.0
        lengths = torch.randint(0, n + 1, (4,), generator=g)
        if kind == "short":
            lengths = torch.randint(0, min(n, k) + 1, (4,), generator=g)
        v2 = ops.topk_v2(s, lengths, k)
        v1 = ops.topk_v1(s, lengths, k)
        assert v2.shape == (4, min(k, n))
        for r in range(4):
            ref = _ref_set(s[r], int(lengths[r]), k)
            got = [x for x in v2[r].tolist() if x >= 0]
            assert len(got) == len(set(got)) == len(ref)
            assert set(got) == ref, (trial, r)
            assert {x for x in v1[r].tolist() if x >= 0} == ref


def test_topk_slot_translation_fused_matches_v1():
    g = torch.Generator().manual_seed(1)
    B, Q, L, ps = 3, 4, 300, 16
    scores = torch.randn(B, Q, L, generator=g)
    pages = torch.randint(1, 100, (B, (L + ps - 1) // ps), generator=g)
    pos = torch.arange(L)
    slot_table = pages[:, pos // ps] * ps + pos % ps
    lengths = torch.randint(1, L + 1, (B, Q), generator=g)
    a = ops.topk_v1(scores, lengths, 64, slot_table.unsqueeze(1))
    b = ops.topk_v2(scores, lengths, 64, slot_table.unsqueeze(1))
    for i in range(B):
        for q in range(Q):
            assert set(a[i, q].tolist()) == set(b[i, q].tolist())


def test_topk_v2_has_no_sort_and_no_host_sync():
    from torch.profiler import ProfilerActivity, profile

    s, n = torch.randn(2, 3, 500), torch.tensor([[500, 20, 1], [0, 499, 77]])
    with profile(activities=[ProfilerActivity.CPU]) as p:
        ops.topk_v2(s, n, 64)
    names = {e.name for e in p.events()}
    assert not names & {"aten::sort", "aten::topk", "aten::item", "aten::_local_scalar_dense",
                        "aten::nonzero"}


def _prologue_inputs(seed=0, T=7, H=64, ql=48, nh=4, d=32, rope=16):
    g = torch.Generator().manual_seed(seed)
    wk, wp = torch.randn(d, H, generator=g) / H ** .5, torch.randn(nh, H, generator=g) / H ** .5
    w = {"n_heads": nh, "head_dim": d, "hadamard": ops.hadamard_matrix(d),
         "wq_b": torch.randn(nh * d, ql, generator=g) / ql ** .5, "wk": wk, "weights_proj": wp,
         "wk_weights_proj": torch.cat([wk, wp], 0),
         "k_norm_w": torch.ones(d),
         "k_norm_b": torch.zeros(d), "gate_scale": nh ** -.5 * d ** -.5}
    x, q_lat = torch.randn(T, H, generator=g), torch.randn(T, ql, generator=g)
    f = torch.arange(T).float()[:, None] * 10000 ** (-torch.arange(0, rope, 2).float() / rope)
    cos, sin = torch.cos(f), torch.sin(f)
    rope = {"cos": cos, "sin": sin, "cis": ops.rope_cis(cos, sin, d)}
    return w, x, q_lat, rope, cos, sin


def test_indexer_prologue_fused_close_to_unfused():
    w, x, q_lat, rope, cos, sin = _prologue_inputs()
    T, d = x.shape[0], w["head_dim"]
    slots = torch.arange(T) + 3
    out = {}
    for name, fn in (("unfused", ops.indexer_prologue_unfused),
                     ("fused", ops.indexer_prologue_fused)):
        cache = torch.zeros(T + 8, d + 4, dtype=torch.uint8)
        qq, gate = fn(w, x, q_lat, cos, sin, cache, slots)
        assert qq.dtype == ops.FP8 and gate.shape == (T, w["n_heads"])
        qq = qq.reshape(T, w["n_heads"], d)
        rows = cache[slots].unsqueeze(0)
        out[name] = ops.indexer_logits(qq.unsqueeze(0), gate.unsqueeze(0), rows, d)[0]
    # fp32 reference without quantization
    k = torch.nn.functional.layer_norm(x @ w["wk"].T, (d,))
    k = ops._rope_unfused(k, cos, sin)
    q = ops._rope_unfused((q_lat @ w["wq_b"].T).unflatten(-1, (w["n_heads"], d)),
                          cos.unsqueeze(1), sin.unsqueeze(1))
    gate = (x @ w["weights_proj"].T) * w["gate_scale"]
    ref = torch.einsum("thd,ld->thl", q, k).relu() .mul(gate.unsqueeze(-1)).sum(1)
    scale = ref.abs().max()
    for name, got in out.items():
        assert (got - ref).abs().max() / scale < 0.1, name
    assert (out["fused"] - out["unfused"]).abs().max() / scale < 0.1


def test_indexer_prologue_fused_has_fewer_ops():
    from torch.profiler import ProfilerActivity, profile

    w, x, q_lat, rope, _, _ = _prologue_inputs()
    counts = {}
    for name, fn in (("unfused", ops.indexer_prologue_unfused),
                     ("fused", ops.indexer_prologue_fused)):
        cache = torch.zeros(20, w["head_dim"] + 4, dtype=torch.uint8)
        with profile(activities=[ProfilerActivity.CPU]) as p:
            fn(w, x, q_lat, rope["cos"], rope["sin"], cache, torch.arange(7), cis=rope["cis"])
        ev = [e.name for e in p.events()]
        counts[name] = (len(ev), ev.count("aten::linear"), ev.count("aten::matmul"))
    assert counts["fused"][0] < counts["unfused"][0]
    assert counts["unfused"][1] == 3 and counts["fused"][1] == 2  # wk+weights_proj fused


def test_moe_finalize_deferred_same_output():
    g = torch.Generator().manual_seed(3)
    E, N, H, I = 8, 5, 16, 12
    eo = torch.randn(E, N, H, generator=g)
    act, w2 = torch.randn(N, I, generator=g), torch.randn(H, I, generator=g)
    w = torch.zeros(N, E).scatter_(1, torch.randint(0, E, (N, 2), generator=g), 0.5)
    a = ops.moe_finalize(eo, w, act, w2, deferred=False)
    b = ops.moe_finalize(eo, w, act, w2, deferred=True)
    ref = torch.einsum("ne,enh->nh", w, eo) + act @ w2.T
    torch.testing.assert_close(a, ref)
    torch.testing.assert_close(b, ref)


def test_prefix_cache_reuse_and_release():
    pool = PagedKVPool(num_pages=20, page_size=4)
    toks = list(range(100, 114))  # 14 tokens: 3 full pages
    pages, path = pool.match_prefix(toks)
    assert pages == [] and path == []
    own = pool.alloc(5)
    pool.insert_and_release(toks + [7, 8, 9], own, valid_len=16, locked=[])
    assert pool.stats()["cached_pages"] == 4  # 16 valid positions
    # the next turn extends the sequence: hits the 4 cached pages (16 tokens)
    turn2 = toks + [7, 8, 9] + [1, 2, 3, 4, 5]
    pages2, path2 = pool.match_prefix(turn2)
    assert pages2 == own[:4] and len(path2) == 4
    # at least one token must be left to compute
    pages3, path3 = pool.match_prefix(toks[:12])
    assert len(pages3) == 2
    pool.unlock(path3)
    # locked pages are not evicted; unlocked ones are, leaf first
    free_before = len(pool.free)
    with pytest.raises(OutOfPages):
        pool.alloc(free_before + 1)
    pool.unlock(path2)
    got = pool.alloc(free_before + 4)
    assert len(got) == free_before + 4 and pool.stats()["cached_pages"] == 0
    pool.release(got)


def test_proxy_package_imports_without_torch():
    code = ("import sys; import profkit, profkit.proxy, profkit.proxy.config, "
            "profkit.proxy.kvcache; assert 'torch' not in sys.modules, 'torch imported'; "
            "print(profkit.proxy.SWITCHES)")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": ROOT})
    assert r.returncode == 0, r.stderr
    assert "topk_v2" in r.stdout
