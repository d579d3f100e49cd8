"""TopK-V2 in CUDA C++ for sm_90 (csrc/topk_v2.cu): clustered radix selection fused with the
page-table translation, built with the machine's ``nvcc`` at first use and called through ctypes.

The kernel (``topk_v2_cluster_kernel<C>``; the catalog's ``topk_v2_*`` rule owns it): one
thread-block cluster of C CTAs per score row (C = 1 is the single-CTA path), each CTA's chunk in
registers when it holds <= 16,384 scores (else streamed: a sample of each CTA's first tile gives a
lower bound of the threshold bin, and the scores at or above it are kept in a shared-memory stash,
appended warp by warp, for the second pass instead of re-reading the row), a 1,024-bin shared-memory histogram of
FP16-rounded order-preserving keys per CTA, a cluster-wide reduction through distributed shared
memory that finds the bin of the need-th largest score, the scores above it emitted directly, the
boundary bin's scores gathered in the leader CTA's shared memory (a global workspace when there are
more than ``CAP``) and selected exactly by 11-bit radix rounds on (fp32 key, position), ties to the
lowest position. One launch, no host sync, CUDA-graph capturable; see the .cu file's header.

Plan (host side, from the batch's shape only, so that it never syncs): ``plan(rows, n)`` picks the
cluster size C, the smallest power of two that puts <= 16,384 positions on each CTA (the register
path), at most 16 (8 where the device cannot run 16-CTA clusters), and smaller when the batch
would need more CTAs than the device has SMs. Each cluster then picks its own path from its row's
length on the device (all positions when length <= k, register-resident or streamed chunk).

``available()`` is False (and the Triton kernel is used) without CUDA, on GPUs before sm_90, when
``nvcc`` is missing or the build fails, or with ``PROFKIT_TOPK_CUDA=0``; ``unavailable_reason()``
says why. The library is cached under ``$PROFKIT_KERNEL_CACHE`` (default ``~/.cache/profkit``),
keyed by the source's hash.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

SRC = Path(__file__).resolve().parent / "csrc" / "topk_v2.cu"
CAP = 16384  # boundary candidates held in the leader CTA's shared memory (more: global workspace)
REG = 16384  # positions per CTA held in registers
MAX_CLUSTER = 16
# Streamed chunks (more than REG positions per CTA, e.g. 1M positions on 16 CTAs): every score in a
# bin at or above the first-tile lower bound t0 is kept in shared memory between the two passes
# (STASH entries of 8 bytes per CTA; 0 = pass 2 re-reads the chunk, the kernel before the stash),
# and SAMPLE4 of the 4 float4s per thread of each CTA's first tile are counted in full for t0.
# FLAGS (streamed chunks): WARP_APPEND = warp-aggregated stash appends (a ballot per score, one
# segment of STASH / 32 entries per warp, the histogram of the stash built once after the pass);
# L2_PREFETCH = the CTA's later tiles prefetched into L2 at the start. 0 = the per-score branch
# (shared-memory atomics per passing score) of the kernel before. Default WARP_APPEND: fastest on
# the H200 at 1M (35.4 us graph-replayed against 39.7 for 0 and 36.6 with the prefetch too, which
# alone is slower: 42.1; benchmarks/RESULTS_kernels.md).
# Environment overrides (benchmarks): PROFKIT_TOPK_STASH, PROFKIT_TOPK_SAMPLE4, PROFKIT_TOPK_FLAGS.
WARP_APPEND, L2_PREFETCH = 1, 2
STASH = int(os.environ.get("PROFKIT_TOPK_STASH", "8192"))
SAMPLE4 = int(os.environ.get("PROFKIT_TOPK_SAMPLE4", "4"))
FLAGS = int(os.environ.get("PROFKIT_TOPK_FLAGS", str(WARP_APPEND)))
KERNEL_NAME = "topk_v2_cluster_kernel"

_lock = threading.Lock()
_lib = None
_error: str | None = None
_dev_info: dict = {}
_WS: dict = {}
_OLD_WS: list = []  # superseded workspaces stay alive: captured CUDA graphs may still use them


def _nvcc() -> str | None:
    for cand in (os.environ.get("NVCC"), shutil.which("nvcc"),
                 os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "nvcc"),
                 "/usr/local/cuda/bin/nvcc"):
        if cand and os.path.isfile(cand) and os.access(cand, os.X_OK):
            return cand
    return None


def _cache_dir() -> Path:
    d = os.environ.get("PROFKIT_KERNEL_CACHE")
    return Path(d) if d else Path.home() / ".cache" / "profkit"


NVCC_FLAGS = ["-O3", "-std=c++17", "-gencode", "arch=compute_90,code=sm_90",
              "-gencode", "arch=compute_90,code=compute_90", "-lineinfo", "-shared",
              "-Xcompiler", "-fPIC", "-cudart", "shared"]


def library_path() -> Path:
    h = hashlib.sha256(SRC.read_bytes() + " ".join(NVCC_FLAGS).encode()).hexdigest()[:16]
    return _cache_dir() / f"libtopk_v2_{h}.so"


def build(verbose: bool = False) -> Path:
    """Compile csrc/topk_v2.cu into the cache (no-op when the cached library exists)."""
    out = library_path()
    if out.exists():
        return out
    nvcc = _nvcc()
    if nvcc is None:
        raise RuntimeError("nvcc not found (PATH, $NVCC, $CUDA_HOME/bin)")
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=out.parent)
    os.close(fd)
    cmd = [nvcc, *NVCC_FLAGS, "-o", tmp, str(SRC)]
    if verbose:
        cmd.insert(1, "-Xptxas=-v")
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        os.unlink(tmp)
        raise RuntimeError(f"nvcc failed ({p.returncode}): {(p.stderr or p.stdout)[-2000:]}")
    if verbose:
        print(p.stderr[-6000:])
    os.replace(tmp, out)  # atomic: concurrent builders (TP ranks) each leave a complete file
    return out


def _load():
    global _lib, _error
    if _lib is not None or _error is not None:
        return _lib
    with _lock:
        if _lib is not None or _error is not None:
            return _lib
        try:
            import torch  # noqa: F401  (its libcudart is the one the library binds to)

            lib = ctypes.CDLL(str(build()))
            vp, ll, i = ctypes.c_void_p, ctypes.c_longlong, ctypes.c_int
            lib.topk_v2_cuda_launch.argtypes = [vp, ll, vp, i, vp, ll, i, i, i, vp, vp, vp, ll,
                                                i, i, i, i, i, i, i, i, vp]
            lib.topk_v2_cuda_launch.restype = i
            lib.topk_v2_cuda_max_active_clusters.argtypes = [i, i]
            lib.topk_v2_cuda_max_active_clusters.restype = i
            lib.topk_v2_cuda_error_string.argtypes = [i]
            lib.topk_v2_cuda_error_string.restype = ctypes.c_char_p
            lib.topk_v2_cuda_sm_count.restype = i
            _lib = lib
        except Exception as e:  # no compiler, failed build, unloadable library
            _error = f"{type(e).__name__}: {e}"[:2000]
    return _lib


def _device_ok(device) -> str | None:
    import torch

    if os.environ.get("PROFKIT_TOPK_CUDA", "1") in ("0", "false", "no", "off"):
        return "disabled by PROFKIT_TOPK_CUDA=0"
    if not torch.cuda.is_available() or torch.version.cuda is None:
        return "no CUDA device (or a ROCm/CPU build of torch)"
    dev = torch.device(device) if device is not None else torch.device("cuda")
    if dev.type != "cuda":
        return f"device {dev} is not CUDA"
    major, _ = torch.cuda.get_device_capability(dev)
    if major < 9:
        return f"compute capability {major}.x < 9.0 (no thread-block clusters)"
    return None


def unavailable_reason(device=None) -> str | None:
    """None when the CUDA kernel can run on `device`; else why not."""
    why = _device_ok(device)
    if why:
        return why
    if _load() is None:
        return _error
    return None


_AVAIL: dict = {}


def available(device=None) -> bool:
    """Cached per device (and PROFKIT_TOPK_CUDA's value)."""
    key = (str(device), os.environ.get("PROFKIT_TOPK_CUDA", "1"))
    ok = _AVAIL.get(key)
    if ok is None:
        ok = _AVAIL[key] = unavailable_reason(device) is None
    return ok


def _info(dev_index: int) -> dict:
    info = _dev_info.get(dev_index)
    if info is None:
        import torch

        lib = _load()
        with torch.cuda.device(dev_index):
            sms = lib.topk_v2_cuda_sm_count()
            act = {c: lib.topk_v2_cuda_max_active_clusters(c, CAP) for c in (1, 2, 4, 8, 16)}
        maxc = max([c for c, a in act.items() if a >= 1] or [1])
        info = {"sms": sms, "active_clusters": act, "max_cluster": min(maxc, MAX_CLUSTER)}
        _dev_info[dev_index] = info
    return info


def plan(rows: int, n: int, dev_index: int = 0) -> int:
    """Cluster size for a batch of `rows` rows of up to `n` positions (see the module doc)."""
    info = _info(dev_index)
    c = 1
    while c < info["max_cluster"] and -(-n // c) + 8 > REG:
        c *= 2
    while c > 1 and rows * c > info["sms"]:
        c //= 2
    return c


def _workspace(device, rows: int, n: int):
    import torch

    key = str(device)
    ws = _WS.get(key)
    need = max(rows * n, 1)
    if ws is None or ws.numel() < need:
        if ws is not None:
            _OLD_WS.append(ws)
        size = 1 << (need - 1).bit_length()
        ws = torch.empty(size, dtype=torch.int64, device=device)
        _WS[key] = ws
    return ws


def topk_v2_cuda(x, k: int, page_table=None, page_size: int = 1, lengths=None,
                 cluster: int | None = None, stash: int | None = None,
                 sample4: int | None = None, flags: int | None = None):
    """topk_v2's contract (topk.py) on the CUDA kernel: x fp32 [rows, n] on an sm_90+ device,
    last dim contiguous. Returns (indices, slots) int32 [rows, k], -1 padded. ``stash`` /
    ``sample4`` / ``flags`` override STASH / SAMPLE4 / FLAGS (benchmarks, tests)."""
    import torch

    lib = _load()
    if lib is None:
        raise RuntimeError(f"CUDA TopK-V2 unavailable: {_error}")
    rows, n = x.shape
    dev = x.device
    out_idx = torch.empty(rows, k, dtype=torch.int32, device=dev)
    out_slot = torch.empty(rows, k, dtype=torch.int32, device=dev)
    if rows == 0:
        return out_idx, out_slot
    if n >= 2 ** 31 - 16:
        raise ValueError("topk_v2_cuda: n must fit in int32")
    len_ptr, len64 = 0, 0
    if lengths is not None:
        lens = lengths.reshape(rows)
        if lens.device != dev:
            lens = lens.to(dev)
        if lens.dtype not in (torch.int32, torch.int64):
            lens = lens.to(torch.int32)
        lens = lens.contiguous()
        len_ptr, len64 = lens.data_ptr(), int(lens.dtype == torch.int64)
    pt_ptr, pt_stride, pt64, rows_per_pt = 0, 0, 0, 1
    if page_table is not None:
        pt = page_table
        if pt.device != dev:
            pt = pt.to(dev)
        if pt.dtype not in (torch.int32, torch.int64):
            pt = pt.to(torch.int32)
        if pt.stride(1) != 1:
            pt = pt.contiguous()
        pt_ptr, pt_stride, pt64 = pt.data_ptr(), pt.stride(0), int(pt.dtype == torch.int64)
        rows_per_pt = rows // pt.shape[0]
    di = dev.index if dev.index is not None else torch.cuda.current_device()
    c = plan(rows, n, di) if cluster is None else int(cluster)
    ws = _workspace(dev, rows, max(n, 1))
    st = max(STASH if stash is None else int(stash), 0)  # (the library drops it where no row streams)
    s4 = SAMPLE4 if sample4 is None else int(sample4)
    fl = FLAGS if flags is None else int(flags)
    stream = torch.cuda.current_stream(dev).cuda_stream
    args = (x.data_ptr(), x.stride(0), len_ptr, len64, pt_ptr, pt_stride, pt64, rows_per_pt,
            page_size, out_idx.data_ptr(), out_slot.data_ptr(), ws.data_ptr(), max(n, 1), rows,
            n, k, CAP, c, st, s4, fl, stream)
    if di != torch.cuda.current_device():
        with torch.cuda.device(di):
            rc = lib.topk_v2_cuda_launch(*args)
    else:
        rc = lib.topk_v2_cuda_launch(*args)
    if rc != 0:
        raise RuntimeError(f"topk_v2_cuda launch (cluster {c}) failed: "
                           f"{lib.topk_v2_cuda_error_string(rc).decode()}")
    return out_idx, out_slot  # temporaries (converted lengths/table) are freed stream-ordered
