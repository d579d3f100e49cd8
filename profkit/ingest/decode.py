"""Bytes of a Kineto (Chrome-trace JSON) file -> typed event records, with clear errors.

Decoding is typed (msgspec Structs): no per-event dicts, unknown keys skipped by the decoder. Three
tiers, fastest first: strict types; lax types (numbers written as strings, integral floats for ids:
a schema variant, reported as one warning); an untyped fallback that coerces event by event and
skips what it cannot read (also reported). A file that is not a Kineto trace at all raises
TraceInputError with one line naming the file, the problem and what to try.
"""

from __future__ import annotations

import gzip
import zlib
from pathlib import Path
from typing import Any, NoReturn, TypedDict

import msgspec

from profkit.errors import TraceInputError
from profkit.ingest.identity import TraceFile


class Args(msgspec.Struct, gc=False, frozen=True):
    """The event args profkit reads: the one Kineto args schema, of both decoders (this one and
    the chunked path's, ingest/columnar.py). Frozen and untracked by the GC: a shared default
    instance needs no None check, and millions of them cost no collections."""

    correlation: int | None = None
    external_id: int | None = msgspec.field(name="External id", default=None)
    stream: int | None = None
    device: int | None = None
    bytes: int | str | None = None  # ROCm runtime calls write it as a string
    # only whether it is there: the shapes themselves are read apart, where a view needs them (ingest/shapes.py)
    input_dims: Any = msgspec.field(name="Input Dims", default=None)


class Event(msgspec.Struct):
    ph: str = ""
    cat: str = ""
    name: str = ""
    ts: float | None = None
    dur: float | None = None
    pid: int | str = 0
    tid: int | str = 0
    args: Args | None = None


class DeviceProp(msgspec.Struct):
    name: str = ""
    # what device_name reads when the name is empty (typed loosely: a file whose values are of
    # other types keeps the strict decoder)
    computeMajor: Any = None
    computeMinor: Any = None
    numSms: Any = None
    totalGlobalMem: Any = None
    warpSize: Any = None


# AMD Instinct parts by what Kineto's deviceProperties say of a ROCm device: (name, GFXIP major and
# minor version = computeMajor/computeMinor, compute units = numSms, VRAM GiB = totalGlobalMem), from
# the "AMD GPU specifications" table of the ROCm documentation
# (rocm.docs.amd.com/en/latest/reference/gpu-specs.html). Only parts no other row shares.
AMD_PARTS = (("AMD Instinct MI300X", 9, 4, 304, 192), ("AMD Instinct MI325X", 9, 4, 304, 256))


def device_name(p: DeviceProp) -> str:
    """A deviceProperties entry's device: its `name`; when that is empty (vLLM's ROCm traces), the AMD
    Instinct part its GFXIP version, compute units and memory are (AMD_PARTS), else those properties
    in words ("AMD GPU (GFXIP 9.4, 304 CUs, 192 GiB)"); "" when the entry says nothing."""
    name = p.name.strip()
    if name:
        return name
    major, minor, units, mem, warp = p.computeMajor, p.computeMinor, p.numSms, p.totalGlobalMem, p.warpSize
    if not isinstance(mem, int) or not all(isinstance(v, int) and not isinstance(v, bool) for v in (major, minor, units, mem)):
        return ""
    gib = mem / (1 << 30)
    amd = warp == 64  # a wavefront of 64: an AMD GPU (NVIDIA's warps are 32)
    for part, mj, mn, cu, vram in AMD_PARTS if amd else ():
        if (major, minor, units) == (mj, mn, cu) and abs(gib - vram) <= 0.02 * vram:
            return part
    return (f"AMD GPU (GFXIP {major}.{minor}, {units} CUs, {gib:.0f} GiB)" if amd
            else f"GPU (compute capability {major}.{minor}, {units} SMs, {gib:.0f} GiB)")


class DistInfo(msgspec.Struct):
    rank: int | None = None
    world_size: int | None = None


