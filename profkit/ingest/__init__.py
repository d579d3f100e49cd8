"""Trace files -> typed polars tables (one `Trace` per rank)."""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path
from typing import TYPE_CHECKING, Any

from profkit.errors import TraceInputError
from profkit.ingest.decode import check_readable, decode_events, read_bytes
from profkit.ingest.identity import TP_RANK, TraceFile, trace_file

if TYPE_CHECKING:
    from profkit.ingest.decode import TraceMeta
    from profkit.ingest.processes import Split
    from profkit.ingest.tables import Trace

__all__ = ["Trace", "TraceFile", "load_trace", "load_ranks", "load_traces", "find_trace_files"]

TRACE_SUFFIXES = (".trace.json.gz", ".trace.json", ".pt.trace.json.gz", ".pt.trace.json", ".json.gz", ".json")
# JSON that profkit writes beside traces (run manifests, a fixture's <run>.manifest.json, summaries, diffs,
# sweeps, before/after of an attribution): never read as a trace in a folder
SIDECAR_NAMES = ("manifest.json", "summary.json", "diff.json", "sweep.json", "before.json", "after.json")
SIDECAR_SUFFIXES = (".manifest.json", ".summary.json", ".profkit.json")
WINDOW_DIR = re.compile(r"(window|repeat)-(\d+)")


def is_sidecar(name: str) -> bool:
    return name in SIDECAR_NAMES or name.endswith(SIDECAR_SUFFIXES)


def profile_windows(path: Path) -> list[Path]:
    """The profile windows of a run folder (`trace --profile-windows N` writes window-<i>/; repeats
    are repeat-<i>/), in order; [] for a file, or a folder with trace files of its own."""
    path = Path(path)
    if not path.is_dir() or any(e.is_file() and e.name.endswith(TRACE_SUFFIXES) and not is_sidecar(e.name) for e in path.iterdir()):
        return []
    subs = [d for d in path.iterdir() if d.is_dir() and WINDOW_DIR.fullmatch(d.name)]
    return sorted(subs, key=lambda d: (d.name.split("-")[0], int(d.name.split("-")[1])))


def skipped_files(path: Path) -> list[str]:
    """The files of a folder that reading its traces leaves out (manifests, logs, READMEs, sidecar
    JSON), by name; [] for a file."""
    path = Path(path)
    if not path.is_dir():
        return []
    return sorted(e.name for e in path.iterdir() if e.is_file() and not e.name.startswith(".")
                  and (is_sidecar(e.name) or not e.name.endswith(TRACE_SUFFIXES)))


def merged_beside_ranks(names: list[str]) -> list[str]:
    """Of a folder's trace file names, SGLang's merged traces whose rank files are beside them:
    `/start_profile` with `merge_profiles` writes `merged-<profile_id>.trace.json.gz` into the folder
    of the `<profile_id>...-TP-<r>....trace.json.gz` it merged (sglang srt/utils/profile_merger.py).
    Read from the folder they would be the same ranks twice, so the folder means the rank files."""
    out = []
    for n in names:
        if n.startswith("merged-") and n.endswith(".trace.json.gz"):
            pid = n[len("merged-"):-len(".trace.json.gz")]
            if pid and any(o != n and o.startswith(pid) and "TP-" in o and o.endswith(".trace.json.gz") for o in names):
                out.append(n)
    return out


def __getattr__(name: str) -> Any:
    # the tables (and polars) load on first use: finding the inputs and the summary cache need neither
    if name == "Trace":
        from profkit.ingest.tables import Trace

        return Trace
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def load_trace(path: Path | TraceFile, *, default_rank: int = 0, cache: bool | None = False, jobs: int = 1,
               executor: Any = None, defer_cache_write: bool = False, early: Any = None) -> Trace:
    """Read one Kineto trace file (plain or gzipped JSON) into a `Trace`.

    path: the file, or its identity.TraceFile when the caller has inspected it already (then the
    file is opened once more, to decode it, and stat-ed never).
    Rank: `distributedInfo.rank` when the file has it, else SGLang's `-TP-<r>` in the file name,
    else `default_rank` (the file's position among the inputs).

    cache: read and write the parquet cache beside the file (`<file>.profkit-cache/`, see
    ingest/cache.py). Off by default for library calls (it writes beside the trace); None means on
    unless the environment sets PROFKIT_NO_CACHE=1 (what the CLI passes). Traces under
    cache.MIN_BYTES of JSON are never cached.
    jobs/executor: decode the file's chunks in that many workers (see ingest/columnar.py).
    defer_cache_write: write the cache at the next cache.wait_pending() (after the caller's
    analysis) instead of in a background thread now.
    early: an ingest/early.py EarlyDecode begun for this file, taken over when it is of this file.
    The tables are the same whichever path produced them.

    A file that holds several ranks (ingest/processes.py: SGLang's merged trace, a TraceLens
    fusion) gives its first rank, with a warning; `load_ranks` gives them all.
    """
    got = load_ranks(path, default_rank=default_rank, cache=cache, jobs=jobs, executor=executor,
                     defer_cache_write=defer_cache_write, early=early)
    if len(got) > 1:
        got[0].warnings.append(f"{got[0].path.name} holds {len(got)} ranks; read as one trace it is the first only (profkit analyze reads them all)")
    return got[0]


