"""Nsight Systems captures -> the tables the Kineto reader produces (docs/nsys.md).

An `nsys export --type sqlite` file is read with the standard library's sqlite3 (no dependency;
DuckDB would need its sqlite extension, which it downloads): each table once for all the ranks,
streamed in chunks of rows into polars frames (see read_all and _frame), then split by rank:

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
from typing import TYPE_CHECKING, Any, Iterator

from profkit.errors import TraceInputError
from profkit.ingest.identity import TraceFile

if TYPE_CHECKING:
    from polars import DataType

    from profkit.ingest.decode import TraceMeta
    from profkit.ingest.tables import Trace

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
_EMIT_NVTX_RS = r", (?:seq|op_id|sizes|input_op_ids) = "  # where PyTorch emit_nvtx's decoration begins (a polars regex); it runs to the end
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

    def _version(self) -> dict[str, str]:
        out = {"format": "nsys-sqlite"}
        # EXPORT_META_DATA: the same table in exports of schema 2.x (Nsight Systems 2022)
        table = next((t for t in ("META_DATA_EXPORT", "EXPORT_META_DATA") if {"name", "value"} <= self.columns.get(t, set())), None)
        if table is None:
            self.lacks("META_DATA_EXPORT")
            return out
        got = dict(self.rows(f"SELECT name, value FROM {table}"))
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

    def rows(self, sql: str, params: tuple | dict[str, Any] = ()) -> list[tuple]:
        return list(self.batches(sql, params, size=None))

    def batches(self, sql: str, params: tuple | dict[str, Any] = (), *, size: int | None = BATCH) -> Iterator[Any]:
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
        """The rank's name in TraceFile.part and in messages: "device=1 pid=4242" (and the global
        id's upper bits, nsys's host/VM id, when above 1: exports merged from several hosts)."""
        upper = self.process >> 24 if self.process is not None else 0
        return f"device={self.device} pid={self.pid if self.pid is not None else '?'}" + (f" host={upper}" if upper > 1 else "")


@dataclass
class Plan:
    """The ranks of an export and the devices' names (TARGET_INFO_GPU, through TARGET_INFO_CUDA_DEVICE
    where the export has it)."""

    ranks: list[RankKey]
    names: dict[int, str] = field(default_factory=dict)  # deviceId -> name
    by_process: dict[tuple[int, int], str] = field(default_factory=dict)  # (pid, deviceId) -> name

    def name(self, key: RankKey) -> str | None:
        got = self.by_process.get((key.pid, key.device)) if key.pid is not None else None
        return got or self.names.get(key.device)


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
    gpus: dict[int, str] = {}
    if "TARGET_INFO_GPU" in ex.columns and {"id", "name"} <= ex.columns["TARGET_INFO_GPU"]:
        for i, n in ex.rows('SELECT "id", "name" FROM TARGET_INFO_GPU'):
            if i is not None and n:
                gpus.setdefault(int(i), str(n))
    names: dict[int, str] = dict(gpus)
    by_process: dict[tuple[int, int], str] = {}
    # TARGET_INFO_CUDA_DEVICE maps a process's CUDA device (cudaId, the deviceId of its GPU rows) to
    # the GPU (gpuId, TARGET_INFO_GPU.id): CUDA_VISIBLE_DEVICES renumbers the one, not the other
    cuda = ex.columns.get("TARGET_INFO_CUDA_DEVICE", set())
    if gpus and {"gpuId", "cudaId"} <= cuda:
        pid = '"pid"' if "pid" in cuda else "NULL"
        names = {}
        for g, c, p in ex.rows(f'SELECT "gpuId", "cudaId", {pid} FROM TARGET_INFO_CUDA_DEVICE'):
            if g is None or c is None or int(g) not in gpus:
                continue
            names.setdefault(int(c), gpus[int(g)])
            if p is not None:
                by_process.setdefault((int(p), int(c)), gpus[int(g)])
        names = names or dict(gpus)
    return Plan(ranks, names, by_process)


_PLANS: dict[tuple[str, int, int, str], Plan] = {}  # the last file's plan: parts() makes it, its read_all reuses it


def _ident(f: TraceFile) -> tuple[str, int, int, str]:
    """What names one export's content: its path, size, mtime and head/tail hash."""
    return (str(Path(f.path).resolve()), f.size, f.mtime_ns, f.head_tail_sha256)


def _plan_of(f: TraceFile, ex: Export) -> Plan:
    """plan(ex), once per file content (each table's DISTINCT ranks are a scan of it)."""
    ident = _ident(f)
    if ident not in _PLANS:
        _PLANS.clear()
        _PLANS[ident] = plan(ex)
    return _PLANS[ident]


