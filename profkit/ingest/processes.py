"""One Kineto file that holds several processes (ranks) -> which rows belong to which rank.

DESIGN.md "Traces as engines write them": each process of a multi-GPU job has its own correlation
ids and its own device, so a file that holds several is split into one rank per process before
anything is counted. Two forms are recognized, from the `pid` of the events alone (polars-free):

- **SGLang's profile merger** (`merge_profiles` of `/start_profile`, sglang
  `python/sglang/srt/utils/profile_merger.py`): every event's `pid` becomes `"<label> <pid>"`, the
  label naming the parallel ranks present in the rank file's name, `[TP01]` or
  `[TP01-DP00-PP00-EP00]` (`[Unknown]` when the name had none). The label names the rank; the rank
  files are ordered as the merger orders them (DP, EP, PP, TP) and numbered in that order; each
  rank's `pid` is given back without its label. The merger keeps the first rank file's
  `distributedInfo` and `baseTimeNanoseconds` and concatenates every file's `deviceProperties`.
- **TraceLens' TraceFusion** (`TraceLens/TraceFusion/trace_fuse.py`): rank r's integer `pid`s (and
  correlation ids) are offset by r x M, M a power of ten above rank 0's largest pid. A GPU op's `pid`
  is its device's index in a Kineto trace, so GPU ops whose `pid` differs from their `args.device` by
  multiples of one power of ten M mark the form; rank = pid // M, the pid given back as pid - r x M.

A file in neither form is one rank, exactly as before (a process that drives two GPUs writes GPU
`pid`s equal to its devices: one rank).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

# SGLang's rank label: `[TP00]`, `[TP01-DP00-PP00-EP00]`, or `[Unknown]`, a space, the original pid
LABEL = re.compile(r"\[((?:TP|DP|PP|EP)\d+(?:-(?:TP|DP|PP|EP)\d+)*|Unknown)\] (.*)", re.S)
_PART = re.compile(r"(TP|DP|PP|EP)(\d+)")
SGLANG = "sglang merge_profiles"
TRACELENS = "TraceLens TraceFusion"


@dataclass
class Split:
    """How a file's rows divide into ranks: `locate(pid)` gives a pid text's rank (its index in
    `names`) and the pid as that rank's own file wrote it, or None for a pid of no rank."""

    form: str  # SGLANG or TRACELENS
    names: list[str]  # each rank's name (SGLang's label, or "rank <r>"), in rank order
    ranks: list[int]  # each rank's number
    multiplier: int = 0  # TraceLens' pid offset per rank
    pids: dict[str, tuple[int, str] | None] = field(default_factory=dict)  # memo of locate

    def locate(self, pid: str) -> tuple[int, str] | None:
        if pid in self.pids:
            return self.pids[pid]
        got: tuple[int, str] | None = None
        if self.form == SGLANG:
            lab = label_of(pid)
            if lab is not None and lab[0] in self.names:
                got = (self.names.index(lab[0]), lab[1])
        else:
            p = _int(pid)
            r = p // self.multiplier if p is not None and p >= 0 else 0  # a pid TraceLens did not offset: rank 0's
            if r in self.ranks:
                got = (self.ranks.index(r), str(p - r * self.multiplier) if p is not None and p >= 0 else pid)
        self.pids[pid] = got
        return got

    def source(self, k: int) -> dict[str, str | int | None]:
        """summary.json's `source` of rank k: the form and the process it was taken from."""
        return {"merged": self.form, "process": self.names[k]}


def label_of(pid: str) -> tuple[str, str] | None:
    """(label, original pid) of a pid SGLang's merger rewrote, else None."""
    if not pid.startswith("["):
        return None
    m = LABEL.fullmatch(pid)
    return (f"[{m.group(1)}]", m.group(2)) if m else None


def _label_order(label: str) -> tuple[int, int, int, int]:
    got = {k: int(v) for k, v in _PART.findall(label)}
    return got.get("DP", 0), got.get("EP", 0), got.get("PP", 0), got.get("TP", 0)


def sglang_split(pids: set[str]) -> Split | None:
    """The split of a file whose pids carry SGLang's rank labels, else None."""
    labels = {got[0] for p in pids if (got := label_of(p)) is not None}
    if not labels:
        return None
    names = sorted(labels, key=lambda s: (_label_order(s), s))
    return Split(SGLANG, names, list(range(len(names))))


def _int(text: str) -> int | None:
    if text.isascii() and (text.isdigit() or (text[:1] == "-" and text[1:].isdigit())):
        return int(text)
    return None


def tracelens_split(gpu_pairs: set[tuple[str, int | None]], pids: set[str]) -> Split | None:
    """The split of a TraceLens-fused file, from its GPU ops' (pid, args.device) pairs and every pid
    text of the file, else None."""
    offsets = []
    for pid, dev in gpu_pairs:
        p = _int(pid)
        if p is None or dev is None or dev < 0 or p == dev:
            continue
        if p < dev:
            return None  # not an offset
        offsets.append(p - dev)
    if not offsets:
        return None
    g = 0
    for o in offsets:
        g = math.gcd(g, o)
    if g < 10:
        return None
    m = 10 ** int(math.log10(g))
    if any(o % m for o in offsets) or any(dev is not None and dev >= m for _, dev in gpu_pairs):
        return None
    ranks = sorted({(p - d) // m for p, d in ((_int(t), d) for t, d in gpu_pairs) if p is not None and d is not None} | {0})
    # TraceFuse's M is 10^(digits of rank 0's largest pid + 1): rank 0's pids are at most M / 10, and
    # every process (CPU pids included) falls in a rank that has GPU ops; anything else is no fusion
    for t in pids:
        p = _int(t)
        if p is None or p < 0:
            continue
        if p // m not in ranks or (p < m and p > m // 10):
            return None
    if len(ranks) < 2:
        return None
    return Split(TRACELENS, [f"rank {r}" for r in ranks], ranks, m)


def plan_split(gpu_pairs: set[tuple[str, int | None]], pids: set[str]) -> Split | None:
    """The file's split (SGLang labels first, then the TraceLens form), or None: one rank. `pids`:
    the pid texts of the GPU ops and runtime calls (or, with neither, of the CPU events)."""
    return sglang_split(pids) or tracelens_split(gpu_pairs, pids)


def min_ts_by_label(pids: list[str], ts: list[float | None]) -> dict[str, float]:
    """The earliest timestamp of each SGLang-labelled pid among events (pid text, ts): each rank's t0
    is the earliest timestamp of any of its events, as in its own file."""
    out: dict[str, float] = {}
    for p, t in zip(pids, ts):
        if t is None or p[:1] != "[":
            continue
        got = out.get(p)
        if got is None or t < got:
            out[p] = t
    return out