class DocMeta(msgspec.Struct, kw_only=True):
    """The document around `traceEvents` as the strict decoders type it (the chunked path decodes
    it apart from the events, ingest/reading.py): a file whose metadata does not fit takes the
    tiered path, whichever path saw it first."""

    deviceProperties: list[DeviceProp] | None = None
    distributedInfo: DistInfo | None = None
    baseTimeNanoseconds: int | None = None


class TraceDoc(DocMeta, kw_only=True):
    traceEvents: list[Event]


class TraceMeta(TypedDict, total=False):
    """A trace's metadata (Trace.meta): what trace_meta reads from the document, and what the loader
    adds; every key absent when unknown. Stored as it is in the tables cache's manifest.json."""

    devices: list[str]  # deviceProperties' names, in order (device_name); an nsys rank's one device
    rank: int  # distributedInfo.rank; a rank of a file of several (ingest/processes.py), of an nsys export
    world_size: int
    # what the rank was read from when not a Kineto trace of its own (summary.json's rank `source`):
    # {"merged": form, "process": name} (processes.Split.source) or an nsys export's version, device_id and pid
    source: dict[str, str | int | None]
    shapes: bool  # recorded with shapes (`Input Dims`: ingest/shapes.py); absent otherwise


def trace_meta(doc: DocMeta) -> TraceMeta:
    """The metadata profkit reads from a trace document the strict decoders typed: `devices`
    (deviceProperties' names, in order; device_name), `rank` and `world_size` (distributedInfo's,
    where integers). The one reader of trace metadata (json_trace_meta reads the untyped JSON
    object the same way): the decoders' tiers, the chunked path and the run grouping
    (ingest/runs.py) all use it; what is not of the expected type is left out."""
    return _meta(doc.deviceProperties or None, doc.distributedInfo)


def json_trace_meta(doc: object) -> TraceMeta:
    """trace_meta of an untyped JSON document (the loose tier, a file's head): entries of the
    wrong type are left out."""
    if not isinstance(doc, dict):
        return {}
    props = doc.get("deviceProperties")
    devices = None
    if isinstance(props, list):
        devices = [DeviceProp(name=str(p.get("name") or ""), computeMajor=p.get("computeMajor"), computeMinor=p.get("computeMinor"),
                              numSms=p.get("numSms"), totalGlobalMem=p.get("totalGlobalMem"), warpSize=p.get("warpSize"))
                   for p in props if isinstance(p, dict)]
    meta = _meta(devices if props else None, None)
    dist = doc.get("distributedInfo")
    if isinstance(dist, dict):
        rank, world = dist.get("rank"), dist.get("world_size")
        if isinstance(rank, int):
            meta["rank"] = rank
        if isinstance(world, int):
            meta["world_size"] = world
    return meta


def _meta(props: list[DeviceProp] | None, dist: DistInfo | None) -> TraceMeta:
    meta: TraceMeta = {}
    if props is not None:
        meta["devices"] = [device_name(p) for p in props]
    if dist is not None:
        if isinstance(dist.rank, int):
            meta["rank"] = dist.rank
        if isinstance(dist.world_size, int):
            meta["world_size"] = dist.world_size
    return meta


_STRICT = msgspec.json.Decoder(TraceDoc)
_LAX = msgspec.json.Decoder(TraceDoc, strict=False)
_STRICT_LIST = msgspec.json.Decoder(list[Event])
_LAX_LIST = msgspec.json.Decoder(list[Event], strict=False)

_HINT_KINETO = "profkit reads PyTorch-profiler (Kineto) Chrome-trace JSON, plain or gzipped (*.trace.json.gz, *.pt.trace.json)"


def check_reachable(path: Path) -> None:
    """Raise TraceInputError if a folder on the way to `path` cannot be traversed (Python < 3.12's
    Path.exists() would raise PermissionError) or `path` does not exist."""
    try:
        path.stat()
    except PermissionError:
        raise TraceInputError(f"{path}: permission denied", hint="check the permissions of the file and its folders") from None
    except OSError:
        pass
    if not path.exists():
        raise TraceInputError(f"{path}: no such file or directory", hint="check the path")


