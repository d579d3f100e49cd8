#!/usr/bin/env python3
"""Independent per-device figures of an Nsight Systems SQLite export (`nsys export --type sqlite`).

Standard library only; shares no code with profkit and does not import it. Every figure is counted
here from the export's raw tables, following the nsys schema and DESIGN.md as written:

  - device of a GPU row: `deviceId` of CUPTI_ACTIVITY_KIND_KERNEL / _MEMCPY / _MEMSET;
  - process of a row: `globalPid >> 24` (GPU rows, synchronizations) or `globalTid >> 24` (runtime
    calls); a rank is a (device, process) pair that ran GPU work (`ranks`, "<device>/<pid>"; an
    export whose GPU rows record no process has one device, "<device>/?"); a runtime call belongs
    to the device its process ran GPU work on; a process on several devices has each call on the
    device its own GPU work ran on, a call without GPU work on the device its thread's calls ran on
    most (ties: the lower), a thread with none on the process's lowest device. `devices`: the ranks
    of each device summed (busy: the union of every row on it);
  - launch: the runtime call of the same process with the same correlationId (CUPTI numbers
    correlation ids per process);
  - CUDA backtraces: an export recorded with them holds, for each traced call, a second
    CUPTI_ACTIVITY_KIND_RUNTIME row of eventClass TRACE_PROCESS_EVENT_CUDABACKTRACE (its id in
    ENUM_NSYS_EVENT_CLASS; 67 in exports without that table) with the call's correlationId. Of the
    rows of one (process, correlationId), those are dropped when any other row remains: a call is
    counted once, with its own row's name and duration; a backtrace row alone stands for its call;
  - copies by direction, from ENUM_CUDA_MEMCPY_OPER's symbol names: HTOD -> h2d, DTOH -> d2h,
    DTOD and PTOP -> d2d, anything else -> other; pageable when either side's ENUM_CUDA_MEM_KIND
    label is "Pageable";
  - launch calls: runtime calls named (version suffix dropped) cudaLaunchKernel(ExC),
    cuLaunchKernel(Ex), cuda/cuLaunchCooperativeKernel, cuda/cuGraphLaunch, cudaMemcpyAsync,
    cudaMemsetAsync;
  - synchronizations: host-blocking records of CUPTI_ACTIVITY_KIND_SYNCHRONIZATION (event, stream
    and context synchronize: not stream-wait-event, which blocks no host thread), plus synchronize
    runtime calls (cuda*/cu*Synchronize) that have no such record. CUPTI writes an event-synchronize
    record for cudaEventQuery too: a poll that returns at once, not counted;
  - blocking copies: cudaMemcpyAsync calls whose copy is pageable, and synchronous copy calls
    (cudaMemcpy, cudaMemset, ...), that have a copy record;
  - blocked time: the duration (end - start, ns) of each sync (its runtime call, else its
    synchronization record) and of each blocking copy's call, summed (`sync_ns`, `blocking_copy_ns`);
  - exports of schema 2.x (Nsight Systems 2022) have no ENUM_* tables and name META_DATA_EXPORT
    EXPORT_META_DATA: the enums' values are those the later exports write (CUDA_MEMCPY_KIND_*,
    CUDA_MEMOPR_MEMORY_KIND_*, CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_*), copied below;
  - busy: the union of every GPU row's [start, end) on the device, in integer ns;
  - "in window": with no iteration marker the whole capture is one window, and a GPU op is counted
    in it when its launch call is in the export (else it is work outside every iteration).

    python3 tests/plain_nsys.py FILE.sqlite [...]      # prints the figures as JSON
"""

from __future__ import annotations

import json
import re
import sqlite3
import sys
from collections import Counter, defaultdict

KERNEL_LAUNCH = {"cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx",
                 "cudaLaunchCooperativeKernel", "cuLaunchCooperativeKernel"}
GRAPH_LAUNCH = {"cudaGraphLaunch", "cuGraphLaunch"}
LAUNCH = KERNEL_LAUNCH | GRAPH_LAUNCH | {"cudaMemcpyAsync", "cudaMemsetAsync"}
SYNC_CALL = re.compile(r"^cu(da)?\w*Synchronize$")
BLOCKING_COPY = {"cudaMemcpy", "cudaMemcpy2D", "cudaMemcpy3D", "cudaMemcpyToSymbol", "cudaMemcpyFromSymbol", "cudaMemcpyPeer",
                 "cuMemcpy", "cuMemcpyDtoH", "cuMemcpyHtoD", "cuMemcpyDtoD", "cudaMemset"}
