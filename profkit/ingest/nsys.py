"""Nsight Systems captures -> the tables the Kineto reader produces (docs/nsys.md).

An `nsys export --type sqlite` file is read with the standard library's sqlite3 (no dependency;
DuckDB would need its sqlite extension, which it downloads), one rank at a time, each table
streamed in batches of rows into polars frames:

- one rank per (device, process) pair that ran GPU work: `CUPTI_ACTIVITY_KIND_KERNEL` / `_MEMCPY` /
  `_MEMSET` rows by `deviceId` and `globalPid` (the usual one process per GPU gives one rank per
  device; processes that each see "device 0" give one rank per process). Ranks are numbered in
  (device, process) order; `TraceFile.part` names the pair, so a file of N ranks is N inputs;
- GPU ops: kernels named by `demangledName` (StringIds), copies named as Kineto names them
  (`Memcpy HtoD (Pageable -> Device)`) from `ENUM_CUDA_MEMCPY_OPER` / `ENUM_CUDA_MEM_KIND`, with
  their direction and pageable flag from the same enums, memsets (`Memset (Device)`);
- runtime and driver calls from `CUPTI_ACTIVITY_KIND_RUNTIME` of the rank's process (linked to
  their GPU work by `correlationId`, which CUPTI numbers per process: graph-replayed kernels
  (`graphId`, `graphNodeId`) carry their cudaGraphLaunch's id); a process that drives several
  devices has its calls split by the device their work ran on (calls with no GPU work: the device
  their thread launched most onto);
- host-blocking synchronizations in `CUPTI_ACTIVITY_KIND_SYNCHRONIZATION` (event, stream, context
  sync; not stream waits, which block no host thread) whose runtime call is missing become calls
  of that name, so the sync figures hold whichever of the two the export has;
- NVTX ranges (`NVTX_EVENTS`, push/pop and start/end) become CPU spans: the iteration markers and
  phases of the Kineto reader's chain. PyTorch's `emit_nvtx` decoration (`, op_id = N`,
  `, seq = N`, `, sizes = [...]`) is dropped, and its `aten::` ranges are cpu ops, as Kineto has them;
- threads are named from `ThreadNames` (`tid` is "<tid> (<name>)").

The export's schema version (`META_DATA_EXPORT`) goes into the rank's `source`; a table or column
the export lacks is one warning naming it (the kernel table alone is required). Times are the
export's own integer ns. A file that is no SQLite database, a truncated one, or an SQLite database
that is not an nsys export: TraceInputError, one line naming the file.
"""

from __future__ import annotations

import re
import shutil
import sqlite3
import subprocess
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Iterator

from profkit.errors import TraceInputError
from profkit.ingest.identity import TraceFile

KERNEL = "CUPTI_ACTIVITY_KIND_KERNEL"
MEMCPY = "CUPTI_ACTIVITY_KIND_MEMCPY"
MEMSET = "CUPTI_ACTIVITY_KIND_MEMSET"
RUNTIME = "CUPTI_ACTIVITY_KIND_RUNTIME"
SYNC = "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION"
NVTX = "NVTX_EVENTS"
GRAPH_TRACE = "CUPTI_ACTIVITY_KIND_GRAPH_TRACE"
STRINGS = "StringIds"
BATCH = 1 << 16  # rows fetched at a time

REP_SUFFIXES = (".nsys-rep", ".qdrep")
# CUPTI's enum values, used when the export lacks its ENUM_* table (the export writes the same ones)
_COPY_KINDS = {0: "UNKNOWN", 1: "HTOD", 2: "DTOH", 3: "HTOA", 4: "ATOH", 5: "ATOA", 6: "ATOD", 7: "DTOA", 8: "DTOD", 9: "HTOH",
               10: "PTOP", 11: "UVM_HTOD", 12: "UVM_DTOH", 13: "UVM_DTOD"}
