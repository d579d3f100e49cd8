"""A chunk of events -> its table rows through the C scanner in _scan.c: no Python object per event.

The scanner is compiled on first use with the system C compiler (`cc -O3 -shared`; $CC to choose
another) into the user's cache folder (~/.cache/profkit, or $PROFKIT_CACHE_DIR), keyed by a hash of
its source, and loaded with ctypes. Where there is no compiler (or PROFKIT_NO_SCANNER=1), `lib()`
is None and columnar.decode_chunk_tables decodes with msgspec instead: the same tables, several times slower.

The scanner accepts only what msgspec's typed decode accepts and returns an error code for
anything else; `scan_chunk_rows` then returns None and the caller decodes that chunk with msgspec, which
gives its own verdict (a NotFast, then the tiered decoder's warnings). So every table is the same
whichever decoder produced it; tests/test_scan.py checks that on real and adversarial inputs.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # numpy is imported where the arrays are made: loading this module costs no numpy
    import numpy as np

_SRC = Path(__file__).with_name("_scan.c")
CFLAGS = ("-O3", "-shared", "-fPIC")  # -O3: ~15% fewer instructions per byte than -O2 (callgrind)
X_PHASE = 26  # index of 'X' in the scanner's PHASES
V_TS, V_DUR, V_CORR, V_EXT, V_STREAM, V_DEVICE, V_BYTES, V_ARGS = 1, 2, 4, 8, 16, 32, 64, 128
NO_TEXT = 0xFFFFFFFF  # profkit_emit's id where a row has no `Input Dims` / `Input type`


class _Out(ctypes.Structure):
    _fields_ = [
        ("ph", ctypes.c_void_p), ("name", ctypes.c_void_p), ("cat", ctypes.c_void_p), ("pid", ctypes.c_void_p),
        ("tid", ctypes.c_void_p), ("ts", ctypes.c_void_p), ("dur", ctypes.c_void_p), ("corr", ctypes.c_void_p),
        ("ext", ctypes.c_void_p), ("stream", ctypes.c_void_p), ("device", ctypes.c_void_p), ("nbytes", ctypes.c_void_p),
        ("valid", ctypes.c_void_p), ("cap", ctypes.c_int64),
        ("s_off", ctypes.c_void_p), ("s_len", ctypes.c_void_p), ("s_esc", ctypes.c_void_p), ("s_cap", ctypes.c_int64),
        ("s_n", ctypes.c_int64), ("slots", ctypes.c_void_p), ("n_slots", ctypes.c_int64), ("shapes", ctypes.c_int64),
        ("dims", ctypes.c_void_p), ("types", ctypes.c_void_p),
    ]


_LIB: Any = None
_TRIED = False
_BUILD_LOCK = threading.Lock()


def cache_folder() -> Path:
    env = os.environ.get("PROFKIT_CACHE_DIR")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "profkit"


def _private(folder: Path) -> bool:
    """The folder exists (made 0700 if new), belongs to this user and only this user can write it:
    a library loaded from it cannot have been put there by someone else."""
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = folder.stat()
    except OSError:
        return False
    if hasattr(os, "getuid") and st.st_uid != os.getuid():
        return False
    return not st.st_mode & 0o022


def _build(so: Path) -> bool:
    cc = os.environ.get("CC", "cc")
    fd, tmp = tempfile.mkstemp(prefix=".scan-", suffix=".so", dir=so.parent)
    os.close(fd)
    try:
        r = subprocess.run([cc, *CFLAGS, "-o", tmp, str(_SRC)], capture_output=True, timeout=120)
        if r.returncode != 0:
            return False
        os.replace(tmp, so)  # atomic: processes building at once each publish a complete library
        return True
    except (OSError, subprocess.SubprocessError):
        return False
    finally:
        try:
            os.unlink(tmp)
        except OSError:
            pass


class _Emit(ctypes.Structure):
    _fields_ = [
        ("gid", ctypes.c_void_p), ("canon", ctypes.c_void_p), ("table", ctypes.c_void_p),
        ("name", ctypes.c_void_p), ("cat", ctypes.c_void_p), ("pid", ctypes.c_void_p), ("tid", ctypes.c_void_p),
        ("ts", ctypes.c_void_p), ("dur", ctypes.c_void_p), ("end", ctypes.c_void_p), ("corr", ctypes.c_void_p),
        ("ext", ctypes.c_void_p), ("stream", ctypes.c_void_p), ("device", ctypes.c_void_p), ("nbytes", ctypes.c_void_p),
        ("valid", ctypes.c_void_p), ("start", ctypes.c_int64 * 4), ("count", ctypes.c_int64 * 4),
        ("unusable", ctypes.c_int64 * 3), ("tmin", ctypes.c_double), ("has_tmin", ctypes.c_int64),
        ("dims", ctypes.c_void_p), ("types", ctypes.c_void_p), ("cpu_op", ctypes.c_uint32), ("cpu_op_without_args", ctypes.c_int64),
    ]


class _Lib:
    """The library's functions: profkit_scan (chunk -> events), profkit_emit (events -> table rows)
    and, for the analysis, profkit_gap_exclusive (a thread's exclusive time in each GPU gap)."""

    def __init__(self, dll: Any) -> None:
        p64, p32 = ctypes.POINTER(ctypes.c_int64), ctypes.POINTER(ctypes.c_int32)
        self.gap_exclusive = dll.profkit_gap_exclusive
        self.gap_exclusive.restype = ctypes.c_int64
        self.gap_exclusive.argtypes = [p64, p64, p32, ctypes.c_int64, p64, p64, p32, ctypes.c_int64, p64, p64, ctypes.c_int64,
                                       ctypes.c_int32, p32, p64]
        self.point_owner = dll.profkit_point_owner
        self.point_owner.restype = ctypes.c_int64
        self.point_owner.argtypes = [p64, p64, ctypes.c_int64, p64, ctypes.c_int64, p64]
        self.scan = dll.profkit_scan
        self.scan.restype = ctypes.c_int64
        self.scan.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.POINTER(_Out)]
        self.emit = dll.profkit_emit
        self.emit.restype = ctypes.c_int64
        self.emit.argtypes = [ctypes.POINTER(_Out), ctypes.c_int64, ctypes.POINTER(_Emit)]