HOST_BLOCKING_SYNC = ("EVENT_SYNCHRONIZE", "STREAM_SYNCHRONIZE", "CONTEXT_SYNCHRONIZE")
DIRS = ("h2d", "d2h", "d2d", "other")
# the ENUM tables of an Nsight Systems 2026.2 export (h100_2gpu_1s.sqlite), for exports without them
COPY_KINDS = {0: "CUDA_MEMCPY_KIND_UNKNOWN", 1: "CUDA_MEMCPY_KIND_HTOD", 2: "CUDA_MEMCPY_KIND_DTOH", 8: "CUDA_MEMCPY_KIND_DTOD",
              10: "CUDA_MEMCPY_KIND_PTOP"}
MEM_KINDS = {0: "Pageable", 1: "Pinned", 2: "Device", 3: "Array", 4: "Managed", 5: "Device Static", 6: "Managed Static", 7: "Unknown"}
SYNC_TYPES = {0: "CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_UNKNOWN", 1: "CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_EVENT_SYNCHRONIZE",
              2: "CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_STREAM_WAIT_EVENT", 3: "CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_STREAM_SYNCHRONIZE",
              4: "CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_CONTEXT_SYNCHRONIZE"}
BACKTRACE = "TRACE_PROCESS_EVENT_CUDABACKTRACE"


def base_name(name: str) -> str:
    """cudaLaunchKernel_v7000 -> cudaLaunchKernel (CUPTI's version suffixes)."""
    return re.sub(r"(_v\d+)?(_ptsz|_ptds)?$", "", name)


def columns(con: sqlite3.Connection, table: str) -> set[str]:
    return {r[1] for r in con.execute(f'PRAGMA table_info("{table}")')}


def union_ns(intervals: list[tuple[int, int]]) -> int:
    total, cur_s, cur_e = 0, None, None
    for s, e in sorted(intervals):
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        total += cur_e - cur_s
    return total