def parts(f: TraceFile) -> list[tuple[TraceFile, RankKey, int, int, str | None]]:
    """An export's ranks as inputs: (its TraceFile with `part` set, key, rank, world size, device
    name), in rank order. Raises TraceInputError for a file that is not a readable export."""
    with Export(f.path) as ex:
        p = _plan_of(f, ex)
    n = len(p.ranks)
    return [(replace(f, part=k.part), k, r, n, p.name(k)) for r, k in enumerate(p.ranks)] or [(f, RankKey(0, None), 0, 1, None)]


# --- the ranks' tables ---------------------------------------------------------------------------
#
# Each table is read once for every rank (its rows tagged with device and process, then split),
# the tables in parallel threads, each on its own connection (sqlite3 releases the GIL while
# SQLite steps). The ranks not asked for yet wait in _READ for their loads (one file at a time).

_READ: dict[tuple[str, int, int, str], dict[str, Trace]] = {}


def load(f: TraceFile) -> Trace:
    """One rank of an nsys export (f.part; None: the first rank, with a warning when the file
    holds more) -> ingest.tables.Trace."""
    ident = _ident(f)
    got = _READ.get(ident)
    if got is None or (f.part is not None and f.part not in got):
        _READ.clear()
        got = _READ[ident] = read_all(f)
    if f.part is None:
        order = list(got)
        trace = got.pop(order[0])
        if len(order) > 1:
            trace.warnings.append(f"{f.path.name} holds {len(order)} ranks ({', '.join(order)}); read as one input it is the first only")
    else:
        trace = got.pop(f.part)
    if not got:
        _READ.pop(ident, None)
    return trace


def read_all(f: TraceFile) -> dict[str, Trace]:
    """Every rank of an export: {part: Trace}, in rank order."""
    import polars as pl
    from concurrent.futures import ThreadPoolExecutor

    from profkit.ingest.tables import CPU_SCHEMA, Trace, finish_tables

    with Export(f.path) as ex:
        p = _plan_of(f, ex)
        threads = _thread_names(ex)
        readers = {"gpu": _gpu_ops, "calls": _calls, "ranges": _ranges, "syncs": _sync_rows}
        with ThreadPoolExecutor(max_workers=len(readers), thread_name_prefix="profkit-nsys") as pool:
            futs = {k: pool.submit(_on_own_connection, ex, fn, pl) for k, fn in readers.items()}
            frames = {k: fut.result() for k, fut in futs.items()}
        graph_rows = ex.rows(f'SELECT COUNT(*) FROM "{GRAPH_TRACE}"')[0][0] if GRAPH_TRACE in ex.columns else 0
        stacks = call_stacks(ex, frames["calls"], pl)
        warnings = ex.warnings()
        version = ex.version
    gpu, calls, ranges, syncs = frames["gpu"], frames["calls"], frames["ranges"], frames["syncs"]
    # host-blocking synchronizations whose runtime call the export lacks become calls of that API
    if syncs.height:
        lost = syncs.join(calls.select("proc", "correlation"), on=["proc", "correlation"], how="anti", nulls_equal=True)
        calls = pl.concat([calls, lost.select(list(calls.columns))], how="vertical_relaxed")
    if graph_rows:
        warnings.append(f"{graph_rows} CUDA graph executions are recorded whole ({GRAPH_TRACE}: `nsys profile --cuda-graph-trace=graph`), "
                        "not as their kernels: their GPU time is not in the figures; record with --cuda-graph-trace=node")
    keys = p.ranks or [RankKey(0, None)]
    out: dict[str, Trace] = {}
    for rank, key in enumerate(keys):

        def mine(df: pl.DataFrame, process: int | None = key.process) -> pl.DataFrame:
            return df if process is None else df.filter(pl.col("proc") == process)

        g = mine(gpu).filter(pl.col("device") == key.device)
        siblings = [k for k in keys if k.process == key.process]
        c = mine(calls)
        if len(siblings) > 1:
            c = _own_device(key, siblings, c, mine(gpu), pl)
        pid = "" if key.pid is None else str(key.pid)
        g = _gpu_table(g, pl)
        c = _call_table(c, pid, threads, pl)
        cpu = _cpu_table(mine(ranges), pid, threads, pl)
        n_events = g.height + c.height + cpu.height
        if n_events == 0:
            raise TraceInputError(f"{f.path}: the nsys export has no GPU activity, runtime calls or NVTX ranges", hint="record while the GPU is busy")
        starts = [t["ts_ns"].min() for t in (g, c, cpu) if t.height]
        w = list(warnings)
        g, c, cpu, ann = finish_tables(g, c, cpu, pl.DataFrame(schema=CPU_SCHEMA), w)
        device = p.name(key)
        meta: TraceMeta = {"rank": rank, "world_size": len(keys), "source": {**version, "device_id": key.device, "pid": key.pid}}
        if device:
            meta["devices"] = [device]
        mine_stacks = {corr: fr for (proc, corr), fr in stacks.items() if key.process is None or proc == key.process}
        out[key.part] = Trace(path=f.path, rank=rank, device=device, gpu_ops=g, calls=c, cpu=cpu, gpu_annotations=ann, t0_ns=int(min(starts)),
                              n_events=n_events, meta=meta, warnings=w, sha256=f.sha256, call_stacks=mine_stacks)
    return out


