"""`export-perfetto` end to end: what it is pointed at (flows/inputs.analysis_inputs: a trace file, a run
folder, its profile windows) -> each profile's traces analyzed (analysis/rank.py, under the catalog chosen
once) -> a Perfetto protobuf trace (export/perfetto.py), gzip-compressed when its name ends in .gz,
written where flows/outputs.perfetto_file says. Nothing here prints: notes go to `note` as they come, the
catalog's note to `catalog_note`, each file's line to `wrote` once it is written."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Optional

from profkit.errors import TraceInputError
from profkit.flows.outputs import perfetto_file

Say = Callable[[str], Any]


def _quiet(_: str) -> None:
    pass


def export_perfetto(trace: Path, output: Optional[Path] = None, *, marker: Optional[str] = None, min_bubble_us: float = 2.0,
                    catalog: Optional[str] = None, window: Optional[int] = None, note: Say = _quiet, catalog_note: Say = _quiet,
                    wrote: Say = _quiet) -> list[Path]:
    """The files written, one per profile (see the module doc)."""
    import gzip

    from profkit.analysis import analyze_trace
    from profkit.analysis.catalog import choose_catalog
    from profkit.export.perfetto import build_perfetto
    from profkit.flows.inputs import analysis_inputs
    from profkit.ingest import load_traces
    from profkit.store import write_bytes_atomic

    pointed, notes = analysis_inputs([trace], window)
    for n in notes:
        note(n)
    stored = [x for x in pointed if x.summary is not None]
    if stored:
        raise TraceInputError(f"{stored[0].summary}: a stored summary, no trace events to export",
                              hint="point export-perfetto at the run's traces (traces/<run_id>/, or one of its window-<i>/ folders)")
    choice = choose_catalog(catalog, [trace])
    said = choice.note()
    if said:
        catalog_note(said)
    out: list[Path] = []
    for x in pointed:
        traces = load_traces(x.traces)
        pairs = [(t, analyze_trace(t, marker=marker, min_bubble_us=min_bubble_us, catalog=choice.catalog, digest=False)) for t in traces]
        data = build_perfetto(pairs)
        dest = perfetto_file(trace, x.traces[0], output, len(pointed) > 1)
        size = f"{len(data):,} bytes"
        if dest.name.endswith(".gz"):  # the Perfetto UI opens gzip as it is (a proxy CPU window: 2.1 MB plain, 0.3 MB gzip)
            data = gzip.compress(data, compresslevel=6, mtime=0)
            size = f"{len(data):,} bytes gzip of {size}"
        write_bytes_atomic(dest, data)
        wrote(f"{dest} ({size}, {len(traces)} rank(s)); open it at https://ui.perfetto.dev")
        out.append(dest)
    return out
