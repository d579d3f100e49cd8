"""`profkit analyze TRACE` on one large trace file: its decode begun before the CLI imports its commands.

Typer, rich and the flows take about 0.3 s to import, on one core, before `analyze` reaches the point
where it starts decoding a large trace in threads (analysis/summarize.py's early decode). Read from the
command line as it stands, before any of that is imported, the plain case begins the same decode at
once (ingest/early.ahead): the `analyze` command, exactly one file argument of at least
PARALLEL_MIN_BYTES of JSON, no folder among the arguments, no --jobs, --list-markers or --help, and no
tables cache beside the file unless --no-cache (or PROFKIT_NO_CACHE) says it will not be read. The
command itself then parses its options as always and asks for the decode where it always did; it is
handed this one when that is the same file with the same jobs, and otherwise this one stops (so does
one nobody asks for: flows/analyze.py drops it when the command ends). Either way the tables are the
same: only where the decode began changes.
"""

from __future__ import annotations

from pathlib import Path

_SKIP = ("--list-markers", "--help", "-h", "--jobs")


def decode_ahead(argv: list[str]) -> None:
    """Begin the decode of `profkit analyze`'s one large trace in `argv` (sys.argv), where the plain case holds:
    only in profkit's own process (the console script, or `python -m profkit`), not in a program that imports it."""
    if argv[1:2] != ["analyze"] or Path(argv[0]).name not in ("profkit", "profkit.exe", "__main__.py"):
        return
    args = argv[2:]
    if any(a in _SKIP or a.startswith("--jobs=") for a in args):
        return
    try:
        from profkit.ingest import PARALLEL_MIN_BYTES
        from profkit.ingest.identity import CACHE_SUFFIX, cache_disabled_by_env, trace_file

        big = []
        for a in args:
            if a.startswith("-"):
                continue
            p = Path(a)
            if p.is_dir():
                return  # a run folder: the plan decides what to read
            if p.is_file() and p.name.endswith((".json", ".json.gz", ".gz")):
                f = trace_file(p)
                if not f.sqlite and f.estimated_json_bytes >= PARALLEL_MIN_BYTES:
                    big.append(f)
        if len(big) != 1:
            return
        f = big[0]
        no_cache = "--no-cache" in args or cache_disabled_by_env()
        if not no_cache and f.path.with_name(f.path.name + CACHE_SUFFIX).exists():
            return  # likely read from the cache
        from profkit.ingest import early
        from profkit.ingest.reading import default_jobs

        early.ahead(f, jobs=default_jobs(1), prepare=early.numpy_without_blas_threads)
    except OSError:
        return  # the command says what is wrong with its inputs