def _on_own_connection(ex: Export, fn: Any, pl: Any) -> Any:
    """fn(ex, pl) with ex on a connection of its own (for a thread)."""
    import copy

    mine = copy.copy(ex)
    mine.con = _connect(ex.path)
    try:
        return fn(mine, pl)
    finally:
        mine.con.close()


_US, _RS = "\x1f", "\x1e"  # the unit and record separators texts travel with (see _frame)
CHUNK_ROWIDS = 1 << 17
_JSON: list[bool] = []  # whether this process's SQLite has json_group_array (see _json_arrays)


def _json_arrays(ex: Export) -> bool:
    """Whether SQLite has json_group_array: built in since 3.38, the JSON1 extension before (which
    most builds include)."""
    if not _JSON:
        try:
            ex.con.execute("SELECT json_group_array(1)").fetchall()
            _JSON.append(True)
        except sqlite3.OperationalError:
            _JSON.append(False)
    return _JSON[0]


def _frame(ex: Export, pl: Any, sql: str, schema: dict[str, type[DataType]]) -> Any:
    """The rows of `sql` ("SELECT e0, e1, ... FROM <table> t ... [WHERE ...]") as a frame of
    `schema` (Int64 and String columns), with no Python object per value (that costs as much as
    SQLite's own reading): for each chunk of rows (by rowid) SQLite joins each column into one
    string, handed over as bytes, and polars' CSV reader parses it. Integers come as a JSON array
    (json_group_array: the cheapest way out of SQLite; null for NULL), texts one after the other
    apart by the ASCII record separator. Text values lose that and the unit separator (spaces
    instead); an empty text is null; text that is not UTF-8: TraceInputError, as for a damaged file.

    A chunk is first read as it is; only when a text column holds more separators than its rows
    make (a text holds one) is it read again with its texts' separators replaced: the replacing
    costs as much as the rest of the row, and texts almost never hold them."""
    m = re.search(r"\bFROM\s+\"?(\w+)\"?\s+t\b", sql)
    names = list(schema)
    table = m.group(1) if m else None
    try:
        # two subqueries: SQLite finds a lone MIN or MAX of the rowid at the b-tree's ends, both in one SELECT by a scan
        lo, hi = ex.rows(f'SELECT (SELECT MIN(rowid) FROM "{table}"), (SELECT MAX(rowid) FROM "{table}")')[0] if table else (None, None)
    except TraceInputError:
        lo = hi = None
    if lo is None or hi is None:  # no rowid (a view) or no rows: one row at a time
        frames = [pl.DataFrame(dict(zip(names, map(list, zip(*b)))), schema=schema, strict=False) for b in ex.batches(sql)]
        return pl.concat(frames) if frames else pl.DataFrame(schema=schema)
    cols = [f"c{i}" for i in range(len(names))]
    texts = [schema[n] == pl.String for n in names]
    ranged = sql.replace(" WHERE ", " WHERE t.rowid BETWEEN :lo AND :hi AND ", 1) if " WHERE " in sql else sql + " WHERE t.rowid BETWEEN :lo AND :hi"
    json = _json_arrays(ex)  # else integers as texts are: "1,,3" (an empty one for NULL)

    def joined(c: str, text: bool, clean: bool) -> str:
        if not text:
            return f"json_group_array({c})" if json else f"group_concat(COALESCE({c}, ''), ',')"
        if clean:
            c = f"replace(replace({c}, char(30), ' '), char(31), ' ')"
        return f"group_concat(COALESCE({c}, ''), char(30))"

    def query(clean: bool) -> str:
        out = ", ".join(f"CAST({joined(c, t, clean)} AS BLOB)" for c, t in zip(cols, texts))
        return f"WITH q({', '.join(cols)}) AS ({ranged}) SELECT {out}, count(*) FROM q"

    fast, slow = query(False), query(True)
    us, rs = _US.encode(), _RS.encode()
    frames = []
    for a in range(lo, hi + 1, CHUNK_ROWIDS):
        chunk = {"lo": a, "hi": a + CHUNK_ROWIDS - 1}
        *got, n = ex.rows(fast, chunk)[0]
        if not n:
            continue
        if any(t and (b.count(rs) != n - 1 or b.count(us)) for b, t in zip(got, texts)):  # a text holds a separator
            *got, n = ex.rows(slow, chunk)[0]
        try:
            # the integer columns one after the other, parsed at once (each read_csv costs about a millisecond), then cut apart
            ints = None if all(texts) else pl.read_csv(
                b",".join(b[1:-1] if json else b for b, t in zip(got, texts) if not t) + b",", separator=_US, eol_char=",", has_header=False,
                quote_char=None, null_values="null" if json else None, schema={"v": pl.Int64}).to_series()
            out, k = [], 0
            for name, b, t in zip(names, got, texts):
                if t:
                    out.append(pl.read_csv(b + rs, separator=_US, eol_char=_RS, has_header=False, quote_char=None, schema={name: pl.String}).to_series())
                else:
                    out.append(ints.slice(k * n, n).alias(name))  # type: ignore[union-attr]
                    k += 1
        except pl.exceptions.ComputeError as e:  # text that is not UTF-8
            raise corrupt(ex.path, e) from None
        frames.append(pl.DataFrame(out))
    return pl.concat(frames) if frames else pl.DataFrame(schema=schema)