_MEM_KINDS = {0: "Pageable", 1: "Pinned", 2: "Device", 3: "Array", 4: "Managed", 5: "Device Static", 6: "Managed Static", 7: "Unknown"}
_DIRECTION = {"HTOD": "h2d", "UVM_HTOD": "h2d", "DTOH": "d2h", "UVM_DTOH": "d2h", "DTOD": "d2d", "PTOP": "d2d", "UVM_DTOD": "d2d"}
# host-blocking CUPTI synchronization types -> the runtime call that makes them
_SYNC_CALLS = {1: "cudaEventSynchronize", 3: "cudaStreamSynchronize", 4: "cudaDeviceSynchronize"}
_RANGE_TYPES = (59, 60, 70, 71)  # NvtxPushPopRange, NvtxStartEndRange, NvtxtPushPopRange, NvtxtStartEndRange
_EMIT_NVTX = re.compile(r", (?:seq|op_id|sizes|input_op_ids) = .*\Z", re.S)
_HINT_EXPORT = "export the report again: nsys export --type sqlite -o CAPTURE.sqlite CAPTURE.nsys-rep"


def is_report(path: Path) -> bool:
    """An Nsight Systems report (.nsys-rep, or the older .qdrep), by its name."""
    return Path(path).name.lower().endswith(REP_SUFFIXES)


def export_command(rep: Path) -> list[str]:
    return ["nsys", "export", "--type", "sqlite", "--force-overwrite", "true", "-o", str(_sqlite_of(rep)), str(rep)]


def _sqlite_of(rep: Path) -> Path:
    name = rep.name
    for suf in REP_SUFFIXES:
        if name.lower().endswith(suf):
            name = name[: -len(suf)]
    return rep.with_name(name + ".sqlite")


def announce(line: str) -> None:
    """Where the conversion says what it runs (stderr, beside profkit's other notes)."""
    print(line, file=sys.stderr, flush=True)


def exported(rep: Path) -> Path:
    """The SQLite export of an nsys report: the `.sqlite` beside it when it is newer than the
    report, else made now with `nsys export --type sqlite` (the command shown); without nsys on
    PATH, TraceInputError naming the command to run."""
    rep = Path(rep)
    out = _sqlite_of(rep)
    try:
        if out.is_file() and out.stat().st_mtime_ns >= rep.stat().st_mtime_ns:
            return out
    except OSError:
        pass
    if not rep.is_file():
        raise TraceInputError(f"{rep}: no such file", hint="check the path")
    cmd = export_command(rep)
    shown = " ".join(_quote(c) for c in cmd)
    exe = shutil.which("nsys")
    if exe is None:
        raise TraceInputError(f"{rep}: an Nsight Systems report and no `nsys` on PATH to export it; run `{shown}` and analyze {out}",
                              hint="profkit reads the report's SQLite export")
    announce(f"exporting the Nsight Systems report: {shown}")
    try:
        done = subprocess.run([exe, *cmd[1:]], stdin=subprocess.DEVNULL, capture_output=True, text=True, check=False)
    except OSError as e:
        raise TraceInputError(f"{rep}: `{shown}` could not run ({e.strerror or e})", hint="run it yourself and analyze the .sqlite") from None
    if done.returncode != 0 or not out.is_file():
        tail = (done.stderr or done.stdout or "").strip().splitlines()[-1:] or ["no output"]
        raise TraceInputError(f"{rep}: `{shown}` failed (exit {done.returncode}: {tail[0]})", hint="run it yourself to see nsys's messages")
    return out


def _quote(s: str) -> str:
    import shlex

    return shlex.quote(s)


# --- the export --------------------------------------------------------------------------------


def _connect(path: Path) -> sqlite3.Connection:
    uri = Path(path).resolve().as_uri() + "?mode=ro"
    try:
        return sqlite3.connect(uri, uri=True, check_same_thread=False)
    except sqlite3.Error as e:
        raise TraceInputError(f"{path}: cannot open as an SQLite database ({e})", hint=_HINT_EXPORT) from None


def corrupt(path: Path, e: Exception) -> TraceInputError:
    return TraceInputError(f"{path}: truncated or corrupt SQLite file ({e})", hint="copy or " + _HINT_EXPORT)


