// TopK-V2 in CUDA C++ for sm_90: clustered radix *selection* of the k largest scores per row, fused
// with the logical-position -> physical-slot translation (page table). Built at run time by
// profkit/proxy/kernels/topk_cuda.py (nvcc -arch=sm_90, a shared library called through ctypes).
//
// One thread-block cluster of C CTAs (C = 1, 2, 4, 8, 16; 1024 threads each) per score row; the
// row is split into C contiguous chunks.
//   pass 1  each CTA reads its chunk (kept in registers when it fits: <= 16,384 scores per CTA,
//           "register-resident"; streamed in 16,384-score tiles otherwise) and builds a 1,024-bin
//           histogram in shared memory of the top 10 bits of the FP16-rounded order-preserving key
//           (one shared-memory atomic per score; streamed chunks: part of the first tile of every
//           CTA (sample4 of its 4 float4s per thread) in full, then, after a cluster.sync, only the
//           scores at or above a lower bound t0 of the threshold bin read off the union of those
//           samples: one float compare per score, and the few that pass are counted and kept in a
//           shared-memory stash (score, position) for pass 2, when the sample predicts they fit);
//   cluster.sync #1, then every CTA reads all C histograms through distributed shared memory
//           (DSMEM), finds the bin B* of the need-th largest score (need = min(k, length)) and,
//           from the per-rank counts, its own output offsets: no global atomics, no counters to reset;
//   pass 2  (from the registers, the stash, or a second read of a streamed chunk whose stash was
//           off or overflowed: tie-heavy rows, rows ordered ascending)
//           scores above B* are emitted directly (position + page-table slot); scores in B* (the
//           boundary candidates) are pushed as 64-bit composites (fp32 key << 32 | ~position) into
//           the leader CTA's shared memory through DSMEM (into a global workspace when there are
//           more than `cap` of them: tie-heavy rows; exact either way);
//   cluster.sync #2, then the leader alone finds the exact threshold among the candidates with
//           11-bit radix rounds over the composite (starting at the highest bit where candidates
//           differ, stopping as soon as the remaining bin is taken whole), which breaks ties to the
//           lowest position exactly, emits the selected candidates and pads with -1.
// Rows with length <= k take every position (no histogram); rows of length 0 are padded.
//
// Selection rule = a stable descending sort's first min(k, length): -0.0 == +0.0, NaN above +inf
// (NaNs among themselves by lowest position), ties to the lowest positions. Output order inside a
// row is unspecified (the above-B* scores first, then the boundary ones).

#include <cooperative_groups.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <float.h>
#include <stdint.h>

namespace cg = cooperative_groups;

struct TopkV2Params {
  const float* scores;
  long long stride;           // elements between rows
  const void* lengths;        // [rows] int32 / int64, or null
  const void* pt;             // page table [pt_rows, n_pages] int32 / int64, or null
  long long pt_stride;        // elements
  unsigned long long* gws;    // overflow workspace: rows * ws_stride composites
  long long ws_stride;
  int* out_idx;               // [rows, k]
  int* out_slot;              // [rows, k]
  int len64, pt64, rows_per_pt, page_size;
  int rows, n, k, cap;
  int stash_cap;              // streamed chunks: (score, position) entries kept in shared memory
                              // between pass 1 and pass 2 (0 = pass 2 re-reads the chunk)
  int sample4;                // streamed chunks: float4s per thread of the first tile counted in
                              // full for the lower bound t0 (1..4)
  int flags;                  // streamed chunks: TOPK_WARP_APPEND | TOPK_L2_PREFETCH
};

// flags (streamed chunks only; the register path ignores them)
#define TOPK_WARP_APPEND 1  // warp-aggregated stash appends into per-warp segments, histogram of
                            // the stash once after the pass (template WA; see the kernel)
#define TOPK_L2_PREFETCH 2  // L2 prefetch of the CTA's tiles after its first two, at the start

