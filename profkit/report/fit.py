"""Terminal tables that keep their numbers at any width (80 columns and up).

Three kinds of column: numbers (never cut, never wrapped), names (kernel names: demangled, then cut
in the middle with an ellipsis to what the numbers leave), and strings a user copies (switches, APIs,
triggers, paths, CPU-op lists: never cut; folded onto more lines when they do not fit). Rich draws
the table; this module only decides the widths before it does.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import shutil
import subprocess
from collections.abc import Iterable, Sequence
from functools import lru_cache

from rich.cells import cell_len
from rich.console import Console, Group, RenderableType
from rich.markup import escape
from rich.table import Table
from rich.text import Text

NUM, NAME, COPY, TEXT = "num", "name", "copy", "text"
MIN_NAME = 16
ELLIPSIS = "…"


@lru_cache(maxsize=1)
def _cxa_demangle():  # the C++ runtime's own demangler (libstdc++), through ctypes: no dependency
    try:
        lib = ctypes.CDLL(ctypes.util.find_library("stdc++") or "libstdc++.so.6")
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None)
        f = lib.__cxa_demangle
        f.restype = ctypes.c_void_p
        f.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.POINTER(ctypes.c_int)]
        libc.free.argtypes = [ctypes.c_void_p]
        return f, libc.free
    except (OSError, AttributeError):
        return None


def _cxa(name: str) -> str:
    """libstdc++'s __cxa_demangle, or `name` when it cannot (or no libstdc++)."""
    fns = _cxa_demangle()
    if fns is None:
        return name
    f, free = fns
    status = ctypes.c_int(1)
    try:
        p = f(name.encode("utf-8", "replace"), None, None, ctypes.byref(status))
    except (ValueError, OSError):
        return name
    if not p:
        return name
    try:
        return ctypes.string_at(p).decode("utf-8", "replace") if status.value == 0 else name
    finally:
        free(p)


_DEMANGLED: dict[str, str] = {}


def demangle_many(names: Iterable[str]) -> None:
    """Demangle the Itanium-mangled names (``_Z...``) among `names` into the cache: libstdc++'s
    __cxa_demangle first, then binutils' c++filt (one process for all the rest) for what the runtime's
    demangler does not know (newer manglings such as DF16b, std::bfloat16_t); a name neither can read stays."""
    todo = [n for n in dict.fromkeys(names) if n.startswith("_Z") and n not in _DEMANGLED]
    rest = []
    for n in todo:
        d = _cxa(n)
        if d != n:
            _DEMANGLED[n] = d
        else:
            rest.append(n)
    tool = shutil.which("c++filt") if rest else None
    got: list[str] = []
    if tool and all("\n" not in n for n in rest):
        try:
            got = subprocess.run([tool], input="\n".join(rest) + "\n", capture_output=True, text=True, timeout=30).stdout.splitlines()
        except (OSError, subprocess.SubprocessError):
            got = []
    for i, n in enumerate(rest):
        _DEMANGLED[n] = got[i] if len(got) == len(rest) and got[i] else n


def demangle(name: str) -> str:
    """An Itanium-mangled C++ name (``_Z...``) as C++ (demangle_many); any other name, or one that no
    demangler reads, unchanged."""
    if not name.startswith("_Z"):
        return name
    if name not in _DEMANGLED:
        demangle_many([name])
    return _DEMANGLED.get(name, name)


def middle_ellipsis(text: str, width: int) -> str:
    """`text` in at most `width` cells: its head and tail kept, the middle replaced by one ``…``."""
    if cell_len(text) <= width:
        return text
    if width <= 1:
        return ELLIPSIS[:width]
    keep = width - 1
    head = (keep + 1) // 2
    tail = keep - head
    return text[:head] + ELLIPSIS + (text[-tail:] if tail else "")