def _tag() -> str:
    """The library's file tag: its source, the platform and the compiler flags."""
    return hashlib.blake2b(_SRC.read_bytes() + f"{sys.platform}|{os.uname().machine}|{CFLAGS}".encode(), digest_size=8).hexdigest()


def lib() -> Any:
    """The loaded scanner (a _Lib), building it on first use; None where it cannot be built or is switched off."""
    global _LIB, _TRIED
    if _TRIED:
        return _LIB
    with _BUILD_LOCK:  # threads asking at once wait for one build
        if not _TRIED:
            _LIB = _load()
            _TRIED = True
    return _LIB


def _load() -> Any:
    if os.environ.get("PROFKIT_NO_SCANNER", "").strip() not in ("", "0", "false", "no"):
        return None
    try:
        tag = _tag()
    except (OSError, AttributeError):
        return None
    for folder in (cache_folder(), Path(tempfile.gettempdir()) / f"profkit-{os.getuid() if hasattr(os, 'getuid') else 'user'}"):
        so = folder / f"_scan-{tag}.so"
        try:
            if not _private(folder):
                continue
            if not so.exists() and not _build(so):
                continue
            return _Lib(ctypes.CDLL(str(so)))
        except (OSError, AttributeError):  # not loadable here, or not our library: next folder, else msgspec
            continue
    return None


def _address(data: Any) -> tuple[int, Any]:
    """(address, keep-alive) of a bytes-like object's memory, without copying where possible."""
    if isinstance(data, bytes):
        p = ctypes.cast(ctypes.c_char_p(data), ctypes.c_void_p).value
        return p or 0, data
    mv = memoryview(data)
    if not mv.readonly:
        buf = (ctypes.c_char * mv.nbytes).from_buffer(mv)
        return ctypes.addressof(buf), (buf, mv)
    b = mv.tobytes()
    return ctypes.cast(ctypes.c_char_p(b), ctypes.c_void_p).value or 0, b


_LOCAL = threading.local()


def _buffers(cap: int, s_cap: int) -> dict[str, np.ndarray]:
    """The scanner's output arrays, reused by each thread from chunk to chunk (fresh arrays cost
    page faults: more system time than the scan itself); the columns built from them are copies."""
    import numpy as np

    got = getattr(_LOCAL, "arrays", None)
    if got is None or len(got["ph"]) < cap or len(got["s_off"]) < s_cap:
        got = {
            "ph": np.empty(cap, np.int8), "name": np.empty(cap, np.int32), "cat": np.empty(cap, np.int32),
            "pid": np.empty(cap, np.int32), "tid": np.empty(cap, np.int32), "ts": np.empty(cap, np.float64),
            "dur": np.empty(cap, np.float64), "corr": np.empty(cap, np.int64), "ext": np.empty(cap, np.int64),
            "stream": np.empty(cap, np.int64), "device": np.empty(cap, np.int64), "nbytes": np.empty(cap, np.int64),
            "valid": np.empty(cap, np.uint8), "s_off": np.empty(s_cap, np.int64), "s_len": np.empty(s_cap, np.int32),
            "s_esc": np.empty(s_cap, np.uint8), "slots": np.empty(2 * s_cap, np.int32),
            "dims": np.empty(cap, np.int32), "types": np.empty(cap, np.int32),
        }
        _LOCAL.arrays = got
    got["slots"][: 2 * s_cap] = -1
    return got