namespace topk_v2_detail {

constexpr int THREADS = 1024;
constexpr int WARPS = THREADS / 32;
constexpr int VPT4 = 4;                   // float4 per thread per tile
constexpr int TILE4 = THREADS * VPT4;     // float4 per tile (16,384 scores)
constexpr int NB1 = 1024;                 // coarse bins (10 bits); == THREADS
constexpr int RBITS = 11;                 // refinement digit
constexpr int NB2 = 1 << RBITS;           // 2,048 refinement bins; == 2 * THREADS
constexpr unsigned FULL = 0xFFFFFFFFu;

static_assert(NB1 == THREADS, "one coarse bin per thread");
static_assert(NB2 == 2 * THREADS, "two refinement bins per thread");
static_assert(WARPS == 32, "block scans assume 32 warps");



__device__ __forceinline__ uint32_t full_key(float x) {
  uint32_t b = __float_as_uint(x);
  uint32_t mag = b & 0x7FFFFFFFu;
  if (mag > 0x7F800000u) return 0xFFFFFFFFu;  // NaN (any sign/payload) above +inf
  if (mag == 0) b = 0;                        // -0.0 == +0.0
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

// top 10 bits of the order-preserving key of the FP16-rounded score (monotone in the score);
// the same function as topk.coarse_bins.
__device__ __forceinline__ int coarse_bin(float x) {
  if (x != x) return NB1 - 1;
  uint32_t b = __float_as_uint(x);
  if ((b & 0x7FFFFFFFu) == 0) b = 0;
  uint32_t h = __half_as_ushort(__float2half_rn(__uint_as_float(b)));
  uint32_t u = (h & 0x8000u) ? (~h & 0xFFFFu) : (h | 0x8000u);
  return (int)(u >> 6);
}

__device__ __forceinline__ int to_slot(const TopkV2Params& p, long long pt_row, int pos) {
  if (p.pt == nullptr) return pos;
  int pg = pos / p.page_size;
  long long page = p.pt64 ? ((const long long*)p.pt)[pt_row * p.pt_stride + pg]
                          : (long long)((const int*)p.pt)[pt_row * p.pt_stride + pg];
  return (int)(page * p.page_size + pos % p.page_size);
}

// warp-aggregated slot allocation from a shared counter; every lane of the warp must call it
__device__ __forceinline__ int warp_alloc(bool want, int* ctr) {
  unsigned m = __ballot_sync(FULL, want);
  if (m == 0) return 0;
  int lane = threadIdx.x & 31;
  int leader = __ffs(m) - 1;
  int base = 0;
  if (lane == leader) base = atomicAdd(ctr, __popc(m));
  base = __shfl_sync(FULL, base, leader);
  return base + __popc(m & ((1u << lane) - 1u));
}

// inclusive prefix sum over the block (1024 threads); `tot` gets the block total.
// Ends with a barrier, so s_w can be reused at once.
__device__ __forceinline__ int block_scan(int v, int* s_w, int& tot) {
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    int t = __shfl_up_sync(FULL, v, o);
    if (lane >= o) v += t;
  }
  if (lane == 31) s_w[warp] = v;
  __syncthreads();
  if (warp == 0) {
    int w = s_w[lane];
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      int t = __shfl_up_sync(FULL, w, o);
      if (lane >= o) w += t;
    }
    s_w[lane] = w;
  }
  __syncthreads();
  if (warp > 0) v += s_w[warp - 1];
  tot = s_w[WARPS - 1];
  __syncthreads();
  return v;
}

// block max and min of u64 (all threads get both); ends with a barrier
__device__ __forceinline__ void block_minmax(unsigned long long& mx, unsigned long long& mn,
                                             unsigned long long* s_w) {
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    unsigned long long a = __shfl_xor_sync(FULL, mx, o);
    unsigned long long b = __shfl_xor_sync(FULL, mn, o);
    mx = a > mx ? a : mx;
    mn = b < mn ? b : mn;
  }
  if (lane == 0) { s_w[warp] = mx; s_w[WARPS + warp] = mn; }
  __syncthreads();
  mx = s_w[lane];
  mn = s_w[WARPS + lane];
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    unsigned long long a = __shfl_xor_sync(FULL, mx, o);
    unsigned long long b = __shfl_xor_sync(FULL, mn, o);
    mx = a > mx ? a : mx;
    mn = b < mn ? b : mn;
  }
  __syncthreads();
}

template <int C>
__device__ __forceinline__ void cluster_barrier() {
  if constexpr (C == 1) {
    __syncthreads();
  } else {
    cg::this_cluster().sync();  // barrier.cluster arrive.release + wait.acquire
  }
}

}  // namespace topk_v2_detail

using namespace topk_v2_detail;

