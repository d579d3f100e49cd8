"""TopK-V2: *selection* (not a sort) of the k largest indexer scores per row, fused with the
logical-position -> physical KV-cache-slot translation (page table).

Public API
----------
``topk_v2(scores, k, page_table=None, page_size=1, lengths=None) -> (indices, slots)``

* ``scores``: float tensor ``[rows, n]`` (fp32; other float dtypes are upcast), last dim contiguous.
* ``k``: python int, runtime value (any k >= 1; the study's kernels support up to 2048).
* ``page_table``: int tensor ``[pt_rows, n_pages]`` with ``rows % pt_rows == 0``; score row ``r``
  uses page-table row ``r // (rows // pt_rows)`` (so one table row can serve all the draft-token
  rows of a request). ``None``: slots are the logical positions.
* ``page_size``: positions per page; slot = ``page_table[pt_row, pos // page_size] * page_size +
  pos % page_size``. With ``page_size=1`` the page table is a per-position slot table.
* ``lengths``: optional int tensor ``[rows]``: position ``p`` of row ``r`` is a candidate iff
  ``p < lengths[r]`` (default: all ``n``).
* returns ``indices`` int32 ``[rows, k]`` (logical positions) and ``slots`` int32 ``[rows, k]``.
  A row selects ``min(k, length)`` entries; the rest of the row is ``-1`` in both outputs.

``topk_slots(scores, lengths, k, slot_table=None)`` is the same selection with the proxy's
``ops.topk_v2`` contract (int64 slots ``[..., min(k, N)]``, -1 padded).

Selection rule (the same *set* as ``torch.topk`` / a stable descending sort): the ``min(k, length)``
largest scores; among equal scores the lowest positions win; ``-0.0 == +0.0``; **NaN ranks above
+inf** (as in ``torch.topk`` / ``torch.sort``), NaNs among themselves by lowest position.
**Order** of the selected entries inside a row: unspecified on CUDA (atomic emission order; compare
as sets); the CPU twin returns them in ascending position order.

CUDA kernel (``path="cuda"``; what ``path="auto"`` runs on CUDA when it builds: sm_90+, ``nvcc``
on the machine; one launch, kernel name ``topk_v2_cluster_kernel<C>``; topk_cuda.py and
csrc/topk_v2.cu): the study's design. A score row is split across a thread-block cluster of C CTAs
(C from the batch's shape: ``topk_cuda.plan``); each CTA keeps its chunk in registers when it fits
(else streams it) and builds a 1,024-bin shared-memory histogram of the fp16-rounded keys
(``coarse_bins``); a cluster-wide reduction through distributed shared memory finds the bin of the
need-th largest score; scores above it are emitted directly, the bin's scores are selected exactly
(11-bit radix rounds on the full fp32 key and the position) by the leader CTA. ``backend(device)``
says which implementation runs; the Triton plans below are the fallback where the CUDA kernel is
unavailable, and the CPU path is the torch twin.

Triton plan (``path="sample"``, the fallback where the CUDA kernel is unavailable; three Triton
launches, kernel names ``topk_v2_*``)
1. ``topk_v2_sample_kernel`` (one program per row): order-preserving int32 keys of a sample of the
   row (runs of 8 consecutive positions = one 32-byte sector each, spread evenly; the whole row when
   it fits) give a threshold ``t``: the ``want``-th largest sampled key, ``want`` = the expected
   number of samples at or above the row's ``need``-th largest score (``need = min(k, length)``)
   plus a 4-sigma + 4 margin, found by a 32-step bitwise search on register-resident keys;
2. ``topk_v2_filter_kernel`` (P programs per row, ~264 in all; the one full read of the row,
   16-byte loads): every position whose key reaches ``t`` is appended to the row's candidate list
   (one atomic per 4,096-element tile for the offsets);
3. ``topk_v2_select_kernel`` (one program per row): exact top-``need`` among the candidates on the
   full 32-bit key (bitwise search for the need-th largest key ``T``; ties at ``T`` to the lowest
   positions by a second bitwise search on the position, only when needed), with the candidates in
   registers when they fit (``block_r``), streamed otherwise; emits positions and page-table slots,
   pads with -1, and resets the row's counter (the workspace stays zeroed, no memset launch). If
   the sampled threshold missed (fewer candidates than ``need``, which takes an adversarial row)
   it selects exactly from the whole row instead: always exact, only slower.

Measured on the H200 (benchmarks/RESULTS_kernels.md): the CUDA kernel takes 17.0 us at 80K
positions and 35.4 us at 1M graph-replayed, the Triton plan 40.6 / 72.6 us. Two Triton variants
were measured slower there and are no longer here: the study's histogram plan in Triton
(``tl.histogram`` costs ~bins * log2(bins) operations per element: 68 us at 80K and 234 us at 1M
with 1,024 bins) and radix rounds in place of the 32-step bitwise searches (44.2 / 79.1 us).

Workspace buffers are cached per device and reused, so calls can be captured in a CUDA graph.
Not safe for concurrent calls on several streams of one device.
"""