def check_readable(path: Path | TraceFile) -> TraceFile:
    """The file inspected once (identity.TraceFile), or TraceInputError (one line, the file and
    what to do) unless `path` is a readable, non-empty file. A TraceFile is taken as it is."""
    if not isinstance(path, TraceFile):
        given = path
        try:
            path = TraceFile.of(given)
        except OSError as e:
            _explain(Path(given), e)
    if path.size == 0:
        raise TraceInputError(f"{path.path}: empty file", hint="the profiler may still be writing it, or it failed; record again")
    return path


def _explain(path: Path, e: OSError) -> NoReturn:
    """Raise the one line for a file that could not be opened."""
    check_reachable(path)
    if not path.exists():
        raise TraceInputError(f"{path}: no such file", hint="check the path")
    if path.is_dir():
        raise TraceInputError(f"{path}: is a directory with no trace files", hint=_HINT_KINETO)
    if isinstance(e, PermissionError):
        raise TraceInputError(f"{path}: permission denied", hint="check the file's permissions (chmod +r)") from None
    raise TraceInputError(f"{path}: cannot read ({e.strerror})", hint="check the file") from None


def read_bytes(path: Path | TraceFile) -> bytes:
    """The file's JSON bytes, gunzipped when the content is gzip (decided by magic bytes, not suffix)."""
    f = check_readable(path)
    raw = f.whole
    if raw is None:
        try:
            raw = f.path.read_bytes()
        except OSError as e:
            raise TraceInputError(f"{f.path}: cannot read ({e.strerror})", hint="check the file") from None
    path = f.path
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (EOFError, gzip.BadGzipFile, zlib.error) as e:
            raise TraceInputError(
                f"{path}: truncated or corrupt gzip ({e}): capture health: unusable",
                hint="the file was cut short (copy interrupted, or the profiler still writing); copy or record it again",
            ) from None
        if not raw:
            raise TraceInputError(f"{path}: gzip of an empty file", hint="record the trace again")
    return raw


def _sniff_not_json(path: Path, data: bytes) -> None:
    head = data[:64].lstrip()
    if head[:1] in (b"{", b"["):
        return
    name = path.name.lower()
    if name.endswith(".sqlite"):
        what = "not an SQLite database (an Nsight Systems export starts with 'SQLite format 3')"
        hint = "export the report again: nsys export --type sqlite -o CAPTURE.sqlite CAPTURE.nsys-rep"
    elif name.endswith((".pftrace", ".perfetto-trace", ".pb", ".proto")) or data[:1] in (b"\x0a", b"\x08"):
        what = "binary (a Perfetto protobuf trace?)"
        hint = "export the trace as Chrome JSON (torch: prof.export_chrome_trace('x.json.gz'))"
    elif path.suffix == ".gz":
        what = "not gzip and not JSON"
        hint = _HINT_KINETO
    else:
        what = "not JSON"
        hint = _HINT_KINETO
    raise TraceInputError(f"{path}: {what}", hint=hint)


def decode_events(path: Path, data: bytes) -> tuple[list[Event], TraceMeta, list[str]]:
    """Typed events, the document's metadata (device names, rank) and warnings."""
    _sniff_not_json(path, data)
    warnings: list[str] = []
    is_list = data.lstrip()[:1] == b"["
    try:
        if is_list:
            return _STRICT_LIST.decode(data), {}, warnings
        doc = _STRICT.decode(data)
        return doc.traceEvents, trace_meta(doc), warnings
    except msgspec.ValidationError:
        pass
    except msgspec.DecodeError as e:
        raise TraceInputError(f"{path}: not valid JSON ({_short(e)}): capture health: unusable",
                              hint="the file is truncated or corrupt; record or copy it again") from None
    try:
        if is_list:
            events = _LAX_LIST.decode(data)
            meta: TraceMeta = {}
        else:
            doc = _LAX.decode(data)
            events, meta = doc.traceEvents, trace_meta(doc)
        warnings.append("some event fields had non-standard types (numbers written as strings, float ids); converted")
        return events, meta, warnings
    except msgspec.ValidationError:
        pass
    return _decode_loose(path, data, is_list, warnings)


