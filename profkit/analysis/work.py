"""The work of each GPU op: FLOPs and bytes from its launching op's shapes (DESIGN.md "Work and the hardware floor").

A GPU op takes the `Input Dims` / `Input type` of the CPU op that launched it (analysis/shapes.py). From those:

- GEMMs (`mm`, `addmm`, `bmm`, `baddbmm`, `linear`, `matmul`, `_scaled_mm`, and the in-place `addmm_`,
  `baddbmm_`): 2·M·N·K FLOPs (times the batch of a batched product) and the bytes of both operands and the
  result, each at its dtype's size (a bias or `self` added in is not counted), the textbook count of a
  matrix product (as tests/plain_flops.py counts it, independently);
- attention (`scaled_dot_product_attention` and its flash, efficient and cuDNN forms, `_flash_attention_forward`,
  `_efficient_attention_forward`, `_cudnn_attention_forward`): from q [B, Hq, Lq, D], k [B, Hkv, Lk, D], v [B, Hkv,
  Lk, Dv] (`_flash_attention_forward`: [B, L, H, D]), 2·B·Hq·Lq·Lk·(D + Dv) FLOPs (QKᵀ and PV) and the bytes of q,
  k, v and the output [B, Hq, Lq, Dv]; a causal mask is not visible in the shapes, so prefill is counted in full;
- elementwise, reduction, norm and copy ops: the bytes they read and write (no FLOPs): every tensor input read
  once and the output written once, the output being the first input's shape (unary ops, norms, copies), the
  inputs' broadcast shape (binary ops; 1 byte an element for comparisons), the first input itself (in-place ops,
  read and written), nothing (reductions: the output is small and its size is not in the shapes), or what the op
  writes (`copy_`: its destination; `fill_`/`zero_`: self, written only; `sort`: values and
  int64 indices; `gather`/`index_select`/`embedding`/`index_copy_`/`scatter_`: the rows they move, not the
  whole table they index);
- memcpy and memset records: a device-to-device copy reads and writes its bytes (2×), a memset writes them; a
  host-to-device or device-to-host copy has no work model (the host link is not in the peaks).

Everything else has no work model (`unmodeled`), `cat` among them: Kineto writes its TensorList input's dims but no
element type. A launching op's work is counted once, on the first of the
kernels it launched (a split-K GEMM's second kernel, a sort's histogram pass: work 0, their time is the op's);
its memcpy and memset records keep their own bytes. Peak-independent: analysis/floor.py turns work into time.
"""

from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING, Any

from profkit.apis import GRAPH_LAUNCH_APIS

if TYPE_CHECKING:
    import polars as pl

# bytes per element by the type name Kineto writes (c10's C++ spellings; c10/core/ScalarType.h sizes)
DTYPE_BYTES = {"float": 4, "double": 8, "c10::Half": 2, "c10::BFloat16": 2, "c10::Float8_e4m3fn": 1, "c10::Float8_e5m2": 1,
               "c10::Float8_e4m3fnuz": 1, "c10::Float8_e5m2fnuz": 1, "c10::Float8_e8m0fnu": 1, "c10::Float4_e2m1fn_x2": 1,
               "signed char": 1, "unsigned char": 1, "bool": 1, "short int": 2, "int": 4, "long int": 8,
               "c10::complex<float>": 8, "c10::complex<double>": 16, "c10::complex<c10::Half>": 4}
# the peaks table's dtype key of a matrix op by its operands' type (kernels/peaks/datasheet.toml `dense_tflop_s`);
# float32 counts at the plain FP32 rate (torch's default matmul precision, "highest", does not use TF32)
PEAK_DTYPE = {"c10::BFloat16": "bf16", "c10::Half": "fp16", "float": "fp32", "c10::Float8_e4m3fn": "fp8", "c10::Float8_e5m2": "fp8",
              "c10::Float8_e4m3fnuz": "fp8", "c10::Float8_e5m2fnuz": "fp8", "c10::Float4_e2m1fn_x2": "fp4"}

GEMM_OPS = frozenset({"aten::mm", "aten::addmm", "aten::addmm_", "aten::bmm", "aten::baddbmm", "aten::baddbmm_", "aten::linear",
                      "aten::matmul", "aten::_scaled_mm"})