def cut_names(names: Sequence[str], width: int) -> list[str]:
    """Each name in at most `width` cells, cut in the middle; names that would look the same once cut
    (three Cijk_Alik_… GEMMs that differ in the middle) show instead their head, then the part from
    just before where they differ."""
    shown = [middle_ellipsis(n, width) for n in names]
    by_shown: dict[str, set[str]] = {}
    for n, v in zip(names, shown):
        by_shown.setdefault(v, set()).add(n)
    fixed: dict[str, str] = {}
    for group in (g for g in by_shown.values() if len(g) > 1):
        p = len(os.path.commonprefix(sorted(group)))
        head = max(4, width // 4)
        for n in group:
            if cell_len(n) <= width:
                continue
            start = max(head, p - 6)
            room = width - head - 1
            seg = n[start:start + room]
            if start + room < len(n):
                seg = seg[:-1] + ELLIPSIS
            fixed[n] = n[:head] + ELLIPSIS + seg
    return [fixed.get(n, v) for n, v in zip(names, shown)]


def fit_table(console: Console, title: str | None, columns: Sequence[tuple[str, str]], rows: Sequence[Sequence[object]],
              *, width: int | None = None) -> RenderableType:
    """A rich Table whose NUM columns keep every digit at the console's width.

    `columns`: (header, kind) with kind NUM, NAME, COPY or TEXT; `rows`: plain strings (not markup;
    escaped here). NAME cells are demangled and cut in the middle to the width the other columns
    leave (at least MIN_NAME); TEXT cells wrap at spaces. When a COPY column cannot have its full
    width, the table becomes one block per row: the row's other columns, then its COPY strings
    whole on a line of their own ("api: cudaStreamSynchronize · trigger: aten::item")."""
    width = width or console.width
    cells = [["" if v is None else str(v) for v in r] for r in rows]
    natural = [max([cell_len(h)] + [cell_len(r[i]) for r in cells]) for i, (h, _) in enumerate(columns)]
    kinds = [k for _, k in columns]
    pad = 2 * len(columns)
    fixed = sum(w for w, k in zip(natural, kinds) if k == NUM)
    flex = [i for i, k in enumerate(kinds) if k != NUM]
    room = max(width - pad - fixed, sum(MIN_NAME if kinds[i] == NAME else 4 for i in flex))
    # strings a user copies first, whole, while the others keep their least (a name MIN_NAME; wrapping
    # text its longest word, at least 8): text wraps, a cut switch or API is useless
    share = dict.fromkeys(flex, 0)
    least = {i: MIN_NAME if kinds[i] == NAME else min(natural[i], max(8, max((cell_len(w) for r in cells for w in r[i].split()), default=4)))
             if kinds[i] == TEXT else 4 for i in flex}
    for i in flex:  # a text column's longest word is folded, not kept whole, when it would crowd the others out
        if kinds[i] == TEXT:
            least[i] = min(least[i], max(8, room // 2))
    left = room
    for i in sorted((i for i in flex if kinds[i] == COPY), key=lambda i: natural[i]):
        rest = sum(least[j] for j in flex if j != i and share[j] == 0)
        if natural[i] <= left - rest:
            share[i] = natural[i]
            left -= natural[i]
    # share the rest among the others: each gets what it needs if all fit, else a fair share
    todo = sorted((i for i in flex if share[i] == 0), key=lambda i: natural[i])
    while todo:
        fair = left // len(todo)
        i = todo.pop(0)
        w = min(natural[i], max(fair, least[i]))
        share[i] = w
        left -= w
    over = [i for i in flex if kinds[i] == COPY and share[i] < natural[i]]
    if over:
        return _blocks(title, columns, cells, natural, over, width)
    t = Table(box=None)  # the title goes above as a line of its own: a table's title wraps at the table's width
    for i, (h, k) in enumerate(columns):
        if k == NUM:
            t.add_column(escape(h), justify="right", no_wrap=True, min_width=natural[i])
        elif k == NAME:
            t.add_column(escape(h), no_wrap=True, width=share[i], overflow="ellipsis")
        else:
            t.add_column(escape(h), width=share[i], overflow="fold")
    demangle_many(r[i] for r in cells for i in range(len(columns)) if kinds[i] == NAME)
    for i in range(len(columns)):
        if kinds[i] == NAME:
            for r, v in zip(cells, cut_names([demangle(r[i]) for r in cells], share[i])):
                r[i] = v
    for r in cells:
        t.add_row(*(Text(v) for v in r))
    if not title:
        return t
    return Group(Text(title, style="italic"), t)


def _blocks(title: str | None, columns: Sequence[tuple[str, str]], cells: list[list[str]], natural: list[int], over: list[int],
            width: int) -> RenderableType:
    """One block per row: a table of the columns that fit (fixed widths, so the blocks line up),
    then the long COPY strings of that row on their own indented line, never cut."""
    keep = [i for i in range(len(columns)) if i not in over]
    parts: list[RenderableType] = []
    if title:
        parts.append(Text(title, style="italic"))
    for n, r in enumerate(cells):
        t = Table(box=None, show_header=n == 0)
        for i in keep:
            h, k = columns[i]
            w = natural[i] if k != NAME else max(MIN_NAME, min(natural[i], width - 2 * len(keep) - sum(natural[j] for j in keep if j != i)))
            t.add_column(escape(h), justify="right" if k == NUM else "left", no_wrap=True, width=w, overflow="ellipsis")
        t.add_row(*(Text(middle_ellipsis(demangle(r[i]), natural[i]) if columns[i][1] == NAME else r[i]) for i in keep))
        parts.append(t)
        parts.append(Text("    " + " · ".join(f"{columns[i][0]}: {r[i]}" for i in over if r[i]), overflow="fold"))
    return Group(*parts)
