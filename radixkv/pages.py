"""PagePool: physical KV pages with a free list and per-page reference counts. No torch.

Invariant: a page is either free (refcount 0, on the free list exactly once) or held
(refcount >= 1, not on the free list). `alloc` is all-or-nothing.
"""
from __future__ import annotations

from collections.abc import Iterable


class OutOfPages(RuntimeError):
    """Raised by PagePool.alloc when fewer pages are free than asked for; nothing is allocated."""

    def __init__(self, requested: int, free: int) -> None:
        super().__init__(f"out of KV pages: asked for {requested}, {free} free")
        self.requested = requested
        self.free = free


class PagePool:
    """A fixed set of `num_pages` page ids 0..num_pages-1."""

    def __init__(self, num_pages: int) -> None:
        if num_pages < 0:
            raise ValueError(f"num_pages must be >= 0, got {num_pages}")
        self.num_pages = num_pages
        self._refs = [0] * num_pages
        # Popped from the end: low ids are handed out first, which keeps tests readable.
        self._free = list(range(num_pages - 1, -1, -1))

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self.num_pages - len(self._free)

    def alloc(self, n: int) -> list[int]:
        """Take `n` free pages, each with refcount 1."""
        if n < 0:
            raise ValueError(f"cannot allocate {n} pages")
        if n > len(self._free):
            raise OutOfPages(n, len(self._free))
        if n == 0:
            return []
        pages = self._free[-n:]
        del self._free[-n:]
        pages.reverse()
        refs = self._refs
        for p in pages:
            refs[p] = 1
        return pages

    def incref(self, pages: Iterable[int]) -> None:
        """Add one reference to each held page (a page listed twice gets two)."""
        refs = self._refs
        for p in pages:
            if refs[p] <= 0:
                raise ValueError(f"incref of free page {p}")
            refs[p] += 1

    def decref(self, pages: Iterable[int]) -> None:
        """Drop one reference from each page; a page reaching 0 returns to the free list."""
        refs = self._refs
        for p in pages:
            r = refs[p]
            if r <= 0:
                raise ValueError(f"decref of free page {p} (double free)")
            refs[p] = r - 1
            if r == 1:
                self._free.append(p)

    def refcount(self, page: int) -> int:
        if not 0 <= page < self.num_pages:
            raise IndexError(f"page {page} outside pool of {self.num_pages}")
        return self._refs[page]

    def check_invariants(self) -> None:
        """Every page is free (refcount 0, on the free list once) or held, never both, never negative."""
        on_free = [0] * self.num_pages
        for p in self._free:
            assert 0 <= p < self.num_pages, f"free list holds out-of-range page {p}"
            on_free[p] += 1
        for p, r in enumerate(self._refs):
            assert r >= 0, f"page {p} has negative refcount {r}"
            if r == 0:
                assert on_free[p] == 1, f"page {p} has refcount 0 but is on the free list {on_free[p]} times"
            else:
                assert on_free[p] == 0, f"page {p} is held (refcount {r}) and also on the free list"