def _name_id(ex: Export, table: str, cols: tuple[str, ...]) -> str | None:
    """The first of `cols` (StringIds references) the table has, else None (noted as missing)."""
    have = [c for c in cols if c in ex.columns.get(table, set())]
    if not have:
        ex.lacks(f"{table}.{cols[0]}")
        return None
    if STRINGS not in ex.columns:
        ex.lacks(STRINGS)
    return have[0]


def _named(ex: Export, pl: Any, df: Any, col: str | None) -> Any:
    """df's `name` column (a StringIds id) as the string: each distinct string read once (a name
    per row would cost as much as the rest of the row); an id without its string reads
    "<string N>"."""
    if col is None:
        return df.with_columns(pl.lit(None, pl.String).alias("name"))
    got: dict[int, str] = {}
    if STRINGS in ex.columns:
        wanted = df["name"].drop_nulls().unique().to_list()
        for k in range(0, len(wanted), 500):
            part = wanted[k:k + 500]
            got.update((int(i), v) for i, v in ex.rows(f'SELECT id, value FROM {STRINGS} WHERE id IN ({",".join("?" * len(part))})', tuple(part)))
    ids = pl.col("name")
    return df.with_columns(ids.replace_strict(got, default=None, return_dtype=pl.String).fill_null(pl.format("<string {}>", ids)).alias("name"))


_GPU_RAW = ("name", "ts_ns", "end_ns", "device", "proc", "stream", "correlation", "bytes", "copy_kind", "src", "dst")


