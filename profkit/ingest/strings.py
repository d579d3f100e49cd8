"""A file's distinct strings, shared by its chunks as they are decoded: the ids the coded tables
carry (ingest/coded.py). Polars-free."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from profkit.ingest.categories import canonical_cat, table_code


class Strings:
    """A file's distinct strings: id <-> text, filled by the chunks as they are decoded (thread-safe)."""

    def __init__(self) -> None:
        self.texts: list[str] = []
        self._ids: dict[str, int] = {}
        self._lock = threading.Lock()
        # the earliest timestamp (µs) of the events of each SGLang-labelled pid ("[TP01] 4242"): a
        # merged file's ranks each start at their own t0 (ingest/processes.py); empty otherwise
        self.labelled_min_ts: dict[str, float] = {}
        # some CPU op carries `Input Dims` (recorded with record_shapes): ingest/shapes.py reads them
        self.shapes = False
        # the chunks' CPU rows lack some of what ingest/shapes.py needs (a chunk decoded by msgspec, a
        # cpu_op without args): its rows are read from the file again, not from the tables' `_dims`
        self.shape_rows_missing = False

    def ids(self, texts: list[str]) -> np.ndarray:
        """The ids of `texts` (new ones added), as a uint32 array."""
        out = np.empty(len(texts), np.uint32)
        with self._lock:
            known, all_texts = self._ids, self.texts
            for i, t in enumerate(texts):
                g = known.get(t)
                if g is None:
                    g = known[t] = len(all_texts)
                    all_texts.append(t)
                out[i] = g
        return out

    def note_min_ts(self, got: dict[str, float]) -> None:
        """A chunk's earliest timestamp per labelled pid, folded into labelled_min_ts."""
        if not got:
            return
        with self._lock:
            have = self.labelled_min_ts
            for p, t in got.items():
                if p not in have or t < have[p]:
                    have[p] = t

    def series(self) -> Any:
        """The strings as a polars Series, by id."""
        import polars as pl

        return pl.Series("s", self.texts, dtype=pl.String)


def cat_codes(strings: Strings, texts: list[str], used: Any) -> tuple[np.ndarray, np.ndarray]:
    """For a chunk whose categories are `texts[i]` for i in `used`: per local id, the id of the
    canonical spelling (categories.canonical_cat) and its table (categories.table_code; -1 elsewhere)."""
    canon = np.zeros(len(texts), np.uint32)
    table = np.full(len(texts), -1, np.int8)
    spelled = [canonical_cat(texts[i]) for i in used]
    if spelled:
        canon[used] = strings.ids(spelled)
        table[used] = [table_code(c) for c in spelled]
    return canon, table