class Export:
    """An open nsys export: its tables and their columns, its version, and warnings for what it lacks."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.con = _connect(self.path)
        self.missing: list[str] = []  # tables and columns the reader wanted and the export lacks
        try:
            names = [r[0] for r in self.con.execute("SELECT name FROM sqlite_master WHERE type IN ('table', 'view')")]
            self.columns: dict[str, set[str]] = {}
            for t in names:
                self.columns[t] = {r[1] for r in self.con.execute(f'PRAGMA table_info("{t}")')}
        except sqlite3.DatabaseError as e:
            self.close()
            raise corrupt(self.path, e) from None
        if KERNEL not in self.columns:
            self.close()
            nsys_like = STRINGS in self.columns or "META_DATA_EXPORT" in self.columns or any(t.startswith("CUPTI_ACTIVITY_KIND_") for t in names)
            if not nsys_like:
                raise TraceInputError(f"{self.path}: an SQLite database but not an Nsight Systems export (no {KERNEL}, {STRINGS} or META_DATA_EXPORT table)",
                                      hint="profkit reads `nsys export --type sqlite` files and Kineto JSON traces")
            raise TraceInputError(f"{self.path}: an Nsight Systems export without {KERNEL} (no kernel ran in the capture, or CUDA was not traced)",
                                  hint="record with `nsys profile --trace=cuda,nvtx ...` while the GPU is busy")
        for c in ("start", "end", "deviceId"):
            if c not in self.columns[KERNEL]:
                self.close()
                raise TraceInputError(f"{self.path}: {KERNEL} has no '{c}' column: not an nsys export profkit can read", hint=_HINT_EXPORT)
        self.version = self._version()

    def close(self) -> None:
        self.con.close()

    def __enter__(self) -> Export:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _version(self) -> dict[str, Any]:
        out: dict[str, Any] = {"format": "nsys-sqlite"}
        if "META_DATA_EXPORT" not in self.columns:
            self.lacks("META_DATA_EXPORT")
            return out
        got = dict(self.rows("SELECT name, value FROM META_DATA_EXPORT"))
        for key, name in (("schema_version", "EXPORT_SCHEMA_VERSION"), ("nsys_version", "EXPORT_PRODUCT_VERSION")):
            if got.get(name):
                out[key] = str(got[name])
        if "schema_version" not in out:
            self.lacks("META_DATA_EXPORT.EXPORT_SCHEMA_VERSION")
        return out

    def has(self, table: str, *cols: str, want: bool = True) -> bool:
        """Whether the export has the table (and its columns); when it does not and `want`, noted
        once as missing."""
        if table not in self.columns:
            if want:
                self.lacks(table)
            return False
        gone = [c for c in cols if c not in self.columns[table]]
        for c in gone:
            if want:
                self.lacks(f"{table}.{c}")
        return not gone

    def col(self, table: str, col: str, alias: str, *, prefix: str = "", default: str = "NULL", want: bool = True) -> str:
        """`prefix.col AS alias`, or `default AS alias` (noted as missing) when the export lacks it."""
        if table in self.columns and col in self.columns[table]:
            return f'{prefix}"{col}" AS {alias}'
        if want and table in self.columns:
            self.lacks(f"{table}.{col}")
        return f"{default} AS {alias}"

    def lacks(self, what: str) -> None:
        if what not in self.missing:
            self.missing.append(what)

    def rows(self, sql: str, params: tuple = ()) -> list[tuple]:
        return list(self.batches(sql, params, size=None))

    def batches(self, sql: str, params: tuple = (), *, size: int | None = BATCH) -> Iterator[Any]:
        """The rows of a query, BATCH at a time (size None: one row at a time). A damaged file:
        TraceInputError naming it."""
        try:
            cur = self.con.execute(sql, params)
            if size is None:
                yield from cur
                return
            while True:
                got = cur.fetchmany(size)
                if not got:
                    return
                yield got
        except sqlite3.DatabaseError as e:
            raise corrupt(self.path, e) from None

    def enum(self, table: str, fallback: dict[int, str], *, label: bool) -> dict[int, str]:
        """An ENUM_* table as {id: name without its common prefix (label: the human label)},
        else CUPTI's values (noted as missing)."""
        if not self.has(table, "id", "label" if label else "name"):
            return dict(fallback)
        col = "label" if label else "name"
        got = {int(i): str(v) for i, v in self.rows(f'SELECT id, "{col}" FROM "{table}"') if v is not None}
        if not label:
            got = {i: re.sub(r"^CUDA_MEMCPY_KIND_", "", v) for i, v in got.items()}
        return got or dict(fallback)

    def warnings(self) -> list[str]:
        if not self.missing:
            return []
        v = self.version.get("schema_version")
        made = f"export schema {v}" + (f", Nsight Systems {self.version['nsys_version']}" if self.version.get("nsys_version") else "") if v else "export of unknown schema version"
        return [f"this nsys export ({made}) lacks {', '.join(self.missing)}: the figures that need them are left out or defaulted"]