from __future__ import annotations

import math

import torch

from ._triton import HAVE_TRITON, use_triton

SAMPLE = 4096  # default sample per row for the twin (the dispatcher's sizes: default_plan)
BLOCK = 4096  # elements per tile in the streaming pass
TARGET_PROGRAMS = 264  # programs per launch for the streaming pass (2 per SM on a 132-SM H200)
NUM_WARPS = 8
BLOCK_R = 8192  # candidates held in registers by the exact select (more: a streamed path)
LOG2NB = 10  # the CUDA kernel's coarse histogram: 1,024 bins of fp16-rounded keys (coarse_bins)

# ----------------------------------------------------------------------------------------------
# torch twin (CPU) + reference
# ----------------------------------------------------------------------------------------------


def coarse_bins(x: torch.Tensor, log2nb: int = LOG2NB) -> torch.Tensor:
    """fp32 -> coarse bin (int64) of the fp16-rounded order-preserving key; NaN -> top bin."""
    b = x.float().contiguous().view(torch.int32)
    b = torch.where((b & 0x7FFFFFFF) == 0, torch.zeros_like(b), b)  # -0.0 -> +0.0
    h = b.view(torch.float32).to(torch.float16).view(torch.int16).to(torch.int32)
    sk = h ^ ((h >> 15) & 0x7FFF)
    bins = ((sk + 32768) >> (16 - log2nb)).to(torch.int64)
    return torch.where(torch.isnan(x), (1 << log2nb) - 1, bins)


def full_keys(x: torch.Tensor) -> torch.Tensor:
    """fp32 -> int64 keys in [0, 2^32) ordered like the floats; -0 == +0; NaN above +inf."""
    b = x.float().contiguous().view(torch.int32)
    mag = b & 0x7FFFFFFF
    b = torch.where(mag == 0, torch.zeros_like(b), b)
    b = torch.where(mag > 0x7F800000, torch.full_like(b, 0x7FFFFFFF), b)
    sk = b ^ ((b >> 31) & 0x7FFFFFFF)
    return sk.to(torch.int64) + 2147483648


def _lengths(lengths, rows, n, device):
    if lengths is None:
        return torch.full((rows,), n, dtype=torch.int64, device=device)
    return lengths.reshape(rows).to(device=device, dtype=torch.int64).clamp(0, n)


