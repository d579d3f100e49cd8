"""Trace files -> typed polars tables (one `Trace` per rank)."""

from __future__ import annotations

import re
from pathlib import Path

from profkit.errors import TraceInputError
from profkit.ingest.decode import decode_events, read_bytes
from profkit.ingest.tables import Trace, events_frame, split_tables

__all__ = ["Trace", "load_trace", "load_traces", "find_trace_files"]

_TP_RANK = re.compile(r"-TP-(\d+)")
TRACE_SUFFIXES = (".trace.json.gz", ".trace.json", ".pt.trace.json.gz", ".pt.trace.json", ".json.gz", ".json")


def load_trace(path: Path, *, default_rank: int = 0) -> Trace:
    """Read one Kineto trace file (plain or gzipped JSON) into a `Trace`.

    Rank: `distributedInfo.rank` when the file has it, else SGLang's `-TP-<r>` in the file name,
    else `default_rank` (the file's position among the inputs).
    """
    path = Path(path)
    data = read_bytes(path)
    events, meta, warnings = decode_events(path, data)
    if path.name.endswith(".gz") and _head(path) != b"\x1f\x8b":
        warnings.append(f"{path.name} is named .gz but is not gzip-compressed; read as plain JSON")
    del data
    n_events = len(events)
    df, t0 = events_frame(events, warnings)
    del events
    gpu_ops, calls, cpu, ann = split_tables(df, warnings)
    rank = meta.get("rank")
    if not isinstance(rank, int):
        m = _TP_RANK.search(path.name)
        rank = int(m.group(1)) if m else default_rank
    devices = meta.get("devices") or []
    device = devices[0] if devices else None
    if n_events == 0:
        raise TraceInputError(f"{path}: the trace has no events (empty 'traceEvents')", hint="the profiler window captured nothing; profile while the server is busy")
    return Trace(
        path=path, rank=rank, device=device, gpu_ops=gpu_ops, calls=calls, cpu=cpu, gpu_annotations=ann,
        t0_ns=t0, n_events=n_events, meta=meta, warnings=warnings,
    )


def _head(path: Path) -> bytes:
    with open(path, "rb") as f:
        return f.read(2)


def find_trace_files(path: Path) -> list[Path]:
    """The trace files a user means by `path`: the file itself, or the traces inside a run folder."""
    path = Path(path)
    if not path.exists():
        raise TraceInputError(f"{path}: no such file or directory", hint="check the path")
    if path.is_file():
        return [path]
    found = sorted(
        p for p in path.iterdir()
        if p.is_file() and p.name.endswith(TRACE_SUFFIXES) and p.name not in ("manifest.json", "summary.json", "diff.json")
        and not p.name.endswith((".profkit.json",))
    )
    if not found:
        raise TraceInputError(f"{path}: directory holds no trace files (*.trace.json.gz, *.pt.trace.json)", hint="point at a trace file or a run folder under traces/")
    return found


def load_traces(paths: list[Path]) -> list[Trace]:
    """Several inputs (files or run folders) -> one Trace per file, sorted by rank."""
    files: list[Path] = []
    for p in paths:
        files.extend(find_trace_files(Path(p)))
    traces = [load_trace(f, default_rank=i) for i, f in enumerate(files)]
    ranks = [t.rank for t in traces]
    if len(set(ranks)) != len(ranks):
        # Same rank twice (e.g. two single-GPU traces): fall back to file order so each is its own entry.
        for i, t in enumerate(traces):
            t.warnings.append(f"rank {t.rank} appears in several inputs; using file order ({i}) as its rank")
            t.rank = i
    return sorted(traces, key=lambda t: t.rank)