# --- ranks ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RankKey:
    """One rank of an export: a device and the process that ran work on it (None: not recorded)."""

    device: int
    process: int | None  # the serialized process id (globalPid >> 24: host bits and pid)

    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process & 0xFFFFFF

    @property
    def part(self) -> str:
        return f"device={self.device} pid={self.pid if self.pid is not None else '?'}" + (
            f" host={self.process >> 24}" if self.process is not None and self.process >> 24 else "")


@dataclass
class Plan:
    """The ranks of an export, the devices' names, and which ranks each process has."""

    ranks: list[RankKey]
    names: dict[int, str] = field(default_factory=dict)

    def of_process(self, process: int | None) -> list[RankKey]:
        return [k for k in self.ranks if k.process == process]


_GPU_TABLES = (KERNEL, MEMCPY, MEMSET)


def _process(ex: Export, table: str, prefix: str = "") -> str:
    """The SQL of a row's process key (globalPid, or globalTid, >> 24), NULL when not recorded."""
    cols = ex.columns.get(table, set())
    if "globalPid" in cols:
        return f'({prefix}"globalPid" >> 24)'
    if "globalTid" in cols:
        return f'({prefix}"globalTid" >> 24)'
    return "NULL"


def plan(ex: Export) -> Plan:
    pairs: set[tuple[int, int | None]] = set()
    for t in _GPU_TABLES:
        if t in ex.columns and "deviceId" in ex.columns[t]:
            for d, p in ex.rows(f'SELECT DISTINCT "deviceId", {_process(ex, t)} FROM "{t}"'):
                if d is not None:
                    pairs.add((int(d), None if p is None else int(p)))
    ranks = [RankKey(d, p) for d, p in sorted(pairs, key=lambda x: (x[0], -1 if x[1] is None else x[1]))]
    names: dict[int, str] = {}
    if "TARGET_INFO_GPU" in ex.columns and {"id", "name"} <= ex.columns["TARGET_INFO_GPU"]:
        for i, n in ex.rows('SELECT "id", "name" FROM TARGET_INFO_GPU'):
            if i is not None and n:
                names.setdefault(int(i), str(n))
    return Plan(ranks, names)


def parts(f: TraceFile) -> list[tuple[TraceFile, RankKey, int, int, str | None]]:
    """An export's ranks as inputs: (its TraceFile with `part` set, key, rank, world size, device
    name), in rank order. Raises TraceInputError for a file that is not a readable export."""
    with Export(f.path) as ex:
        p = plan(ex)
    n = len(p.ranks)
    return [(replace(f, part=k.part), k, r, n, p.names.get(k.device)) for r, k in enumerate(p.ranks)] or [(f, RankKey(0, None), 0, 1, None)]


# --- one rank's tables -------------------------------------------------------------------------