def _slots_of(idx: torch.Tensor, page_table, page_size: int) -> torch.Tensor:
    """idx int64 [rows, m] (>= 0) -> slots int64 via the page table."""
    if page_table is None:
        return idx
    rows = idx.shape[0]
    rep = rows // page_table.shape[0]
    pt = page_table.to(torch.int64).repeat_interleave(rep, 0)
    return torch.gather(pt, 1, idx // page_size) * page_size + idx % page_size


def signed_keys(x: torch.Tensor) -> torch.Tensor:
    """fp32 -> int64 in [-2^31, 2^31) ordered like the floats (the kernels' int32 keys)."""
    return full_keys(x) - 2147483648


def sample_thresholds(x: torch.Tensor, length: torch.Tensor, need: torch.Tensor,
                      sample: int = SAMPLE) -> torch.Tensor:
    """Pass 1 of the default plan: per row, the want-th largest key of a sample of `sample`
    scores (runs of 8 consecutive positions spread evenly over the row), want = the expected
    count at or above the row's need-th largest plus a 4-sigma + 4 margin (the whole row, so
    exact, when length <= sample)."""
    rows, n = x.shape
    key = signed_keys(x)
    j = torch.arange(sample, device=x.device).unsqueeze(0)
    rstride = (length // (sample // 8)).clamp(min=8).unsqueeze(1)
    pos = (j // 8) * rstride + j % 8
    m = pos < length.unsqueeze(1)
    sk = torch.where(m, key.gather(1, pos.clamp(max=max(n - 1, 0))), -(1 << 40))
    s_eff = m.sum(1)
    e = need.float() * s_eff.float() / length.clamp(min=1).float()
    want = torch.minimum((e + 4.0 * e.sqrt() + 4.0).to(torch.int64), s_eff)
    want = torch.where(length <= sample, need, want)
    srt = sk.sort(1, descending=True).values
    t = srt.gather(1, (want - 1).clamp(min=0).unsqueeze(1)).squeeze(1)
    return torch.where(want > 0, t, torch.full_like(t, 2147483647))


def topk_v2_twin(scores: torch.Tensor, k: int, page_table: torch.Tensor | None = None,
                 page_size: int = 1, lengths: torch.Tensor | None = None,
                 sample: int = SAMPLE) -> tuple[torch.Tensor, torch.Tensor]:
    """The default plan of the Triton kernels, in torch ops (CPU, or any device), sync-free:
    sampled threshold -> candidates (every score reaching it) -> exact top-need among the
    candidates (the whole row when the sample missed), ties to the lowest position.

    Outputs are in ascending position order within each row, -1 padded (see the module doc).
    """
    x = scores.float()
    rows, n = x.shape
    dev = x.device
    length = _lengths(lengths, rows, n, dev)
    need = length.clamp(max=k)
    pos = torch.arange(n, device=dev)
    valid = pos < length.unsqueeze(1)
    key = signed_keys(x)
    t = sample_thresholds(x, length, need, sample)
    cand = valid & (key >= t.unsqueeze(1))
    missed = cand.sum(1) < need
    cand = torch.where(missed.unsqueeze(1), valid, cand)
    # exact: a stable descending sort of the candidates' keys keeps the lowest positions first
    ckey = torch.where(cand, key, -(1 << 40))
    order = ckey.sort(dim=1, descending=True, stable=True).indices
    rank = torch.empty_like(order)
    rank.scatter_(1, order, pos.expand(rows, n).clone())
    sel = cand & (rank < need.unsqueeze(1))
    # emit in position order, translate, pad
    dst = torch.where(sel, sel.cumsum(1) - 1, k)
    idx = torch.full((rows, k + 1), -1, dtype=torch.int64, device=dev)
    idx.scatter_(1, dst, pos.expand(rows, n).clone())
    idx = idx[:, :k]
    slots = torch.where(idx >= 0, _slots_of(idx.clamp(min=0), page_table, page_size), -1)
    return idx.to(torch.int32), slots.to(torch.int32)


def topk_reference(scores: torch.Tensor, k: int, lengths: torch.Tensor | None = None):
    """Plain reference: stable descending sort of each row's valid prefix, first min(k, len).

    Returns a list (one per row) of int64 index tensors in rank order (ties by lowest index, NaN
    first, as torch.sort orders them).
    """
    rows, n = scores.shape
    length = _lengths(lengths, rows, n, scores.device).tolist()
    out = []
    for r in range(rows):
        x = scores[r, : length[r]].float()
        x = torch.where(x == 0, torch.zeros_like(x), x)  # -0.0 == +0.0
        _, order = torch.sort(x, descending=True, stable=True)
        out.append(order[:k])
    return out


# ----------------------------------------------------------------------------------------------
# Triton kernels
# ----------------------------------------------------------------------------------------------


if HAVE_TRITON:
    import triton
    import triton.language as tl

    @triton.jit
    def _row_length(len_ptr, row, n, HAS_LEN: tl.constexpr):
        if HAS_LEN:
            length = tl.minimum(tl.maximum(tl.load(len_ptr + row).to(tl.int32), 0), n)
        else:
            length = n + row * 0
        return length

    @triton.jit
    def _to_slot(idx, pt_row_ptr, page_size, mask, HAS_PT: tl.constexpr):
        if HAS_PT:
            page = tl.load(pt_row_ptr + idx // page_size, mask=mask, other=0).to(tl.int32)
            slot = page * page_size + idx % page_size
        else:
            slot = idx
        return slot

    @triton.jit
    def _skey(x):
        """fp32 -> int32 whose signed order is the float order; -0 == +0; NaN above +inf."""
        bits = x.to(tl.int32, bitcast=True)
        mag = bits & 0x7FFFFFFF
        bits = tl.where(mag == 0, 0, bits)
        bits = tl.where(mag > 0x7F800000, 0x7FFFFFFF, bits)
        return bits ^ ((bits >> 31) & 0x7FFFFFFF)

    @triton.jit
    def _signed(c):
        """unsigned 32-bit search value (int64) -> the int32 signed-order key it stands for."""
        return (c - 2147483648).to(tl.int32)

    @triton.jit
    def _kth_largest_regs(key, m, want):
        """Largest t with count(key >= t) >= want among the lanes m (= the want-th largest key;
        INT32_MAX when want == 0): a 32-step bitwise search on register-resident keys."""
        ans = tl.zeros([], dtype=tl.int64)
        one = tl.full([], 1, tl.int64)
        for i in range(32):
            c = ans | (one << (31 - i))
            cnt = tl.sum(((key >= _signed(c)) & m).to(tl.int32), 0)
            ans = tl.where(cnt >= want, c, ans)
        return _signed(ans)

    @triton.jit
    def topk_v2_sample_kernel(scores_ptr, stride_s, len_ptr, thr_ptr, n, k,
                              HAS_LEN: tl.constexpr, S: tl.constexpr):
        """Pass 1 (one program per row): a strided sample of S scores gives a threshold t that
        at least need = min(k, length) scores of the row reach, with a wide safety margin (exact
        when the row has <= S positions). A miss is detected and handled exactly in pass 3."""
        row = tl.program_id(0)
        length = _row_length(len_ptr, row, n, HAS_LEN)
        need = tl.minimum(length, k)
        # runs of 8 consecutive positions (one 32-byte sector each), spread over the row
        j = tl.arange(0, S)
        rstride = tl.maximum(length // (S // 8), 8)
        pos = (j // 8) * rstride + (j % 8)
        m = pos < length
        x = tl.load(scores_ptr + row.to(tl.int64) * stride_s + pos, mask=m, other=0.0)
        key = _skey(x)
        s_eff = tl.sum(m.to(tl.int32), 0)
        e = need.to(tl.float32) * s_eff.to(tl.float32) / tl.maximum(length, 1).to(tl.float32)
        want = tl.minimum((e + 4.0 * tl.sqrt(e) + 4.0).to(tl.int32), s_eff)
        want = tl.where(length <= S, need, want)
        tl.store(thr_ptr + row, _kth_largest_regs(key, m, want))

    @triton.jit
    def _filter_tile(x, offs, m, t, cnt_row, cand_row):
        sel = m & (_skey(x) >= t)
        s32 = sel.to(tl.int32)
        ns = tl.sum(s32, 0)
        if ns > 0:
            base = tl.atomic_add(cnt_row, ns, sem="relaxed")
            tl.store(cand_row + base + tl.cumsum(s32, 0) - 1, offs, mask=sel)

    @triton.jit
    def topk_v2_filter_kernel(scores_ptr, stride_s, len_ptr, thr_ptr, cnt_ptr, cand_ptr, n,
                              chunk, HAS_LEN: tl.constexpr, BLOCK: tl.constexpr):
        """Pass 2 (P programs per row, one read of the row): every position whose score reaches
        the row's threshold goes to the row's candidate list (one atomic per tile)."""
        row = tl.program_id(0)
        pid = tl.program_id(1)
        length = _row_length(len_ptr, row, n, HAS_LEN)
        t = tl.load(thr_ptr + row)
        start = pid * chunk
        end = tl.minimum(start + chunk, length)
        srow = scores_ptr + row.to(tl.int64) * stride_s
        cand_row = cand_ptr + row.to(tl.int64) * n
        cnt_row = cnt_ptr + row * 2
        full_end = start + tl.maximum(end - start, 0) // BLOCK * BLOCK
        for off in range(start, full_end, BLOCK):
            offs = tl.multiple_of(off, BLOCK) + tl.arange(0, BLOCK)
            x = tl.load(srow + offs)
            _filter_tile(x, offs, offs < end, t, cnt_row, cand_row)
        if full_end < end:
            offs = full_end + tl.arange(0, BLOCK)
            m = offs < end
            x = tl.load(srow + offs, mask=m, other=0.0)
            _filter_tile(x, offs, m, t, cnt_row, cand_row)

    @triton.jit
    def _pad(out_idx_row, out_slot_row, need, k, BLOCK_P: tl.constexpr):
        for off in range(need, k, BLOCK_P):
            offs = off + tl.arange(0, BLOCK_P)
            m = offs < k
            tl.store(out_idx_row + offs, tl.full([BLOCK_P], -1, tl.int32), mask=m)
            tl.store(out_slot_row + offs, tl.full([BLOCK_P], -1, tl.int32), mask=m)

    @triton.jit
    def _select_regs(srow, cand_row, C, need, out_idx_row, out_slot_row, pt_row, page_size,
                     HAS_PT: tl.constexpr, BLOCK_R: tl.constexpr):
        """Exact top-need among C <= BLOCK_R candidates held in registers."""
        offs = tl.arange(0, BLOCK_R)
        m = offs < C
        idx = tl.load(cand_row + offs, mask=m, other=0)
        key = _skey(tl.load(srow + idx, mask=m, other=0.0))
        T = _kth_largest_regs(key, m, need)
        gt = tl.sum(((key > T) & m).to(tl.int32), 0)
        eqm = (key == T) & m
        eq = tl.sum(eqm.to(tl.int32), 0)
        rem = need - gt
        imax = 2147483647 + rem * 0
        if rem == 0:
            imax = rem * 0 - 1
        elif rem < eq:  # ties at T: the lowest positions win
            ians = rem * 0
            for i in range(31):
                c = ians | (1 << (30 - i))
                cnt = tl.sum((eqm & (idx < c)).to(tl.int32), 0)
                ians = tl.where(cnt < rem, c, ians)
            imax = ians
        sel = m & ((key > T) | ((key == T) & (idx <= imax)))
        s32 = sel.to(tl.int32)
        dst = tl.cumsum(s32, 0) - 1
        tl.store(out_idx_row + dst, idx, mask=sel)
        tl.store(out_slot_row + dst, _to_slot(idx, pt_row, page_size, sel, HAS_PT), mask=sel)

    @triton.jit
    def _load_keys(srow, cand_row, offs, m, FROM_ROW: tl.constexpr):
        if FROM_ROW:
            idx = offs
        else:
            idx = tl.load(cand_row + offs, mask=m, other=0)
        return idx, _skey(tl.load(srow + idx, mask=m, other=0.0))

    @triton.jit
    def _select_tiled(srow, cand_row, C, need, out_idx_row, out_slot_row, pt_row, page_size,
                      HAS_PT: tl.constexpr, FROM_ROW: tl.constexpr, BLOCK_T: tl.constexpr):
        """Exact top-need among C candidates (FROM_ROW: the row's first C positions) streamed
        in tiles: slow (one pass per search bit) but any C; the rare path."""
        ans = tl.zeros([], dtype=tl.int64)
        one = tl.full([], 1, tl.int64)
        for i in range(32):
            c = ans | (one << (31 - i))
            cs = _signed(c)
            cnt = need * 0
            for off in range(0, C, BLOCK_T):
                offs = off + tl.arange(0, BLOCK_T)
                m = offs < C
                idx, key = _load_keys(srow, cand_row, offs, m, FROM_ROW)
                cnt += tl.sum(((key >= cs) & m).to(tl.int32), 0)
            ans = tl.where(cnt >= need, c, ans)
        T = _signed(ans)
        gt = need * 0
        eq = need * 0
        for off in range(0, C, BLOCK_T):
            offs = off + tl.arange(0, BLOCK_T)
            m = offs < C
            idx, key = _load_keys(srow, cand_row, offs, m, FROM_ROW)
            gt += tl.sum(((key > T) & m).to(tl.int32), 0)
            eq += tl.sum(((key == T) & m).to(tl.int32), 0)
        rem = need - gt
        imax = 2147483647 + rem * 0
        if rem == 0:
            imax = rem * 0 - 1
        elif rem < eq:
            ians = rem * 0
            for i in range(31):
                c2 = ians | (1 << (30 - i))
                cnt2 = rem * 0
                for off in range(0, C, BLOCK_T):
                    offs = off + tl.arange(0, BLOCK_T)
                    m = offs < C
                    idx, key = _load_keys(srow, cand_row, offs, m, FROM_ROW)
                    cnt2 += tl.sum(((key == T) & m & (idx < c2)).to(tl.int32), 0)
                ians = tl.where(cnt2 < rem, c2, ians)
            imax = ians
        written = need * 0
        for off in range(0, C, BLOCK_T):
            offs = off + tl.arange(0, BLOCK_T)
            m = offs < C
            idx, key = _load_keys(srow, cand_row, offs, m, FROM_ROW)
            sel = m & ((key > T) | ((key == T) & (idx <= imax)))
            s32 = sel.to(tl.int32)
            dst = written + tl.cumsum(s32, 0) - 1
            tl.store(out_idx_row + dst, idx, mask=sel)
            tl.store(out_slot_row + dst, _to_slot(idx, pt_row, page_size, sel, HAS_PT),
                     mask=sel)
            written += tl.sum(s32, 0)

    @triton.jit
    def topk_v2_select_kernel(scores_ptr, stride_s, len_ptr, cnt_ptr, cand_ptr, out_idx_ptr,
                              out_slot_ptr, pt_ptr, stride_pt, rows_per_pt, page_size, n, k,
                              HAS_LEN: tl.constexpr, HAS_PT: tl.constexpr,
                              BLOCK_R: tl.constexpr, BLOCK_T: tl.constexpr):
        """Pass 3 (one program per row): exact top-need among the candidates (registers when
        they fit), emitted with their page-table slots; -1 padding; resets the row's counter.
        If the sampled threshold missed (fewer candidates than need), selects from the whole
        row instead (slow, exact)."""
        row = tl.program_id(0)
        length = _row_length(len_ptr, row, n, HAS_LEN)
        need = tl.minimum(length, k)
        C = tl.load(cnt_ptr + row * 2)
        srow = scores_ptr + row.to(tl.int64) * stride_s
        cand_row = cand_ptr + row.to(tl.int64) * n
        out_idx_row = out_idx_ptr + row.to(tl.int64) * k
        out_slot_row = out_slot_ptr + row.to(tl.int64) * k
        pt_row = pt_ptr + (row // rows_per_pt).to(tl.int64) * stride_pt
        if C >= need:
            if C <= BLOCK_R:
                _select_regs(srow, cand_row, C, need, out_idx_row, out_slot_row, pt_row,
                             page_size, HAS_PT, BLOCK_R)
            else:
                _select_tiled(srow, cand_row, C, need, out_idx_row, out_slot_row, pt_row,
                              page_size, HAS_PT, False, BLOCK_T)
        else:
            _select_tiled(srow, cand_row, length, need, out_idx_row, out_slot_row, pt_row,
                          page_size, HAS_PT, True, BLOCK_T)
        _pad(out_idx_row, out_slot_row, need, k, BLOCK_T)
        tl.store(cnt_ptr + row * 2 + tl.arange(0, 2), tl.zeros([2], dtype=tl.int32))


# ----------------------------------------------------------------------------------------------
# Dispatch
# ----------------------------------------------------------------------------------------------

_WS: dict = {}
_OLD_WS: list = []  # superseded workspaces stay alive: captured CUDA graphs may still use them


def _workspace(device, rows: int, n: int):
    """Per-device scratch: counters [rows, 2] (kept zeroed by the last kernel of each call),
    thresholds [rows], candidate lists [rows * n]."""
    key = str(device)
    ws = _WS.get(key)
    need_rows, need_cand = rows, rows * n
    if ws is None or ws["rows"] < need_rows or ws["cand"].numel() < need_cand:
        if ws is not None:
            _OLD_WS.append(ws)
        r = 1 << max(need_rows - 1, 0).bit_length()
        c = 1 << max(need_cand - 1, 0).bit_length()
        if ws is not None:
            r, c = max(r, ws["rows"]), max(c, ws["cand"].numel())
        ws = {
            "rows": r,
            "cnt": torch.zeros(r, 2, dtype=torch.int32, device=device),
            "thr": torch.zeros(r, dtype=torch.int32, device=device),
            "cand": torch.empty(c, dtype=torch.int32, device=device),
        }
        _WS[key] = ws
    return ws


def cuda_available(device=None) -> bool:
    """Whether topk_v2 uses the CUDA kernel on `device` (see topk_cuda.available)."""
    from . import topk_cuda

    return topk_cuda.available(device)


def backend(device=None) -> str:
    """Which TopK-V2 implementation `topk_v2(path="auto")` runs on `device`: "cuda" (the CUDA
    C++ kernel, csrc/topk_v2.cu), "triton" or "torch" (the CPU twin). May build the CUDA library."""
    dev = torch.device(device) if device is not None else None
    if dev is not None and dev.type == "cuda" and torch.cuda.is_available():
        if cuda_available(dev):
            return "cuda"
        return "triton" if HAVE_TRITON else "torch"
    return "triton" if (HAVE_TRITON and dev is not None and use_triton(torch.empty(0, device=dev)))\
        else "torch"


def default_plan(n: int) -> tuple[int, int, int]:
    """(sample, block_r, select_warps) for rows of n positions: the per-size best configurations
    measured on the H200 (benchmarks/RESULTS_kernels.md, "V2 best")."""
    if n <= 8192:  # the sample is the whole row: exact threshold, ~k candidates
        return max(64, 1 << max(n - 1, 0).bit_length()), 4096, 8
    if n <= 262144:
        return 4096, 8192, 16
    return 8192, 8192, 16


def topk_v2(scores: torch.Tensor, k: int, page_table: torch.Tensor | None = None,
            page_size: int = 1, lengths: torch.Tensor | None = None, *, path: str = "auto",
            sample: int | None = None, block: int = BLOCK, programs: int = TARGET_PROGRAMS,
            num_warps: int = NUM_WARPS, block_r: int | None = None,
            select_warps: int | None = None, cluster: int | None = None,
            _stages: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k selection fused with the page-table translation (see the module doc).

    On CUDA tensors: the CUDA kernel (topk_cuda.py, sm_90+, built with nvcc at first use) when it
    is available, else Triton; Triton on CPU under TRITON_INTERPRET=1; the torch twin otherwise.
    ``path``: "auto" = "cuda" where available (and no Triton knob - sample, block_r,
    select_warps - is given), else "sample" | "cuda" (the CUDA kernel; ``cluster`` overrides its
    planned cluster size: 1, 2, 4, 8, 16) | "sample" (Triton: sample -> filter -> select) |
    "twin". The keyword-only knobs are for benchmarks and tests (``_stages`` < 3 stops the
    Triton plan early and leaves the workspace dirty: timing breakdowns only). Never syncs with
    the host.
    """
    if scores.dim() != 2:
        raise ValueError("scores must be [rows, n]")
    if k < 1:
        raise ValueError("k must be >= 1")
    if page_table is not None and (page_table.dim() != 2 or scores.shape[0] % page_table.shape[0]):
        raise ValueError("page_table must be [pt_rows, n_pages] with rows % pt_rows == 0")
    if path not in ("auto", "cuda", "sample", "twin"):
        raise ValueError(f"unknown path {path!r}")
    if path in ("auto", "cuda") and scores.is_cuda:
        triton_knobs = sample is not None or block_r is not None or select_warps is not None
        if path == "cuda" or (not triton_knobs and cuda_available(scores.device)):
            x = scores if scores.dtype == torch.float32 else scores.float()
            if x.stride(1) != 1:
                x = x.contiguous()
            from . import topk_cuda

            return topk_cuda.topk_v2_cuda(x, k, page_table, page_size, lengths, cluster=cluster)
    if path == "cuda":
        raise ValueError("path='cuda' needs a CUDA tensor")
    d_sample, d_block_r, d_select_warps = default_plan(scores.shape[-1])
    sample = d_sample if sample is None else sample
    block_r = d_block_r if block_r is None else block_r
    select_warps = d_select_warps if select_warps is None else select_warps
    if sample < 8 or sample & (sample - 1):
        raise ValueError("sample must be a power of two >= 8")
    if path == "twin" or not use_triton(scores):
        return topk_v2_twin(scores, k, page_table, page_size, lengths, sample)
    x = scores if scores.dtype == torch.float32 else scores.float()
    if x.stride(1) != 1:
        x = x.contiguous()
    rows, n = x.shape
    dev = x.device
    out_idx = torch.empty(rows, k, dtype=torch.int32, device=dev)
    out_slot = torch.empty(rows, k, dtype=torch.int32, device=dev)
    if rows == 0:
        return out_idx, out_slot
    ws = _workspace(dev, rows, max(n, 1))
    has_len = lengths is not None
    lens = lengths.reshape(rows) if has_len else out_idx  # dummy pointer when unused
    has_pt = page_table is not None
    if has_pt:
        pt = page_table if page_table.stride(1) == 1 else page_table.contiguous()
        stride_pt, rows_per_pt = pt.stride(0), rows // pt.shape[0]
    else:
        pt, stride_pt, rows_per_pt = out_idx, 0, 1
    p = max(1, min(math.ceil(programs / rows), math.ceil(n / block)))
    chunk = math.ceil(math.ceil(n / p) / block) * block
    p = max(1, math.ceil(n / chunk))
    topk_v2_sample_kernel[(rows,)](
        x, x.stride(0), lens, ws["thr"], n, k, HAS_LEN=has_len, S=sample,
        num_warps=max(4, min(16, sample // 512)))
    if _stages < 2:
        return out_idx, out_slot
    topk_v2_filter_kernel[(rows, p)](
        x, x.stride(0), lens, ws["thr"], ws["cnt"], ws["cand"], n, chunk, HAS_LEN=has_len,
        BLOCK=block, num_warps=num_warps)
    if _stages < 3:
        return out_idx, out_slot
    topk_v2_select_kernel[(rows,)](
        x, x.stride(0), lens, ws["cnt"], ws["cand"], out_idx, out_slot, pt, stride_pt,
        rows_per_pt, page_size, n, k, HAS_LEN=has_len, HAS_PT=has_pt, BLOCK_R=block_r,
        BLOCK_T=1024, num_warps=select_warps)
    return out_idx, out_slot


def topk_slots(scores: torch.Tensor, lengths: torch.Tensor, k: int,
               slot_table: torch.Tensor | None = None) -> torch.Tensor:
    """Adapter with the proxy's ``ops.topk_v2`` contract.

    scores [..., N] float, lengths [...] int, slot_table [..., N] (broadcastable over the leading
    dims; per-position slots, i.e. a page table with page_size 1) or None ->
    int64 [..., min(k, N)] slots (positions when slot_table is None), -1 padded.
    """
    shape = scores.shape
    n = shape[-1]
    kk = min(k, n)
    lead = shape[:-1]
    x = scores.reshape(-1, n)
    rows = x.shape[0]
    pt = None
    if slot_table is not None:
        st = slot_table
        while st.dim() < len(shape):
            st = st.unsqueeze(0)
        sl = st.shape[:-1]
        nd = 0  # leading dims that match exactly; the rest must be 1 to avoid a copy
        while nd < len(lead) and sl[nd] == lead[nd]:
            nd += 1
        if all(a == 1 for a in sl[nd:]):
            pt = st.reshape(-1, n)
        else:
            pt = st.expand(*lead, n).reshape(-1, n)
    lens = None
    if lengths is not None:
        lens = lengths.expand(lead).reshape(rows)
    _, slots = topk_v2(x, kk, pt, 1, lens)
    return slots.to(torch.int64).reshape(*lead, kk)