// STREAM = false: no row of the launch can need the streamed path (every chunk fits in registers;
// the host decides from n, see launch_c), so its code is compiled out (register pressure).
// WA (streamed chunks with a stash): warp-aggregated appends. Pass 1 keeps, per score, only a
// float compare and a warp ballot; the passing lanes write at their rank in the warp's own stash
// segment (stash_cap / 32 entries, a warp-uniform count in a register: no shared atomic, no
// divergent branch per score); the histogram of bins >= t0 is built once from the segments after
// the pass (or, where a segment overflowed, from a re-read of the CTA's chunk: exact either way).
template <int C, bool STREAM, bool WA>
__global__ void __launch_bounds__(THREADS, 1) topk_v2_cluster_kernel(const TopkV2Params p) {
  extern __shared__ __align__(16) unsigned char smem[];
  int* h1 = reinterpret_cast<int*>(smem);                                    // [NB1]
  int* h2 = h1 + NB1;                                                        // [NB2]
  unsigned long long* cand = reinterpret_cast<unsigned long long*>(h2 + NB2);  // [cap]
  uint2* stash = reinterpret_cast<uint2*>(cand + p.cap);                     // [stash_cap]
  __shared__ int s_w[WARPS];
  __shared__ unsigned long long s_w64[2 * WARPS];
  __shared__ int s_red[WARPS][C];
  __shared__ int s_above[C];
  __shared__ int s_candc[C];
  __shared__ int s_info[4];  // B*, count above B*, candidates in B*, (unused)
  __shared__ int s_ctr[8];   // above emitted, candidates pushed, boundary emitted, stashed,
                             // stash overflow (WA), (unused)
  __shared__ int s_dig[3];   // refinement: digit, count above it, count in it

  const int tid = threadIdx.x;
  const int lane = tid & 31, warp = tid >> 5;
  const int row = blockIdx.x / C;
  const int rank = blockIdx.x % C;  // == cluster block rank (cluster dims (C, 1, 1))
  const int n = p.n, k = p.k;

  int L = n;
  if (p.lengths != nullptr) {
    long long l = p.len64 ? ((const long long*)p.lengths)[row] : (long long)((const int*)p.lengths)[row];
    L = (int)(l < 0 ? 0 : (l > n ? n : l));
  }
  const int need = L < k ? L : k;
  int* oi = p.out_idx + (long long)row * k;
  int* os = p.out_slot + (long long)row * k;
  const long long pt_row = (long long)(row / p.rows_per_pt);

  // padding [need, k), spread over the cluster (disjoint from everything else written)
  for (int j = need + rank * THREADS + tid; j < k; j += C * THREADS) { oi[j] = -1; os[j] = -1; }
  if (need == L) {  // every position is selected (incl. length 0): no histogram, no sync
    for (int pos = rank * THREADS + tid; pos < L; pos += C * THREADS) {
      oi[pos] = pos;
      os[pos] = to_slot(p, pt_row, pos);
    }
    return;  // uniform over the cluster: nobody touches another CTA's shared memory
  }

  // ---- the chunk: float4 vectors of the 16-byte aligned row (virtual positions -off..) ----
  const float* srow = p.scores + (long long)row * p.stride;
  const int off = (int)((reinterpret_cast<uintptr_t>(srow) >> 2) & 3);
  const float4* base4 = reinterpret_cast<const float4*>(srow - off);
  const int nv = (L + off + 3) >> 2;
  const int vpc = (nv + C - 1) / C;
  const int v0 = rank * vpc;
  const int v1 = min(nv, v0 + vpc);
  const bool regs = !STREAM || vpc <= TILE4;  // uniform over the cluster
  // register path: rank r holds the contiguous vectors [v0, v1). Streamed path: the row's tiles
  // of TILE4 vectors are interleaved over the cluster (rank r takes tiles r, r + C, ...), so that
  // at any time the cluster reads one contiguous span (no partition camping on 2^k-sized chunks).
  const int vlim = regs ? v1 : nv;
  const int ntiles = (nv + TILE4 - 1) / TILE4;

  float4 r[VPT4];
  if (regs) {
#pragma unroll
    for (int i = 0; i < VPT4; ++i) {
      int v = v0 + tid + i * THREADS;
      r[i] = v < v1 ? __ldg(base4 + v) : make_float4(0.f, 0.f, 0.f, 0.f);
    }
  }
  h1[tid] = 0;
  if (tid < 8) s_ctr[tid] = 0;
  __syncthreads();

  auto hist_vec = [&](const float4& f, int v) {
    const int p0 = 4 * v - off;
    const float e[4] = {f.x, f.y, f.z, f.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      int pos = p0 + j;
      if (v < vlim && pos >= 0 && pos < L) atomicAdd(&h1[coarse_bin(e[j])], 1);
    }
  };
  // streamed chunk: tiles of TILE4 vectors, the next tile's loads in flight while one is used
  auto load_tile = [&](float4 (&t)[VPT4], int vt) {
#pragma unroll
    for (int i = 0; i < VPT4; ++i) {
      int v = vt + tid + i * THREADS;
      t[i] = v < vlim ? __ldg(base4 + v) : make_float4(-INFINITY, -INFINITY, -INFINITY, -INFINITY);
    }
  };
  auto stream_chunk = [&](auto&& use) {
    float4 t[VPT4], u[VPT4];
    load_tile(t, rank * TILE4);
    for (int tt = rank; tt < ntiles; tt += C) {  // uniform over the block
      const int vt = tt * TILE4;
      if (tt + C < ntiles) load_tile(u, vt + C * TILE4);
#pragma unroll
      for (int i = 0; i < VPT4; ++i) use(t[i], vt + tid + i * THREADS);
#pragma unroll
      for (int i = 0; i < VPT4; ++i) t[i] = u[i];
    }
  };
  int* h1b = h2;  // streamed chunks: histogram of the tiles after the first (h2 is free until #2)
  bool stash_on = false;  // streamed chunks: pass 2 reads the stash (uniform over the cluster)
  int t0 = 0;             // streamed chunks: the lower bound of B* (uniform over the cluster)
  int wcnt = 0;           // WA: scores this warp appended to its segment (uniform over the warp)
  bool ws_ok = false;     // WA: no segment of this CTA overflowed (uniform over the CTA)
  if (regs) {
#pragma unroll
    for (int i = 0; i < VPT4; ++i) hist_vec(r[i], v0 + tid + i * THREADS);
  } else if constexpr (STREAM) {
    // Streamed chunks (long rows): the first tile of every CTA (tiles 0..C-1) in full; the
    // cluster's union of these tiles is a subset of the row, so the bin t0 of ITS need-th largest
    // score is a lower bound of B* (the row has at least need scores in bins >= t0). The other
    // tiles then count only scores in bins >= t0 (into h1b: h1 stays read-only for the peers),
    // which is exact for every bin >= t0, hence for B* and everything above it, and skips the
    // shared-memory atomic for almost every score.
    h1b[tid] = 0;
    // With a stash (stash_cap > 0), only the first sample4 float4s of each thread's first tile are
    // counted in full (the union stays a subset of the row, so t0 stays a lower bound of B*), and
    // every score in a bin >= t0 is also kept in shared memory as (score bits, position): pass 2
    // then reads the stash instead of the chunk (a second read of the row), unless it overflowed.
    const bool use_stash = p.stash_cap > 0;  // uniform over the cluster
    const int S = use_stash ? p.sample4 : VPT4;
    __shared__ int s_t0[2];  // t0, sampled scores in bins >= t0
    if (p.flags & TOPK_L2_PREFETCH) {
      // this CTA's tiles after the two loaded below, into L2 at once (one 128-byte line per
      // thread and tile): their HBM reads overlap the sample, the bound and cluster sync #0
      for (int tt = rank + 2 * C + (tid >> 9) * C; tt < ntiles; tt += 2 * C) {
        const int v = tt * TILE4 + (tid & 511) * 8;
        if (v < vlim) asm volatile("prefetch.global.L2 [%0];" ::"l"(base4 + v));
      }
    }
    float4 t[VPT4], u[VPT4];
    load_tile(t, rank * TILE4);
    if (rank + C < ntiles) load_tile(u, (rank + C) * TILE4);
#pragma unroll
    for (int i = 0; i < VPT4; ++i)
      if (i < S) hist_vec(t[i], rank * TILE4 + tid + i * THREADS);
    cluster_barrier<C>();  // #0: first-tile histograms complete
    int us = 0;
    if constexpr (C == 1) {
      us = h1[tid];
    } else {
      cg::cluster_group cl = cg::this_cluster();
#pragma unroll
      for (int j = 0; j < C; ++j) us += cl.map_shared_rank(h1, j)[tid];
    }
    int utot;
    const int upre = block_scan(us, s_w, utot);
    if (tid == 0) { s_t0[0] = 0; s_t0[1] = utot; }  // no bound when the union has < need scores
    __syncthreads();
    if (utot - upre + us >= need && utot - upre < need) { s_t0[0] = tid; s_t0[1] = utot - upre + us; }
    __syncthreads();
    t0 = s_t0[0];  // uniform over the cluster (same read-only histograms)
    // count the scores in bins >= t0 (h1b); the sampled ones are in h1 too, see the callers
    auto hist_ge = [&](const float4& f, int v) {
      const int p0 = 4 * v - off;
      const float e[4] = {f.x, f.y, f.z, f.w};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        int pos = p0 + j;
        int b = coarse_bin(e[j]);
        if (v < vlim && pos >= 0 && pos < L && b >= t0) atomicAdd(&h1b[b], 1);
      }
    };
    // the stash only where it is expected to hold at most half its capacity: the sampled share of
    // scores in bins >= t0, times this CTA's share of the row (tie-heavy rows, one-CTA clusters
    // of long rows and the like take the re-read path at once)
    stash_on = use_stash && (long long)s_t0[1] * L <= (long long)p.stash_cap / 2 * utot * C;
    if (stash_on) {
      // f0: the FP16 value just below bin t0's lowest one, as fp32. x < f0 implies
      // fp16(x) <= f0, so coarse_bin(x) < t0: the float compare is a conservative prefilter
      // (NaN passes it; a NaN f0 passes everything), the exact bin is computed for what passes.
      float f0 = -INFINITY;
      if (t0 > 0) {
        const unsigned uk = ((unsigned)t0 << 6) - 1u;
        const unsigned short hb = (uk & 0x8000u) ? (unsigned short)(uk & 0x7FFFu)
                                                 : (unsigned short)(~uk & 0xFFFFu);
        f0 = __half2float(__ushort_as_half(hb));
      }
      if constexpr (WA) {
        // per score: one compare and one ballot over the whole warp (every lane reaches it: the
        // loops are uniform over the block); the passing lanes (about 1% of the scores on random
        // rows) store at base + rank in the warp's segment, base a warp-uniform register. What
        // passes is filtered exactly where the stash is read: position in [0, L), bin >= t0.
        // Vectors past the chunk were loaded as -inf: they pass only where everything passes
        // (t0 <= 15, f0 NaN; t0 = 0 predicts more than the stash holds, so it is off there).
        // t0 = 16 (bin 16 is the lowest finite one, bin 15 holds -inf): f0 = -inf would pass
        // every -inf score; -FLT_MAX keeps the filter conservative and drops them.
        const float fw = (t0 > 0 && f0 == -INFINITY) ? -FLT_MAX : f0;
        const int seg = p.stash_cap / WARPS;
        uint2* wst = stash + warp * seg;
        const unsigned lt = (1u << lane) - 1u;
        auto scan_vec = [&](const float4& f, int v) {
          const float e[4] = {f.x, f.y, f.z, f.w};
          const int p0 = 4 * v - off;
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            const bool pr = !(e[j] < fw);
            const unsigned bal = __ballot_sync(FULL, pr);
            if (bal != 0u) {  // warp-uniform
              const int q = wcnt + __popc(bal & lt);
              if (pr && q < seg) wst[q] = make_uint2(__float_as_uint(e[j]), (unsigned)(p0 + j));
              wcnt += __popc(bal);
            }
          }
        };
#pragma unroll
        for (int i = 0; i < VPT4; ++i) scan_vec(t[i], rank * TILE4 + tid + i * THREADS);
        for (int tt = rank + C; tt < ntiles; tt += C) {  // uniform over the block
          const int vt = tt * TILE4;
#pragma unroll
          for (int i = 0; i < VPT4; ++i) t[i] = u[i];
          if (tt + C < ntiles) load_tile(u, vt + C * TILE4);
#pragma unroll
          for (int i = 0; i < VPT4; ++i) scan_vec(t[i], vt + tid + i * THREADS);
        }
        if (lane == 0 && wcnt > seg) s_ctr[4] = 1;  // (every writer writes 1)
        __syncthreads();  // the segments and the flag complete
        ws_ok = s_ctr[4] == 0;
        if (ws_ok) {
          // the histogram of bins >= t0 from the segments (each warp its own): h1b then holds
          // the chunk's full count of every bin >= t0, the sampled scores included
          for (int i = lane; i < wcnt; i += 32) {
            const uint2 e = wst[i];
            const int b = coarse_bin(__uint_as_float(e.x));
            if ((unsigned)e.y < (unsigned)L && b >= t0) atomicAdd(&h1b[b], 1);
          }
        } else {
          stream_chunk(hist_ge);  // a segment overflowed: count bins >= t0 from the chunk again
        }
      } else {
        const int scap = p.stash_cap;
        // per score: one compare; the few that pass (about 1% on random rows) take a divergent
        // branch: exact bin, the histogram atomic (unless counted in the sample) and a stash slot
        // from a coalesced-group allocation (no warp-wide collective inside the branch)
        auto scan_vec = [&](const float4& f, int v, bool counted) {
          const float e[4] = {f.x, f.y, f.z, f.w};
          const int p0 = 4 * v - off;
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            if (!(e[j] < f0)) {
              const int pos = p0 + j;
              const int b = coarse_bin(e[j]);
              if (v < vlim && pos >= 0 && pos < L && b >= t0) {
                if (!counted) atomicAdd(&h1b[b], 1);
                cg::coalesced_group g = cg::coalesced_threads();
                int q0 = 0;
                if (g.thread_rank() == 0) q0 = atomicAdd(&s_ctr[3], (int)g.size());
                const int q = g.shfl(q0, 0) + (int)g.thread_rank();
                if (q < scap) stash[q] = make_uint2(__float_as_uint(e[j]), (unsigned)pos);
              }
            }
          }
        };
#pragma unroll
        for (int i = 0; i < VPT4; ++i) scan_vec(t[i], rank * TILE4 + tid + i * THREADS, i < S);
        for (int tt = rank + C; tt < ntiles; tt += C) {  // uniform over the block
          const int vt = tt * TILE4;
#pragma unroll
          for (int i = 0; i < VPT4; ++i) t[i] = u[i];
          if (tt + C < ntiles) load_tile(u, vt + C * TILE4);
#pragma unroll
          for (int i = 0; i < VPT4; ++i) scan_vec(t[i], vt + tid + i * THREADS, false);
        }
      }  // !WA
    } else {
#pragma unroll
      for (int i = 0; i < VPT4; ++i)  // the first tile's part left out of the sample
        if (i >= S) hist_ge(t[i], rank * TILE4 + tid + i * THREADS);
      for (int tt = rank + C; tt < ntiles; tt += C) {  // uniform over the block
        const int vt = tt * TILE4;
#pragma unroll
        for (int i = 0; i < VPT4; ++i) t[i] = u[i];
        if (tt + C < ntiles) load_tile(u, vt + C * TILE4);
#pragma unroll
        for (int i = 0; i < VPT4; ++i) hist_ge(t[i], vt + tid + i * THREADS);
      }
    }
  }

  // ---- cluster-wide histogram: every CTA reads all C histograms (DSMEM) ----
  cluster_barrier<C>();  // #1: all local histograms complete (and every CTA of the cluster started)
  int hj[C];
  int tot = 0;
  // WA with the stash on: every CTA's h1b holds the full count of its bins >= t0 (the sample's
  // counts in h1 are left out there); elsewhere h1 + h1b (uniform over the cluster)
  const bool hb_only = WA && !regs && stash_on && tid >= t0;
  if constexpr (C == 1) {
    hj[0] = hb_only ? h1b[tid] : h1[tid] + (regs ? 0 : h1b[tid]);
    tot = hj[0];
  } else {
    cg::cluster_group cl = cg::this_cluster();
#pragma unroll
    for (int j = 0; j < C; ++j) {
      hj[j] = hb_only ? cl.map_shared_rank(h1b, j)[tid]
                      : cl.map_shared_rank(h1, j)[tid] + (regs ? 0 : cl.map_shared_rank(h1b, j)[tid]);
      tot += hj[j];
    }
  }
  // (streamed chunks: bins below t0 are undercounted; the suffix sums at and above t0 are exact,
  // and B* >= t0, so the search below still finds B* exactly)
  int total;
  const int pre = block_scan(tot, s_w, total);  // bins ascending with tid
  const int sfx = total - pre + tot;            // scores in bins >= tid
  const int sfx_next = total - pre;             // scores in bins > tid
  if (sfx >= need && sfx_next < need) {         // exactly one thread: B* = tid
    s_info[0] = tid;
    s_info[1] = sfx_next;
    s_info[2] = tot;
#pragma unroll
    for (int j = 0; j < C; ++j) s_candc[j] = hj[j];
  }
  __syncthreads();
  const int bstar = s_info[0];
  const int n_above = s_info[1];
  const int m = s_info[2];
  // per-rank counts above B* (block reduction of C values)
