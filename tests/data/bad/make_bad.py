"""Build the bad-input corpus from a real H200 fixture: `python tests/data/bad/make_bad.py`.

Each file is a way a trace reaches profkit broken or odd. The corpus is committed; this script
documents (and can rebuild) how each case was made. Expected outcomes are in EXPECTED below and are
checked by tests/test_bad_input.py: either exit 3 with one line naming the file, or a correct
analysis with a warning that says what was skipped.
"""

from __future__ import annotations

import copy
import gzip
import json
from pathlib import Path

HERE = Path(__file__).resolve().parent
SOURCE = HERE.parent / "gpu" / "eager_sync.pt.trace.json.gz"

# name -> (exit code, text that must appear in the output)
EXPECTED: dict[str, tuple[int, str]] = {
    "truncated.json.gz": (3, "truncated or corrupt gzip"),
    "gzip_of_truncated_json.json.gz": (3, "not valid JSON"),
    "not_gzip.json.gz": (3, "not gzip and not JSON"),
    "plain_json_named_gz.json.gz": (0, "not gzip-compressed"),
    "garbage.bin": (3, "not JSON"),
    "empty.json": (3, "empty file"),
    "array_of_numbers.json": (3, "holds no trace events"),
    "no_trace_events.json": (3, "traceEvents"),
    "perfetto.pftrace": (3, "Perfetto"),
    "report.nsys-rep": (3, "Nsight Systems"),
    "empty_trace_events.json": (3, "no events"),
    "cpu_only.json.gz": (0, "CPU-only trace"),
    # annotations, Python frames and the runtime calls that launch nothing: no device work at all (device_records "none")
    "no_device_work.json.gz": (0, "nothing ran on a device"),
    "gpu_only.json.gz": (0, "no runtime calls"),
    "no_marker.json.gz": (0, "whole trace"),
    "missing_dur.json.gz": (0, "without a duration"),
    "negative_dur.json.gz": (0, "negative duration"),
    "string_timestamps.json.gz": (0, "non-standard types"),
    "duplicated_events.json.gz": (0, "duplicated"),
    "huge_kernel_name.json.gz": (0, ""),
    "hostile_names.json.gz": (0, ""),
}


def source() -> dict:
    return json.loads(gzip.decompress(SOURCE.read_bytes()))


def write_json(name: str, doc: object, *, gz: bool = False) -> None:
    data = json.dumps(doc).encode()
    (HERE / name).write_bytes(gzip.compress(data, mtime=0) if gz else data)


def main() -> None:
    doc = source()
    raw = json.dumps(doc).encode()
    gz = gzip.compress(raw, mtime=0)
    (HERE / "truncated.json.gz").write_bytes(gz[: len(gz) // 2])
    (HERE / "gzip_of_truncated_json.json.gz").write_bytes(gzip.compress(raw[: len(raw) // 2], mtime=0))
    (HERE / "not_gzip.json.gz").write_bytes(b"\x00\x13binary not gzip\xff" * 20)
    (HERE / "plain_json_named_gz.json.gz").write_bytes(raw)
    (HERE / "garbage.bin").write_bytes(bytes(range(256)) * 8)
    (HERE / "empty.json").write_bytes(b"")
    write_json("array_of_numbers.json", [1, 2, 3])
    write_json("no_trace_events.json", {"schemaVersion": 1, "deviceProperties": []})
    # a Perfetto TracePacket stream starts with field 1 (packet), wire type 2: byte 0x0a
    (HERE / "perfetto.pftrace").write_bytes(b"\x0a\x10\x08\x01\x12\x0c" + b"trackdescr" * 4)
    (HERE / "report.nsys-rep").write_bytes(b"\x00\x00\x00\x00QDSTRM" + b"\x01" * 64)
    write_json("empty_trace_events.json", {"traceEvents": []})
    ev = doc["traceEvents"]
    cpu_cats = {"cpu_op", "user_annotation", "python_function"}
    gpu_cats = {"kernel", "gpu_memcpy", "gpu_memset"}
    write_json("cpu_only.json.gz", {**doc, "traceEvents": [e for e in ev if e.get("cat") in cpu_cats]}, gz=True)
    launches = {"cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx", "cudaGraphLaunch", "cuGraphLaunch",
                "cudaMemcpyAsync", "cudaMemsetAsync"}
    write_json("no_device_work.json.gz", {**doc, "traceEvents": [
        e for e in ev if e.get("cat") in {"user_annotation", "python_function"}
        or (e.get("cat") in {"cuda_runtime", "cuda_driver"} and e.get("name") not in launches)]}, gz=True)
    write_json("gpu_only.json.gz", {**doc, "traceEvents": [e for e in ev if e.get("cat") in gpu_cats]}, gz=True)
    write_json("no_marker.json.gz", {**doc, "traceEvents": [e for e in ev if e.get("name") not in ("scheduler.run_batch",)
                                                              and not str(e.get("name", "")).startswith(("step[", "ProfilerStep"))]}, gz=True)
    d = copy.deepcopy(doc)
    n = 0
    for e in d["traceEvents"]:
        if e.get("cat") == "kernel" and n < 5:
            e.pop("dur")
            n += 1
    write_json("missing_dur.json.gz", d, gz=True)
    d = copy.deepcopy(doc)
    n = 0
    for e in d["traceEvents"]:
        if e.get("cat") == "kernel" and n < 3:
            e["dur"] = -abs(e["dur"])
            n += 1
    write_json("negative_dur.json.gz", d, gz=True)
    d = copy.deepcopy(doc)
    for e in d["traceEvents"]:
        if "ts" in e:
            e["ts"] = str(e["ts"])
    write_json("string_timestamps.json.gz", d, gz=True)
    d = copy.deepcopy(doc)
    d["traceEvents"] = d["traceEvents"] + [e for e in d["traceEvents"] if e.get("cat") in gpu_cats | {"cuda_runtime", "cuda_driver"}][:40]
    write_json("duplicated_events.json.gz", d, gz=True)
    d = copy.deepcopy(doc)
    for e in d["traceEvents"]:
        if e.get("cat") == "kernel":
            e["name"] = "void huge_kernel<" + ",".join(f"T{i}" for i in range(60000)) + ">()"
            break
    write_json("huge_kernel_name.json.gz", d, gz=True)
    d = copy.deepcopy(doc)
    hostile = ["<script>alert(1)</script>", "[bold red]rich markup[/]", "| pipe | `tick` & <b>", "\u202eRTL\u0000nul"]
    k = 0
    for e in d["traceEvents"]:
        if e.get("cat") == "kernel":
            e["name"] = hostile[k % len(hostile)]
            k += 1
    write_json("hostile_names.json.gz", d, gz=True)


if __name__ == "__main__":
    main()
    print(f"wrote {len(EXPECTED)} cases to {HERE}")