def load(f: TraceFile) -> Any:
    """One rank of an nsys export (f.part; None: the first rank, with a warning when the file
    holds more) -> ingest.tables.Trace."""
    import polars as pl

    from profkit.ingest.tables import CPU_SCHEMA, Trace, finish_tables

    with Export(f.path) as ex:
        p = plan(ex)
        warnings: list[str] = []
        if not p.ranks:
            key, rank = RankKey(0, None), 0
        elif f.part is None:
            key, rank = p.ranks[0], 0
            if len(p.ranks) > 1:
                warnings.append(f"{f.path.name} holds {len(p.ranks)} ranks ({', '.join(k.part for k in p.ranks)}); read as one input it is the first only")
        else:
            found = [r for r, k in enumerate(p.ranks) if k.part == f.part]
            if not found:
                raise TraceInputError(f"{f.path}: no rank {f.part} in this nsys export (it has {', '.join(k.part for k in p.ranks) or 'none'})",
                                      hint="the file changed since it was listed; run the command again")
            rank = found[0]
            key = p.ranks[rank]
        threads = _thread_names(ex)
        gpu = _gpu_ops(ex, key, pl)
        siblings = [k for k in p.ranks if k.process == key.process]
        calls = _calls(ex, key, siblings, threads, pl)
        cpu = _ranges(ex, key, threads, pl)
        if GRAPH_TRACE in ex.columns:
            n = ex.rows(f'SELECT COUNT(*) FROM "{GRAPH_TRACE}"')[0][0]
            if n:
                warnings.append(f"{n} CUDA graph executions are recorded whole ({GRAPH_TRACE}: `nsys profile --cuda-graph-trace=graph`), not as their kernels: "
                                "their GPU time is not in the figures; record with --cuda-graph-trace=node")
        warnings = ex.warnings() + warnings
        source = {**ex.version, "device_id": key.device, "pid": key.pid}
        device = p.names.get(key.device)
    n_events = gpu.height + calls.height + cpu.height
    starts = [t["ts_ns"].min() for t in (gpu, calls, cpu) if t.height]
    t0 = int(min(starts)) if starts else 0
    ann = pl.DataFrame(schema=CPU_SCHEMA)
    gpu, calls, cpu, ann = finish_tables(gpu, calls, cpu, ann, warnings)
    meta: dict[str, Any] = {"rank": rank, "world_size": max(1, len(p.ranks)), "source": source}
    if device:
        meta["devices"] = [device]
    if n_events == 0:
        raise TraceInputError(f"{f.path}: the nsys export has no GPU activity, runtime calls or NVTX ranges for {key.part}",
                              hint="record while the GPU is busy")
    return Trace(path=f.path, rank=rank, device=device, gpu_ops=gpu, calls=calls, cpu=cpu, gpu_annotations=ann, t0_ns=t0,
                 n_events=n_events, meta=meta, warnings=warnings, sha256=f.sha256)


def _where_rank(ex: Export, table: str, key: RankKey, prefix: str = "") -> tuple[str, tuple]:
    proc = _process(ex, table, prefix)
    if key.process is None or proc == "NULL":
        return f'{prefix}"deviceId" = ?', (key.device,)
    return f'{prefix}"deviceId" = ? AND {proc} = ?', (key.device, key.process)


def _frame(pl: Any, batches: Iterator[list[tuple]], schema: dict[str, Any]) -> Any:
    frames = [pl.DataFrame(b, schema=schema, orient="row") for b in batches]
    return pl.concat(frames) if frames else pl.DataFrame(schema=schema)


def _name_join(ex: Export, table: str, cols: tuple[str, ...], alias: str) -> tuple[str, str]:
    """The SQL for a name from StringIds: the first of `cols` the table has (a LEFT JOIN each),
    as (select expression, joins)."""
    have = [c for c in cols if c in ex.columns.get(table, set())]
    if not have:
        ex.lacks(f"{table}.{cols[0]}")
        return "NULL", ""
    if STRINGS not in ex.columns:
        ex.lacks(STRINGS)
        return f"'<string ' || t.\"{have[0]}\" || '>'", ""
    joins = " ".join(f'LEFT JOIN {STRINGS} s{i} ON s{i}.id = t."{c}"' for i, c in enumerate(have))
    expr = "COALESCE(" + ", ".join(f"s{i}.value" for i in range(len(have))) + f", '<string ' || t.\"{have[0]}\" || '>')"
    return expr, joins


