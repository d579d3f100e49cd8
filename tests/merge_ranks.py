"""Rank files -> one merged file, the way the engines' own tools write them (stdlib only; shares no
code with profkit). Used by tests/test_merged_ranks.py to make merged files of real rank pairs.

- `sglang_merge`: what SGLang's profile merger does (sglang `python/sglang/srt/utils/profile_merger.py`,
  `ProfileMerger.merge_chrome_traces`, behind `/start_profile` with `merge_profiles`): the files in
  (DP, EP, PP, TP) order of the ranks in their names; every event's `pid` rewritten as
  `"<label> <pid>"` (label `[TP00]`, `[TP01-DP00-PP00-EP00]`: the rank kinds present in the name);
  `process_sort_index` of pids under 1000 renumbered; `traceEvents` first, then every other key of
  the first file that has it (so `distributedInfo`, `baseTimeNanoseconds`, `trace_id` are rank 0's),
  and `deviceProperties` the concatenation of every file's; written gzipped as
  `merged-<profile_id>.trace.json.gz`.
- `tracelens_fuse`: what TraceLens' TraceFuse.merge_and_save does (AMD-AGI/TraceLens
  `TraceLens/TraceFusion/trace_fuse.py`): events of category `Trace` dropped (and `python_function`),
  `args.rank` added, `pid`, `id` and the linking key (`correlation`) offset by rank x 10^(digits of
  rank 0's largest value + 1), the raw values kept as `<field>_raw`; only `traceEvents` written.
"""

from __future__ import annotations

import gzip
import json
import math
import re
from pathlib import Path
from typing import Any

KINDS = ("TP", "DP", "PP", "EP")


def _load(path: Path) -> Any:
    with open(path, "rb") as f:
        gz = f.read(2) == b"\x1f\x8b"
    with (gzip.open(path, "rt", encoding="utf-8") if gz else open(path, encoding="utf-8")) as f:
        return json.load(f)


def _rank_info(name: str) -> dict[str, int]:
    out = {}
    for kind in KINDS:
        m = re.search(rf"{kind}-(\d+)", name)
        if m:
            out[kind] = int(m.group(1))
    return out


def _label(info: dict[str, int]) -> str:
    parts = [f"{k}{info[k]:02d}" for k in KINDS if k in info]
    return f"[{'-'.join(parts)}]" if parts else "[Unknown]"


def sglang_merge(files: list[Path], out: Path) -> Path:
    """The files merged as SGLang's profile merger merges them, written to `out` (gzipped)."""
    def order(p: Path) -> tuple[int, ...]:
        info = _rank_info(p.name)
        return tuple(info.get(k, 0) for k in ("DP", "EP", "PP", "TP"))

    merged: dict[str, Any] = {"traceEvents": []}
    props: list[Any] = []
    for path in sorted(files, key=order):
        info = _rank_info(path.name)
        label = _label(info)
        doc = _load(path)
        rest = {k: v for k, v in doc.items() if k != "traceEvents"}
        events = doc.get("traceEvents", [])
        for e in events:
            if e.get("name") == "process_sort_index":
                try:
                    pid = int(e.get("pid"))
                except (TypeError, ValueError):
                    pid = None
                if pid is not None and pid < 1000:
                    e["args"]["sort_index"] = (info.get("DP", 0) * 100000000 + info.get("EP", 0) * 1000000
                                               + info.get("PP", 0) * 10000 + info.get("TP", 0) * 100 + pid)
            e["pid"] = f"{label} {e['pid']}"
        merged["traceEvents"].extend(events)
        if "deviceProperties" in rest:
            props.extend(rest.pop("deviceProperties"))
        for k, v in rest.items():
            if k not in merged:
                merged[k] = v
    if props:
        merged["deviceProperties"] = props
    with gzip.open(out, "wb") as f:
        f.write(json.dumps(merged).encode("utf-8"))
    return out


def tracelens_fuse(files: list[Path], out: Path) -> Path:
    """The files (rank i = the i-th) fused as TraceLens' TraceFuse fuses them, written to `out` (gzipped)."""
    first = _load(files[0])["traceEvents"]
    launch = next(e for e in first if e.get("cat") in ("cuda_runtime", "cuda_driver") and "launch" in e.get("name", "").lower())
    link = "correlation" if "correlation" in launch["args"] else "External id"
    fields = ["id", "pid", link]
    top: dict[str, int] = {}
    for e in first:
        for fld in fields:
            v = (e.get("args") or {}).get(fld) if fld == link else e.get(fld)
            if isinstance(v, int):
                top[fld] = max(top.get(fld, 0), v)
    mult = {fld: 10 ** (math.ceil(math.log10(v)) + 1) for fld, v in top.items()}
    merged = []
    for rank, path in enumerate(files):
        for e in _load(path)["traceEvents"]:
            if e.get("cat") == "Trace" or e.get("cat") == "python_function":
                continue
            e.setdefault("args", {})
            e["args"]["rank"] = rank
            for fld, m in mult.items():
                if fld == link:
                    if fld in e["args"]:
                        e["args"][f"{fld}_raw"] = e["args"][fld]
                        e["args"][fld] += rank * m
                elif fld in e:
                    e["args"][f"{fld}_raw"] = e[fld]
                    if type(e[fld]) is int:
                        e[fld] += rank * m
            merged.append(e)
    with gzip.open(out, "wt", encoding="utf-8") as f:
        json.dump({"traceEvents": merged}, f, indent=4)
    return out
