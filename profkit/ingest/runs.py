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

HEAD_BYTES = 1 << 20  # decompressed bytes read for the metadata
TAIL_BYTES = 1 << 20  # of an uncompressed file, for its process names
_TP_RANK = re.compile(r"-TP-(\d+)")
_PROCESS = re.compile(rb'"name"\s*:\s*"process_name"[^{}]*?"args"\s*:\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"')


@dataclass(frozen=True)
class FileInfo:
    path: Path
    devices: tuple[str, ...] = ()  # the distinct non-empty deviceProperties names
    world_size: int | None = None
    rank: int | None = None  # distributedInfo.rank, else -TP-<r> of the name
    trace_id: str | None = None
    processes: tuple[str, ...] = ()  # process names, digits folded

    @property
    def multi_rank(self) -> bool:
        """A rank of a multi-process job (else a run of its own)."""
        if self.world_size is not None:
            return self.world_size > 1
        return _TP_RANK.search(self.path.name) is not None


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


def read_info(path: Path) -> FileInfo:
    """The grouping metadata of one trace file, from its first MiB (and, uncompressed, its last)."""
    import msgspec

    from profkit.ingest.reading import open_decompressed

    path = Path(path)
    head = magic = b""
    try:
        with open(path, "rb") as f:
            magic = f.read(2)
        with open_decompressed(path, magic) as f:
            head = f.read(HEAD_BYTES)
    except Exception:  # unreadable or broken: the loader says what is wrong
        pass
    doc: dict[str, Any] = {}
    i = head.find(b'"traceEvents"')
    prefix = head[:i].strip() if i > 0 else b""
    if prefix.startswith(b"{"):
        prefix = prefix.rstrip(b",").rstrip()
        try:
            got = msgspec.json.decode(prefix + b"}") if len(prefix) > 1 else {}
            doc = got if isinstance(got, dict) else {}
        except msgspec.DecodeError:
            doc = {}
    props = doc.get("deviceProperties")
    devices = tuple(sorted({str(p.get("name")) for p in props if isinstance(p, dict) and p.get("name")})) if isinstance(props, list) else ()
    dist = doc.get("distributedInfo") if isinstance(doc.get("distributedInfo"), dict) else {}
    world = dist.get("world_size") if isinstance(dist.get("world_size"), int) else None
    rank = dist.get("rank") if isinstance(dist.get("rank"), int) else None
    if rank is None:
        m = _TP_RANK.search(path.name)
        rank = int(m.group(1)) if m else None
    tid = doc.get("trace_id")
    procs = set(_PROCESS.findall(head))
    if magic != b"\x1f\x8b":
        try:
            with open(path, "rb") as f:
                f.seek(max(0, path.stat().st_size - TAIL_BYTES))
                procs |= set(_PROCESS.findall(f.read()))
        except OSError:
            pass
    names = tuple(sorted({re.sub(r"\d+", "", p.decode("utf-8", "replace")) for p in procs}))
    return FileInfo(path, devices, world, rank, str(tid) if isinstance(tid, (str, int)) else None, names)


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
    infos = infos if infos is not None else [read_info(f) for f in files]
    runs: list[RunPlan] = []
    groups: dict[tuple[Any, ...], RunPlan] = {}
    for f, info in zip(files, infos):
        if not info.multi_rank:
            runs.append(RunPlan([f], [info]))
            continue
        key = (info.devices, info.world_size, info.processes)
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