def load_ranks(path: Path | TraceFile, *, default_rank: int = 0, cache: bool | None = False, jobs: int = 1,
               executor: Any = None, defer_cache_write: bool = False, early: Any = None) -> list[Trace]:
    """load_trace, giving every rank the file holds: one Trace for a file of one process (every
    argument as load_trace's), one per process, in rank order, for a file that holds several
    (ingest/processes.py: each as its own file would read; their tables are never cached)."""
    from profkit.ingest import cache as _cache

    f = check_readable(path)  # missing, unreadable or empty: one line naming the file, before any fast path
    path = f.path
    use_cache = ((not _cache.cache_disabled_by_env()) if cache is None else cache) and _cache.worth_caching(f)
    key = None
    if use_cache:
        hit = _cache.read(f)
        if hit is not None:
            t = hit.tables
            return [_make_trace(path, default_rank, t["gpu_ops"], t["calls"], t["cpu"], t["gpu_annotations"], hit.t0_ns,
                                hit.n_events, hit.meta, list(hit.warnings), hit.sha256, hit.call_stacks)]
        key = f.source_key()
    if f.sqlite:  # an Nsight Systems export (ingest/nsys.py): one rank of it (f.part), cached as that rank
        from profkit.ingest.nsys import load

        got = load(f)
        if use_cache:
            (_cache.write_later if defer_cache_write else _cache.write_async)(path, _cache.Cached(
                tables={"gpu_ops": got.gpu_ops, "calls": got.calls, "cpu": got.cpu, "gpu_annotations": got.gpu_annotations},
                t0_ns=got.t0_ns, n_events=got.n_events, meta=got.meta, warnings=list(got.warnings), sha256=got.sha256,
                call_stacks=got.call_stacks,
            ), key=key)
        return [got]
    split, ranks, t0, n_events, meta, labelled, shapes = _ingest(f, jobs=jobs, executor=executor, early=early)
    if n_events == 0:
        raise TraceInputError(f"{path}: the trace has no events (empty 'traceEvents')", hint="the profiler window captured nothing; profile while the server is busy")
    sha = f.sha256  # known for files of up to 2 MiB (read whole when inspected)
    if split is not None:
        from profkit.ingest.cache import cache_dir, file_sha256

        sha = sha or file_sha256(path)
        if use_cache:  # its tables are not cached, its summary is (analysis/summary_cache.py writes it into this folder)
            try:
                cache_dir(path).mkdir(exist_ok=True)
            except OSError:
                pass
        return [_make_trace(path, default_rank, g, c, cpu, a, _rank_t0(split, k, (g, c, cpu, a), labelled), n_events,
                            _rank_meta(split, k, meta), w, sha)
                for k, ((g, c, cpu, a), w) in enumerate(ranks)]
    (gpu_ops, calls, cpu, ann), warnings = ranks[0]
    if use_cache:
        sha = sha or _cache.file_sha256(path)
        (_cache.write_later if defer_cache_write else _cache.write_async)(path, _cache.Cached(
            tables={"gpu_ops": gpu_ops, "calls": calls, "cpu": cpu, "gpu_annotations": ann}, t0_ns=t0, n_events=n_events,
            meta=meta, warnings=list(warnings), sha256=sha,
        ), key=key)
    trace = _make_trace(path, default_rank, gpu_ops, calls, cpu, ann, t0, n_events, meta, warnings, sha)
    trace.cpu_shapes = shapes
    return [trace]


def _rank_t0(split: Split, k: int, tables: tuple[Any, ...], labelled: dict[str, float]) -> int:
    """Rank k's t0: the earliest timestamp of any of its events (SGLang's labelled pids, noted by the
    decoders), else of its rows."""
    from profkit.ingest.units import us_to_ns

    mine = [ts for p, ts in labelled.items() if (got := split.locate(p)) is not None and got[0] == k]
    if mine:
        return us_to_ns(min(mine))
    starts = [int(x["ts_ns"].min()) for x in tables if x.height]
    return min(starts) if starts else 0


