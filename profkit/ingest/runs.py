"""Which input files make one run: the ranks of one multi-GPU job, or a single-GPU trace on its own.

A folder of traces is not always one multi-GPU run: the public traces mix GPUs and engines,
`traces/sample` holds two single-GPU runs. The grouping is decided from cheap metadata, read from
the document's head before any event is decoded (Kineto writes it before `traceEvents`):

- a file that is not a rank of a multi-process job is a run of its own: its `distributedInfo` says
  world size 1, or it has no `distributedInfo` and no SGLang `-TP-<r>` in its name;
- the ranks of multi-process jobs form one run per (device names, world size, process names), so
  an 8-rank V100 job and two RTX 2080 Ti traces in one folder are three runs;
- after analysis, ranks of one run whose device or iteration shapes (the set of kind and batch
  size) disagree are split into separate runs (analysis/parallel.py, `split_by_analysis`).

A file that holds several ranks (SGLang's merged trace, a TraceLens fusion: ingest/processes.py) is
planned as one input, a run of its own; it is split when it is read, and analysis/parallel.py's
analyze_runs then gives the run the file once per rank (as an Nsight Systems export is here).

`trace_id` (Kineto's id of one profiler session, one per process) is read too: two files with the
same id come from one process, so they are never two ranks of one run.
Process names come from `process_name` metadata events where they are cheap to read (the head,
and for uncompressed files the tail, where Kineto writes them); digits are folded, so SGLang's
`sglang::scheduler_TP0` and `_TP1` agree.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from profkit.ingest.identity import TP_RANK, TraceFile

HEAD_BYTES = 1 << 20  # decompressed bytes read for the metadata
TAIL_BYTES = 1 << 20  # of an uncompressed file, for its process names
_PROCESS = re.compile(rb'"name"\s*:\s*"process_name"[^{}]*?"args"\s*:\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"')


@dataclass(frozen=True)
class FileInfo:
    path: Path
    devices: tuple[str, ...] = ()  # the distinct non-empty deviceProperties names
    world_size: int | None = None
    rank: int | None = None  # distributedInfo.rank, else -TP-<r> of the name
    trace_id: str | None = None
    processes: tuple[str, ...] = ()  # process names, digits folded
    file: TraceFile | None = field(default=None, compare=False, repr=False)  # as inspected (None: unreadable)

    @property
    def multi_rank(self) -> bool:
        """A rank of a multi-process job (else a run of its own)."""
        if self.world_size is not None:
            return self.world_size > 1
        return TP_RANK.search(self.path.name) is not None


@dataclass
class RunPlan:
    files: list[Path]
    infos: list[FileInfo]
    label: str = ""
    why: str = ""  # what sets it apart from the other runs (empty for a lone run)
    analyses: list[Any] = field(default_factory=list)

    def describe(self) -> str:
        i = self.infos[0] if self.infos else None
        dev = ", ".join(i.devices) if i and i.devices else "device unknown"
        n = len(self.files)
        ranks = f"{n} ranks" if n > 1 else "1 rank"
        ws = f", world size {i.world_size}" if i and i.world_size else ""
        names = ", ".join(f.name for f in self.files[:4]) + (f", … ({n} files)" if n > 4 else "")
        return f"{self.label} ({dev}{ws}; {ranks}: {names})"


def read_info(path: Path | TraceFile) -> FileInfo:
    """The grouping metadata of one trace file, from its first MiB (and, uncompressed, its last):
    decode.trace_meta of the document's head, its trace_id and process names. The file is
    inspected once (identity.TraceFile, kept in `file` for the loader) unless a TraceFile is given."""
    import msgspec

    from profkit.ingest.decode import TraceMeta, json_trace_meta
    from profkit.ingest.identity import trace_file

    try:
        f: TraceFile | None = trace_file(path)
    except OSError:  # unreadable: the loader says what is wrong
        f = None
    path = f.path if f is not None else path.path if isinstance(path, TraceFile) else Path(path)
    head = _json_head(f) if f is not None else b""
    meta: TraceMeta = {}
    tid: object = None
    i = head.find(b'"traceEvents"')
    prefix = head[:i].strip() if i > 0 else b""
    if prefix.startswith(b"{") and len(prefix) > 1:
        prefix = prefix.rstrip(b",").rstrip()
        try:
            doc = msgspec.json.decode(prefix + b"}")  # the untyped JSON head: what is of the wrong type is left out
        except msgspec.DecodeError:
            doc = None
        if isinstance(doc, dict):
            meta, tid = json_trace_meta(doc), doc.get("trace_id")
    devices = tuple(sorted({d for d in meta.get("devices", ()) if d}))
    world, rank = meta.get("world_size"), meta.get("rank")
    if rank is None:
        m = TP_RANK.search(path.name)
        rank = int(m.group(1)) if m else None
    procs = set(_PROCESS.findall(head))
    if f is not None and not f.gzip:
        whole = f.whole
        procs |= set(_PROCESS.findall(whole[-TAIL_BYTES:] if whole is not None else f.tail))
    names = tuple(sorted({re.sub(r"\d+", "", p.decode("utf-8", "replace")) for p in procs}))
    return FileInfo(path, devices, world, rank, str(tid) if isinstance(tid, (str, int)) else None, names, file=f)


def read_infos(files: list[Path]) -> tuple[list[Path], list[FileInfo]]:
    """read_info of each file, an Nsight Systems export (ingest/nsys.py) as one FileInfo per rank
    it holds, its path repeated in the files: (files, infos), in input order."""
    out_files: list[Path] = []
    infos: list[FileInfo] = []
    for p in files:
        info = read_info(p)
        if info.file is not None and info.file.sqlite:
            from profkit.ingest.nsys import parts

            for f, _key, rank, world, device in parts(info.file):
                out_files.append(p)
                infos.append(FileInfo(info.path, (device,) if device else (), world, rank, None, (), file=f))
            continue
        out_files.append(p)
        infos.append(info)
    return out_files, infos


def _json_head(f: TraceFile) -> bytes:
    """The first HEAD_BYTES of the file's JSON: from the bytes the TraceFile holds (gunzipped here
    when gzip), reading the file again only when they do not reach that far; b"" when the file is
    broken (the loader says so)."""
    if not f.gzip:
        return f.head[:HEAD_BYTES]
    import zlib

    whole = f.whole
    data = whole if whole is not None else f.head
    out = bytearray()
    try:
        while data and len(out) < HEAD_BYTES:
            d = zlib.decompressobj(31)  # one gzip member
            out += d.decompress(data, HEAD_BYTES - len(out))
            if len(out) >= HEAD_BYTES:
                break
            if not d.eof:
                if whole is not None:
                    return b""  # truncated
                return _read_head(f)  # the member goes on past the bytes held
            data = d.unused_data
            if data and data[:2] != b"\x1f\x8b":
                return _read_head(f)  # not another member: the gzip reader's own verdict
        if not data and whole is None and len(out) < HEAD_BYTES:
            return _read_head(f)
    except zlib.error:
        return b""
    return bytes(out)


def _read_head(f: TraceFile) -> bytes:
    from profkit.ingest.reading import open_decompressed

    try:
        with open_decompressed(f.path, f.gzip) as fh:
            return fh.read(HEAD_BYTES)
    except Exception:  # unreadable or broken: the loader says what is wrong
        return b""


def _label(files: list[Path]) -> str:
    from profkit.ingest.identity import short_label

    names = {re.sub(r"-TP-\d+(-EP-\d+)?$", "", short_label(f.name)) for f in files}
    if len(names) == 1:
        return names.pop()
    parents = {f.parent.name for f in files}
    return parents.pop() if len(parents) == 1 and next(iter(parents)) else short_label(files[0].name)


def _why(run: RunPlan, others: list[RunPlan]) -> str:
    i = run.infos[0]
    if not i.multi_rank:
        return "one process (world size 1)" if i.world_size == 1 else "one process (no distributedInfo)"
    reasons = []
    for o in others:
        j = o.infos[0]
        if not j.multi_rank:
            continue
        if i.devices != j.devices:
            reasons.append("device names")
        if i.world_size != j.world_size:
            reasons.append("world size")
        if i.processes != j.processes:
            reasons.append("process names")
    return ("its " + " and ".join(sorted(set(reasons))) + " differ") if reasons else "a multi-rank job"


def plan_runs(files: list[Path], infos: list[FileInfo] | None = None) -> list[RunPlan]:
    """The input files -> runs, in input order (see the module doc)."""
    if infos is None:
        files, infos = read_infos(files)
    runs: list[RunPlan] = []
    groups: dict[tuple[Any, ...], RunPlan] = {}
    for f, info in zip(files, infos):
        if not info.multi_rank:
            runs.append(RunPlan([f], [info]))
            continue
        key: tuple[Any, ...] = (info.devices, info.world_size, info.processes)
        g = groups.get(key)
        if g is not None and info.trace_id is not None and any(j.trace_id == info.trace_id for j in g.infos):
            g = None  # the same profiler session twice: one process, not another rank
            key = (*key, len(runs))
        if g is None:
            g = groups[key] = RunPlan([], [])
            runs.append(g)
        g.files.append(f)
        g.infos.append(info)
    label_runs(runs)
    if len(runs) > 1:
        for r in runs:
            r.why = _why(r, [o for o in runs if o is not r])
    return runs


def label_runs(runs: list[RunPlan]) -> None:
    """Each run's label: its files' common name (SGLang's -TP-<r> dropped), numbered where two agree."""
    for r in runs:
        r.label = _label(r.files)
    seen: dict[str, int] = {}
    for r in runs:
        seen[r.label] = seen.get(r.label, 0) + 1
    count: dict[str, int] = {}
    for r in runs:
        if seen[r.label] > 1:
            count[r.label] = count.get(r.label, 0) + 1
            r.label = f"{r.label} #{count[r.label]}"


def several_runs_message(runs: list[RunPlan], what: str, *, verb: str = "holds") -> str:
    """One line naming the runs of `what` (an input, or "these inputs" with verb "hold")."""
    return f"{what} {verb} {len(runs)} separate runs, not one: " + "; ".join(
        f"{k + 1}. {r.describe()}{' [' + r.why + ']' if r.why else ''}" for k, r in enumerate(runs))


def renumber_duplicate_ranks(items: list[Any], *, rank: Any, set_rank: Any, warn: Any, name: Any = lambda x: Path(x.path).name) -> None:
    """Ranks claimed by several files of one run: the first file keeps its rank, each later one
    takes the lowest number no file uses; only the files concerned get a warning naming them."""
    ranks = [rank(x) for x in items]
    if len(set(ranks)) == len(ranks):
        return
    used = set(ranks)
    seen: set[int] = set()
    new: dict[int, int] = {}
    for k, r in enumerate(ranks):
        if r in seen:
            n = 0
            while n in used:
                n += 1
            used.add(n)
            new[k] = n
        seen.add(r)
    for r in sorted({ranks[k] for k in new}):
        concerned = [k for k, x in enumerate(ranks) if x == r]
        names = ", ".join(name(items[k]) for k in concerned)
        moved = "; ".join(f"{name(items[k])} is numbered {new[k]}" for k in concerned if k in new)
        for k in concerned:
            warn(items[k], f"rank {r} appears in several inputs ({names}); {moved}")
    for k, n in new.items():
        set_rank(items[k], n)