def _gpu_ops(ex: Export, key: RankKey, pl: Any) -> Any:
    from profkit.ingest.tables import GPU_OPS_SCHEMA

    raw = {"name": pl.String, "ts_ns": pl.Int64, "end_ns": pl.Int64, "stream": pl.Int64, "correlation": pl.Int64, "bytes": pl.Int64,
           "copy_kind": pl.Int64, "src": pl.Int64, "dst": pl.Int64}
    parts = []
    # kernels: demangled names, as Kineto's kernel events have them
    name, joins = _name_join(ex, KERNEL, ("demangledName", "shortName", "mangledName"), "name")
    where, params = _where_rank(ex, KERNEL, key, "t.")
    sql = (f'SELECT {name}, t."start", t."end", {ex.col(KERNEL, "streamId", "s", prefix="t.")}, {ex.col(KERNEL, "correlationId", "c", prefix="t.")}, '
           f"NULL, NULL, NULL, NULL FROM {KERNEL} t {joins} WHERE {where}")
    parts.append(_frame(pl, ex.batches(sql, params), raw).with_columns(pl.lit("kernel").alias("cat")))
    if ex.has(MEMCPY, "deviceId", "start", "end"):
        where, params = _where_rank(ex, MEMCPY, key, "t.")
        sql = (f'SELECT NULL, t."start", t."end", {ex.col(MEMCPY, "streamId", "s", prefix="t.")}, {ex.col(MEMCPY, "correlationId", "c", prefix="t.")}, '
               f'{ex.col(MEMCPY, "bytes", "b", prefix="t.")}, {ex.col(MEMCPY, "copyKind", "k", prefix="t.")}, {ex.col(MEMCPY, "srcKind", "sk", prefix="t.")}, '
               f'{ex.col(MEMCPY, "dstKind", "dk", prefix="t.")} FROM {MEMCPY} t WHERE {where}')
        copies = _frame(pl, ex.batches(sql, params), raw)
        if copies.height:
            copies = _copy_names(ex, copies, pl)
        parts.append(copies.with_columns(pl.lit("gpu_memcpy").alias("cat")))
    if ex.has(MEMSET, "deviceId", "start", "end"):
        where, params = _where_rank(ex, MEMSET, key, "t.")
        sql = (f'SELECT NULL, t."start", t."end", {ex.col(MEMSET, "streamId", "s", prefix="t.")}, {ex.col(MEMSET, "correlationId", "c", prefix="t.")}, '
               f'{ex.col(MEMSET, "bytes", "b", prefix="t.")}, NULL, {ex.col(MEMSET, "memKind", "m", prefix="t.")}, NULL FROM {MEMSET} t WHERE {where}')
        sets = _frame(pl, ex.batches(sql, params), raw)
        if sets.height:
            kinds = ex.enum("ENUM_CUDA_MEM_KIND", _MEM_KINDS, label=True)
            label = pl.col("src").replace_strict(kinds, default=None, return_dtype=pl.String)
            sets = sets.with_columns(pl.when(label.is_null()).then(pl.lit("Memset")).otherwise(pl.format("Memset ({})", label)).alias("name"))
        parts.append(sets.with_columns(pl.lit("gpu_memset").alias("cat")))
    ops = pl.concat([p.with_columns(pl.col("name").cast(pl.String)) for p in parts], how="diagonal_relaxed")
    if "direction" not in ops.columns:
        ops = ops.with_columns(pl.lit(None, pl.String).alias("direction"), pl.lit(False).alias("pageable"))
    ops = ops.with_columns(pl.col("direction").cast(pl.String), pl.col("pageable").fill_null(False))
    return ops.with_columns(
        (pl.col("end_ns") - pl.col("ts_ns")).alias("dur_ns"), pl.lit(key.device, pl.Int64).alias("device"),
    ).filter(pl.col("dur_ns") >= 0).select(list(GPU_OPS_SCHEMA))


def _copy_names(ex: Export, copies: Any, pl: Any) -> Any:
    """Copies named as Kineto names them (`Memcpy HtoD (Pageable -> Device)`), with direction
    (h2d, d2h, d2d, other) and pageable from the export's enums."""
    opers = ex.enum("ENUM_CUDA_MEMCPY_OPER", _COPY_KINDS, label=False)
    kinds = ex.enum("ENUM_CUDA_MEM_KIND", _MEM_KINDS, label=True)
    pageable = {i for i, v in kinds.items() if v.lower() == "pageable"}

    def short(o: str) -> str:  # HTOD -> HtoD, UVM_HTOD -> HtoD (Unified), as Kineto spells them
        base = o.removeprefix("UVM_")
        s = base[0] + "to" + base[3] if len(base) == 4 and base[1:3] == "TO" else base.title()
        return s + (" (Unified)" if o.startswith("UVM_") else "")

    oper = pl.col("copy_kind").replace_strict(opers, default="UNKNOWN", return_dtype=pl.String)
    src = pl.col("src").replace_strict(kinds, default=None, return_dtype=pl.String)
    dst = pl.col("dst").replace_strict(kinds, default=None, return_dtype=pl.String)
    short_map = {v: short(v) for v in set(opers.values()) | {"UNKNOWN"}}
    return copies.with_columns(
        pl.when(src.is_null() | dst.is_null())
        .then(pl.format("Memcpy {}", oper.replace_strict(short_map, return_dtype=pl.String)))
        .otherwise(pl.format("Memcpy {} ({} -> {})", oper.replace_strict(short_map, return_dtype=pl.String), src, dst)).alias("name"),
        oper.replace_strict(_DIRECTION, default="other", return_dtype=pl.String).alias("direction"),
        (pl.col("src").is_in(list(pageable)) | pl.col("dst").is_in(list(pageable))).fill_null(False).alias("pageable"),
    )