#pragma unroll
  for (int j = 0; j < C; ++j) {
    int a = tid > bstar ? hj[j] : 0;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) a += __shfl_xor_sync(FULL, a, o);
    if (lane == 0) s_red[warp][j] = a;
  }
  __syncthreads();
  if (tid < C) {
    int a = 0;
    for (int w = 0; w < WARPS; ++w) a += s_red[w][tid];
    s_above[tid] = a;
  }
  __syncthreads();
  int above_base = 0, cand_base = 0;
#pragma unroll
  for (int j = 0; j < C; ++j) {
    if (j < rank) { above_base += s_above[j]; cand_base += s_candc[j]; }
  }
  const bool overflow = m > p.cap;  // uniform over the cluster
  unsigned long long* cbuf;
  if (overflow) {
    cbuf = p.gws + (long long)row * p.ws_stride;
  } else if constexpr (C == 1) {
    cbuf = cand;
  } else {
    cbuf = cg::this_cluster().map_shared_rank(cand, 0);
  }

  // ---- pass 2: emit above B*, push B*'s scores to the leader ----
  // one score per lane (warp-collective): above B* -> the output, in B* -> the leader's candidates
  auto emit_one = [&](bool up, bool eq, int pos, float score) {
    int o = warp_alloc(up, &s_ctr[0]);
    if (up) {
      o += above_base;
      oi[o] = pos;
      os[o] = to_slot(p, pt_row, pos);
    }
    int q = warp_alloc(eq, &s_ctr[1]);
    if (eq) {
      cbuf[cand_base + q] = ((unsigned long long)full_key(score) << 32) | (unsigned long long)(0xFFFFFFFFu - (unsigned)pos);
    }
  };
  auto emit_vec = [&](const float4& f, int v) {
    const int p0 = 4 * v - off;
    const float e[4] = {f.x, f.y, f.z, f.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      int pos = p0 + j;
      bool ok = v < vlim && pos >= 0 && pos < L;
      int b = ok ? coarse_bin(e[j]) : -1;
      bool up = ok && b > bstar;
      bool eq = ok && b == bstar;
      if (!__any_sync(FULL, b >= bstar)) continue;  // warp-uniform: nothing to emit or push
      emit_one(up, eq, pos, e[j]);
    }
  };
  // a stashed (score bits, position) entry in coarse bin b (-1: none)
  auto emit_stashed = [&](uint2 e, int b) { emit_one(b > bstar, b == bstar, (int)e.y, __uint_as_float(e.x)); };
  const int n_stash = s_ctr[3];  // complete: every stash write precedes #1
  if (regs) {
#pragma unroll
    for (int i = 0; i < VPT4; ++i) emit_vec(r[i], v0 + tid + i * THREADS);
  } else if constexpr (STREAM) {
    if (WA && stash_on && ws_ok) {
      // each warp reads its own segment (wcnt <= seg entries; a warp-uniform loop)
      const uint2* wst = stash + warp * (p.stash_cap / WARPS);
      for (int i0 = 0; i0 < wcnt; i0 += 32) {
        const int i = i0 + lane;
        uint2 e = make_uint2(0u, 0u);
        int b = -1;
        if (i < wcnt) {
          e = wst[i];
          if ((unsigned)e.y < (unsigned)L) b = coarse_bin(__uint_as_float(e.x));
        }
        emit_stashed(e, b);  // (b = -1: neither; bstar >= 0)
      }
    } else if (!WA && stash_on && n_stash <= p.stash_cap) {
      // the stash holds every score of this CTA's tiles in a bin >= t0 (<= B*): no second read
      for (int i0 = 0; i0 < n_stash; i0 += THREADS) {  // uniform over the block
        const int i = i0 + tid;
        uint2 e = make_uint2(0u, 0u);
        int b = -1;
        if (i < n_stash) {
          e = stash[i];
          b = coarse_bin(__uint_as_float(e.x));
        }
        emit_stashed(e, b);  // (b = -1: neither; bstar >= 0)
      }
    } else {
      stream_chunk(emit_vec);  // no stash, or it overflowed (tie-heavy rows): re-read the chunk
    }
  }
  if (overflow) __threadfence();
  cluster_barrier<C>();  // #2: candidates complete in the leader; peers done reading histograms
  if (rank != 0) return;  // nobody reads a non-leader's shared memory after #2

  // ---- leader: exact selection of `rem` among the m boundary candidates ----
  const unsigned long long* src = overflow ? cbuf : cand;  // own shared memory, or the workspace
  int rem = need - n_above;              // 1 <= rem <= m
  unsigned long long thresh = 0;         // select composites >= thresh
  if (rem < m) {
    unsigned long long mx = 0, mn = ~0ull;
    for (int i = tid; i < m; i += THREADS) {
      unsigned long long c = src[i];
      mx = c > mx ? c : mx;
      mn = c < mn ? c : mn;
    }
    block_minmax(mx, mn, s_w64);
    const unsigned long long diff = mx ^ mn;  // != 0: positions are distinct
    int sh_hi = 64 - __clzll(diff);           // bits >= sh_hi are common to all candidates
    unsigned long long prefix = sh_hi >= 64 ? 0ull : (mx >> sh_hi) << sh_hi;
    while (true) {
      const int bits = sh_hi < RBITS ? sh_hi : RBITS;
      const int sh = sh_hi - bits;
      const unsigned long long himask = sh_hi >= 64 ? 0ull : (~0ull << sh_hi);
      const unsigned dmask = (1u << bits) - 1u;
      h2[tid] = 0;
      h2[tid + THREADS] = 0;
      __syncthreads();
      for (int i = tid; i < m; i += THREADS) {
        unsigned long long c = src[i];
        if ((c & himask) == prefix) atomicAdd(&h2[(unsigned)(c >> sh) & dmask], 1);
      }
      __syncthreads();
      const int a = h2[2 * tid], b = h2[2 * tid + 1];
      int t2;
      const int pr = block_scan(a + b, s_w, t2);
      const int s_next = t2 - pr;  // matching candidates with digit > 2*tid+1
      const int s_b = s_next + b;  // >= 2*tid+1
      const int s_a = s_b + a;     // >= 2*tid
      if (s_b >= rem && s_next < rem) { s_dig[0] = 2 * tid + 1; s_dig[1] = s_next; s_dig[2] = b; }
      else if (s_a >= rem && s_b < rem) { s_dig[0] = 2 * tid; s_dig[1] = s_b; s_dig[2] = a; }
      __syncthreads();
      const int d = s_dig[0], gt = s_dig[1], eq = s_dig[2];
      rem -= gt;
      prefix |= (unsigned long long)d << sh;
      sh_hi = sh;
      if (eq == rem || sh == 0) break;  // the remaining bin is taken whole: done
      // (next round's zeroing of h2 follows the barrier after the last read of h2)
    }
    thresh = prefix;
  }
  // emit the selected candidates at [n_above, need)
  for (int i0 = 0; i0 < m; i0 += THREADS) {
    const int i = i0 + tid;
    unsigned long long c = i < m ? src[i] : 0ull;
    bool sel = i < m && c >= thresh;
    int o = warp_alloc(sel, &s_ctr[2]);
    if (sel) {
      int pos = (int)(0xFFFFFFFFu - (unsigned)(c & 0xFFFFFFFFull));
      o += n_above;
      oi[o] = pos;
      os[o] = to_slot(p, pt_row, pos);
    }
  }
}

