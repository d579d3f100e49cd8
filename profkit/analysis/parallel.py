"""Load and analyze several rank files at once: one worker process per file (ranks in parallel),
or one file with its chunks decoded in parallel; with the cache, results of an earlier run with the
same options are read back instead. A file that holds several ranks (ingest/processes.py) is read
once and its ranks analyzed one after the other, in the process that read it. Results are identical
to `[analyze_trace(t) for t in load_traces(paths)]`, rank renumbering and warnings included."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from profkit.analysis.rank import RankAnalysis, analyze_trace
from profkit.documents import CaptureFacts, GraphCaptureStats, OverlapSlack, RankSpec, typed_or_none

if TYPE_CHECKING:
    from profkit.analysis.catalog import Catalog


def _options(marker: str | None, min_bubble_us: float, catalog: Catalog | None, captures: Any = None) -> dict[str, Any]:
    from profkit.analysis.catalog import catalog_identity

    out = {"marker": marker, "min_bubble_us": repr(float(min_bubble_us)), "catalog": catalog_identity(catalog)}
    if captures is not None:  # the graph-capture profiles change the categories of replayed ops
        out["graph_captures"] = captures.identity
    return out


def _path(f: Any) -> Path:
    """A file's path: `f` itself, or the path of its ingest.TraceFile."""
    return getattr(f, "path", f)


def _cached_analysis(f: Any, default_rank: int, options: dict[str, Any]) -> tuple[RankAnalysis, int] | None:
    from profkit.analysis.owned import owned_by
    from profkit.ingest import cache as pcache

    path = _path(f)
    try:
        key = pcache.analysis_key(pcache.source_key(f), options)  # a TraceFile's identity, or the file's read now
    except OSError:
        return None
    got = pcache.read_analysis(path, key)
    if got is None:
        return None
    frames, f = got
    rank = f["rank"]
    import polars as pl

    phases = pl.DataFrame(f["phases"], schema={"iteration": pl.Int64, "phase": pl.String, "dur_ns": pl.Int64}, orient="row")
    a = RankAnalysis(
        rank=rank if f["rank_from_trace"] else default_rank, device=f["device"], path=path, marker=f["marker"],
        catalog=f["catalog"], t0_ns=int(f["t0_ns"]), warnings=list(f["warnings"]), device_timeline=f["device_timeline"],
        input_sha256=f["input_sha256"], phases=phases, outside={k: int(v) for k, v in f["outside"].items()},
        device_records=f["device_records"], graph_capture=typed_or_none(f.get("graph_capture"), GraphCaptureStats), source=f.get("source"),
        stub_markers=int(f.get("stub_markers", 0)), **frames,
        overlap_slack=typed_or_none(f.get("overlap_slack"), OverlapSlack), capture=typed_or_none(f.get("capture") or None, CaptureFacts),
        speculative=typed_or_none(f.get("speculative"), RankSpec),
    )
    # time by ownership: derived from the stored owned ops (their category, phase and times), not stored again
    a.owned_categories, a.owned_phases = owned_by(a.ops, "category"), owned_by(a.ops, "phase")
    return a, int(f["n_ingest_warnings"])


def _store_analysis(f: Any, a: RankAnalysis, n_ingest_warnings: int, rank_from_trace: bool, options: dict[str, Any]) -> None:
    from profkit.ingest import cache as pcache

    path = _path(f)
    try:
        key = pcache.analysis_key(pcache.source_key(f), options)
    except OSError:
        return
    fields = {
        "rank": a.rank, "rank_from_trace": rank_from_trace, "device": a.device, "marker": a.marker, "catalog": a.catalog,
        "t0_ns": a.t0_ns, "warnings": list(a.warnings), "device_timeline": a.device_timeline, "input_sha256": a.input_sha256,
        "n_ingest_warnings": n_ingest_warnings, "outside": dict(a.outside), "device_records": a.device_records,
        "graph_capture": msgspec.to_builtins(a.graph_capture), "stub_markers": a.stub_markers,
        "source": a.source, "overlap_slack": msgspec.to_builtins(a.overlap_slack),
        "capture": msgspec.to_builtins(a.capture) if a.capture is not None else {}, "speculative": msgspec.to_builtins(a.speculative),
        # small (iterations x phases): kept with the fields rather than as a frame of its own
        "phases": [list(r) for r in a.phases.select("iteration", "phase", "dur_ns").iter_rows()],
    }
    frames = {"iterations": a.iterations, "categories": a.categories, "launch_calls": a.launch_calls, "ops": a.ops,
              "bubbles": a.bubbles, "syncs": a.syncs}
    if a.device_work is not None:  # recorded with shapes: every GPU op's work (an optional frame of the cache)
        frames["device_work"] = a.device_work
    pcache.write_analysis(path, key, frames, fields)