def _thread_names(ex: Export) -> dict[int, str]:
    """globalTid -> thread name, from ThreadNames (the last name a thread was given)."""
    if not ex.has("ThreadNames", "nameId", "globalTid") or STRINGS not in ex.columns:
        return {}
    return {int(t): str(n) for t, n in ex.rows(f'SELECT t."globalTid", s.value FROM ThreadNames t JOIN {STRINGS} s ON s.id = t."nameId" '
                                                'WHERE t."globalTid" IS NOT NULL')}


def _tid_labels(pl: Any, tids: Any, threads: dict[int, str]) -> Any:
    """globalTid (Int64 Series) -> "<tid> (<name>)" / "<tid>"."""
    uniq = [t for t in tids.unique().to_list() if t is not None]
    labels = {t: (f"{t & 0xFFFFFF} ({threads[t]})" if t in threads else str(t & 0xFFFFFF)) for t in uniq}
    return tids.replace_strict(labels, default=None, return_dtype=pl.String)


def _calls(ex: Export, key: RankKey, siblings: list[RankKey], threads: dict[int, str], pl: Any) -> Any:
    from profkit.apis import canonical_api
    from profkit.ingest.tables import CALLS_SCHEMA

    raw = {"name": pl.String, "ts_ns": pl.Int64, "end_ns": pl.Int64, "gtid": pl.Int64, "correlation": pl.Int64}
    if not ex.has(RUNTIME, "start", "end"):
        return pl.DataFrame(schema=CALLS_SCHEMA)
    name, joins = _name_join(ex, RUNTIME, ("nameId",), "name")
    proc = _process(ex, RUNTIME, "t.")
    where, params = ("1", ())
    if key.process is not None and proc != "NULL":
        where, params = f"{proc} = ?", (key.process,)
    elif proc == "NULL":
        ex.lacks(f"{RUNTIME}.globalTid")
    sql = (f'SELECT {name}, t."start", t."end", {ex.col(RUNTIME, "globalTid", "g", prefix="t.")}, {ex.col(RUNTIME, "correlationId", "c", prefix="t.")} '
           f"FROM {RUNTIME} t {joins} WHERE {where}")
    calls = _frame(pl, ex.batches(sql, params), raw)
    calls = calls.with_columns(pl.lit(False).alias("synthetic"))
    calls = pl.concat([calls, _sync_calls(ex, key, calls, pl)], how="vertical_relaxed")
    if len(siblings) > 1:
        calls = _own_device(ex, key, siblings, calls, pl)
    names = calls["name"].unique().to_list()
    canon = {n: canonical_api(n) for n in names if n is not None}
    api = pl.col("name").replace_strict(canon, default=None, return_dtype=pl.String)
    pid = "" if key.pid is None else str(key.pid)
    return calls.with_columns(
        api.alias("name"), api.alias("api"), (pl.col("end_ns") - pl.col("ts_ns")).alias("dur_ns"), pl.lit(pid).alias("pid"),
        _tid_labels(pl, calls["gtid"], threads).fill_null("").alias("tid"), pl.lit(None, pl.Int64).alias("external_id"),
    ).filter(pl.col("dur_ns") >= 0).select(list(CALLS_SCHEMA))


def _sync_calls(ex: Export, key: RankKey, calls: Any, pl: Any) -> Any:
    """Host-blocking synchronizations of the rank's process that have no runtime call in the
    export, as calls of the API that makes them (thread unknown)."""
    schema = {"name": pl.String, "ts_ns": pl.Int64, "end_ns": pl.Int64, "gtid": pl.Int64, "correlation": pl.Int64, "synthetic": pl.Boolean}
    if not ex.has(SYNC, "start", "end", "syncType", "correlationId", want=SYNC in ex.columns):
        return pl.DataFrame(schema=schema)
    proc = _process(ex, SYNC)
    where, params = ("1", ())
    if key.process is not None and proc != "NULL":
        where, params = f"{proc} = ?", (key.process,)
    types = ",".join(str(t) for t in _SYNC_CALLS)
    rows = ex.rows(f'SELECT "syncType", "start", "end", "correlationId", "deviceId" FROM {SYNC} WHERE "syncType" IN ({types}) AND {where}', params)
    have = set(calls["correlation"].drop_nulls().to_list())
    got = [(_SYNC_CALLS[t], s, e, None, c, True) for t, s, e, c, _ in rows if c not in have]
    return pl.DataFrame(got, schema=schema, orient="row")