def _rank_meta(split: Split, k: int, meta: TraceMeta) -> TraceMeta:
    """Rank k's metadata: its rank and the run's world size, its source, and its share of the
    devices (SGLang's merger concatenates each rank file's deviceProperties, in rank order)."""
    n = len(split.names)
    out = meta.copy()
    out["rank"] = split.ranks[k]
    out["world_size"] = meta.get("world_size") or n
    out["source"] = split.source(k)
    devices = meta.get("devices") or []
    if n > 1 and devices and len(devices) % n == 0:
        per = len(devices) // n
        out["devices"] = devices[k * per:(k + 1) * per]
    return out


def _ingest(f: TraceFile, *, jobs: int = 1, executor: Any = None, early: Any = None):
    """Decode one file: the chunked fast path when it applies, else the tiered decoder (same tables).
    Returns (Split or None, per rank (its four tables, its warnings), t0, event count, metadata, the
    earliest timestamp of each SGLang-labelled pid, the CPU ops' shapes where the decode kept them:
    ingest/shapes.py)."""
    from profkit.ingest.columnar import load_tables_fast
    from profkit.ingest.tables import add_unusable_warnings

    path = f.path
    not_gzip = path.name.endswith(".gz") and not f.gzip
    fast = load_tables_fast(f, executor=executor, jobs=jobs, early=early)
    if fast is not None:
        warnings: list[str] = []
        if not_gzip:
            warnings.append(f"{path.name} is named .gz but is not gzip-compressed; read as plain JSON")
        add_unusable_warnings(fast.unusable, warnings)
        split, ranks = fast.ranks(warnings)
        meta = {**fast.meta, "shapes": True} if fast.strings.shapes else fast.meta  # ingest/shapes.py
        return split, ranks, fast.t0_ns, fast.n_events, meta, fast.strings.labelled_min_ts, fast.cpu_shapes
    from profkit.ingest.tables import events_frame, split_tables_ranks

    data = read_bytes(f)
    events, meta, warnings = decode_events(path, data)
    if b'"Input Dims"' in data:  # recorded with shapes (ingest/shapes.py)
        meta = {**meta, "shapes": True}
    if not_gzip:
        warnings.append(f"{path.name} is named .gz but is not gzip-compressed; read as plain JSON")
    del data
    n_events = len(events)
    df, t0 = events_frame(events, warnings)
    labelled: dict[str, float] = {}
    if df.height and df["pid"].str.starts_with("[").any():  # perhaps SGLang's merged ranks: each one's earliest event
        from profkit.ingest.processes import min_ts_by_label

        labelled = min_ts_by_label([str(e.pid) for e in events], [e.ts for e in events])
    del events
    split, ranks = split_tables_ranks(df, warnings)
    return split, ranks, t0, n_events, meta, labelled, None


def _make_trace(path, default_rank, gpu_ops, calls, cpu, ann, t0, n_events, meta, warnings, sha256, call_stacks=None) -> Trace:
    from profkit.ingest.tables import Trace

    rank = meta.get("rank")
    if not isinstance(rank, int):
        m = TP_RANK.search(path.name)
        rank = int(m.group(1)) if m else default_rank
    devices = meta.get("devices") or []
    device = devices[0] if devices else None
    return Trace(
        path=path, rank=rank, device=device, gpu_ops=gpu_ops, calls=calls, cpu=cpu, gpu_annotations=ann,
        t0_ns=t0, n_events=n_events, meta=meta, warnings=warnings, sha256=sha256, call_stacks=call_stacks or {},
    )


def identify(path: Path | TraceFile) -> TraceFile | Path:
    """The file's identity.TraceFile (read once, to be passed down), or the path itself when it
    cannot be read: its loader then says what is wrong, at the point it always did."""
    try:
        return trace_file(path)
    except OSError:  # trace_file raises only for a path (a TraceFile is taken as it is)
        return path.path if isinstance(path, TraceFile) else Path(path)


NSYS_SUFFIXES = (".sqlite", ".nsys-rep", ".qdrep")  # Nsight Systems exports and reports (ingest/nsys.py)


