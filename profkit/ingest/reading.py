"""Reading a Kineto file for the chunked ingest: decompressed as a stream straight into a few
chunk-sized slots of memory, the `traceEvents` array cut at event boundaries into chunks
(`[ev, ..., ev]`, each checked by its decoder), the document around the array kept for its
metadata. Polars-free. A `Reader` fills the slots in its own thread, a few chunks ahead of the decoding.
"""

from __future__ import annotations

import os
import queue
import re
import tempfile
import threading
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import msgspec

from profkit.ingest.decode import DocMeta, TraceMeta, trace_meta

CHUNK_BYTES = 24 << 20  # raw JSON per decoded chunk
READ_BYTES = 8 << 20  # decompressed bytes per read


class NotFast(Exception):
    """The file is not in the shape the fast path handles; use the tiered decoder."""


class _Meta(DocMeta, kw_only=True):
    """decode.TraceDoc without its events (they are cut out: always []), for the same verdict on the rest."""

    traceEvents: list[int]


_META_DEC = msgspec.json.Decoder(_Meta)


def open_decompressed(path: Path, gzipped: bool):
    """A binary file object yielding the JSON bytes: gunzipped (fastest library available) or plain."""
    if not gzipped:
        return open(path, "rb")
    try:
        from isal import igzip

        return igzip.open(path, "rb")
    except ImportError:
        pass
    try:
        from zlib_ng import gzip_ng

        return gzip_ng.open(path, "rb")
    except ImportError:
        import gzip

        return gzip.open(path, "rb")


_WS = b" \t\r\n"
_KEY = re.compile(rb'"traceEvents"\s*:\s*\[')


def _last_boundary(buf: bytes | bytearray, lo: int) -> int:
    """Position just after the ',' of the last `} , {` (between two events) in buf[lo:], or -1."""
    pos = len(buf)
    while True:
        pos = buf.rfind(b"{", lo, pos)
        if pos <= lo:
            return -1
        j = pos - 1
        while j > lo and buf[j] in _WS:
            j -= 1
        if buf[j] == 0x2C:  # ','
            k = j - 1
            while k > lo and buf[k] in _WS:
                k -= 1
            if buf[k] == 0x7D:  # '}'
                return j + 1
        # not a boundary: keep looking further back


@dataclass
class Cut:
    head: bytes = b""  # the document up to and including the array's '['
    tail: bytes = b""  # the document after the array's ']'
    raw_bytes: int = 0
    chunks: int = 0


_LB = ord("[")
_RB = ord("]")
_SEARCH = 1 << 20  # look for a cut in the last MiB of a chunk first


class _Slots:
    """k buffers of `size` bytes: one shared-memory file that the workers map, or anonymous memory."""

    def __init__(self, k: int, size: int, shared: bool) -> None:
        import mmap

        self.k, self.size, self.path, self.mm = k, size, None, None
        self._fd: int | None = None
        self._name: str | None = None
        if shared:
            d = "/dev/shm" if _room_in("/dev/shm", 2 * k * size) else None  # else the temp folder (page cache)
            fd, name = tempfile.mkstemp(prefix="profkit-ingest-", dir=d)
            try:
                os.ftruncate(fd, k * size)
                self.mm = mmap.mmap(fd, k * size)
            except BaseException:
                os.close(fd)
                os.unlink(name)
                raise
            proc = f"/proc/{os.getpid()}/fd/{fd}"
            if os.path.exists(proc):
                # Linux: the workers open it through /proc, so the name can go now and a killed
                # process leaves nothing behind; '#name' keeps the key unique when fds are reused
                os.unlink(name)
                self._fd, self.path = fd, f"{proc}#{name}"
            else:
                os.close(fd)
                self._name = self.path = name
            self.view = memoryview(self.mm)
        else:
            # anonymous memory: its pages are touched (and zeroed by the kernel) only as chunks fill them.
            # Private: mmap(-1)'s default is a shared mapping, which the kernel backs with shmem, whose
            # huge pages are usually off (shmem_enabled: never), so MADV_HUGEPAGE below did nothing
            flags = getattr(mmap, "MAP_PRIVATE", 0) | getattr(mmap, "MAP_ANONYMOUS", 0)
            self.mm = mmap.mmap(-1, k * size, flags=flags) if flags else mmap.mmap(-1, k * size)
            if hasattr(self.mm, "madvise") and hasattr(mmap, "MADV_HUGEPAGE"):
                try:  # 2 MB pages where the kernel has them: 512x fewer page faults filling the slots
                    self.mm.madvise(mmap.MADV_HUGEPAGE)
                except OSError:
                    pass
            self.view = memoryview(self.mm)

    def close(self) -> None:
        try:
            self.view.release()
            if self.mm is not None:
                self.mm.close()
        except BufferError:
            pass  # a slice of it is still held (by an exception's traceback): freed with that
        if self._fd is not None:
            os.close(self._fd)
        if self._name:
            try:
                os.unlink(self._name)
            except OSError:
                pass