def _own_device(ex: Export, key: RankKey, siblings: list[RankKey], calls: Any, pl: Any) -> Any:
    """The calls of a process that drives several devices: those whose work ran on this rank's
    device; calls with no GPU work go to the device their thread launched most onto (the
    process's first device when the thread launched nothing)."""
    linked = []
    for t in _GPU_TABLES:
        if ex.has(t, "correlationId", "deviceId", want=False):
            proc = _process(ex, t)
            where = f"{proc} = ?" if proc != "NULL" else "1"
            linked += ex.rows(f'SELECT DISTINCT "correlationId", "deviceId" FROM "{t}" WHERE {where}', (key.process,) if proc != "NULL" else ())
    dev = pl.DataFrame(linked, schema={"correlation": pl.Int64, "device": pl.Int64}, orient="row").unique("correlation", keep="first")
    c = calls.join(dev, on="correlation", how="left")
    home = (c.filter(pl.col("device").is_not_null()).group_by("gtid", "device").len()
            .sort("len", "device", descending=[True, False]).unique("gtid", keep="first").select("gtid", pl.col("device").alias("home")))
    c = c.join(home, on="gtid", how="left", nulls_equal=True)
    first = siblings[0].device
    c = c.with_columns(pl.coalesce("device", "home", pl.lit(first)).alias("_dev"))
    return c.filter(pl.col("_dev") == key.device).drop("device", "home", "_dev")


def _ranges(ex: Export, key: RankKey, threads: dict[int, str], pl: Any) -> Any:
    """The rank's process's NVTX ranges as CPU spans (CPU_SCHEMA)."""
    from profkit.ingest.tables import CPU_SCHEMA

    if not ex.has(NVTX, "start", "end", "eventType", "globalTid"):
        return pl.DataFrame(schema=CPU_SCHEMA)
    raw = {"text": pl.String, "ts_ns": pl.Int64, "end_ns": pl.Int64, "gtid": pl.Int64}
    types = _RANGE_TYPES
    if "ENUM_NSYS_EVENT_TYPE" in ex.columns:
        got = [int(i) for i, n in ex.rows('SELECT id, name FROM ENUM_NSYS_EVENT_TYPE') if n and re.fullmatch(r"Nvtxt?(PushPop|StartEnd)Range", n)]
        types = tuple(got) or types
    text = 't."text"' if "text" in ex.columns[NVTX] else "NULL"
    if "textId" in ex.columns[NVTX] and STRINGS in ex.columns:
        text, joins = f'COALESCE({text}, s.value)', f'LEFT JOIN {STRINGS} s ON s.id = t."textId"'
    else:
        joins = ""
    where, params = "1", ()
    if key.process is not None:
        where, params = '(t."globalTid" >> 24) = ?', (key.process,)
    sql = (f'SELECT {text}, t."start", t."end", t."globalTid" FROM {NVTX} t {joins} '
           f'WHERE t."eventType" IN ({",".join(map(str, types))}) AND t."end" IS NOT NULL AND {where}')
    spans = _frame(pl, ex.batches(sql, params), raw)
    texts = spans["text"].unique().to_list()
    clean = {t: _EMIT_NVTX.sub("", t) for t in texts if t is not None}
    name = pl.col("text").replace_strict(clean, default=None, return_dtype=pl.String).fill_null("")
    pid = "" if key.pid is None else str(key.pid)
    return spans.with_columns(
        name.alias("name"),
        pl.when(name.str.starts_with("aten::")).then(pl.lit("cpu_op")).otherwise(pl.lit("user_annotation")).alias("cat"),
        (pl.col("end_ns") - pl.col("ts_ns")).alias("dur_ns"), pl.lit(pid).alias("pid"),
        _tid_labels(pl, spans["gtid"], threads).fill_null("").alias("tid"), pl.lit(None, pl.Int64).alias("external_id"),
    ).filter(pl.col("dur_ns") >= 0).select(list(CPU_SCHEMA))