def _short(e: Exception) -> str:
    s = str(e)
    return s if len(s) < 120 else s[:117] + "..."


def _decode_loose(path: Path, data: bytes, is_list: bool, warnings: list[str]) -> tuple[list[Event], TraceMeta, list[str]]:
    try:
        obj = msgspec.json.decode(data)
    except msgspec.DecodeError as e:
        raise TraceInputError(f"{path}: not valid JSON ({_short(e)}): capture health: unusable", hint="the file is truncated or corrupt") from None
    meta: TraceMeta = {}
    if is_list:
        items = obj
    elif isinstance(obj, dict) and isinstance(obj.get("traceEvents"), list):
        items = obj["traceEvents"]
        meta = json_trace_meta(obj)
    elif isinstance(obj, dict):
        raise TraceInputError(f"{path}: JSON object without a 'traceEvents' list", hint=_HINT_KINETO)
    else:
        raise TraceInputError(f"{path}: JSON of the wrong shape (a {type(obj).__name__}, not a trace)", hint=_HINT_KINETO)
    if not isinstance(items, list):
        raise TraceInputError(f"{path}: JSON of the wrong shape", hint=_HINT_KINETO)
    events: list[Event] = []
    bad = 0
    for item in items:
        ev = _coerce(item)
        if ev is None:
            bad += 1
        else:
            events.append(ev)
    if is_list and items and not events:
        raise TraceInputError(f"{path}: JSON array holds no trace events", hint=_HINT_KINETO)
    if bad:
        warnings.append(f"skipped {bad} unreadable events (not objects, or fields of the wrong type)")
    else:
        warnings.append("some event fields had non-standard types; converted")
    return events, meta, warnings


def _num(v: Any) -> float | None:
    if v is None or isinstance(v, bool):
        return None
    if isinstance(v, (int, float)):
        return float(v)
    if isinstance(v, str):
        try:
            return float(v)
        except ValueError:
            return None
    return None


def _int(v: Any) -> int | None:
    f = _num(v)
    if f is None or f != f or f in (float("inf"), float("-inf")):
        return None
    return int(f)


# The args of a raw event that profkit reads: Args' fields, as the JSON names them ("External id" is
# no identifier: the functional form)
RawArgs = TypedDict("RawArgs", {"correlation": int, "External id": int, "stream": int, "device": int, "bytes": int | str},
                    total=False)


class RawEvent(TypedDict, total=False):
    """A trace event as the JSON object the untyped tier reads (the fields of Event, with the types
    the format gives them); a file reaches that tier because some values are of other types, so
    _coerce checks each value before it is used."""

    ph: str
    cat: str
    name: str
    ts: float
    dur: float
    pid: int | str
    tid: int | str
    args: RawArgs


def _coerce(item: RawEvent) -> Event | None:
    """An element of traceEvents as an Event, each value's type checked; None for what is not an object."""
    if not isinstance(item, dict):
        return None
    ph, name, cat = item.get("ph", ""), item.get("name", ""), item.get("cat", "")
    if not isinstance(ph, str):
        return None
    if not isinstance(name, str):
        name = str(name)
    if not isinstance(cat, str):
        cat = str(cat)
    pid = item.get("pid", 0)
    tid = item.get("tid", 0)
    pid = pid if isinstance(pid, (int, str)) and not isinstance(pid, bool) else str(pid)
    tid = tid if isinstance(tid, (int, str)) and not isinstance(tid, bool) else str(tid)
    a = item.get("args")
    args = None
    if isinstance(a, dict):
        args = Args(
            correlation=_int(a.get("correlation")),
            external_id=_int(a.get("External id")),
            stream=_int(a.get("stream")),
            device=_int(a.get("device")),
            bytes=_int(a.get("bytes")),
        )
    return Event(ph=ph, cat=cat, name=name, ts=_num(item.get("ts")), dur=_num(item.get("dur")), pid=pid, tid=tid, args=args)