def _rank_from_trace(t: Any, default_rank: int) -> bool:
    """Whether the trace named its rank (distributedInfo or -TP-<r>) rather than taking the file's position."""
    from profkit.ingest.identity import TP_RANK

    return isinstance(t.meta.get("rank"), int) or TP_RANK.search(t.path.name) is not None


def _load_and_analyze(path: Any, default_rank: int, cache: bool, marker: str | None, min_bubble_us: float,
                      catalog: Catalog | None, options: dict[str, Any], captures: Any = None) -> list[tuple[RankAnalysis, int]]:
    from profkit.ingest import load_ranks

    from profkit.ingest import cache as pcache

    cache = bool(cache) and pcache.worth_caching(path)
    if cache:
        hit = _cached_analysis(path, default_rank, options)
        if hit is not None:
            return [hit]
    traces = load_ranks(path, default_rank=default_rank, cache=cache, defer_cache_write=True)
    out = []
    for t in traces:
        n = len(t.warnings)
        a = analyze_trace(t, marker=marker, min_bubble_us=min_bubble_us, catalog=catalog, captures=captures)
        if cache and len(traces) == 1:  # a file of several ranks (ingest/processes.py) is never cached
            _store_analysis(path, a, n, _rank_from_trace(t, default_rank), options)
        out.append((a, n))
    return out


def _renumber(pairs: list[tuple[RankAnalysis, int]]) -> None:
    """Duplicate ranks, as ingest.fix_duplicate_ranks does before analysis (the warning follows the
    ingest warnings, on the files concerned only)."""
    from profkit.ingest.runs import renumber_duplicate_ranks

    renumber_duplicate_ranks(pairs, rank=lambda p: p[0].rank, set_rank=lambda p, r: setattr(p[0], "rank", r),
                             warn=lambda p, w: p[0].warnings.insert(p[1], w), name=lambda p: Path(p[0].path).name)


def analyze_runs(paths: list[Path], *, marker: str | None = None, min_bubble_us: float = 2.0, catalog: Catalog | None = None,
                 cache: bool | None = None, jobs: int | None = None, min_parallel_bytes: int | None = None,
                 captures: Any = None, runs: Any = None, early: Any = None) -> list[Any]:
    """Files or run folders -> the runs they hold (ingest/runs.py: RunPlan, its `analyses` sorted by
    rank), every file analyzed in one pool. A file's default rank (no distributedInfo, no -TP-<r>)
    is its place in its run; duplicate ranks are renumbered within a run; ranks of one run whose
    device or iteration shapes disagree become runs of their own (split_by_analysis).
    runs: the plan (plan_inputs) when the caller made it (summarize_runs plans before anything is
    decoded, for its checks and its cache key): `paths` is then not read, and no file is inspected or
    planned again. early: an ingest/early.py EarlyDecode of one of the files, handed to its loader."""
    if runs is None:
        runs = plan_inputs(paths)
    files = [i.file or f for r in runs for f, i in zip(r.files, r.infos)]  # as plan_runs inspected them
    defaults = [k for r in runs for k in range(len(r.files))]
    per_file = _analyze_files(files, defaults, marker=marker, min_bubble_us=min_bubble_us, catalog=catalog,
                              cache=cache, jobs=jobs, min_parallel_bytes=min_parallel_bytes, captures=captures,
                              early=early)
    k = 0
    for r in runs:
        got = per_file[k:k + len(r.files)]
        k += len(r.files)
        if any(len(g) > 1 for g in got):  # a file that holds several ranks: its path and info once per rank
            r.files = [f for f, g in zip(r.files, got) for _ in g]
            r.infos = [i for i, g in zip(r.infos, got) for _ in g]
        mine = [p for g in got for p in g]
        _renumber(mine)
        r.analyses = sorted((a for a, _ in mine), key=lambda a: a.rank)
    return split_by_analysis(runs)


def plan_inputs(paths: list[Path]) -> list[Any]:
    """Files or run folders -> the runs they hold (ingest/runs.plan_runs over their trace files), from the
    files' metadata, before anything is decoded: the one place inputs are planned."""
    from profkit.ingest import expand_inputs
    from profkit.ingest.runs import plan_runs

    return plan_runs(expand_inputs(paths))