def _room_in(folder: str, need: int) -> bool:
    """Whether `folder` is writable with `need` bytes free: a small /dev/shm (containers often have
    64 MB) would end in SIGBUS when the mapping's pages are touched."""
    try:
        st = os.statvfs(folder)
        return os.access(folder, os.W_OK) and st.f_bavail * st.f_frsize >= need
    except OSError:
        return False


def _read_into(fh: Any, view: memoryview) -> int:
    """Fill view from fh; the bytes read (fewer only at the end of the file)."""
    got = 0
    n = len(view)
    while got < n:
        k = fh.readinto(view[got: min(n, got + READ_BYTES)])
        if not k:
            break
        got += k
    return got


def _cut_in(view: memoryview, lo: int, hi: int) -> int:
    """Index of the ',' of the last event boundary in view[lo:hi], or -1."""
    start = max(lo, hi - _SEARCH)
    while True:
        b = _last_boundary(bytes(view[start:hi]), 0)
        if b > 0:
            return start + b - 1
        if start == lo:
            return -1
        start = max(lo, start - 8 * _SEARCH)


def iter_slot_chunks(fh: Any, slots: _Slots, cut: Cut, wait_slot: Callable[[int], None]) -> Iterator[tuple[int, int, int]]:
    """Fill the slots round-robin with `[ev, ..., ev]` chunks of the traceEvents array, decompressing
    straight into them; yields (slot, offset, length). `wait_slot(i)` returns once slot i is free."""
    size = slots.size
    view = slots.view
    carry = b""
    first = True
    i = -1
    total = 0
    while True:
        i = (i + 1) % slots.k
        wait_slot(i)
        base = i * size
        pos = base + 1  # view[base] becomes the chunk's '['
        if len(carry) >= size - 1:
            raise NotFast("an event larger than a chunk")
        view[pos: pos + len(carry)] = carry
        room = size - 1 - len(carry)
        got = _read_into(fh, view[pos + len(carry): base + size])
        total += got
        data_end = pos + len(carry) + got
        eof = got < room
        if first:
            first = False
            probe = bytes(view[pos: min(data_end, pos + (1 << 20))])
            m = _KEY.search(probe)
            if m is None or probe.lstrip()[:1] != b"{":
                raise NotFast("no traceEvents array near the start")
            cut.head = probe[: m.end()]
            rest = bytes(view[pos + m.end(): data_end])
            view[pos: pos + len(rest)] = rest
            data_end = pos + len(rest)
        if eof:
            end = _array_end(view, pos, data_end, events_first=cut.head.lstrip()[1:].lstrip().startswith(b'"traceEvents"'))
            cut.tail = bytes(view[end + 1: data_end])
            view[base] = _LB
            view[end] = _RB
            cut.raw_bytes = total
            cut.chunks += 1
            yield i, base, end + 1 - base
            return
        c = _cut_in(view, pos, data_end)
        if c < 0:
            raise NotFast("no event boundary inside a chunk (an event larger than a chunk?)")
        carry = bytes(view[c + 1: data_end])
        view[base] = _LB
        view[c] = _RB
        cut.chunks += 1
        yield i, base, c + 1 - base


def _array_end(view: memoryview, lo: int, hi: int, *, events_first: bool = False) -> int:
    """Index of the ']' closing the events array: the last ']' after which the document's tail
    (`}` or `, "key": value ... }`) decodes; the chunk before it is validated by its decode.

    events_first: the document opens with `traceEvents` (json.dumps of a merged trace, SGLang's
    profile merger, TraceLens' fusion), so its metadata follows the events, and a top-level array
    in it (`"deviceProperties": [...]}`) ends in a ']' after which the tail decodes too: the events'
    ']' is then the leftmost such ']' within the last META_BYTES (a ']' inside the events never
    leaves a tail that decodes as the rest of the document)."""
    start = max(lo, hi - _SEARCH)
    window = bytes(view[start:hi])
    pos = len(window)
    while True:
        pos = window.rfind(b"]", 0, pos)
        if pos < 0:
            if start == lo:
                raise NotFast("no end of the traceEvents array")
            start = lo
            window = bytes(view[start:hi])
            pos = len(window)
            continue
        try:
            msgspec.json.decode(b'{"traceEvents": []' + window[pos + 1:])
        except msgspec.DecodeError:
            continue
        if not events_first:
            return start + pos
        lo_meta = max(lo, start + pos - META_BYTES)
        return lo_meta + _leftmost_end(bytes(view[lo_meta: start + pos + 1]), window[pos + 1:])


META_BYTES = 1 << 18  # the most metadata after the events that _array_end looks through (a 64-GPU deviceProperties is ~64 KiB)
_TAIL_START = re.compile(rb"\A\s*(?:\}|,\s*\")")


def _leftmost_end(window: bytes, after: bytes) -> int:
    """Of the ']'s in `window` (whose last byte is a ']' the document's tail `after` follows), the
    index of the leftmost after which the rest of the document decodes as its tail."""
    best = pos = len(window) - 1
    while True:
        pos = window.rfind(b"]", 0, pos)
        if pos < 0:
            return best
        tail = window[pos + 1:] + after
        if not _TAIL_START.match(tail):
            continue
        try:
            msgspec.json.decode(b'{"traceEvents": []' + tail)
        except msgspec.DecodeError:
            continue
        best = pos


