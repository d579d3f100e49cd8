"""Decoding one large trace ahead of the caller, before polars is imported.

`profkit analyze` on a single large trace spends its first half second importing polars and the
analysis. `start` begins the chunked decode meanwhile, in a thread, with nothing polars needs: the
Reader decompresses into the slots, worker threads run the C scanner's two passes
(scan.scan_chunk_rows) and keep each chunk's rows as arrays; a chunk the scanner declines is copied
aside for msgspec. columnar.load_tables_fast then `take`s the result (waiting for the rest) and
makes the same coded parts it would have made itself: the tables are the same either way.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any, Callable

from profkit.ingest.reading import CHUNK_BYTES, Reader, decode_chunks, falls_back, parse_meta, slot_count

_RUNS: dict[tuple[Any, ...], "_Run"] = {}
_LOCK = threading.Lock()


def _key(path: Path, chunk_bytes: int, jobs: int) -> tuple[Any, ...] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return str(Path(path).resolve()), st.st_size, st.st_mtime_ns, chunk_bytes, jobs


class _Run:
    def __init__(self, path: Path, jobs: int, chunk_bytes: int, prepare: Callable[[], None] | None) -> None:
        self.strings: Any = None  # the file's Strings, made in the thread after `prepare` (it imports numpy)
        self.result: tuple[list[Any], Any, dict[str, Any]] | None = None  # (per chunk: Rows or raw bytes), cut, meta
        self.error: BaseException | None = None
        self.fallback = False  # not fast-path material: the caller's own path decides
        self._stop = False
        self._thread = threading.Thread(target=self._run, args=(path, jobs, chunk_bytes, prepare), name="profkit-early",
                                        daemon=True)
        self._thread.start()

    def _run(self, path: Path, jobs: int, chunk_bytes: int, prepare: Callable[[], None] | None) -> None:
        from concurrent.futures import ThreadPoolExecutor

        try:
            reader = Reader(path, chunk_bytes, slot_count(jobs), shared=False)
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

    def wait(self) -> None:
        self._thread.join()

    def stop(self) -> None:
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


def start(path: Path, *, jobs: int, chunk_bytes: int = CHUNK_BYTES, prepare: Callable[[], None] | None = None) -> bool:
    """Start decoding `path` in a thread, as load_tables_fast would with `jobs` chunk threads.
    Only with the C scanner (else nothing starts: False). `prepare` runs in the thread first."""
    from profkit.ingest.scan import lib

    key = _key(path, chunk_bytes, jobs)
    if key is None or lib() is None:
        return False
    run = _Run(path, jobs, chunk_bytes, prepare)
    with _LOCK:
        old = _RUNS.pop(key, None)
        _RUNS[key] = run
    if old is not None:
        old.stop()
    return True


def take(path: Path, *, chunk_bytes: int, jobs: int) -> _Run | None:
    """The finished run `start` began for this file with these settings (waiting for it); None when
    there is none. Raises what the decoding raised, except what sends the file to the caller's own
    path (run.fallback)."""
    key = _key(path, chunk_bytes, jobs)
    with _LOCK:
        run = _RUNS.pop(key, None) if key is not None else None
    if run is None:
        return None
    run.wait()
    if run.error is not None:
        raise run.error
    return run


def discard() -> None:
    """Stop the runs nobody took (the trace came from a cache, or an error came first)."""
    with _LOCK:
        runs = list(_RUNS.values())
        _RUNS.clear()
    for r in runs:
        r.stop()