def figures(path: str) -> dict:
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    meta_table = next((t for t in ("META_DATA_EXPORT", "EXPORT_META_DATA") if t in tables), None)
    meta = dict(con.execute(f"SELECT name, value FROM {meta_table}")) if meta_table else {}

    # runtime calls: (process, correlation) -> name, duration, thread; process -> its calls
    calls: dict[tuple, str] = {}
    calls_of: dict[object, list[tuple]] = defaultdict(list)
    call_ns: dict[tuple, int] = {}
    thread_of: dict[tuple, object] = {}
    rt_cols = columns(con, "CUPTI_ACTIVITY_KIND_RUNTIME") if "CUPTI_ACTIVITY_KIND_RUNTIME" in tables else set()
    if rt_cols:
        backtrace = 67
        if "ENUM_NSYS_EVENT_CLASS" in tables:
            backtrace = next((i for i, n in con.execute("SELECT id, name FROM ENUM_NSYS_EVENT_CLASS") if n == BACKTRACE), 67)
        proc = "globalTid >> 24" if "globalTid" in rt_cols else "NULL"
        tid = "globalTid" if "globalTid" in rt_cols else "NULL"
        klass = "r.eventClass" if "eventClass" in rt_cols else "NULL"
        rows_of: dict[tuple, list[tuple]] = defaultdict(list)
        for k, (p, t, corr, name, ec, s, e) in enumerate(con.execute(
                f'SELECT {proc}, {tid}, r.correlationId, s.value, {klass}, r.start, r."end" FROM CUPTI_ACTIVITY_KIND_RUNTIME r '
                "LEFT JOIN StringIds s ON s.id = r.nameId")):
            rows_of[(p, corr) if corr is not None else (p, None, k)].append((ec == backtrace, base_name(name or ""), e - s, t))
        for key, rows in rows_of.items():
            own = [r for r in rows if not r[0]]
            for _bt, n, ns, t in own or rows[:1]:  # the call's own row(s); a backtrace row only when it is alone
                p, corr = key[0], key[1]
                calls_of[p].append((corr, n, t))
                if corr is not None:
                    calls[(p, corr)] = n
                    call_ns[(p, corr)] = ns
                    thread_of[(p, corr)] = t

    copy_op = {i: n for i, n in con.execute("SELECT id, name FROM ENUM_CUDA_MEMCPY_OPER")} if "ENUM_CUDA_MEMCPY_OPER" in tables else COPY_KINDS
    mem_kind = {i: l for i, l in con.execute("SELECT id, label FROM ENUM_CUDA_MEM_KIND")} if "ENUM_CUDA_MEM_KIND" in tables else MEM_KINDS

    def direction(kind: int | None) -> str:
        n = (copy_op.get(kind) or "").removeprefix("CUDA_MEMCPY_KIND_")
        return {"HTOD": "h2d", "DTOH": "d2h", "DTOD": "d2d", "PTOP": "d2d"}.get(n, "other")

    # GPU rows: (kind, device, process, start, end, correlation, copyKind, srcKind, dstKind)
    gpu = []
    for table, kind in (("CUPTI_ACTIVITY_KIND_KERNEL", "kernel"), ("CUPTI_ACTIVITY_KIND_MEMCPY", "memcpy"), ("CUPTI_ACTIVITY_KIND_MEMSET", "memset")):
        if table not in tables:
            continue
        cols = columns(con, table)
        proc = "globalPid >> 24" if "globalPid" in cols else "NULL"
        extra = ", copyKind, " + ("srcKind, dstKind" if "srcKind" in cols else "NULL, NULL") if kind == "memcpy" else ", NULL, NULL, NULL"
        gpu += [(kind, *r) for r in con.execute(f'SELECT deviceId, {proc}, start, "end", correlationId{extra} FROM {table}')]

    # a rank is a (device, process) that ran GPU work; a call's rank: its process's device; for a
    # process on several devices, the device its GPU work ran on, else the device its thread's calls
    # that have GPU work ran on most (ties: the lower), else the process's lowest device
    devices_of: dict[object, set] = defaultdict(set)
    work_device: dict[tuple, int] = {}
    for _kind, d, p, _s, _e, corr, *_ in gpu:
        devices_of[p].add(d)
        work_device.setdefault((p, corr), d)
    if None in devices_of:
        if len({d for ds in devices_of.values() for d in ds}) != 1:
            raise SystemExit(f"{path}: GPU rows without a process on several devices: not handled by this script")
        only = next(iter(devices_of[None]))
        devices_of = defaultdict(set, {p: {only} for p in calls_of})
        work_device = {k: only for k in calls}
        single = True
    else:
        single = False
    per_thread: dict[object, Counter] = defaultdict(Counter)
    for (p, corr), d in work_device.items():
        if (p, corr) in thread_of:
            per_thread[thread_of[(p, corr)]][d] += 1

    def rank_of(p, corr, thread) -> tuple | None:
        ds = devices_of.get(p)
        if not ds:
            return None  # a process that ran no GPU work: no rank
        key = None if single else p
        if len(ds) == 1:
            return (next(iter(ds)), key)
        d = work_device.get((p, corr))
        if d is None and per_thread.get(thread):
            d = sorted(per_thread[thread].items(), key=lambda kv: (-kv[1], kv[0]))[0][0]
        return (min(ds) if d is None else d, key)

    def fresh() -> dict:
        return {"kernels": 0, "memcpy": Counter(), "memset": 0, "busy_intervals": [], "launch": Counter(), "syncs": 0, "sync_calls": 0,
                "sync_ns": 0, "in_window": {"kernels": 0, "memcpy": Counter(), "memset": 0}, "pageable_copies": 0, "blocking_copies": 0,
                "blocking_copy_ns": 0}

    ranks: dict[tuple, dict] = defaultdict(fresh)
    device_busy: dict[int, list] = defaultdict(list)
    for kind, d, p, s, e, corr, ck, sk, dk in gpu:
        x = ranks[(d, None if single else p)]
        x["busy_intervals"].append((s, e))
        device_busy[d].append((s, e))
        launched = (p, corr) in calls if p is not None else any(k[1] == corr for k in calls)
        if kind == "kernel":
            x["kernels"] += 1
            x["in_window"]["kernels"] += launched
        elif kind == "memset":
            x["memset"] += 1
            x["in_window"]["memset"] += launched
        else:
            dr = direction(ck)
            x["memcpy"][dr] += 1
            x["in_window"]["memcpy"][dr] += launched
            pageable = "Pageable" in (mem_kind.get(sk), mem_kind.get(dk))
            x["pageable_copies"] += pageable
            call = calls.get((p, corr))
            if call is not None and ((call == "cudaMemcpyAsync" and pageable) or call in BLOCKING_COPY):
                x["blocking_copies"] += 1
                x["blocking_copy_ns"] += call_ns[(p, corr)]

    for p, cs in calls_of.items():
        for corr, n, t in cs:
            r = rank_of(p, corr, t)
            if r is not None and n in LAUNCH:
                ranks[r]["launch"][n] += 1

    sync_corr = set()
    if "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION" in tables:
        types = {i: n for i, n in con.execute("SELECT id, name FROM ENUM_CUPTI_SYNC_TYPE")} if "ENUM_CUPTI_SYNC_TYPE" in tables else SYNC_TYPES
        blocking = {i for i, n in types.items() if n.endswith(HOST_BLOCKING_SYNC)}
        for p, corr, t, s, e in con.execute('SELECT globalPid >> 24, correlationId, syncType, start, "end" FROM CUPTI_ACTIVITY_KIND_SYNCHRONIZATION'):
            call = calls.get((p, corr))
            r = rank_of(p, corr, thread_of.get((p, corr)))
            if t in blocking and r is not None:
                sync_corr.add((p, corr))
                if call is None or SYNC_CALL.match(call):  # not a cudaEventQuery poll
                    ranks[r]["syncs"] += 1
                    ranks[r]["sync_ns"] += call_ns[(p, corr)] if call is not None else e - s
    for p, cs in calls_of.items():
        for corr, n, t in cs:
            r = rank_of(p, corr, t)
            if SYNC_CALL.match(n) and r is not None:
                ranks[r]["sync_calls"] += 1
                if (p, corr) not in sync_corr:
                    ranks[r]["syncs"] += 1
                    ranks[r]["sync_ns"] += call_ns.get((p, corr), 0)

    def shown(xs: list[dict], busy: list) -> dict:
        def add(key: str) -> int:
            return sum(x[key] for x in xs)

        launch = sum((x["launch"] for x in xs), Counter())
        return {
            "kernels": add("kernels"), "memcpy": {k: sum(x["memcpy"][k] for x in xs) for k in DIRS}, "memset": add("memset"),
            "launch_calls": sum(launch.values()), "kernel_launches": sum(n for a, n in launch.items() if a in KERNEL_LAUNCH),
            "graph_launches": sum(n for a, n in launch.items() if a in GRAPH_LAUNCH),
            "syncs": add("syncs"), "sync_calls": add("sync_calls"), "blocking_copies": add("blocking_copies"),
            "pageable_copies": add("pageable_copies"), "sync_ns": add("sync_ns"), "blocking_copy_ns": add("blocking_copy_ns"),
            "busy_ns": union_ns(busy),
            "in_window": {"kernels": sum(x["in_window"]["kernels"] for x in xs),
                          "memcpy": {k: sum(x["in_window"]["memcpy"][k] for x in xs) for k in DIRS},
                          "memset": sum(x["in_window"]["memset"] for x in xs)},
        }

    # per device (its ranks' counts; busy: the union of every row on the device) and per rank ("<device>/<pid>")
    out = {"schema_version": meta.get("EXPORT_SCHEMA_VERSION"), "devices": {}, "ranks": {}}
    for d in sorted(device_busy):
        out["devices"][str(d)] = shown([x for (rd, _p), x in ranks.items() if rd == d], device_busy[d])
    for (d, p) in sorted(ranks, key=lambda k: (k[0], -1 if k[1] is None else k[1])):
        name = f"{d}/{'?' if p is None else p & 0xFFFFFF}"
        if name in out["ranks"]:
            raise SystemExit(f"{path}: two processes with pid {name} on one device (exports merged from several hosts): not handled")
        out["ranks"][name] = shown([ranks[(d, p)]], ranks[(d, p)]["busy_intervals"])
    con.close()
    return out


if __name__ == "__main__":
    print(json.dumps({p: figures(p) for p in sys.argv[1:]}, indent=1))
