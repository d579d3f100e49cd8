"""Decoding one large trace ahead of the caller, before polars is imported.

`profkit analyze` on a single large trace spends its first half second importing polars and the
analysis. `start` begins the chunked decode meanwhile, in a thread, with nothing polars needs: the
Reader decompresses into the slots, worker threads run the C scanner's two passes
(scan.scan_chunk_rows) and keep each chunk's rows as arrays; a chunk the scanner declines is copied
aside for msgspec. `start` returns the decode as a handle (`EarlyDecode`), which the caller passes
down to whoever loads that file (analysis.parallel.analyze_runs -> ingest.load_trace ->
columnar.load_tables_fast, which `take`s it, waiting for the rest, and makes the same coded parts
it would have made itself: the tables are the same either way, whatever number of threads ran it).
Whoever started it stops it once the load is over (`stop`: a no-op for a taken decode), so a decode
nobody took (the trace came from a cache, an error came first) does not run on.
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path
from typing import Any, Callable

from profkit.ingest.identity import TraceFile, trace_file
from profkit.ingest.decode import TraceMeta
from profkit.ingest.reading import CHUNK_BYTES, Reader, decode_chunks, falls_back, parse_meta, slot_count


class EarlyDecode:
    """The decode of one file that `start` began, in a thread of its own."""

    def __init__(self, file: TraceFile, jobs: int, chunk_bytes: int, prepare: Callable[[], None] | None) -> None:
        self.file = file
        self.jobs, self.chunk_bytes = jobs, chunk_bytes
        self.strings: Any = None  # the file's Strings, made in the thread after `prepare` (it imports numpy)
        self.result: tuple[list[Any], Any, TraceMeta] | None = None  # (per chunk: Rows or raw bytes), cut, meta
        self.error: BaseException | None = None
        self.fallback = False  # not fast-path material: the caller's own path decides
        self.taken = False
        self._stop = False
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, args=(jobs, chunk_bytes, prepare), name="profkit-early",
                                        daemon=True)
        self._thread.start()

    def _run(self, jobs: int, chunk_bytes: int, prepare: Callable[[], None] | None) -> None:
        from concurrent.futures import ThreadPoolExecutor

        try:
            reader = Reader(self.file.path, self.file.gzip, chunk_bytes, slot_count(jobs), shared=False)
        except OSError:
            self.fallback = True
            return
        try:
            if prepare is not None:
                prepare()
            from profkit.ingest.strings import Strings

            self.strings = Strings()
            with ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="profkit-chunk") as ex:
                got = decode_chunks(reader, lambda off, n: ex.submit(_rows, reader.slots.view, off, n, self.strings),
                                    stopped=lambda: self._stop)
            if not self._stop:
                self.result = (got, reader.cut, parse_meta(reader.cut))
        except BaseException as e:
            if falls_back(e):
                self.fallback = True
            else:
                self.error = e
        finally:
            reader.close()

    def take(self, file: Path | TraceFile) -> EarlyDecode | None:
        """This decode, finished (waiting for it), when it is of `file` (the same path, size and
        mtime) and neither taken nor stopped before; else None. Raises what the decoding raised,
        except what sends the file to the caller's own path (`fallback`)."""
        path = file.path if isinstance(file, TraceFile) else Path(file)
        with self._lock:
            if self.taken or self._stop or path != self.file.path:
                return None
            if isinstance(file, TraceFile) and (file.size, file.mtime_ns) != (self.file.size, self.file.mtime_ns):
                return None
            self.taken = True
        self._thread.join()
        if self.error is not None:
            raise self.error
        return self

    def wait(self) -> None:
        self._thread.join()

    def stop(self) -> None:
        """Stop the decode unless it was taken (then nothing happens): its thread ends soon after."""
        with self._lock:
            if not self.taken:
                self._stop = True


def _rows(view: memoryview, offset: int, length: int, strings: Any) -> Any:
    """A chunk's scan.Rows, or its bytes when the scanner declines it (msgspec decodes those later)."""
    from profkit.ingest.scan import scan_chunk_rows

    v = view[offset: offset + length]
    try:
        rows = scan_chunk_rows(v, strings)
        return rows if rows is not None else bytes(v)
    finally:
        v.release()


def start(file: Path | TraceFile, *, jobs: int, chunk_bytes: int = CHUNK_BYTES,
          prepare: Callable[[], None] | None = None) -> EarlyDecode | None:
    """Start decoding `file` in a thread, with `jobs` chunk threads: the handle to pass to its
    loader, or None where nothing starts (no C scanner, or the file cannot be read: its loader
    says what is wrong). `prepare` runs in the thread first. The decode `ahead` began is this
    one when it is of the same file (path, size and mtime) with the same jobs; else it stops."""
    global _AHEAD
    from profkit.ingest.scan import lib

    began, _AHEAD = _AHEAD, None
    try:
        f = trace_file(file)
    except OSError:
        f = None
    if began is not None:
        if f is not None and _same(began.file, f) and (began.jobs, began.chunk_bytes) == (jobs, chunk_bytes):
            began.file = f  # as the loader will name it (`take` compares)
            return began
        began.stop()
    if lib() is None or f is None:
        return None
    if f.sqlite:
        return None  # an Nsight Systems export: ingest/nsys.py reads it, not the JSON decoder
    return EarlyDecode(f, jobs, chunk_bytes, prepare)


_AHEAD: EarlyDecode | None = None  # the decode `ahead` began, until `start` takes it or `drop_ahead` stops it


def ahead(file: TraceFile, *, jobs: int, prepare: Callable[[], None] | None = None) -> None:
    """Begin decoding `file` before anyone asks for it (the CLI, before it imports its commands: see
    flows/ahead.py); `start` gives it to the first caller that asks for the same file and jobs."""
    global _AHEAD
    drop_ahead()
    _AHEAD = start(file, jobs=jobs, prepare=prepare)


def drop_ahead() -> None:
    """Stop the decode `ahead` began, unless `start` has given it out (then nothing happens)."""
    global _AHEAD
    began, _AHEAD = _AHEAD, None
    if began is not None:
        began.stop()


def _same(a: TraceFile, b: TraceFile) -> bool:
    try:
        return (a.size, a.mtime_ns) == (b.size, b.mtime_ns) and a.path.resolve() == b.path.resolve()
    except OSError:
        return False


def numpy_without_blas_threads() -> None:
    """Import numpy with one OpenBLAS thread: profkit does no linear algebra, and OpenBLAS's idle
    threads otherwise spin on the cores the decoding needs. The environment is left as it was."""
    if "numpy" in sys.modules:
        return
    import os

    before = os.environ.get("OPENBLAS_NUM_THREADS")
    os.environ["OPENBLAS_NUM_THREADS"] = "1"
    try:
        import numpy  # noqa: F401
    finally:
        if before is None:
            del os.environ["OPENBLAS_NUM_THREADS"]
        else:
            os.environ["OPENBLAS_NUM_THREADS"] = before