def find_trace_files(path: Path) -> list[Path]:
    """The trace files a user means by `path`: the file itself, or the traces inside a run folder
    (Kineto traces, Nsight Systems exports, and reports with no export beside them; SGLang's merged
    trace only when its rank files are not beside it: merged_beside_ranks)."""
    path = Path(path)
    try:
        st = path.stat()  # one stat: missing, unreachable, a file or a folder
    except PermissionError:
        raise TraceInputError(f"{path}: permission denied", hint="check the permissions of the file and its folders") from None
    except OSError:
        raise TraceInputError(f"{path}: no such file or directory", hint="check the path") from None
    if stat.S_ISREG(st.st_mode):
        return [path]
    with os.scandir(path) as it:
        found = sorted(
            path / e.name for e in it
            if e.is_file() and e.name.endswith(TRACE_SUFFIXES + NSYS_SUFFIXES) and not is_sidecar(e.name)
        )
        exports = {p.name for p in found if p.name.endswith(".sqlite")}
        found = [p for p in found if not (p.name.endswith((".nsys-rep", ".qdrep")) and p.name.rsplit(".", 1)[0] + ".sqlite" in exports)]
        twice = set(merged_beside_ranks([p.name for p in found]))
        found = [p for p in found if p.name not in twice]
    if not found:  # a run folder of `trace --profile-windows N` (or of repeats): one profile per subfolder
        subs = [d.name for d in profile_windows(path)]
        if subs:
            raise TraceInputError(f"{path}: a run folder of {len(subs)} profile windows ({', '.join(s + '/' for s in subs[:3])}{' …' if len(subs) > 3 else ''}), each its own profile",
                                  hint=f"analyze one window ({path / subs[0]}), or compare the folder with `profkit diff` (which uses every window for noise)")
    if not found:
        raise TraceInputError(f"{path}: directory holds no trace files (*.trace.json.gz, *.pt.trace.json)", hint="point at a trace file or a run folder under traces/")
    return found


def expand_inputs(paths: list[Path]) -> list[Path]:
    """Files and run folders -> the trace files, in input order."""
    from profkit.ingest.nsys import exported, is_report

    files: list[Path] = []
    for p in paths:
        files.extend(exported(f) if is_report(f) else f for f in find_trace_files(Path(p)))
    return files


def identify_all(files: list[Path]) -> list[TraceFile | Path]:
    """identify() each file, an Nsight Systems export as one TraceFile per rank it holds (its `part`)."""
    out: list[TraceFile | Path] = []
    for p in files:
        f = identify(p)
        if isinstance(f, TraceFile) and f.sqlite:
            from profkit.ingest.nsys import parts

            out.extend(x[0] for x in parts(f))
        else:
            out.append(f)
    return out


def fix_duplicate_ranks(traces: list[Any]) -> None:
    """Same rank twice: the first file keeps it, each later one takes the lowest unused number; the
    warning names the files concerned and goes to them only (ingest/runs.py)."""
    from profkit.ingest.runs import renumber_duplicate_ranks

    renumber_duplicate_ranks(traces, rank=lambda t: t.rank, set_rank=lambda t, r: setattr(t, "rank", r),
                             warn=lambda t, w: t.warnings.append(w))


# Below this much JSON (estimated: gzip ~8x), worker processes cost more than they save.
PARALLEL_MIN_BYTES = 96 << 20


def estimated_raw_bytes(path: Path | TraceFile) -> int:
    """identity.estimated_json_bytes, 0 for a file that cannot be read."""
    from profkit.ingest.identity import estimated_json_bytes

    try:
        return estimated_json_bytes(path)
    except OSError:
        return 0


def _load_one(path: Path | TraceFile, default_rank: int, cache: bool | None) -> list[Trace]:
    return load_ranks(path, default_rank=default_rank, cache=cache)


def load_traces(paths: list[Path], *, cache: bool | None = False, jobs: int | None = None,
                min_parallel_bytes: int = PARALLEL_MIN_BYTES) -> list[Trace]:
    """Several inputs (files or run folders) -> one Trace per rank file (per rank of a file that
    holds several: load_ranks), sorted by rank.

    jobs: worker processes (default: the cores, at most one per file when several files). One
    file: its chunks are decoded in parallel; several files: the files are. Inputs smaller than
    `min_parallel_bytes` (estimated JSON) are read here. `cache`: see load_trace.
    """
    from profkit.ingest.columnar import make_executor
    from profkit.ingest.reading import default_jobs

    files = identify_all(expand_inputs(paths))
    jobs = default_jobs(len(files)) if jobs is None else max(1, jobs)
    big = sum(estimated_raw_bytes(f) for f in files) >= min_parallel_bytes
    if jobs > 1 and big and len(files) > 1:
        ex = make_executor(min(jobs, len(files)))
        try:
            futs = [ex.submit(_load_one, f, i, cache) for i, f in enumerate(files)]  # type: ignore[union-attr]
            traces = [t for f in futs for t in f.result()]
        finally:
            ex.shutdown(cancel_futures=True)  # type: ignore[union-attr]
    elif jobs > 1 and big:
        ex = make_executor(jobs, chunks=True)
        try:
            traces = [t for i, f in enumerate(files) for t in load_ranks(f, default_rank=i, cache=cache, jobs=jobs, executor=ex)]
        finally:
            ex.shutdown(cancel_futures=True)  # type: ignore[union-attr]
    else:
        traces = [t for i, f in enumerate(files) for t in load_ranks(f, default_rank=i, cache=cache)]
    fix_duplicate_ranks(traces)
    return sorted(traces, key=lambda t: t.rank)