def _scan(data: Any) -> tuple[dict[str, np.ndarray], int, list[str], _Out] | None:
    """Run the scanner over a chunk: (its output arrays, event count, the chunk's distinct strings
    by local id, the output struct), or None when the scanner is not there or does not accept the chunk."""
    got = lib()
    if got is None:
        return None
    fn = got.scan
    n_bytes = len(data) if isinstance(data, bytes) else memoryview(data).nbytes
    addr, keep = _address(data)
    cap = n_bytes // 48 + 1024
    s_cap = 1 << 15
    for _ in range(4):
        a = _buffers(cap, s_cap)
        out = _Out(cap=cap, s_cap=s_cap, s_n=2, n_slots=2 * s_cap, **{k: v.ctypes.data for k, v in a.items()})
        n = fn(addr, n_bytes, ctypes.byref(out))
        if n == -3:  # E_CAP: more events or distinct strings than room: grow and scan again
            cap, s_cap = max(cap, n_bytes // 10 + 16), s_cap * 8
            continue
        break
    if n < 0:
        return None
    del keep
    # the distinct strings: ids 0 and 1 are the defaults "" (name, cat) and "0" (pid, tid)
    view = memoryview(data) if not isinstance(data, bytes) else data
    texts = ["", "0"]
    try:
        for off, ln, esc in zip(a["s_off"][2: out.s_n].tolist(), a["s_len"][2: out.s_n].tolist(), a["s_esc"][2: out.s_n].tolist()):
            raw = bytes(view[off: off + ln])
            # esc 1: a string's content with escapes; 2: the raw JSON text of a value (`Input Dims`), kept as it is written
            texts.append(json.loads(b'"' + raw + b'"') if esc == 1 else raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return None  # invalid UTF-8 or escape: msgspec's verdict
    return a, int(n), texts, out


@dataclass
class Rows:
    """A chunk's rows of the four tables as the scanner's second pass writes them: one array per
    column (name, cat, pid, tid, ts, dur, end, corr, ext, stream, device, nbytes, valid), the rows
    of table t at [start[t], start[t] + count[t]); plus what columnar.decode_chunk_tables returns
    besides the rows. A table's rows hold only its own columns (coded.py's GPU_CODED, CALLS_CODED,
    CPU_CODED): the others are left unwritten there (e.g. `corr` of a CPU row is garbage)."""

    cols: dict[str, np.ndarray]
    start: tuple[int, int, int, int]
    count: tuple[int, int, int, int]
    unusable: tuple[int, int, int]
    tmin: float | None
    n_events: int

    def table(self, t: int) -> dict[str, np.ndarray]:
        a, b = self.start[t], self.start[t] + self.count[t]
        return {k: v[a:b] for k, v in self.cols.items()}


def scan_chunk_rows(data: Any, strings: Any) -> Rows | None:
    """A chunk -> its Rows, with the string columns as ids into `strings` (an ingest.strings.Strings
    shared by the file's chunks) and `cat` in its canonical spelling; None when the scanner is not
    there or does not accept the chunk. Polars-free: the scanner's second pass (profkit_emit)
    computes the integer times and groups the usable rows by table, into fresh arrays."""
    got = _scan(data)
    if got is None:
        return None
    import numpy as np

    from profkit.ingest.strings import cat_codes

    a, n, texts, out = got
    if out.shapes:
        strings.shapes = True  # the file has `Input Dims` (ingest/shapes.py reads them when a view needs them)
    if any(t[:1] == "[" for t in texts):  # perhaps SGLang's merged ranks: each rank's earliest event
        _note_labelled(a, n, texts, strings)
    gid = strings.ids(texts)  # chunk id -> file id
    x = a["ph"][:n] == X_PHASE
    canon, table = cat_codes(strings, texts, np.flatnonzero(np.bincount(a["cat"][:n][x], minlength=len(texts))))
    cols = {k: np.empty(n, np.uint32) for k in ("name", "cat", "pid", "tid")}
    cols.update({k: np.empty(n, np.int64) for k in ("ts", "dur", "end", "corr", "ext", "stream", "device", "nbytes")})
    cols["valid"] = np.empty(n, np.uint8)
    if out.shapes:  # the CPU rows' `Input Dims` and `Input type` (ingest/shapes.py): only in chunks that have them
        cols["dims"], cols["types"] = np.empty(n, np.uint32), np.empty(n, np.uint32)
    e = _Emit(gid=gid.ctypes.data, canon=canon.ctypes.data, table=table.ctypes.data, cpu_op=int(strings.ids(["cpu_op"])[0]),
              **{k: v.ctypes.data for k, v in cols.items()})
    lib().emit(ctypes.byref(out), n, ctypes.byref(e))
    if e.cpu_op_without_args:
        strings.shape_rows_missing = True  # ingest/shapes.py's rows need the args of every cpu_op: read them apart
    return Rows(cols, tuple(e.start), tuple(e.count), tuple(e.unusable), e.tmin if e.has_tmin else None, n)


def _note_labelled(a: dict[str, np.ndarray], n: int, texts: list[str], strings: Any) -> None:
    """The earliest timestamp of the chunk's events of each SGLang-labelled pid, noted in `strings`
    (Strings.note_min_ts; ingest/processes.py)."""
    from profkit.ingest.processes import label_of

    ids = [i for i, t in enumerate(texts) if t[:1] == "[" and label_of(t) is not None]
    if not ids:
        return
    pid = a["pid"][:n] & 0x3FFFFFFF  # the scanner's id; its 0x40000000 bit marks the text of an int
    has_ts = (a["valid"][:n] & V_TS) != 0
    ts = a["ts"][:n]
    got = {}
    for i in ids:
        sel = (pid == i) & has_ts
        if sel.any():
            got[texts[i]] = float(ts[sel].min())
    strings.note_min_ts(got)


def gap_exclusive(a: tuple[Any, Any, Any], b: tuple[Any, Any, Any], g0: Any, g1: Any, top: int) -> tuple[Any, Any] | None:
    """profkit_gap_exclusive over numpy arrays: one thread's two event streams a and b (its CPU
    events, its runtime calls), each (ts, end, name id) with int64 times ordered by ts and int32
    name ids in the names' order; gaps (int64 g0, g1) disjoint and ordered. (names, ns), each of
    shape (gaps, top), name -1 where a gap has fewer; None without the native library or when a
    stream is not ordered by ts (the caller sweeps in Python)."""
    import numpy as np

    got = lib()
    if got is None:
        return None
    p64, p32 = ctypes.POINTER(ctypes.c_int64), ctypes.POINTER(ctypes.c_int32)
    args: list[Any] = []
    keep = []
    for ts, end, name in (a, b):
        ts, end = (np.ascontiguousarray(x, dtype=np.int64) for x in (ts, end))
        name = np.ascontiguousarray(name, dtype=np.int32)
        keep += [ts, end, name]
        args += [ts.ctypes.data_as(p64), end.ctypes.data_as(p64), name.ctypes.data_as(p32), len(ts)]
    g0, g1 = (np.ascontiguousarray(x, dtype=np.int64) for x in (g0, g1))
    m = len(g0)
    out_name = np.empty(max(m * top, 1), np.int32)
    out_ns = np.empty(max(m * top, 1), np.int64)
    rc = got.gap_exclusive(*args, g0.ctypes.data_as(p64), g1.ctypes.data_as(p64), m, top, out_name.ctypes.data_as(p32),
                           out_ns.ctypes.data_as(p64))
    if rc == -2:
        return None
    if rc != 0:
        raise MemoryError("profkit_gap_exclusive: out of memory")
    return out_name[: m * top].reshape(m, top), out_ns[: m * top].reshape(m, top)


def point_owner(ts: Any, end: Any, points: Any) -> Any | None:
    """profkit_point_owner over numpy arrays (spans ordered by (ts, -end), points by time): per point
    the position of the innermost span holding it, -1 for none; None without the native library."""
    import numpy as np

    got = lib()
    if got is None:
        return None
    ts, end, points = (np.ascontiguousarray(x, dtype=np.int64) for x in (ts, end, points))
    out = np.empty(max(len(points), 1), np.int64)
    p64 = ctypes.POINTER(ctypes.c_int64)
    if got.point_owner(ts.ctypes.data_as(p64), end.ctypes.data_as(p64), len(ts), points.ctypes.data_as(p64), len(points),
                       out.ctypes.data_as(p64)) != 0:
        raise MemoryError("profkit_point_owner: out of memory")
    return out[: len(points)]