def split_by_analysis(runs: list[Any]) -> list[Any]:
    """Ranks of one planned run whose device or set of iteration shapes (kind, batch size) disagree
    are separate runs: they cannot be ranks of one job, whose steps run in lockstep."""
    from profkit.ingest.runs import RunPlan, label_runs

    out = []
    split = False
    for r in runs:
        if len(r.analyses) < 2:
            out.append(r)
            continue
        groups: dict[tuple[Any, ...], list[RankAnalysis]] = {}
        for a in r.analyses:
            shapes = tuple(sorted({(str(k), -1 if b is None else int(b)) for k, b in a.iterations.select("kind", "batch_size").iter_rows()}))
            groups.setdefault((a.device, shapes), []).append(a)
        if len(groups) == 1:
            out.append(r)
            continue
        split = True
        devices = {d for d, _ in groups}
        why = "its ranks' " + ("device names" if len(devices) > 1 else "iteration shapes") + " differ"
        for g in groups.values():
            paths = {Path(a.path) for a in g}
            sub = RunPlan([f for f in r.files if f in paths], [i for i in r.infos if i.path in paths], why=why, analyses=g)
            out.append(sub)
    if split:
        label_runs(out)
        for r in out:
            if not r.why:
                from profkit.ingest.runs import _why

                r.why = _why(r, [o for o in out if o is not r])
    return out


def _analyze_files(files: list[Any], default_ranks: list[int], *, marker: str | None, min_bubble_us: float, catalog: Catalog | None,
                   cache: bool | None, jobs: int | None, min_parallel_bytes: int | None,
                   captures: Any, early: Any = None) -> list[list[tuple[RankAnalysis, int]]]:
    """Every file (a path or its ingest.TraceFile) analyzed (or read from the cache), in file
    order: per file, per rank it holds (one, but for a file of several: ingest/processes.py),
    (analysis, its ingest warnings)."""
    from profkit.ingest import PARALLEL_MIN_BYTES, estimated_raw_bytes, load_ranks
    from profkit.ingest import cache as pcache
    from profkit.ingest.columnar import make_executor
    from profkit.ingest.reading import default_jobs

    use_cache = (not pcache.cache_disabled_by_env()) if cache is None else cache
    jobs = default_jobs(len(files)) if jobs is None else max(1, jobs)
    threshold = PARALLEL_MIN_BYTES if min_parallel_bytes is None else min_parallel_bytes
    if captures is not None and not hasattr(captures, "graphs"):  # paths: graph-capture profiles (analysis/graphs.py)
        from profkit.analysis.graphs import load_captures

        captures = load_captures([Path(p) for p in captures])
    options = _options(marker, min_bubble_us, catalog, captures)
    done: list[list[tuple[RankAnalysis, int]] | None] = [None] * len(files)
    cached_ok = [use_cache and pcache.worth_caching(f) for f in files]
    for i, f in enumerate(files):
        if cached_ok[i]:
            hit = _cached_analysis(f, default_ranks[i], options)
            done[i] = [hit] if hit is not None else None
    todo = [i for i, d in enumerate(done) if d is None]
    big = sum(estimated_raw_bytes(files[i]) for i in todo) >= threshold
    if todo and jobs > 1 and len(todo) > 1 and big:
        ex = make_executor(min(jobs, len(todo)))
        try:
            futs = {i: ex.submit(_load_and_analyze, files[i], default_ranks[i], use_cache, marker, min_bubble_us, catalog, options, captures)  # type: ignore[union-attr]
                    for i in todo}
            for i, fut in futs.items():
                done[i] = fut.result()
        finally:
            ex.shutdown(cancel_futures=True)  # type: ignore[union-attr]
    elif todo:
        # as load_traces then analyze_trace: every file is read before any is analyzed. The tables'
        # cache is written meanwhile, in a thread (the analysis leaves a core free; in worker
        # processes, whose analyses fill both cores, it is written after the analysis instead)
        ex = make_executor(jobs, chunks=True) if jobs > 1 and big else None
        try:
            traces = {i: load_ranks(files[i], default_rank=default_ranks[i], cache=cached_ok[i], jobs=jobs if ex else 1, executor=ex,
                                    early=early) for i in todo}
        finally:
            if ex is not None:
                ex.shutdown(cancel_futures=True)
        for i in todo:
            ranks = traces.pop(i)
            done[i] = []
            while ranks:
                t = ranks.pop(0)
                n = len(t.warnings)
                a = analyze_trace(t, marker=marker, min_bubble_us=min_bubble_us, catalog=catalog, captures=captures)
                if cached_ok[i] and not ranks and not done[i]:  # a file of several ranks is never cached
                    _store_analysis(files[i], a, n, _rank_from_trace(t, default_ranks[i]), options)
                done[i].append((a, n))  # type: ignore[union-attr]
    return [d for d in done if d is not None]
