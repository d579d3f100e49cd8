"""summary.json and diff.json as typed structs (msgspec): decoded once where a document enters
attribution or a renderer, read by field everywhere after.

`summary_of` takes a summary.json (schema v1, v2 or v3: the dict `profkit analyze` builds, or the
bytes of a file) and upgrades what older versions lack in one place: a v1 rank lists every bubble and
sync, so its `bubbles_by_cause` and `sync_groups` aggregates are counted from the lists here. What
cannot be recovered stays None (a v1 rank's `bubble_cpu_ops` has no times; v1 and v2 iterations have
no time by ownership: `owned_category_us` None, which attribution takes as the clock basis).

Unknown keys are ignored and every field has a default, so older and newer files decode. Capture
health (Health), a rank's overlap slack (OverlapSlack), capture facts (CaptureFacts), graph-capture
statistics (GraphCaptureStats), the speculative cost (SpecCost, RankSpec), a rank's floor (FloorSection)
and its source (RankSource) are read by field; the run manifest and a summary's `run` section stay the
plain JSON they were written as (reports list every key) and are typed where read (`manifest_of`, `run_of`);
the representative timeline only travels through, as plain JSON. Writing: analysis builds each section as its
struct (an optional key that is left out is UNSET) and assembles summary.json as a dict of their plain JSON,
and attribution builds diff.json as the Diff below (`compare_summaries`), encoded once where it is written
(`diff_doc`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Generic, TypedDict, TypeVar

import msgspec
from msgspec import UNSET, UnsetType

__all__ = ["UNSET", "UnsetType", "Summary", "Rank", "Iteration", "summary_of", "rank_of", "Diff", "diff_of", "diff_doc"]

Num = int | float  # a JSON number as written: an int stays an int (a count), a float a float


class _Doc(msgspec.Struct, forbid_unknown_fields=False, kw_only=True):
    pass


_D = TypeVar("_D", bound=_Doc)


# ---------------------------------------------------------------------------------------------
# summary.json


class GapSplit(_Doc):
    """gpu_window_us - floor_us = idle + above_floor + floor_mix + unmodeled - overlap (analysis/floor.py)."""
    total_us: Num = 0.0
    idle_us: Num = 0.0
    idle_us_by_cause: dict[str, Num] = {}
    above_floor_us: Num = 0.0
    above_floor_us_by_category: dict[str, Num] = {}
    floor_mix_us: Num = 0.0
    floor_mix_parts_us: dict[str, Num] = {}  # mix_us (by ownership, >= 0) + edges_us (work across the window's edges)
    unmodeled_us: Num = 0.0
    unmodeled_us_by_category: dict[str, Num] = {}
    overlap_us: Num = 0.0


class CategoryWork(_Doc):
    """One category's own work in an iteration (analysis/floor.py): FLOPs, bytes, the sum of its ops' own floors (in a
    rank's `median`, the medians: FLOPs and bytes may be halves)."""
    flops: Num = 0
    bytes: Num = 0
    floor_us: Num = 0.0


class IterationFloor(_Doc):
    """An iteration's work, hardware floor and gap split (analysis/floor.py): the last keys of its summary record."""
    flops: int = 0
    bytes: int = 0
    work_by_category: dict[str, CategoryWork] = {}
    floor_us: Num = 0.0
    floor_bound: str = "memory"
    floor_memory_us: Num = 0.0
    floor_compute_us: Num = 0.0
    gap_us: GapSplit = msgspec.field(default_factory=GapSplit)


class FloorPeaks(_Doc):
    """The peaks a rank's floor used (analysis/peaks.py Peaks)."""
    device: str = ""
    memory_tb_s: Num = 0.0
    dense_tflop_s: dict[str, Num] = {}
    source: str = ""


class ModeledOp(_Doc):
    """A modeled launching op of a rank's `floor` by (op, shape, dtypes): its GPU ops' time and work, the rates
    achieved (where it ran) and their share of the peaks (where known); FLOPs only for gemm and attention."""
    shape_op: str | None = None
    shape: str | None = None
    shape_dtypes: str | None = None
    kind: str | None = None
    gpu_ops: int = 0
    total_us: Num = 0.0
    bytes: int = 0
    flops: int | UnsetType = UNSET
    tb_s: Num | UnsetType = UNSET
    tflop_s: Num | UnsetType = UNSET
    memory_share: Num | UnsetType = UNSET
    compute_share: Num | UnsetType = UNSET
    bound: str | UnsetType = UNSET


class FloorSection(_Doc):
    """A rank's `floor` (analysis/floor.py rank_floor): the peaks used, or `note`: why there is no floor; the
    modeled share of the GPU ops and the modeled ops (absent without shapes)."""
    note: str | UnsetType = UNSET
    peaks: FloorPeaks | UnsetType = UNSET
    gpu_ops: int | UnsetType = UNSET
    modeled_gpu_ops: int | UnsetType = UNSET
    ops: list[ModeledOp] | UnsetType = UNSET


class Iteration(_Doc):
    index: int = 0
    kind: str | None = None
    batch_size: int | None = None
    step: dict[str, int] | None = None  # the SGLang step span's fields but bs (toks, ext, dec, roofline c_*/g_*); None: none
    start_us: float | None = None
    gpu_start_us: float | None = None
    wall_us: Num | None = None
    gpu_window_us: Num | None = None
    gpu_busy_us: Num | None = None
    gpu_idle_us: Num | None = None
    overlap_us: Num | None = None
    gpu_kernels: Num | None = None
    memcpy: dict[str, Num | None] = {}
    memset: Num | None = None
    kernel_launches: Num | None = None
    graph_launches: Num | None = None
    launch_calls: dict[str, Num] = {}
    launch_us: Num | None = None
    launch_latency_us_p50: Num | None = None
    syncs: Num | None = None
    sync_us: Num | None = None
    sync_copies: Num | None = None
    sync_copy_us: Num | None = None
    bubble_count: Num | None = None
    bubble_us: Num | None = None
    bubble_us_by_cause: dict[str, Num | None] = {}
    category_us: dict[str, Num | None] = {}  # by the clock
    phase_us: dict[str, Num | None] = {}  # schema v2
    owned_gpu_us: Num | None = None  # schema v2
    spill_us: Num | None = None  # schema v2
    owned_category_us: dict[str, Num | None] | None = None  # schema v3: by ownership
    owned_phase_us: dict[str, Num | None] | None = None
    owned_overlap_us: Num | None = None
    # issue 41 (recorded with shapes, and peaks known): the step's own work, its hardware floor and the split of
    # gpu_window_us - floor_us (analysis/floor.py); absent (None) otherwise, never 0
    flops: Num | None = None
    bytes: Num | None = None
    work_by_category: dict[str, CategoryWork] | None = None
    floor_us: Num | None = None
    floor_bound: str | None = None
    floor_memory_us: Num | None = None
    floor_compute_us: Num | None = None
    gap_us: GapSplit | None = None

    def count(self, key: str) -> Num:
        """A count by diff.json's name (``memcpy_d2h`` is memcpy["d2h"]); 0 when absent."""
        if key.startswith("memcpy_"):
            return self.memcpy.get(key.removeprefix("memcpy_")) or 0
        v = getattr(self, key)
        return v or 0


class Sync(_Doc):
    iteration: int | None = None
    api: str | None = None  # the CUDA spelling (what is counted)
    name: str | None = None  # the trace's own spelling, where it is not `api`'s (a HIP call)
    kind: str | None = None
    direction: str | None = None
    start_us: float | None = None
    blocked_us: Num | None = None
    trigger: str | None = None
    stack: str | None = None


class Bubble(_Doc):
    iteration: int | None = None
    start_us: Num | None = None
    dur_us: Num | None = None
    cause: str | None = None
    cpu_ops: list[str] = []
    cpu_ops_us: list[Num | None] | None = None  # schema v2


class SyncGroup(_Doc):
    kind: str | None = None
    api: str | None = None
    name: str | None = None  # as in Sync
    direction: str | None = None
    trigger: str | None = None
    count: int = 0
    blocked_us: Num = 0.0
    by_iteration: dict[str, int] = {}  # iteration index (as a string) -> count


class CauseTotal(_Doc):
    count: int = 0
    us: Num | None = 0.0


class BubbleCpuOp(_Doc):
    cause: str | None = None
    cpu_op: str = ""
    idle_us: Num | None = None
    bubbles: int = 0


class Kernel(_Doc):
    name: str | None = None
    category: str | None = None
    count: int | None = None
    total_us: Num | None = None
    # the launching CPU op and its Input Dims / Input type (compact JSON text), in a trace recorded with shapes
    shape_op: str | None = None
    shape: str | None = None
    shape_dtypes: str | None = None


class Outside(_Doc):
    """GPU work outside every iteration (schema v2)."""
    gpu_ops: int = 0
    gpu_us: Num | None = None
    before_first: int = 0
    after_last: int = 0
    no_launch_in_trace: int = 0
    device_busy_us: Num | None = None
    gpu_kernels: int = 0
    memcpy: dict[str, int] = {}
    memset: int = 0
    launch_calls: int = 0
    syncs: int = 0
    sync_copies: int = 0


class Breaker(_Doc):
    """What took an exposed interval's time (analysis/slack.py): a sync or blocking copy, a CPU op, or host code outside recorded ops."""
    kind: str = ""
    name: str = ""
    direction: str | None | UnsetType = UNSET  # these two: a sync's or blocking copy's only
    trigger: str | None | UnsetType = UNSET
    us: Num = 0.0


class Transition(_Doc):
    """One transition N -> N+1 of a rank's overlap slack."""
    from_: int | None = msgspec.field(default=None, name="from")
    to: int | None = None
    kind: str | None = None
    slack_us: Num = 0.0
    exposed_host_us: Num = 0.0
    broken_by: list[Breaker] = []


class BreakerTotal(_Doc):
    breaker: str = ""
    us: Num = 0.0


class OverlapSlack(_Doc):
    """A rank's `overlap_slack` (analysis/slack.py rank_slack): every transition and the rank's statistics."""
    transitions: list[Transition] = []
    count: int = 0
    median_us: Num | None = None
    p10_us: Num | None = None
    p1_us: Num | None = None
    exposed_share: Num | None = None
    exposed_us: Num = 0.0
    exposed_us_mean: Num | None = None
    exposed_us_by_breaker: list[BreakerTotal] = []


class ReplaysMissing(_Doc):
    """Graph launches inside the iterations with no replayed kernel recorded (captures left out)."""
    count: int = 0
    graph_launches: int = 0
    iterations: list[int] = []  # the first few


class StartRecordsMissing(_Doc):
    """Eager launch calls with no device record: those of the first iteration, and those later."""
    count: int = 0
    launches_first_iteration: int = 0
    missing_later: int = 0


class DeferredWork(_Doc):
    """Owned GPU ops that start after the next iteration's GPU window ended."""
    count: int = 0
    us: Num = 0.0
    iterations: list[int] = []


class StreamOverlap(_Doc):
    """Launches overlapping an earlier one on their stream (`ex_launch`: those that may use programmatic dependent launch, apart)."""
    count: int = 0
    worst_us: Num = 0.0
    ex_launch: int = 0
    streams: list[int] = []


class UnderRecordedWorst(_Doc):
    ops: int = 0
    pattern_ops: int = 0
    iteration: int | None = None
    site: str | None = None


class UnderRecorded(_Doc):
    """Graph replays with fewer ops than the other replays of their graph."""
    count: int = 0
    replays: int = 0
    ops_missing: int = 0
    iterations: list[int] = []
    worst: UnderRecordedWorst | None = None


class ImpossibleWorst(_Doc):
    name: str = ""
    dur_us: Num = 0.0
    iteration: int | None = None
    rules: list[str] = []


class ImpossibleDurations(_Doc):
    """GPU ops whose duration the device cannot have, by rule (window, name, overflow)."""
    count: int = 0
    us: Num = 0.0
    longer_than_window: int = 0
    beyond_name: int = 0
    overflow: int = 0
    iterations: list[int] = []
    worst: ImpossibleWorst | None = None


class CaptureOnly(_Doc):
    flagged: bool = False
    capture_iterations: int = 0
    iterations: int = 0


class CutMarkers(_Doc):
    count: int = 0
    dropped: int = 0
    kept_as_iteration: int = 0


class CaptureFacts(_Doc):
    """A rank's `capture` (analysis/health.py rank_facts): the facts capture health is judged on. The first four
    checks only on a GPU timeline with device records and ops; the next three only where they found something."""
    device_timeline: str | None = None
    device_records: str | None = None
    graph_replays_missing: ReplaysMissing | UnsetType = UNSET
    start_records_missing: StartRecordsMissing | UnsetType = UNSET
    deferred_work: DeferredWork | UnsetType = UNSET
    stream_overlap: StreamOverlap | UnsetType = UNSET
    graph_replays_under_recorded: UnderRecorded | UnsetType = UNSET
    impossible_durations: ImpossibleDurations | UnsetType = UNSET
    capture_only: CaptureOnly | UnsetType = UNSET
    cut_markers: CutMarkers = msgspec.field(default_factory=CutMarkers)
    first_iteration_start_ns: int | None = None


class RankSpec(_Doc):
    """A rank's `speculative` (analysis/spec.py rank_spec): its verify iterations' mean owned GPU time by phase and mean wall time."""
    verify_iterations: int = 0
    owned_phase_us: dict[str, Num] = {}
    owned_gpu_us: Num = 0.0
    wall_us: Num = 0.0


class Refused(_Doc):
    why: str = ""
    replays: int = 0


class GraphCaptureStats(_Doc):
    """A rank's `graph_capture` (analysis/graphs.py, with capture profiles): the replays mapped to a captured graph,
    those refused and why, and the GPU time of each."""
    files: list[str] = []
    graphs: int = 0
    replays: int = 0
    replays_mapped: int = 0
    replays_refused: int = 0
    ops: int = 0
    ops_mapped: int = 0
    replayed_us: Num = 0.0
    mapped_us: Num = 0.0
    unmapped_us: Num = 0.0
    unmapped_other_us: Num = 0.0
    refused: list[Refused] = []
    replays_shape_ambiguous: int | UnsetType = UNSET  # only when some were


class RankSource(_Doc):
    """A rank's `source`, where it was not read from a Kineto trace of its own: a file of several ranks (ingest/processes.py:
    its form, and the process the rank was taken from), or an nsys export (its format, version, device and pid: not read)."""
    merged: str | None = None  # the merged file's form (SGLang's merger, TraceLens' TraceFuse)
    process: str | int | None = None


class Rank(_Doc):
    rank: int | None = None
    device: Any = None
    path: str | None = None
    marker: Any = UNSET  # UNSET: the rank does not say; the summary's marker holds
    catalog: str | None = None
    device_timeline: str | None = "gpu"
    device_records: Any = None
    graph_capture: GraphCaptureStats | None = None
    source: RankSource | None = None
    t0_us: float | None = None
    iterations: list[Iteration] = []
    median: Iteration = msgspec.field(default_factory=Iteration)  # the median over iterations of every figure (none: no iterations)
    syncs: list[Sync] = []
    syncs_total: int | None = None
    sync_groups: list[SyncGroup] = []  # v1: counted from `syncs` on decoding
    bubbles: list[Bubble] = []
    bubbles_total: int | None = None
    bubbles_by_cause: dict[str, CauseTotal] = {}  # v1: counted from `bubbles` on decoding
    bubble_cpu_ops: list[BubbleCpuOp] | None = None  # None: a v1 rank (no times)
    kernels: list[Kernel] = []
    outside_iterations: Outside | None = None
    warnings: list[str] = []
    stub_markers: Any = None
    overlap_slack: OverlapSlack | None = None
    capture: CaptureFacts | None = None
    speculative: RankSpec | None = None
    timeline: Any = None
    floor: FloorSection | None = None  # issue 41: the peaks the floor used and the modeled ops, or `note`: why there is none


class Straggler(_Doc):
    rank: int | None = None
    times_straggler: int = 0
    mean_wait_caused_us: Num = 0.0
    mean_comm_wait_us: Num = 0.0


class CrossIteration(_Doc):
    """One aligned iteration across the ranks (per-rank figures keyed by the rank as a string)."""
    index: int = 0
    kind: str | None = None
    batch_size: int | None = None
    slowest_rank: int | None = None
    straggler_rank: int | None = None
    spread_us: Num = 0.0
    gpu_window_us: dict[str, Num] = {}
    wall_us: dict[str, Num] = {}
    collectives: dict[str, int] = {}
    comm_us: dict[str, Num] = {}
    comm_wait_us: dict[str, Num] = {}
    gpu_start_skew_us: Num | None = None


class CrossRank(_Doc):
    """summary.json's `cross_rank` (analysis/ranks.py), with two ranks or more: stragglers and clock offsets."""
    ranks: list[int | None] = []
    aligned_iterations: int = 0
    clock_offsets_us: dict[str, Num] = {}
    iterations: list[CrossIteration] = []
    stragglers: list[Straggler] = []
    warnings: list[str] = []


class Finding(_Doc):
    """One capture-health finding (analysis/health.py): the check, its status, the figures it doubts, in words."""
    check: str = ""
    status: str = "degraded"  # degraded, unusable
    metrics: list[str] = []
    detail: str = ""


class Health(_Doc):
    """summary.json's `health` (analysis/health.py assess): the verdict over every rank's capture facts."""
    verdict: str | None = None  # ok, degraded, unusable, unchecked
    metrics: list[str] = []
    findings: list[Finding] = []
    cut_markers_dropped: int | None = None

    def doubts(self, metric: str) -> bool:
        """Whether `metric` (a summary field, or `category_us.<cat>`) is in doubt under this verdict."""
        if self.verdict not in ("degraded", "unusable"):
            return False
        return metric in self.metrics or metric.split(".")[0] in self.metrics


class SpecCost(_Doc):
    """summary.json's `speculative` (analysis/spec.py spec_cost): one window's cost per accepted token on rank 0."""
    verify_iterations: int = 0
    owned_phase_us: dict[str, Num] = {}
    wall_us: Num | None = None
    accept_length: Num | None = None
    accept_source: str | None = None  # window; else where the accepted length came from (the unprofiled passes)
    window: int | None = None
    # these three: only with an accepted length (absent, UNSET, without one)
    phase_us_per_accepted_token: dict[str, Num] | None | UnsetType = UNSET
    gpu_us_per_accepted_token: Num | None | UnsetType = UNSET
    wall_us_per_accepted_token: Num | None | UnsetType = UNSET


class Versions(_Doc):
    """A run manifest's `versions`: what ran (the GPU's name, or "cpu"; the engine's and torch's versions)."""
    gpu: Any = None
    engine: str | None = None  # the server's own version (/server_info's `version`): part of a gate's comparability key


class RunSection(_Doc):
    """summary.json's `run` (flows/trace.py writes it into every summary of a run it records): which run and
    profile window, its switches, and the manifest figures a diff of the summaries alone needs. A plain value in
    the summary (diff.json carries it as written, as a manifest's stand-in): typed where read, by run_of."""
    run_id: str | None = None
    label: str | None = None
    target: str | None = None
    preset: str | None = None
    optimizations: Any = None
    base: str | None = None
    command: Any = None
    throughput: list[ThroughputPoint] | None = None  # the manifest's, as Manifest
    profiler_overhead: Overhead | None = None  # the manifest's; analysis/health.py, spec.py read it (with each window's accept)
    versions: Versions | None = None
    workload: Any = None
    window: int | None = None  # which profile window this summary is
    capture_order: str | None = None
    recorded_with: Any = None
    host_load: Any = None


class ServerInfo(_Doc):
    """What a manifest's `server_info` (the server's /server_info, as it answered) says of the model and the device: what
    a gate's comparability key reads."""
    model_path: str | None = None
    model: str | dict[str, Any] | None = None  # a name, or the proxy's model configuration (compared whole)
    device_name: str | None = None


class HostLoadSection(_Doc):
    """A manifest's `host_load` (capture/hostload.py): the CPUs other processes kept busy while the run recorded (median
    and maximum over its measured steps) and the machine's CPUs."""
    cpus: int | None = None
    other_cpus_median: Num | None = None
    other_cpus_max: Num | None = None


class ProfileRequest(_Doc):
    """A manifest's `profile` (capture/manifest.py ManifestDoc): what the profile request asked of the engine."""
    num_steps: int | None = None
    windows: int | None = None  # profile windows recorded (None: one, or a run from before windows were said)


class Overhead(_Doc):
    """A manifest's `profiler_overhead` (capture/run.py): how much slower the profiled window ran than the unprofiled
    passes (tokens/s per user): the first window's at the top, and every window's under `windows` when several."""
    tokens_per_s_per_user_unprofiled: Num | None = None
    tokens_per_s_per_user_profiled: Num | None = None
    slowdown: Num | None = None
    window_s: Num | None = None
    requests_in_window: int | None = None
    note: str | None = None  # --nsys: not measured
    windows: list[Overhead] | None = None  # None: one window (or a run from before windows were listed)

    def slowdowns(self) -> list[float]:
        """Each profile window's slowdown (this one's where it lists no windows); those that say none left out."""
        return [float(w.slowdown) for w in self.windows or [self] if w.slowdown is not None and w.slowdown > 0]


class Manifest(_Doc):
    """A run's manifest.json (capture/manifest.py writes it), typed where read, by manifest_of: the fields the
    readers of a summary and the gate use. The whole document stays a plain value in the summary (`manifest`), since
    reports list every key of it and diff.json carries it as written (a summary's `run` section stands in for it there,
    and reads as one). Lenient (Any) where hand-written manifests vary; every field has a default, so a manifest
    written before a field existed decodes (None: the run does not say)."""
    schema_version: Any = None
    run_id: str | None = None
    label: Any = None
    status: Any = None
    target: str | None = None
    preset: str | None = None
    model: Any = None
    model_path: str | None = None
    optimizations: Any = None
    base: Any = None
    versions: Versions | None = None
    throughput: list[ThroughputPoint] | None = None  # the unprofiled workload points
    profiler_overhead: Overhead | None = None
    profile: ProfileRequest | None = None
    capture_order: str | None = None  # alternating (A B A B) or sequential
    recorded_with: list[str] | None = None  # the runs whose steps alternated with this one's (None: recorded before it was said)
    host_load: HostLoadSection | None = None
    server_info: ServerInfo | None = None
    workload: dict[str, Any] | None = None  # what drove the server (compared whole, by the gate's key, but `repeat`)


def typed_or_none(raw: Any, cls: type[_D]) -> _D | None:
    """`raw` as the struct `cls` (itself when it is one), or None when it is not one (not an object, or of another shape)."""
    if isinstance(raw, cls):
        return raw
    try:
        return msgspec.convert(raw, cls) if isinstance(raw, Mapping) else None
    except msgspec.ValidationError:
        return None


def run_of(raw: Any) -> RunSection | None:
    """A summary's `run` section typed; None without one (or one of another shape)."""
    return typed_or_none(raw, RunSection)


def manifest_of(raw: Any) -> Manifest | None:
    """A run manifest typed; None without one (or one of another shape)."""
    return typed_or_none(raw, Manifest)


class InputFile(_Doc):
    """One of a summary's `inputs` (analysis/summary.py): a trace file it was analyzed from. diff.json's sides carry them
    as written (a key the summary lacks stays absent: UNSET)."""
    path: str | UnsetType = UNSET
    sha256: str | None | UnsetType = UNSET
    rank: int | None | UnsetType = UNSET


class Summary(_Doc):
    schema_version: int = 1
    profkit_version: str | None = None
    inputs: list[InputFile] = []
    marker: Any = None
    ranks: list[Rank] = []
    health: Health | None = None
    cross_rank: CrossRank | None = None  # several ranks: stragglers and clock offsets (analysis/ranks.py)
    speculative: SpecCost | None = None
    manifest: Any = None  # the run folder's manifest.json, given on loading (profkit/flows/inputs.py); typed by manifest_of
    run: Any = None  # what `profkit trace` writes into every summary; typed by run_of


def run_labels(summaries: Iterable[Summary]) -> dict[str, str]:
    """run id -> its configuration's name (``+topk_v2``), from the `run` section `profkit trace` and
    `sweep` write into each summary; runs without one are left out."""
    out: dict[str, str] = {}
    for sm in summaries:
        run = run_of(sm.run)
        if run is not None and run.label:
            out[str(run.run_id)] = str(run.label)
    return out


# ---------------------------------------------------------------------------------------------
# diff.json (attribution/diff.py writes it: compare_summaries)

T = TypeVar("T")


class Pair(_Doc, Generic[T]):
    """A figure of each side."""
    baseline: T | None = None
    candidate: T | None = None


class Change(_Doc):
    """{baseline, candidate, delta, ratio}: a side-by-side figure and its change (µs per iteration)."""
    baseline: Num | None = None
    candidate: Num | None = None
    delta: Num | None = None
    ratio: float | None = None


class IterationsUsed(_Doc):
    """A side's iterations: how many its rank has, and the indices of the compared ones."""
    total: int = 0
    used: list[int] = []


class SideInfo(_Doc):
    label: str = "?"
    inputs: list[InputFile] = []
    rank: int | None = None
    device: Any = None
    device_timeline: str | None = None
    catalog: str | None = None
    marker: Any = None
    iterations: IterationsUsed = msgspec.field(default_factory=IterationsUsed)
    shapes: dict[str, int] = {}
    repeats: int = 0


class Shape(_Doc):
    kind: str | None = None
    batch_size: int | None = None
    label: str = ""
    baseline_label: str | UnsetType = UNSET  # the baseline's shape where the step itself changed (speculative decoding)
    iterations: dict[str, int] = {}


class DecompositionSide(_Doc):
    gpu_window_us: Num | None = None
    gpu_busy_us: Num | None = None
    category_us: dict[str, Num | None] = {}
    phase_us: dict[str, Num | None] = {}
    overlap_us: Num | None = None
    idle_us: Num | None = None
    idle_us_by_cause: dict[str, Num | None] = {}
    backlog_us: Num | None = None


class Spreads(_Doc):
    """The noise each decomposition term is judged against (None: not judged), keyed like the terms."""
    gpu_window_us: Num | None = None
    category_us: dict[str, Num | None] = {}
    overlap_us: Num | None = None
    idle_us: Num | None = None
    idle_us_by_cause: dict[str, Num | None] = {}
    backlog_us: Num | None | UnsetType = UNSET  # UNSET: a diff.json written before the backlog term
    phase_us: dict[str, Num | None] = {}


class WindowChange(_Doc):
    """One pair of profile windows (window i of each side): each term's exact change and the identity's residual."""
    window: int = 0
    gpu_window_us: Num | None = None
    category_us: dict[str, Num | None] = {}
    overlap_us: Num | None = None
    idle_us_by_cause: dict[str, Num | None] = {}
    backlog_us: Num | None | UnsetType = UNSET  # UNSET: a diff.json written before the backlog term
    phase_us: dict[str, Num | None] = {}
    residual_us: Num | None = None
    exact: bool = True


class Decomposition(_Doc):
    unstable: str | None = None
    statistic: str | None = None
    basis: str | None = None  # "ownership", "clock"; None in a diff.json written before the basis existed
    windows: int | None = None
    judged: bool | None = None
    identity: str | None = None
    gpu_window_us: Change = msgspec.field(default_factory=Change)
    category_us: dict[str, Num] = {}
    overlap_us: Num = 0.0
    idle_us: Num | None = None
    idle_us_by_cause: dict[str, Num] = {}
    backlog_us: Num | None | UnsetType = UNSET  # UNSET: a diff.json written before the backlog term
    phase_us: dict[str, Num] = {}
    spread_us: Spreads = msgspec.field(default_factory=Spreads)
    residual_us: Num | None = None
    exact: bool | None = None
    per_window: list[WindowChange] = []
    baseline: DecompositionSide = msgspec.field(default_factory=DecompositionSide)
    candidate: DecompositionSide = msgspec.field(default_factory=DecompositionSide)


class SideBySide(_Doc):
    baseline: Num | None = None
    candidate: Num | None = None
    delta: Num | None = None


class SyncChange(_Doc):
    kind: str = ""
    api: str = ""
    direction: str = ""
    trigger: str = ""
    baseline_per_iteration: Num = 0.0
    candidate_per_iteration: Num = 0.0
    delta: Num = 0.0


class KernelEntry(_Doc):
    name: str = ""
    category: str | None = None
    count_per_iteration: Num = 0.0
    us_per_iteration: Num = 0.0
    examples: list[str] = []
    shape: str | UnsetType = UNSET  # the launching op's shape, where both sides have them (diff.py); UNSET: not by shape


class Mover(_Doc):
    name: str = ""
    category: str | None = None
    baseline_us: Num = 0.0
    candidate_us: Num = 0.0
    delta_us: Num = 0.0
    baseline_count: Num = 0.0
    candidate_count: Num = 0.0
    status: str = ""
    examples: list[str] = []
    shape: str | UnsetType = UNSET  # the kernels' launching op and its shapes, where both sides have them (diff.py); UNSET: not by shape


class NoiseTerm(_Doc):
    """A term of the expected-effect check and its change against the noise (one that moved elsewhere: `beyond_noise`)."""
    term: str = ""
    delta_us: Num = 0.0
    spread_us: Num | None = None
    within_noise: bool | None = None


class OwnTerm(NoiseTerm):
    """A term of the optimization's own (`own`): its change, each side's figure and the verdict."""
    baseline_us: Num | None = None
    candidate_us: Num | None = None
    expected: str | None = None
    as_expected: bool | None = None


class CategoryChange(_Doc):
    """A category's change in the expected-effect check: inside the optimization's categories or not, beyond the
    threshold, flagged."""
    category: str = ""
    baseline_us: Num | None = None
    candidate_us: Num | None = None
    delta_us: Num | None = None
    pct: float | None = None
    inside: bool = False
    exceeds_threshold: bool = False
    flagged: bool = False
    within_noise: bool | None = None
    expected_growth: bool | UnsetType = UNSET  # (optional key) growth the catalog expects of the optimization's design


class NotJudged(_Doc):
    """Flags withheld: why (the windows disagree on the profiler's slowdown), and the changes that would be flags."""
    reason: str = ""
    changes: list[str] = []


class ExpectedEffect(_Doc):
    optimization: str = ""
    known: bool = False
    catalog: str | None = None
    categories: list[str] = []
    phases: list[str] = []
    idle: list[str] = []
    judged: bool = False
    threshold: str = ""
    backlog_drift_us: Num | None = None
    own: list[OwnTerm] = []
    against: list[str] = []
    beyond_noise: list[NoiseTerm] = []
    floor_us: Num | None = None
    changes: list[CategoryChange] = []
    flags: list[str] = []
    not_judged: NotJudged | None = None  # flags withheld (the windows disagree on the profiler's slowdown)
    grows: list[str] = []  # the categories whose per-step work it grows by design ("*": every one)
    grows_why: str | None = None
    ok: bool | None = None
    note: str = ""  # an optimization the catalog does not know

    def doc(self) -> dict[str, Any]:
        """As diff.json writes it: a known optimization's check without `note` (and `not_judged`, `grows`, `grows_why`
        only where set), an unknown one's in UNKNOWN_EFFECT_KEYS."""
        d = msgspec.to_builtins(self)
        if not self.known:
            return {k: d[k] for k in UNKNOWN_EFFECT_KEYS}
        drop = {"note", *(() if self.not_judged is not None else ("not_judged",)), *(() if self.grows else ("grows", "grows_why"))}
        return {k: v for k, v in d.items() if k not in drop}


# an optimization the catalog does not know: what its expected-effect check says, in diff.json's order
UNKNOWN_EFFECT_KEYS = ("optimization", "known", "catalog", "categories", "changes", "flags", "against", "ok", "judged", "note")


class NoiseSide(_Doc):
    median: Num | None = None
    spread: Num | None = None
    n: int = 0


class NoiseMetric(_Doc):
    baseline: NoiseSide = msgspec.field(default_factory=NoiseSide)
    candidate: NoiseSide = msgspec.field(default_factory=NoiseSide)
    delta: Num | None = None
    spread: Num | None = None
    per_window: list[Num] = []
    within_noise: bool = False


class Noise(_Doc):
    """The noise estimate: with one (`available`), its `statistic` and per-metric figures; without, only why not (`note`;
    `unstable` where the windows disagree)."""
    available: bool = False
    unstable: bool | UnsetType = UNSET
    repeats: dict[str, int] = {}
    statistic: str | UnsetType = UNSET
    note: str = "no noise estimate"
    metrics: dict[str, NoiseMetric] | UnsetType = UNSET

    def metric(self, key: str) -> NoiseMetric | None:
        """A metric's noise figures (None: none, or no estimate)."""
        return self.metrics.get(key) if isinstance(self.metrics, dict) else None

    def windows(self) -> int:
        """The most profile windows of a side."""
        return max(self.repeats.get("baseline") or 0, self.repeats.get("candidate") or 0)


class CpuOpTime(_Doc):
    name: str = ""
    us: Num | None = None


class LargeBubble(_Doc):
    iteration: int | None = None
    start_us: Num | None = None
    dur_us: Num | None = None
    cause: str | None = None
    cpu_ops: list[CpuOpTime] = []


class IdleCpuOp(_Doc):
    name: str = ""
    idle_us: Num | None = None


class BubbleView(_Doc):
    largest: list[LargeBubble] = []
    idle_cpu_ops: list[IdleCpuOp] = []


class SeriesPoint(_Doc):
    """One iteration as the per-iteration figures draw it (diff.json's `series`)."""
    index: int = 0
    shape: str = ""
    used: bool = True
    wall_us: Num | None = None
    gpu_window_us: Num | None = None
    gpu_kernels: Num | None = None
    kernel_launches: Num | None = None
    graph_launches: Num | None = None
    syncs: Num | None = None
    sync_copies: Num | None = None
    bubble_count: Num | None = None


class GapChange(_Doc):
    """A figure of the gap to the floor on each side, its change and spread (attribution/floor_gap.py)."""
    baseline: Num = 0.0
    candidate: Num = 0.0
    delta: Num = 0.0
    spread: Num = 0.0


class FloorSide(_Doc):
    """One side's gap to the floor and its split (means over the compared iterations, the median over windows)."""
    gpu_window_us: Num = 0.0
    floor_us: Num = 0.0
    gap_us: Num = 0.0
    idle_us: Num = 0.0
    above_floor_us: Num = 0.0
    floor_mix_us: Num = 0.0
    unmodeled_us: Num = 0.0
    overlap_us: Num = 0.0


class ClosedGap(_Doc):
    """What the optimization closed of the baseline's gap (None where it has no category of its own in the catalog)."""
    name: str = ""
    categories: list[str] = []
    closed_us: Num | None = None
    own_time_change_us: Num | None = None
    baseline_gap_us: Num = 0.0
    spread_us: Num | None = None


class FloorGap(_Doc):
    """diff.json's `floor` (attribution/floor_gap.py gap_change): each side's gap to the floor, its split and change,
    and what the optimization closed; or only `note`, why a side has no floor. Read by report/floor_view.py."""
    note: str | None = None
    statistic: str | None = None
    baseline: FloorSide | None = None
    candidate: FloorSide | None = None
    gap_us: GapChange | None = None
    terms: dict[str, GapChange] = {}
    category_gap_us: dict[str, GapChange] = {}
    optimization: ClosedGap | None = None


class SlackSide(_Doc):
    """A side of diff.json's `overlap_slack` (attribution/capture_terms.py slack_side): each figure's median over the
    profile windows with its spread, and the first window's transitions (`series`, the slack-per-step strip)."""
    exposed_us_mean: Measure | None = None
    exposed_share: Measure | None = None
    median_us: Measure | None = None
    p10_us: Measure | None = None
    transitions: int = 0
    series: list[Transition] = []


class SlackChange(_Doc):
    delta: Num = 0.0
    noise: str = ""  # beyond noise, within noise, not judged


class SlackDiff(_Doc):
    """diff.json's `overlap_slack`: each side's, and each figure's change where both sides have it. Read by report/capture_view.py."""
    baseline: SlackSide | None = None
    candidate: SlackSide | None = None
    delta: dict[str, SlackChange] = {}


class SpecSide(_Doc):
    """A side of diff.json's `speculative` (analysis/spec.py side_cost): the median over windows of each per-token figure."""
    accept_source: list[str] = []
    accept_length: Measure | None = None
    phase_us_per_accepted_token: dict[str, Measure] = {}
    gpu_us_per_accepted_token: Measure | None = None
    wall_us_per_accepted_token: Measure | None = None


class SpecDelta(_Doc):
    phase_us_per_accepted_token: dict[str, Num | None] = {}
    gpu_us_per_accepted_token: Num | None = None
    wall_us_per_accepted_token: Num | None = None
    accept_length: Num | None = None


class SpecDiff(_Doc):
    """diff.json's `speculative` (analysis/spec.py compare): each side's cost per accepted token and the change. Read by
    report/capture_view.py."""
    baseline: SpecSide | None = None
    candidate: SpecSide | None = None
    delta: SpecDelta | None = None


class Diff(_Doc):
    """diff.json, schema 1 (attribution/diff.py compare_summaries writes it, in this order)."""
    schema_version: int = 1
    profkit_version: str | None = None
    baseline: SideInfo = msgspec.field(default_factory=SideInfo)
    candidate: SideInfo = msgspec.field(default_factory=SideInfo)
    rank: int | None = None
    shape: Shape = msgspec.field(default_factory=Shape)
    optimization: str | None = None
    wall_us: Change = msgspec.field(default_factory=Change)
    gpu_window_us: Change = msgspec.field(default_factory=Change)
    decomposition: Decomposition = msgspec.field(default_factory=Decomposition)
    counts: dict[str, SideBySide] = {}
    timings: dict[str, SideBySide] = {}
    syncs: list[SyncChange] = []
    kernels_added: list[KernelEntry] = []
    kernels_removed: list[KernelEntry] = []
    kernels_added_total: int | None = None
    kernels_removed_total: int | None = None
    top_movers: list[Mover] = []
    expected_effect: ExpectedEffect | None = None
    noise: Noise = msgspec.field(default_factory=Noise)
    stability: Pair[str] = msgspec.field(default_factory=Pair)
    warnings: list[str] = []
    timelines: Pair[Any] = msgspec.field(default_factory=Pair)
    bubbles: Pair[BubbleView] = msgspec.field(default_factory=Pair)
    series: Pair[list[SeriesPoint]] = msgspec.field(default_factory=Pair)
    manifests: Pair[Any] = msgspec.field(default_factory=Pair)
    throughput: Pair[Any] = msgspec.field(default_factory=Pair)  # each side's first point as the manifest has it: point_of
    health: Pair[Any] = msgspec.field(default_factory=Pair)
    overlap_slack: Any = UNSET  # issue 31 (optional keys): attribution/capture_terms.py
    speculative: Any = UNSET
    floor: Any = UNSET  # issue 41 (an optional key): the gap to the floor on each side, its change (attribution/floor_gap.py)

    def kernel_list(self, which: str) -> tuple[list[KernelEntry], int]:
        """``added`` or ``removed`` kernels: the listed ones and how many there were."""
        ks = self.kernels_added if which == "added" else self.kernels_removed
        total = self.kernels_added_total if which == "added" else self.kernels_removed_total
        return ks, len(ks) if total is None else total


# ---------------------------------------------------------------------------------------------
# unprofiled throughput (a run manifest's `throughput` points; diff.json's `throughput`: each side's first)


class Measure(_Doc):
    """A figure over repeats: median and spread (max - min), and how many repeats (None: the figure does not say)."""
    median: Num | None = None
    spread: Num | None = None
    n: int | None = None


Figure = Measure | Num | str | None  # a figure over repeats, or a single value


class ThroughputPoint(_Doc):
    """One workload point: input length, concurrency, and its figures."""
    isl: Any = None
    concurrency: Any = None
    tokens_per_s_per_user_p50: Figure = None
    tokens_per_s_per_gpu: Figure = None
    tokens_per_s: Figure = None
    ttft_ms_p50: Figure = None
    itl_ms_p50: Figure = None
    accept_length: Figure = None
    cache_hit_rate: Figure = None

    def median(self, key: str) -> Num | None:
        """The figure's median over repeats (None for a single value or none)."""
        v = getattr(self, key)
        return v.median if isinstance(v, Measure) else None

    def value(self, key: str) -> tuple[float | None, float | None]:
        """(median, spread) of a figure over repeats, (value, None) of a single value, else (None, None)."""
        v = getattr(self, key)
        if isinstance(v, Measure):
            return v.median, v.spread
        return (float(v), None) if isinstance(v, (int, float)) else (None, None)


def point_of(raw: Any) -> ThroughputPoint | None:
    """A throughput point, or None when it is not one (not an object, or figures of another shape)."""
    return typed_or_none(raw, ThroughputPoint)


def throughput_of(manifest: Any) -> list[ThroughputPoint]:
    """A run manifest's unprofiled workload points, typed ([] without any)."""
    m = manifest_of(manifest)
    return (m.throughput or []) if m is not None else []


# ---------------------------------------------------------------------------------------------


def diff_doc(diff: Diff) -> dict[str, Any]:
    """diff.json's document of a Diff, as profkit writes it (store.json_text): encoded once, where it is written."""
    d: dict[str, Any] = msgspec.to_builtins(diff)
    if diff.expected_effect is not None:
        d["expected_effect"] = diff.expected_effect.doc()
    return d


def diff_of(doc: Diff | Mapping[str, Any] | bytes) -> Diff:
    """A diff.json (a dict, or a file's bytes) as a Diff; a Diff as is."""
    if isinstance(doc, Diff):
        return doc
    if isinstance(doc, (bytes, bytearray)):
        return msgspec.json.decode(doc, type=Diff)
    return msgspec.convert(doc, Diff)


def _upgrade_rank(r: dict[str, Any]) -> dict[str, Any]:
    """A v1 rank's aggregates, counted from its lists (which v1 did not bound: they hold every bubble and sync)."""
    if r.get("bubbles_by_cause") is None:
        by: dict[str, dict[str, Any]] = {}
        for b in r.get("bubbles") or []:
            g = by.setdefault(b["cause"], {"count": 0, "us": 0.0})
            g["count"] += 1
            g["us"] += b.get("dur_us") or 0.0
        r = {**r, "bubbles_by_cause": by}
    if r.get("sync_groups") is None:
        acc: dict[tuple, dict[str, Any]] = {}
        for s in r.get("syncs") or []:
            k = (s.get("kind"), s.get("api"), s.get("direction"), s.get("trigger"))
            g = acc.setdefault(k, {"kind": k[0], "api": k[1], "direction": k[2], "trigger": k[3], "count": 0, "blocked_us": 0.0,
                                   "by_iteration": {}})
            g["count"] += 1
            g["blocked_us"] += s.get("blocked_us") or 0.0
            if s.get("iteration") is not None:
                g["by_iteration"][str(s["iteration"])] = g["by_iteration"].get(str(s["iteration"]), 0) + 1
        r = {**r, "sync_groups": sorted(acc.values(), key=lambda g: -g["blocked_us"])}
    return r


def summary_of(doc: Summary | Mapping[str, Any] | bytes) -> Summary:
    """A summary.json of any schema version (a dict, or a file's bytes) as a Summary; a Summary as is."""
    if isinstance(doc, Summary):
        return doc
    raw = msgspec.json.decode(doc) if isinstance(doc, (bytes, bytearray)) else doc
    if any(isinstance(r, Mapping) and (r.get("bubbles_by_cause") is None or r.get("sync_groups") is None) for r in raw.get("ranks") or []):
        raw = {**raw, "ranks": [_upgrade_rank(dict(r)) for r in raw.get("ranks") or []]}
    return msgspec.convert(raw, Summary)


class _RankFile(Rank, kw_only=True):
    """A rank entry as summary_from_json reads it: its `iterations` required (check_summary's rule), a v1 rank's
    missing aggregates counted from its lists as _upgrade_rank counts them."""
    iterations: list[Iteration]
    bubbles_by_cause: dict[str, CauseTotal] | None | UnsetType = UNSET  # type: ignore[assignment]
    sync_groups: list[SyncGroup] | None | UnsetType = UNSET  # type: ignore[assignment]

    def __post_init__(self) -> None:
        if self.bubbles_by_cause is None or self.bubbles_by_cause is UNSET:
            by: dict[str, CauseTotal] = {}
            for b in self.bubbles:
                g = by.setdefault(b.cause, CauseTotal(count=0, us=0.0))  # type: ignore[arg-type]
                g.count += 1
                g.us = (g.us or 0.0) + (b.dur_us or 0.0)
            self.bubbles_by_cause = by
        if self.sync_groups is None or self.sync_groups is UNSET:
            acc: dict[tuple[Any, ...], SyncGroup] = {}
            for s in self.syncs:
                k = (s.kind, s.api, s.direction, s.trigger)
                sg = acc.setdefault(k, SyncGroup(kind=k[0], api=k[1], direction=k[2], trigger=k[3], count=0, blocked_us=0.0, by_iteration={}))
                sg.count += 1
                sg.blocked_us += s.blocked_us or 0.0
                if s.iteration is not None:
                    sg.by_iteration[str(s.iteration)] = sg.by_iteration.get(str(s.iteration), 0) + 1
            self.sync_groups = sorted(acc.values(), key=lambda g: -g.blocked_us)


class _SummaryFile(Summary, kw_only=True):
    """summary.json's text as summary_from_json reads it: `schema_version` and `ranks` required (is_summary's rule)."""
    schema_version: int
    ranks: list[_RankFile]  # type: ignore[assignment]


def summary_from_json(text: bytes) -> Summary:
    """A summary.json file's text as a Summary in one decode (v1 ranks upgraded as summary_of upgrades them). Raises
    msgspec.DecodeError or ValidationError where the text is not one: not JSON msgspec reads (NaN), no
    `schema_version` or `ranks`, a rank without `iterations`, a field of another type; the caller then reads the
    file the slow way, for its message."""
    return msgspec.json.decode(text, type=_SummaryFile)


class _DiffFile(Diff, kw_only=True):
    """diff.json's text as diff_from_json reads it: the keys is_diff_doc looks for required."""
    schema_version: int
    baseline: SideInfo
    candidate: SideInfo
    decomposition: Decomposition


def diff_from_json(text: bytes) -> Diff:
    """A diff.json file's text as a Diff in one decode; msgspec.DecodeError or ValidationError where it is not one
    (the caller then reads it the slow way, for its message)."""
    return msgspec.json.decode(text, type=_DiffFile)


def rank_of(rank: Rank | Mapping[str, Any]) -> Rank:
    """One rank entry of a summary.json (any schema version) as a Rank; a Rank as is."""
    if isinstance(rank, Rank):
        return rank
    raw = rank if rank.get("bubbles_by_cause") is not None and rank.get("sync_groups") is not None else _upgrade_rank(dict(rank))
    return msgspec.convert(raw, Rank)


# ---------------------------------------------------------------------------------------------
# gate.json and calibration.json (attribution/gate.py builds them as the structs below; encoded once where written:
# gate_doc, calibration_doc)


class RunKey(TypedDict, total=False):
    """A run's comparability key (attribution/gate.run_key, in KEY_FIELDS' order; objects as canonical JSON text): None
    where the run does not say. A key is written as built and read back as written (gate.json, calibration.json, a
    stored baseline's baseline.json); a field absent from one read back is unknown, as None is."""
    target: str | None
    engine_version: str | None
    model: str | None
    preset: str | None
    workload: str | None
    gpu: str | None
    schema: int | None


class RankDevice(_Doc):
    device: str | None = None


class KeyFacts(_Doc):
    """What a run's comparability key reads of a summary.json, typed without converting the rest of it: its schema, its
    `run` section (which stands in for a manifest) and each rank's device."""
    schema_version: int | None = None
    run: RunSection | None = None
    ranks: list[RankDevice] = []


class PolicyMetric(_Doc, forbid_unknown_fields=True):
    """A policy file's `[metric."KEY or GLOB"]` (docs/ci.md; attribution/gate.py policy_from): None where it leaves the
    default (the direction by the metric, the file's or the built-in threshold)."""
    direction: str | None = None  # lower: a rise is worse; higher: a fall is worse
    threshold_pct: float | None = None
    gate: bool = True  # false: listed, never decides


class PolicyDefaults(_Doc):
    threshold_pct: float | None = None


class PolicyFile(_Doc):
    """A gate's policy file (TOML, parsed): `[defaults]` and its metrics, in the file's order."""
    defaults: PolicyDefaults = msgspec.field(default_factory=PolicyDefaults)
    metric: dict[str, PolicyMetric] = {}


class StoredBaseline(_Doc, kw_only=True):
    """A stored baseline's baseline.json (flows/gate.py save_baseline): its name, its run's key, where it was saved from
    and when, its profile windows."""
    name: str
    key: RunKey
    source: str = ""
    saved_at: str = ""
    windows: int | None = None


class KeyDiff(_Doc):
    """A comparability key's field that differs between the sides."""
    field: str = ""
    baseline: str | int | None = None
    candidate: str | int | None = None


class Comparability(_Doc):
    """Which key fields differ (both known and unequal) and which are unknown on a side; each side's key."""
    comparable: bool = True
    differ: list[KeyDiff] = []
    unknown: list[str] = []
    baseline: RunKey = {}
    candidate: RunKey = {}


class HostLoadCheck(_Doc):
    """Whether the sides were recorded beside comparable other work (their manifests' host_load)."""
    baseline_other_cpus: Num | None = None
    candidate_other_cpus: Num | None = None
    cpus: int | None = None
    limit_cpus: Num = 0.5
    comparable: bool = True
    known: bool = False


class GateCalibration(_Doc):
    """gate.json's `calibration`: whether one was used, where from, and what to doubt about it."""
    used: bool = False
    source: str | None = None
    note: str | None = None


class History(_Doc):
    """gate.json's `history` (gate --history): runs seen, the nightly status, the metrics two runs confirmed."""
    runs: int = 1
    status: str = ""
    confirmed: list[str] = []
    note: str | UnsetType = UNSET  # suspect: why
    folder: str | UnsetType = UNSET  # the history folder (set by flows/gate.py)


class GateRow(_Doc):
    """One gated metric: its figures, threshold, noise, MDE and verdict."""
    metric: str = ""
    unit: str = ""
    direction: str = "lower"
    gated: bool = True
    baseline: Num | None = None
    candidate: Num | None = None
    change: Num | None = None
    change_pct: Num | None = None
    threshold_pct: Num = 2.0
    threshold: Num | None = None  # absolute: the larger of threshold_pct of the baseline and the floor
    floor: Num | None = None
    noise: Num | None = None
    noise_pct: Num | None = None
    window_noise: Num | None = None
    aa_spread_pct: Num | None = None
    mde_pct: Num | None = None
    mde: Num | None = None
    mde_from: str | None = None  # pair: the calibration's A/A pair (sides recorded together); sessions: across its sessions
    verdict: str = ""  # regression, improvement, within noise, below threshold, not judged, cannot be judged here, too noisy
    reason: str | None = None


class Gate(_Doc):
    """gate.json, schema 1."""
    schema_version: int = 1
    decision: str = ""  # pass, regression, inconclusive (suspect: --history, one regressing run)
    exit_code: int = 0
    inconclusive_policy: str = "fail"
    reasons: list[str] = []
    headline: str | None = None
    owned_term: str | None = None
    regressions: list[str] = []
    policy: str = ""
    calibration: GateCalibration = msgspec.field(default_factory=GateCalibration)
    comparability: Comparability = msgspec.field(default_factory=Comparability)
    pairing: str = "paired"  # paired: the sides were recorded together, alternating; apart: not (a stored baseline)
    host_load: HostLoadCheck = msgspec.field(default_factory=HostLoadCheck)  # other processes' CPU use while each side recorded
    shape: str | None = None
    sides: Pair[str] = msgspec.field(default_factory=Pair)  # each side's label
    health: Pair[str] = msgspec.field(default_factory=Pair)  # each side's capture health verdict (None: none)
    timeline: str = "gpu"
    rows: list[GateRow] = []
    history: History | None = None
    created_at: str | UnsetType = UNSET  # when the gate ran (flows/gate.py)

    def row(self, metric: str | None) -> GateRow | None:
        """The row of `metric` (None: none)."""
        return next((r for r in self.rows if r.metric == metric), None) if metric else None


class CalibrationMetric(_Doc):
    unit: str = ""
    baseline: Num | None = None
    aa_change_abs: Num | None = None
    aa_spread_abs: Num | None = None
    aa_change_pct: Num | None = None
    aa_spread_pct: Num | None = None
    mde_abs: Num | None = None
    mde_pct: Num | None = None
    note: str | None = None
    # the same across sessions: what a gate of runs recorded apart (a stored baseline) allows for
    stored_aa_change_abs: Num | None = None
    stored_aa_spread_abs: Num | None = None
    stored_aa_change_pct: Num | None = None
    stored_aa_spread_pct: Num | None = None
    stored_mde_abs: Num | None = None
    stored_mde_pct: Num | None = None


class Calibration(_Doc):
    """calibration.json, schema 1: each metric's A/A spread and minimum detectable effect."""
    schema_version: int = 1
    kind: str = "calibration"
    source: str = ""
    judged: bool = True  # false: the trace figures' A/A was not judged (unstable windows, one window): no MDE for them
    note: str | None = None
    sessions: int = 1  # A/A sessions recorded one after another (each an alternating pair)
    key: RunKey = {}
    windows: dict[str, int] = {}  # the first session's profile windows a side (diff.json's noise.repeats)
    mde: str = ""
    sides: Pair[str] = msgspec.field(default_factory=Pair)
    health: Pair[str] = msgspec.field(default_factory=Pair)
    metrics: dict[str, CalibrationMetric] = {}


def gate_doc(gate: Gate) -> dict[str, Any]:
    """gate.json's document of a Gate, as profkit writes it: encoded once, where it is written."""
    d: dict[str, Any] = msgspec.to_builtins(gate)
    return d


def calibration_doc(cal: Calibration) -> dict[str, Any]:
    """calibration.json's document of a Calibration, as profkit writes it."""
    d: dict[str, Any] = msgspec.to_builtins(cal)
    return d


# ---------------------------------------------------------------------------------------------
# sweep.json (flows/sweep.py builds it; flows/report.read_sweep reads it)


class SweepRun(_Doc):
    """One run of a sweep: its label (the configuration: baseline, +topk_v2, all ...), run id, switches,
    its summary.json's path and the manifest's throughput points (as recorded)."""
    label: str = ""
    run_id: str = ""
    states: dict[str, bool] = {}
    summary: str = ""
    throughput: Any = None


class PerUser(_Doc):
    """A compared pair's tokens/s per user (the median of each side's p50), and candidate / baseline."""
    baseline: Num | None = None
    candidate: Num | None = None
    ratio: Num | None = None


class ParetoPoint(_Doc):
    """One measured point of a run: its concurrency and first-prompt length, tokens/s per GPU and per user (medians)."""
    concurrency: Num | None = None
    isl: Num | None = None
    tokens_per_s_per_gpu: Num | None = None
    tokens_per_s_per_user: Num | None = None


class SweepStep(_Doc):
    """One compared pair of a sweep (sweep.json's `attribution` rows, flows/sweep.attribution_row): the
    runs compared (run ids), its diff.json's path, the throughput per user of each side, the diff's window,
    wall and decomposition as diff.json holds them, each count's change, the expected-effect flags."""
    label: str = ""
    optimization: str | None = None
    baseline: str | None = None
    candidate: str | None = None
    diff: str | None = None
    tokens_per_s_per_user: PerUser = msgspec.field(default_factory=PerUser)
    gpu_window_us: Any = None
    wall_us: Any = None
    decomposition: Any = None
    counts: dict[str, Num | None] = {}
    flags: list[str] = []


class SweepDoc(_Doc):
    """sweep.json, schema 1: what `profkit sweep` ran and compared. `status`: running (written after each
    run), captured (--capture-only), ok (every pair attributed; `pareto` then holds, per run label, tokens/s
    per GPU and per user at each measured point)."""
    schema_version: int = 1
    kind: str = "sweep"
    mode: str = ""
    base: str = ""
    target: str = ""
    optimizations: list[str] = []
    runs: list[SweepRun] = []
    attribution: list[SweepStep] = []
    status: str = "running"
    pareto: dict[str, list[ParetoPoint]] | UnsetType = UNSET


def sweep_values(doc: SweepDoc) -> dict[str, Any]:
    """sweep.json's document as JSON values, in its fields' order (what is written; what the sweep's renderers read)."""
    out: dict[str, Any] = msgspec.to_builtins(doc)
    return out