ATTENTION_OPS = frozenset({"aten::scaled_dot_product_attention", "aten::_scaled_dot_product_flash_attention",
                           "aten::_scaled_dot_product_efficient_attention", "aten::_scaled_dot_product_cudnn_attention",
                           "aten::_efficient_attention_forward", "aten::_cudnn_attention_forward",
                           "aten::_scaled_dot_product_flash_attention_for_cpu"})
FLASH_LAYOUT = frozenset({"aten::_flash_attention_forward"})  # q [B, L, H, D]
_UNARY = {"relu", "silu", "gelu", "sigmoid", "tanh", "exp", "exp2", "log", "log2", "neg", "rsqrt", "sqrt", "abs", "cos", "sin",
          "reciprocal", "_softmax", "softmax", "_log_softmax", "log_softmax", "clamp", "clamp_min", "clamp_max", "sign", "erf",
          "floor", "ceil", "round", "trunc", "bitwise_not", "logical_not", "cumsum", "cumprod", "clone", "contiguous", "_to_copy",
          "to", "square", "hardtanh", "leaky_relu", "softplus", "mish", "nan_to_num", "isnan", "isinf", "frac", "triu", "tril",
          "flip", "roll", "gelu_and_mul", "silu_and_mul", "_fused_rms_norm", "rms_norm", "layer_norm", "native_layer_norm",
          "group_norm", "native_group_norm", "fused_add_rms_norm", "_weight_norm"}
_BINARY = {"add", "sub", "mul", "div", "rsub", "pow", "maximum", "minimum", "where", "masked_fill", "bitwise_and", "bitwise_or",
           "bitwise_xor", "logical_and", "logical_or", "floor_divide", "remainder", "fmod", "atan2", "lerp", "addcmul", "addcdiv",
           "complex", "polar", "copysign", "hypot", "xlogy"}
_COMPARE = {"eq", "ne", "lt", "le", "gt", "ge", "isclose"}
_REDUCE = {"sum", "mean", "amax", "amin", "max", "min", "argmax", "argmin", "prod", "norm", "linalg_vector_norm", "any", "all",
           "var", "std", "var_mean", "std_mean", "topk", "count_nonzero", "logsumexp", "max_pool2d", "aminmax"}
_ROWS = {"index_copy_", "index_add_", "scatter_", "scatter_add_", "scatter_reduce_", "index_copy", "index_add", "scatter",
         "scatter_add", "index_put_", "masked_scatter_"}  # write rows of a table: the moved rows, not the table


def _size(t: Any) -> int:
    return DTYPE_BYTES.get(t, 0) if isinstance(t, str) else 0


def _numel(d: Any) -> int:
    return math.prod(int(v) for v in d) if isinstance(d, list) and all(isinstance(v, int) for v in d) else 0


def _tensors(dims: list[Any], types: list[Any]) -> list[tuple[list[int], int]]:
    """(dims, element size) of each tensor input (a known dtype and a list of ints; 0-dim tensors included)."""
    out = []
    for i, d in enumerate(dims):
        t = types[i] if i < len(types) else None
        if isinstance(d, list) and all(isinstance(v, int) for v in d) and _size(t):
            out.append((d, _size(t)))
    return out


def _broadcast(shapes: list[list[int]]) -> list[int]:
    n = max((len(s) for s in shapes), default=0)
    out = [1] * n
    for s in shapes:
        for i, v in enumerate([1] * (n - len(s)) + list(s)):
            out[i] = max(out[i], v) if v != 1 else out[i]
    return out


