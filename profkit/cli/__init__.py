"""profkit's command line: a thin Typer layer over flows/. It parses options, calls each command's
flow (flows/: the only way down to the stages; tests/test_import_graph.py holds it to flows, report,
documents and errors), prints, and maps errors to exit codes in one place (common.py).

- common.py: the app, the consoles, the options several commands share, errors -> exit codes, main()
- analyze.py: `analyze`
- capture.py: `trace`, `sweep`, `opts` (they launch engines; nothing of the analysis stack is
  imported until a run is analyzed)
- report.py: `diff`, `report`, `export-perfetto`
- gate.py: `gate`, `baseline save`, `baseline list` (`calibrate` records runs: capture.py)

Importing this package registers every command on `app`; `main` is the console script.
"""

from __future__ import annotations

import os
import sys

from profkit.flows.ahead import decode_ahead

# polars' allocator (its own jemalloc, configured by this variable when polars loads) with one arena instead of
# four per core: memory a thread freed serves the next thread's allocation instead of new pages. Measured on the
# 2-core VM, `analyze --no-cache` of bench_ingest's 1 GB dense trace, two series of 8 paired runs: peak 988 vs 1042
# and 992 vs 1031 MiB (medians); wall 0.92x and 1.05x (no change beyond the noise). A value the user set is kept.
os.environ.setdefault("_RJEM_MALLOC_CONF", "narenas:1")

# `profkit analyze BIG_TRACE`: its decode begins now, beside the imports below (flows/ahead.py)
decode_ahead(sys.argv)

from profkit.cli import analyze as _analyze  # noqa: E402, F401  (registers analyze)
from profkit.cli import capture as _capture  # noqa: E402, F401  (registers trace, sweep, opts)
from profkit.cli import report as _report  # noqa: E402, F401  (registers diff, report, export-perfetto)
from profkit.cli import gate as _gate  # noqa: E402, F401  (registers gate, baseline save|list)
from profkit.cli.common import app, err, main, out  # noqa: E402

__all__ = ["app", "err", "main", "out"]