def _gpu_ops(ex: Export, pl: Any) -> Any:
    """Every kernel, copy and memset of the export (raw columns, with device and process)."""
    raw = {"name": pl.Int64, **{k: pl.Int64 for k in _GPU_RAW[1:]}}  # the kernel's name id: _named names it
    parts = []
    name = _name_id(ex, KERNEL, ("demangledName", "shortName", "mangledName"))
    sql = (f'SELECT {f"t.{chr(34)}{name}{chr(34)}" if name else "NULL"}, t."start", t."end", t."deviceId", {_process(ex, KERNEL, "t.")}, {ex.col(KERNEL, "streamId", "s", prefix="t.")}, '
           f'{ex.col(KERNEL, "correlationId", "c", prefix="t.")} FROM {KERNEL} t')
    kernels = _frame(ex, pl, sql, {k: raw[k] for k in _GPU_RAW[:7]})  # the copy columns are no kernel's: not carried
    parts.append(_named(ex, pl, kernels, name).with_columns(pl.lit("kernel").alias("cat")))
    if ex.has(MEMCPY, "deviceId", "start", "end"):
        sql = (f'SELECT t."start", t."end", t."deviceId", {_process(ex, MEMCPY, "t.")}, {ex.col(MEMCPY, "streamId", "s", prefix="t.")}, '
               f'{ex.col(MEMCPY, "correlationId", "c", prefix="t.")}, {ex.col(MEMCPY, "bytes", "b", prefix="t.")}, {ex.col(MEMCPY, "copyKind", "k", prefix="t.")}, '
               f'{ex.col(MEMCPY, "srcKind", "sk", prefix="t.")}, {ex.col(MEMCPY, "dstKind", "dk", prefix="t.")} FROM {MEMCPY} t')
        copies = _frame(ex, pl, sql, {k: raw[k] for k in _GPU_RAW[1:]})
        parts.append((_copy_names(ex, copies, pl) if copies.height else copies).with_columns(pl.lit("gpu_memcpy").alias("cat")))
    if ex.has(MEMSET, "deviceId", "start", "end"):
        sql = (f'SELECT t."start", t."end", t."deviceId", {_process(ex, MEMSET, "t.")}, {ex.col(MEMSET, "streamId", "s", prefix="t.")}, '
               f'{ex.col(MEMSET, "correlationId", "c", prefix="t.")}, {ex.col(MEMSET, "bytes", "b", prefix="t.")}, '
               f'{ex.col(MEMSET, "memKind", "m", prefix="t.")} FROM {MEMSET} t')
        sets = _frame(ex, pl, sql, {k: raw[k] for k in (*_GPU_RAW[1:8], "src")})
        if sets.height:
            kinds = ex.enum("ENUM_CUDA_MEM_KIND", _MEM_KINDS, label=True)
            label = pl.col("src").replace_strict(kinds, default=None, return_dtype=pl.String)
            sets = sets.with_columns(pl.when(label.is_null()).then(pl.lit("Memset")).otherwise(pl.format("Memset ({})", label)).alias("name"))
        parts.append(sets.with_columns(pl.lit("gpu_memset").alias("cat")))
    ops = pl.concat(parts, how="diagonal_relaxed").with_columns(pl.col("name").cast(pl.String))
    ops = ops.with_columns(pl.lit(None, pl.Int64).alias(k) for k in _GPU_RAW if k not in ops.columns)
    if "direction" not in ops.columns:
        ops = ops.with_columns(pl.lit(None, pl.String).alias("direction"), pl.lit(False).alias("pageable"))
    return ops.with_columns(pl.col("pageable").fill_null(False))


def _gpu_table(ops: Any, pl: Any) -> Any:
    from profkit.ingest.tables import GPU_OPS_SCHEMA

    return ops.with_columns((pl.col("end_ns") - pl.col("ts_ns")).alias("dur_ns")).filter(pl.col("dur_ns") >= 0).select(list(GPU_OPS_SCHEMA))