def gemm_work(op: str, dims: list[Any], types: list[Any]) -> tuple[int, int, str] | None:
    """(flops, bytes, operand dtype) of one GEMM op; None when its shapes do not read as one."""
    def at(i: int) -> tuple[list[int], int, str]:
        return dims[i], _size(types[i]), types[i]

    try:
        if op in ("aten::mm", "aten::_scaled_mm"):
            (a, sa, ta), (b, sb, _) = at(0), at(1)
            batch, m, k, n = 1, a[0], a[1], b[1]
        elif op in ("aten::addmm", "aten::addmm_"):
            (a, sa, ta), (b, sb, _) = at(1), at(2)
            batch, m, k, n = 1, a[0], a[1], b[1]
        elif op == "aten::bmm":
            (a, sa, ta), (b, sb, _) = at(0), at(1)
            batch, m, k, n = a[0], a[1], a[2], b[2]
        elif op in ("aten::baddbmm", "aten::baddbmm_"):
            (a, sa, ta), (b, sb, _) = at(1), at(2)
            batch, m, k, n = a[0], a[1], a[2], b[2]
        elif op == "aten::linear":  # x [..., K] · weightᵀ, weight [N, K]
            (a, sa, ta), (b, sb, _) = at(0), at(1)
            batch, m, k, n = 1, _numel(a[:-1]), a[-1], b[0]
        elif op == "aten::matmul":  # numpy's rules: 1-d operands promoted, leading dims broadcast
            (a, sa, ta), (b, sb, _) = at(0), at(1)
            x = [1, *a] if len(a) == 1 else list(a)
            y = [*b, 1] if len(b) == 1 else list(b)
            batch, m, k, n = _numel(_broadcast([x[:-2], y[:-2]])) or 1, x[-2], x[-1], y[-1]
        else:
            return None
    except (IndexError, TypeError, KeyError):
        return None
    if not (sa and sb) or min(batch, m, k, n) < 0:
        return None
    # the result at the first operand's size (_scaled_mm's out_dtype is not in the shapes: fp8 operands give a
    # 1-byte result here, a lower bound of what a bf16 result writes)
    nbytes = _numel(a) * sa + _numel(b) * sb + batch * m * n * sa
    return 2 * batch * m * n * k, nbytes, ta


def attention_work(op: str, dims: list[Any], types: list[Any]) -> tuple[int, int, str] | None:
    """(flops, bytes, q's dtype) of one attention op from q, k, v; None when the shapes do not read as such."""
    ts = _tensors(dims[:3], types[:3])
    if len(ts) < 3 or any(len(d) != 4 for d, _ in ts):
        return None
    (q, sq), (k, sk), (v, sv) = ts
    if op in FLASH_LAYOUT:  # [B, L, H, D] -> [B, H, L, D]
        q, k, v = ([d[0], d[2], d[1], d[3]] for d in (q, k, v))
    b, hq, lq, dq = q
    lk, dv = k[2], v[3]
    out = b * hq * lq * dv * sq
    return 2 * b * hq * lq * lk * (dq + dv), _numel(q) * sq + _numel(k) * sk + _numel(v) * sv + out, types[0]


def bytes_work(op: str, dims: list[Any], types: list[Any]) -> int | None:
    """Bytes read and written by an elementwise, reduction, norm or copy op; None without a rule for it."""
    name = op.removeprefix("aten::")
    base = name[:-1] if name.endswith("_") and not name.endswith("__") else name
    inplace = base != name
    if name == "cat" and dims and isinstance(dims[0], list) and all(isinstance(x, list) for x in dims[0]):
        size = _size(next((t for t in types if t in DTYPE_BYTES), None)) or 0
        # a TensorList: its element type is not written ("TensorList"); the output's dtype is the inputs'
        return None if not size else 2 * sum(_numel(x) for x in dims[0]) * size
    ts = _tensors(dims, types)
    if not ts:
        return None
    read = sum(_numel(d) * s for d, s in ts)
    first = _numel(ts[0][0]) * ts[0][1]
    if name == "copy_" and len(ts) >= 2:
        return _numel(ts[1][0]) * ts[1][1] + first
    if base in ("fill", "zero"):
        return first
    if name == "sort":
        return first + first + _numel(ts[0][0]) * 8
    if name in ("gather", "index_select", "embedding", "take_along_dim"):
        # gather(self, dim, index) / index_select(self, dim, index) / embedding(weight, indices): the rows picked
        if len(ts) < 2:
            return None
        table, idx = ts[0], ts[1]
        rows = _numel(idx[0]) * (_numel(table[0][1:]) if name in ("index_select", "embedding") else 1)
        return _numel(idx[0]) * idx[1] + 2 * rows * table[1]
    if name in _ROWS:
        # (self, dim, index, source) or (self, index, source): the index and the moved rows (read, then written)
        rest = ts[1:]
        return sum(_numel(d) * s for d, s in rest) + (_numel(rest[-1][0]) * rest[-1][1] if rest else 0)
    if base in _REDUCE:
        return read
    if base in _UNARY:
        return read + (0 if inplace else first)
    if base in _BINARY or base in _COMPARE:
        if inplace:
            return read + first
        out = _numel(_broadcast([d for d, _ in ts]))
        return read + out * (1 if base in _COMPARE else max(s for _, s in ts))
    return None