namespace {

template <int C, bool STREAM, bool WA>
cudaError_t launch_cs(const TopkV2Params& p, cudaStream_t stream) {
  const size_t smem = (size_t)(NB1 + NB2) * 4 + (size_t)p.cap * 8 + (size_t)p.stash_cap * 8;
  static size_t configured[64] = {};  // per device of this process
  int dev = 0;
  cudaGetDevice(&dev);
  if (dev < 0 || dev >= 64) dev = 0;
  if (smem > configured[dev]) {
    cudaError_t e = cudaFuncSetAttribute(topk_v2_cluster_kernel<C, STREAM, WA>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess) return e;
    if (C > 8) {
      e = cudaFuncSetAttribute(topk_v2_cluster_kernel<C, STREAM, WA>,
                               cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
      if (e != cudaSuccess) return e;
    }
    configured[dev] = smem;
  }
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3((unsigned)(p.rows * C), 1, 1);
  cfg.blockDim = dim3(THREADS, 1, 1);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = C;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  return cudaLaunchKernelEx(&cfg, topk_v2_cluster_kernel<C, STREAM, WA>, p);
}

// the streamed instantiation only when a row of n positions (after the row's alignment padding:
// none when every row starts 16-byte aligned, else up to 3 elements) can put more than TILE4
// float4s on a CTA; the stash only there
template <int C>
cudaError_t launch_c(TopkV2Params p, cudaStream_t stream) {
  const bool aligned = (reinterpret_cast<uintptr_t>(p.scores) & 15) == 0 && (p.stride & 3) == 0;
  const long long nv = ((long long)p.n + (aligned ? 0 : 3) + 3) >> 2;
  if ((nv + C - 1) / C > TILE4) {
    if (p.stash_cap > 0 && (p.flags & TOPK_WARP_APPEND)) return launch_cs<C, true, true>(p, stream);
    return launch_cs<C, true, false>(p, stream);
  }
  p.stash_cap = 0;
  return launch_cs<C, false, false>(p, stream);
}

template <int C>
int max_active_clusters_c(int cap) {
  const size_t smem = (size_t)(NB1 + NB2) * 4 + (size_t)cap * 8;
  if (cudaFuncSetAttribute(topk_v2_cluster_kernel<C, false, false>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           (int)smem) != cudaSuccess) return -1;
  if (C > 8 && cudaFuncSetAttribute(topk_v2_cluster_kernel<C, false, false>,
                                    cudaFuncAttributeNonPortableClusterSizeAllowed, 1) != cudaSuccess)
    return -1;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3((unsigned)(C * 64), 1, 1);
  cfg.blockDim = dim3(THREADS, 1, 1);
  cfg.dynamicSmemBytes = smem;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = C;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  int n = 0;
  if (cudaOccupancyMaxActiveClusters(&n, topk_v2_cluster_kernel<C, false, false>, &cfg) != cudaSuccess) {
    cudaGetLastError();
    return -1;
  }
  return n;
}

}  // namespace

extern "C" {

// returns a cudaError_t (0 = launched); 1000 = bad argument
int topk_v2_cuda_launch(const float* scores, long long stride, const void* lengths, int len64,
                        const void* pt, long long pt_stride, int pt64, int rows_per_pt,
                        int page_size, int* out_idx, int* out_slot, unsigned long long* gws,
                        long long ws_stride, int rows, int n, int k, int cap, int cluster,
                        int stash_cap, int sample4, int flags, void* stream) {
  if (rows <= 0 || n < 0 || k < 1 || cap < 1 || rows_per_pt < 1 || page_size < 1) return 1000;
  if (stash_cap < 0 || sample4 < 1 || sample4 > VPT4) return 1000;
  if (flags & ~(TOPK_WARP_APPEND | TOPK_L2_PREFETCH)) return 1000;
  TopkV2Params p;
  p.scores = scores; p.stride = stride; p.lengths = lengths; p.pt = pt; p.pt_stride = pt_stride;
  p.gws = gws; p.ws_stride = ws_stride; p.out_idx = out_idx; p.out_slot = out_slot;
  p.len64 = len64; p.pt64 = pt64; p.rows_per_pt = rows_per_pt; p.page_size = page_size;
  p.rows = rows; p.n = n; p.k = k; p.cap = cap; p.stash_cap = stash_cap; p.sample4 = sample4;
  p.flags = flags;
  cudaStream_t s = reinterpret_cast<cudaStream_t>(stream);
  switch (cluster) {
    case 1: return (int)launch_c<1>(p, s);
    case 2: return (int)launch_c<2>(p, s);
    case 4: return (int)launch_c<4>(p, s);
    case 8: return (int)launch_c<8>(p, s);
    case 16: return (int)launch_c<16>(p, s);
    default: return 1000;
  }
}

// how many clusters of this size can be resident at once (-1: this size cannot be launched)
int topk_v2_cuda_max_active_clusters(int cluster, int cap) {
  switch (cluster) {
    case 1: return max_active_clusters_c<1>(cap);
    case 2: return max_active_clusters_c<2>(cap);
    case 4: return max_active_clusters_c<4>(cap);
    case 8: return max_active_clusters_c<8>(cap);
    case 16: return max_active_clusters_c<16>(cap);
    default: return -1;
  }
}

const char* topk_v2_cuda_error_string(int e) {
  if (e == 1000) return "topk_v2_cuda: bad argument";
  return cudaGetErrorString((cudaError_t)e);
}

int topk_v2_cuda_sm_count() {
  int dev = 0, n = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return -1;
  if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) return -1;
  return n;
}

}  // extern "C"