def parse_meta(cut: Cut) -> TraceMeta:
    """The metadata of the document around the events (decode.trace_meta), decoded as strictly as
    the tiered decoder's first tier would (else NotFast)."""
    try:
        doc = _META_DEC.decode(cut.head + b"]" + cut.tail)
    except (msgspec.ValidationError, msgspec.DecodeError) as e:
        raise NotFast(f"document around the events: {e}") from None
    return trace_meta(doc)


def falls_back(e: BaseException) -> bool:
    """Whether an error while reading or decoding a file's chunks sends the file to the tiered
    decoder (which then reports it precisely): not fast-path material, a broken gzip and the like."""
    return isinstance(e, (NotFast, OSError, EOFError)) or (isinstance(e, Exception) and _is_decompress_error(e))


def _is_decompress_error(e: Exception) -> bool:
    s = f"{type(e).__name__} {e}".lower()
    return any(w in s for w in ("gzip", "deflate", "compress", "crc", "header", "zlib", "isal", "igzip"))


def default_jobs(n_files: int = 1) -> int:
    """min(cores, files): the cores this process may use, at most one per file for several files."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count() or 1
    return max(1, cores if n_files <= 1 else min(cores, n_files))




class Reader:
    """Fills k slots with the chunks of one file in its own thread (decompressing, cutting), k
    chunks ahead of whoever takes them: iterate for (slot, offset, length), `release(slot)` once
    a chunk is decoded, `close()` at the end (also when stopping early). The producer's errors
    (NotFast, a broken gzip) are raised by the iteration, in order."""

    def __init__(self, path: Path, gzipped: bool, chunk_bytes: int, k: int, shared: bool) -> None:
        self.path, self.chunk_bytes, self.k, self.shared = Path(path), chunk_bytes, k, shared
        self.slots = _Slots(k, chunk_bytes + (1 << 20), shared=shared)
        self.cut = Cut()
        self._free = [threading.Semaphore(1) for _ in range(k)]
        self._out: queue.Queue = queue.Queue()
        self._stop = False
        self._thread = threading.Thread(target=self._produce, args=(gzipped,), name="profkit-read", daemon=True)
        self._thread.start()

    def _wait_slot(self, i: int) -> None:
        self._free[i].acquire()
        if self._stop:
            raise _Stopped

    def _produce(self, gzipped: bool) -> None:
        try:
            with open_decompressed(self.path, gzipped) as fh:
                for item in iter_slot_chunks(fh, self.slots, self.cut, self._wait_slot):
                    self._out.put(item)
            self._out.put(None)
        except _Stopped:
            pass
        except BaseException as e:  # handed to the consumer, raised there (without this thread's frames)
            self._out.put(e.with_traceback(None))

    def __iter__(self) -> Iterator[tuple[int, int, int]]:
        while True:
            item = self._out.get()
            if item is None:
                return
            if isinstance(item, BaseException):
                raise item
            yield item

    def release(self, slot: int) -> None:
        self._free[slot].release()

    def close(self) -> None:
        """Stop the producer and free the slots (the caller has finished with every chunk)."""
        self._stop = True
        for s in self._free:
            s.release()
        self._thread.join()
        self.slots.close()


class _Stopped(Exception):
    pass


def decode_chunks(reader: Reader, submit: Callable[[int, int], Future], stopped: Callable[[], bool] | None = None) -> list[Any]:
    """submit(offset, length) -> a Future decoding that chunk of the reader's slots, for each chunk
    in turn; each slot is given back once its future is done. The results in file order; the
    first error (raised at its place in that order) stops the reading. Pending futures are
    cancelled or waited for before this returns or raises, so the slots can be freed then."""
    futs: list[Future] = []
    try:
        for i, off, length in reader:
            if stopped is not None and stopped():
                break
            fut = submit(off, length)

            def release(_f: Future, i: int = i) -> None:
                reader.release(i)

            fut.add_done_callback(release)
            futs.append(fut)
            if fut.done() and fut.exception() is not None:
                break  # decoded in place, and failed: no need to read on
        return [f.result() for f in futs]
    finally:
        for f in futs:
            f.cancel()
        for f in futs:
            try:
                f.result()
            except BaseException:
                pass


def done(fn: Callable[..., Any], *args: Any) -> Future:
    """fn(*args) called here, as a finished Future (decode_chunks' `submit` without workers)."""
    fut: Future = Future()
    try:
        fut.set_result(fn(*args))
    except Exception as e:
        fut.set_exception(e)
    return fut


def slot_count(jobs: int) -> int:
    """Chunks in flight: one being decoded by each worker, as many filled and waiting, one filling.
    (More would let reading run further ahead, but each slot's memory costs page faults once.)"""
    return 2 * jobs + 1 if jobs > 1 else 2