def _copy_names(ex: Export, copies: Any, pl: Any) -> Any:
    """Copies named as Kineto names them (`Memcpy HtoD (Pageable -> Device)`), with direction
    (h2d, d2h, d2d, other) and pageable from the export's enums."""
    opers = ex.enum("ENUM_CUDA_MEMCPY_OPER", _COPY_KINDS, label=False)
    kinds = ex.enum("ENUM_CUDA_MEM_KIND", _MEM_KINDS, label=True)
    pageable = [i for i, v in kinds.items() if v.lower() == "pageable"]

    def short(o: str) -> str:  # HTOD -> HtoD, UVM_HTOD -> HtoD (Unified), as Kineto spells them
        base = o.removeprefix("UVM_")
        s = base[0] + "to" + base[3] if len(base) == 4 and base[1:3] == "TO" else base.title()
        return s + (" (Unified)" if o.startswith("UVM_") else "")

    oper = pl.col("copy_kind").replace_strict(opers, default="UNKNOWN", return_dtype=pl.String)
    src = pl.col("src").replace_strict(kinds, default=None, return_dtype=pl.String)
    dst = pl.col("dst").replace_strict(kinds, default=None, return_dtype=pl.String)
    shown = oper.replace_strict({v: short(v) for v in set(opers.values()) | {"UNKNOWN"}}, return_dtype=pl.String)
    return copies.with_columns(
        pl.when(src.is_null() | dst.is_null()).then(pl.format("Memcpy {}", shown))
        .otherwise(pl.format("Memcpy {} ({} -> {})", shown, src, dst)).alias("name"),
        oper.replace_strict(_DIRECTION, default="other", return_dtype=pl.String).alias("direction"),
        (pl.col("src").is_in(pageable) | pl.col("dst").is_in(pageable)).fill_null(False).alias("pageable"),
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


def _calls(ex: Export, pl: Any) -> Any:
    """Every runtime and driver call of the export (raw columns, with process and the id of its
    backtrace in CUDA_CALLCHAINS, `chain`). An export recorded with CUDA backtraces holds a second row
    per traced call (eventClass TRACE_PROCESS_EVENT_CUDABACKTRACE, the same correlationId, wrapping
    the call): it is the call's stack, not a call (see _backtraces_folded)."""
    raw = {"name": pl.String, "ts_ns": pl.Int64, "end_ns": pl.Int64, "gtid": pl.Int64, "proc": pl.Int64, "correlation": pl.Int64,
           "chain": pl.Int64}
    if not ex.has(RUNTIME, "start", "end"):
        return pl.DataFrame(schema=raw)
    name = _name_id(ex, RUNTIME, ("nameId",))
    if "globalTid" not in ex.columns[RUNTIME]:
        ex.lacks(f"{RUNTIME}.globalTid")
    sql = (f'SELECT {f"t.{chr(34)}{name}{chr(34)}" if name else "NULL"}, t."start", t."end", {ex.col(RUNTIME, "globalTid", "g", prefix="t.", want=False)}, '
           f'{ex.col(RUNTIME, "correlationId", "c", prefix="t.")}')
    schema = {"name": pl.Int64, "ts_ns": pl.Int64, "end_ns": pl.Int64, "gtid": pl.Int64, "correlation": pl.Int64}  # the name id: _named names it
    bt = backtrace_class(ex)
    # the two columns only where backtrace rows are (one indexed-free EXISTS: milliseconds on a large export)
    traced = "eventClass" in ex.columns[RUNTIME] and ex.rows(f'SELECT EXISTS(SELECT 1 FROM {RUNTIME} WHERE "eventClass" = ?)', (bt,))[0][0]
    if traced:
        sql += f', t."eventClass", {ex.col(RUNTIME, "callchainId", "cc", prefix="t.", want=False)}'
        schema |= {"event_class": pl.Int64, "chain": pl.Int64}
    got = _frame(ex, pl, sql + f" FROM {RUNTIME} t", schema).with_columns((pl.col("gtid") // (1 << 24)).alias("proc"))
    got = _backtraces_folded(got, bt, pl) if traced else got.with_columns(pl.lit(None, pl.Int64).alias("chain"))
    return _named(ex, pl, got.select(list(raw)), name)


BACKTRACE_CLASS = 67  # TRACE_PROCESS_EVENT_CUDABACKTRACE in ENUM_NSYS_EVENT_CLASS (schema 3.x); the value older exports use too


def backtrace_class(ex: Export) -> int:
    """The eventClass of a CUDA backtrace row: ENUM_NSYS_EVENT_CLASS's TRACE_PROCESS_EVENT_CUDABACKTRACE,
    else 67 (an export of schema 2.x has no ENUM tables and writes 67)."""
    if ex.has("ENUM_NSYS_EVENT_CLASS", "id", "name", want=False):
        for i, n in ex.rows('SELECT id, name FROM ENUM_NSYS_EVENT_CLASS'):
            if n == "TRACE_PROCESS_EVENT_CUDABACKTRACE":
                return int(i)
    return BACKTRACE_CLASS


def _backtraces_folded(calls: Any, bt: int, pl: Any) -> Any:
    """The calls with their backtrace rows folded in: a backtrace row (eventClass `bt`) of a call
    that has its own row (same process and correlationId) is dropped, its callchainId becoming the
    call's `chain`; one with no such row stands for the call (its name is the API's)."""
    is_bt = (pl.col("event_class") == bt).fill_null(False)
    traces, real = calls.filter(is_bt).drop("event_class"), calls.filter(~is_bt).drop("event_class")
    keys = ["proc", "correlation"]
    chains = traces.filter(pl.col("chain").is_not_null()).select(*keys, pl.col("chain").alias("_bt_chain")).unique(keys, keep="first")
    real = real.join(chains, on=keys, how="left").with_columns(pl.coalesce("chain", "_bt_chain").alias("chain")).drop("_bt_chain")
    alone = traces.join(real.select(keys), on=keys, how="anti")
    return pl.concat([real, alone.select(real.columns)]).sort("ts_ns", maintain_order=True)


CALLCHAINS = "CUDA_CALLCHAINS"
# frames of the profiler and of CUDA's own libraries: not where a call came from (a module's file name)
_RUNTIME_MODULE = re.compile(r"^lib(cupti|cuda|cudart|nvToolsExt\w*|nvtx\w*|ToolsInjection\w*)([.\-]|$)", re.IGNORECASE)
_ADDRESS = re.compile(r"^0x[0-9a-fA-F]+$")


def call_stacks(ex: Export, calls: Any, pl: Any) -> dict[tuple[int | None, int], tuple[str, ...]]:
    """(process, correlationId) -> the frames of the call's CUDA backtrace (CUDA_CALLCHAINS, innermost
    first), for the host-blocking calls and copies (the calls whose trigger and stack the sync table
    shows): the frames of Nsight Systems, libcupti, libcuda and libcudart and the unresolved addresses
    left out, so the first frame is the code that made the call. Empty without backtraces.

    Exports of schema 2.x number `callchainId` from 0 and CUDA_CALLCHAINS from 1 (in the public saxpy
    export every chain at id + 1 holds the call's own API frame, at id only 17 of 38 do); later ones
    point at the id itself. Which of the two an export does is decided from the calls: the offset
    under which more chains hold the call's own API frame (ties: none)."""
    from profkit.apis import ASYNC_COPY_APIS, BLOCKING_COPY_APIS, SYNC_APIS, canonical_api

    if "chain" not in calls.columns or not ex.has(CALLCHAINS, "id", "symbol", "stackDepth", want=False) or STRINGS not in ex.columns:
        return {}
    c = calls.filter(pl.col("chain").is_not_null() & pl.col("correlation").is_not_null())
    if c.height == 0:
        return {}
    canon = {n: canonical_api(n) for n in c["name"].unique().to_list() if n is not None}
    wanted = SYNC_APIS | BLOCKING_COPY_APIS | ASYNC_COPY_APIS
    c = c.with_columns(pl.col("name").replace_strict(canon, default=None, return_dtype=pl.String).alias("api")).filter(pl.col("api").is_in(wanted))
    if c.height == 0:
        return {}
    ids = sorted({int(i) + d for i in c["chain"].unique().to_list() for d in (0, 1)})
    cols = ex.columns[CALLCHAINS]
    module = 'm.value' if "module" in cols else "NULL"
    unresolved = 'ch."unresolved"' if "unresolved" in cols else "NULL"
    frames: dict[int, list[tuple[str, str, Any]]] = {}
    for k in range(0, len(ids), 500):
        part = ids[k:k + 500]
        for i, sym, mod, unres in ex.rows(
                f'SELECT ch."id", s.value, {module}, {unresolved} FROM {CALLCHAINS} ch LEFT JOIN {STRINGS} s ON s.id = ch."symbol" '
                + (f'LEFT JOIN {STRINGS} m ON m.id = ch."module" ' if "module" in cols else "")
                + f'WHERE ch."id" IN ({",".join("?" * len(part))}) ORDER BY ch."id", ch."stackDepth"', tuple(part)):
            frames.setdefault(int(i), []).append((str(sym or ""), str(mod or ""), unres))
    rows = list(zip(c["proc"].to_list(), c["correlation"].to_list(), c["chain"].to_list(), c["api"].to_list()))

    def holds_api(chain: int, api: str) -> bool:
        return any(sym == api for sym, _, _ in frames.get(chain, ()))

    off = 1 if sum(holds_api(ch + 1, a) for _, _, ch, a in rows) > sum(holds_api(ch, a) for _, _, ch, a in rows) else 0
    out: dict[tuple[int | None, int], tuple[str, ...]] = {}
    for p, corr, ch, _api in rows:
        kept = tuple(sym for sym, mod, unres in frames.get(ch + off, ())
                     if sym and not unres and not _ADDRESS.match(sym) and not _RUNTIME_MODULE.match(mod.rsplit("/", 1)[-1])
                     and "nsight-systems" not in mod.lower())
        if kept:
            out[(p, corr)] = kept
    return out


def _sync_rows(ex: Export, pl: Any) -> Any:
    """Host-blocking synchronizations (event, stream, context synchronize) as calls of the API
    that makes them (thread unknown); read_all keeps those without a runtime call."""
    raw = {"name": pl.String, "ts_ns": pl.Int64, "end_ns": pl.Int64, "gtid": pl.Int64, "proc": pl.Int64, "correlation": pl.Int64,
           "chain": pl.Int64}
    if not ex.has(SYNC, "start", "end", "syncType", "correlationId", want=SYNC in ex.columns):
        return pl.DataFrame(schema=raw)
    case = "CASE t.\"syncType\" " + " ".join(f"WHEN {k} THEN '{v}'" for k, v in _SYNC_CALLS.items()) + " END"
    sql = (f'SELECT {case}, t."start", t."end", NULL, {_process(ex, SYNC, "t.")}, t."correlationId", NULL FROM {SYNC} t '
           f'WHERE t."syncType" IN ({",".join(map(str, _SYNC_CALLS))})')
    return _frame(ex, pl, sql, raw)


def _call_table(calls: Any, pid: str, threads: dict[int, str], pl: Any) -> Any:
    from profkit.apis import canonical_api
    from profkit.ingest.tables import CALLS_SCHEMA

    canon = {n: canonical_api(n) for n in calls["name"].unique().to_list() if n is not None}
    calls = calls.with_columns((pl.col("end_ns") - pl.col("ts_ns")).alias("dur_ns")).filter(pl.col("dur_ns") >= 0)
    calls = calls.with_columns(pl.col("name").replace_strict(canon, default=None, return_dtype=pl.String).alias("api"))  # once (see _cpu_table)
    return calls.with_columns(
        pl.col("api").alias("name"), pl.lit(pid).alias("pid"), _tid_labels(pl, calls["gtid"], threads).fill_null("").alias("tid"),
        pl.lit(None, pl.Int64).alias("external_id"),
    ).select(list(CALLS_SCHEMA))


def _own_device(key: RankKey, siblings: list[RankKey], calls: Any, gpu: Any, pl: Any) -> Any:
    """The calls of a process that drives several devices: those whose work ran on this rank's
    device; calls with no GPU work go to the device their thread launched most onto (the
    process's first device when the thread launched nothing)."""
    dev = gpu.select("correlation", "device").drop_nulls().unique("correlation", keep="first")
    c = calls.join(dev, on="correlation", how="left")
    home = (c.filter(pl.col("device").is_not_null()).group_by("gtid", "device").len()
            .sort("len", "device", descending=[True, False]).unique("gtid", keep="first").select("gtid", pl.col("device").alias("home")))
    c = c.join(home, on="gtid", how="left", nulls_equal=True)
    c = c.with_columns(pl.coalesce("device", "home", pl.lit(siblings[0].device)).alias("_dev"))
    return c.filter(pl.col("_dev") == key.device).drop("device", "home", "_dev")


def _ranges(ex: Export, pl: Any) -> Any:
    """Every NVTX range of the export (push/pop and start/end; raw columns, with process)."""
    raw = {"text": pl.String, "ts_ns": pl.Int64, "end_ns": pl.Int64, "gtid": pl.Int64, "proc": pl.Int64}
    if not ex.has(NVTX, "start", "end", "eventType", "globalTid"):
        return pl.DataFrame(schema=raw)
    types: tuple[int, ...] = _RANGE_TYPES
    if "ENUM_NSYS_EVENT_TYPE" in ex.columns:
        got = [int(i) for i, n in ex.rows("SELECT id, name FROM ENUM_NSYS_EVENT_TYPE") if n and re.fullmatch(r"Nvtxt?(PushPop|StartEnd)Range", n)]
        types = tuple(got) or types
    text, joins = ('t."text"' if "text" in ex.columns[NVTX] else "NULL"), ""
    if "textId" in ex.columns[NVTX] and STRINGS in ex.columns:
        text, joins = f"COALESCE({text}, s.value)", f'LEFT JOIN {STRINGS} s ON s.id = t."textId"'
    sql = (f'SELECT {text}, t."start", t."end", t."globalTid" FROM {NVTX} t {joins} '
           f'WHERE t."eventType" IN ({",".join(map(str, types))}) AND t."end" IS NOT NULL')
    got = _frame(ex, pl, sql, {k: v for k, v in raw.items() if k != "proc"})
    return got.with_columns((pl.col("gtid") // (1 << 24)).alias("proc"))


def _cpu_table(spans: Any, pid: str, threads: dict[int, str], pl: Any) -> Any:
    """NVTX ranges -> CPU_SCHEMA: emit_nvtx's decoration dropped, aten:: ranges as cpu ops."""
    from profkit.ingest.tables import CPU_SCHEMA

    spans = spans.with_columns((pl.col("end_ns") - pl.col("ts_ns")).alias("dur_ns")).filter(pl.col("dur_ns") >= 0)
    # the text up to its decoration: cut at the match's byte offset (half the cost of a regex replace).
    # The name first, on its own: an expression used twice in one with_columns is computed twice
    text = pl.col("text")
    cut = text.str.find(_EMIT_NVTX_RS).fill_null(text.str.len_bytes())
    spans = spans.with_columns(text.cast(pl.Binary).bin.head(cut).cast(pl.String).fill_null("").alias("name"))
    return spans.with_columns(
        pl.when(pl.col("name").str.starts_with("aten::")).then(pl.lit("cpu_op")).otherwise(pl.lit("user_annotation")).alias("cat"),
        pl.lit(pid).alias("pid"), _tid_labels(pl, spans["gtid"], threads).fill_null("").alias("tid"), pl.lit(None, pl.Int64).alias("external_id"),
    ).select(list(CPU_SCHEMA))
