"""Host-side bookkeeping of the paged KV pool and the prefix cache (no torch).

The device tensors (one latent row and one indexer-key row per slot, slot = page * page_size +
offset) live in the model; this module only hands out page ids. Page 0 is reserved as the dummy
page that padded tokens write to.

Prefix cache: a chain of full pages keyed by (parent node id, the page's tokens), so a lookup of a
token list walks page by page and returns the longest cached page-aligned prefix. Pages whose
tokens are cached are owned by the cache; requests using them hold a reference (lock), unused ones
are evicted leaf-first in LRU order when the pool runs out.
"""

from __future__ import annotations

import itertools
import threading


class OutOfPages(Exception):
    pass


class _Node:
    __slots__ = ("nid", "key", "page", "parent", "children", "ref", "last_use")

    def __init__(self, nid, key, page, parent):
        self.nid, self.key, self.page, self.parent = nid, key, page, parent
        self.children = 0
        self.ref = 0
        self.last_use = 0


class PagedKVPool:
    """Page allocator plus prefix cache. Used only from the scheduler thread (the lock is for the
    stats readers)."""

    def __init__(self, num_pages: int, page_size: int):
        if num_pages < 2:
            raise ValueError("num_pages must be >= 2 (page 0 is reserved)")
        self.page_size = page_size
        self.num_pages = num_pages
        self.free: list[int] = list(range(num_pages - 1, 0, -1))  # pop() gives low ids first
        self.nodes: dict[tuple, _Node] = {}
        self.by_page: dict[int, _Node] = {}
        self._ids = itertools.count(1)
        self._clock = itertools.count(1)
        self.lock = threading.Lock()
        self.hit_tokens = 0
        self.lookup_tokens = 0

    # -- allocation ---------------------------------------------------------------------------
    def available(self) -> int:
        return len(self.free) + sum(1 for n in self.nodes.values() if n.ref == 0)

    def alloc(self, n: int) -> list[int]:
        if n <= 0:
            return []
        if len(self.free) < n:
            self.evict(n - len(self.free))
        if len(self.free) < n:
            raise OutOfPages(f"need {n} pages, {len(self.free)} free")
        return [self.free.pop() for _ in range(n)]

    def release(self, pages) -> None:
        self.free.extend(pages)

    def evict(self, n: int) -> int:
        """Evict up to n unreferenced leaf pages, least recently used first."""
        done = 0
        while done < n:
            leaves = [x for x in self.nodes.values() if x.ref == 0 and x.children == 0]
            if not leaves:
                break
            leaves.sort(key=lambda x: x.last_use)
            for node in leaves[: n - done]:
                self._drop(node)
                done += 1
        return done

    def _drop(self, node: _Node) -> None:
        del self.nodes[node.key]
        del self.by_page[node.page]
        if node.parent is not None:
            node.parent.children -= 1
        self.free.append(node.page)

    # -- prefix cache ---------------------------------------------------------------------------
    def match_prefix(self, tokens: list[int]) -> tuple[list[int], list[_Node]]:
        """Longest cached page-aligned prefix of tokens, leaving at least one token to compute.

        Returns (pages, nodes); the nodes are locked (call unlock when the request is done).
        """
        ps = self.page_size
        limit = (len(tokens) - 1) // ps if tokens else 0
        pages, path = [], []
        parent = None
        now = next(self._clock)
        for i in range(limit):
            key = (parent.nid if parent else 0, tuple(tokens[i * ps:(i + 1) * ps]))
            node = self.nodes.get(key)
            if node is None:
                break
            node.ref += 1
            node.last_use = now
            pages.append(node.page)
            path.append(node)
            parent = node
        with self.lock:
            self.hit_tokens += len(pages) * ps
            self.lookup_tokens += len(tokens)
        return pages, path

    def unlock(self, path: list[_Node]) -> None:
        for node in path:
            node.ref -= 1

    def insert_and_release(self, tokens: list[int], pages: list[int], valid_len: int,
                           locked: list[_Node]) -> None:
        """A finished request: cache its full pages whose KV is valid (positions < valid_len),
        free every other page it owned, and drop its locks."""
        ps = self.page_size
        full = min(valid_len, len(tokens)) // ps
        parent = None
        now = next(self._clock)
        owned = set(pages[len(locked):])
        to_free = []
        for i, page in enumerate(pages):
            if i >= full:
                if page in owned:
                    to_free.append(page)
                continue
            key = (parent.nid if parent else 0, tuple(tokens[i * ps:(i + 1) * ps]))
            node = self.nodes.get(key)
            if node is None:
                if page not in owned:  # a locked page of ours whose chain was evicted? cannot be
                    break
                node = _Node(next(self._ids), key, page, parent)
                if parent is not None:
                    parent.children += 1
                self.nodes[key] = node
                self.by_page[page] = node
                owned.discard(page)
            elif node.page != page and page in owned:
                to_free.append(page)  # computed twice (concurrent identical prefixes)
            node.last_use = now
            parent = node
        else:
            i = len(pages)
        # pages not reached because the chain broke
        to_free.extend(p for p in pages[i:] if p in owned and p not in to_free)
        self.unlock(locked)
        self.release(to_free)

    def stats(self) -> dict:
        with self.lock:
            return {"free_pages": len(self.free), "cached_pages": len(self.nodes),
                    "hit_tokens": self.hit_tokens, "lookup_tokens": self.lookup_tokens}