def op_model(op: str | None, dims_text: str | None, types_text: str | None) -> tuple[int | None, int | None, str | None, str] | None:
    """(flops, bytes, peak dtype key, kind) of one launching op from its shapes (kind: gemm, attention, bytes);
    None: no work model."""
    if not op or dims_text is None:
        return None
    try:
        dims, types = json.loads(dims_text), json.loads(types_text) if types_text else []
    except ValueError:
        return None
    if not isinstance(dims, list) or not isinstance(types, list):
        return None
    if op in GEMM_OPS:
        g = gemm_work(op, dims, types)
        return None if g is None else (g[0], g[1], PEAK_DTYPE.get(g[2]), "gemm")
    if op in ATTENTION_OPS or op in FLASH_LAYOUT:
        w = attention_work(op, dims, types)
        return None if w is None else (w[0], w[1], PEAK_DTYPE.get(w[2]), "attention")
    b = bytes_work(op, dims, types)
    return None if b is None else (None, b, None, "bytes")


WORK_COLUMNS = ("work_flops", "work_bytes", "work_dtype", "work_kind")


def attach_work(ops: pl.DataFrame) -> pl.DataFrame:
    """`ops` (with analysis/shapes.py's columns) plus WORK_COLUMNS, null where an op has no work model:
    work_flops, work_bytes (Int64), work_dtype (the peaks' dtype key of its FLOPs), work_kind (gemm,
    attention, bytes, copy, memset; null: unmodeled). A launching op's work sits on its first kernel; its
    other kernels get 0 and its kind (modeled: their time is the op's)."""
    import polars as pl

    n = ops.height
    flops: list[int | None] = [None] * n
    nbytes: list[int | None] = [None] * n
    dtype: list[str | None] = [None] * n
    kind: list[str | None] = [None] * n
    models: dict[tuple[Any, Any, Any], Any] = {}
    seen: set[tuple[Any, ...]] = set()
    cols = ops.select("cat", "direction", "bytes", "shape_op", "shape", "shape_dtypes", "shape_op_ns", "launch_api", "correlation",
                      "launch_tid", "ts_ns").with_row_index("_i").sort("ts_ns", "_i")
    for i, cat, direction, b, op, dims, types, op_ns, api, corr, tid, _ in cols.iter_rows():
        if cat == "gpu_memcpy":
            if direction == "d2d" and b is not None:
                nbytes[i], kind[i] = 2 * int(b), "copy"
            continue
        if cat == "gpu_memset":
            if b is not None:
                nbytes[i], kind[i] = int(b), "memset"
            continue
        if op is None or op_ns is None:
            continue
        key = (op, dims, types)
        m = models.get(key, False)
        if m is False:
            m = models[key] = op_model(op, dims, types)
        if m is None:
            continue
        # one launching op: a graph replay's ops by (replay, capture-time start), an eager op by (thread, start)
        unit = (corr, op_ns, op) if api in GRAPH_LAUNCH_APIS else (tid, op_ns, op)
        kind[i] = m[3]
        if unit in seen:
            flops[i] = 0 if m[0] is not None else None
            nbytes[i] = 0
            dtype[i] = m[2]
            continue
        seen.add(unit)
        flops[i], nbytes[i], dtype[i] = m[0], m[1], m[2]
    return ops.with_columns(pl.Series("work_flops", flops, dtype=pl.Int64), pl.Series("work_bytes", nbytes, dtype=pl.Int64),
                            pl.Series("work_dtype", dtype, dtype=pl.String), pl.Series("work_kind", kind, dtype=pl.String))
