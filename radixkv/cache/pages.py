"""PagePool: physical KV pages with a free list and per-page reference counts. No torch.

Invariant: a page is either free (refcount 0, on the free list exactly once) or held
(refcount >= 1, not on the free list). `alloc` is all-or-nothing; a bad incref/decref
raises before changing anything. Counts live in numpy arrays so that pools of millions
of pages cost no Python objects (and no garbage-collector time).

Failure atomicity: every operation that changes the pool is all or nothing at every bytecode
boundary, also against an exception raised in the middle of it (a KeyboardInterrupt from Ctrl-C):
what it changed is put back before the exception propagates. The pages an operation hands out or
takes back pass to or from their holder inside the same operation (`alloc_into`, `alloc_each`,
`adopt`, `release`, `exchange`), so no instant exists at which a page is held by nobody: callers
that must survive an interrupt (the scheduler) use those, never `alloc()` followed by a store.
(One exception at a time: a second interrupt raised while the first is being undone is not covered.)
"""
from __future__ import annotations

import struct
from collections.abc import Iterable

import numpy as np


class OutOfPages(RuntimeError):
    """Raised by PagePool.alloc when fewer pages are free than asked for; nothing is allocated."""

    def __init__(self, requested: int, free: int) -> None:
        super().__init__(f"out of KV pages: asked for {requested}, {free} free")
        self.requested = requested
        self.free = free


_PY_REDUCE_MAX = 32  # _list_as_pages: lists shorter than this are reduced with Python's min/max


def _as_pages(pages: Iterable[int], num_pages: int) -> np.ndarray:
    """pages as a flat integer array, every id checked to be an integer in the pool.

    An integer numpy array passes as it is. Anything else is read element by element and
    must hold Python or numpy integers only: a float, bool, string or None raises instead of
    being truncated or converted (numpy's own conversion would make 1.9 page 1)."""
    if isinstance(pages, np.ndarray):
        if pages.dtype.kind not in "iu":
            raise ValueError(f"pages must be integers, got dtype {pages.dtype}")
        if pages.ndim != 1:
            raise ValueError(f"pages must be a flat sequence, got shape {pages.shape}")
        _check_range(pages, num_pages)
        return pages
    if not isinstance(pages, (list, tuple)):
        pages = list(pages)
    return _list_as_pages(pages, num_pages)


def _list_as_pages(pages: list[int] | tuple[int, ...], num_pages: int) -> np.ndarray:
    """A list of page ids as an int64 array [n]; raises ValueError for an element that is not
    an integer (float, bool, string, None, a nested list) and IndexError for one outside the
    pool, naming it, before anything is changed."""
    n = len(pages)
    try:  # 'q' packs integers (anything with __index__) that fit in 64 bits; it refuses the rest
        arr = np.frombuffer(struct.pack(f"{n}q", *pages), dtype=np.int64)
    except struct.error:
        raise bad_page_id(pages, num_pages) from None
    if n == 0:
        return arr
    if n < _PY_REDUCE_MAX:  # Python's min/max beat numpy's fixed cost on short lists
        lo, hi = min(pages), max(pages)
    else:
        lo, hi = arr.min(), arr.max()
    if lo < 0 or hi >= num_pages:
        _check_range(arr, num_pages)
    if lo <= 1 and bool in map(type, pages):  # a bool packs as 0 or 1: look only then
        raise bad_page_id(pages, num_pages)
    return arr


def bad_page_id(pages: list[int] | tuple[int, ...], num_pages: int) -> Exception:
    """The error for the first element of `pages` that is not a page id of the pool."""
    for i, p in enumerate(pages):
        if isinstance(p, (bool, np.bool_)) or not isinstance(p, (int, np.integer)):
            return ValueError(f"pages must be integer page ids: pages[{i}] is {p!r} "
                              f"({type(p).__name__})")
        if not 0 <= p < num_pages:
            return IndexError(f"page {int(p)} outside pool of {num_pages}")
    return ValueError("pages must be integer page ids")  # (struct refused some element above)


def _check_range(arr: np.ndarray, num_pages: int) -> None:
    if arr.size and (arr.min() < 0 or arr.max() >= num_pages):
        bad = int(arr[(arr < 0) | (arr >= num_pages)][0])
        raise IndexError(f"page {bad} outside pool of {num_pages}")


class PagePool:
    """A fixed set of `num_pages` page ids 0..num_pages-1."""

    def __init__(self, num_pages: int) -> None:
        if not 0 <= num_pages < 2**31:
            raise ValueError(f"num_pages must be in [0, 2**31), got {num_pages}")
        self.num_pages = num_pages
        self._refs = np.zeros(num_pages, dtype=np.int32)  # [num_pages]
        # A stack: _free[:_top] are the free pages, popped from the top (low ids first).
        self._free = np.arange(num_pages - 1, -1, -1, dtype=np.int32)  # [num_pages]
        self._top = num_pages
        self._mark = np.zeros(num_pages, dtype=np.int32)  # scratch for duplicate detection
        self._iota = np.arange(min(num_pages, 4096), dtype=np.int32)  # 0, 1, 2, ... (grows)

    @property
    def num_free(self) -> int:
        return self._top

    @property
    def num_used(self) -> int:
        return self.num_pages - self._top

    def _take(self, n: int) -> np.ndarray:
        """The n pages alloc(n) would hand out (a view of the free stack; nothing changes)."""
        if n < 0:
            raise ValueError(f"cannot allocate {n} pages")
        if n > self._top:
            raise OutOfPages(n, self._top)
        return self._free[self._top - n: self._top][::-1]

    def alloc(self, n: int) -> list[int]:
        """Take `n` free pages, each with refcount 1; all or nothing (OutOfPages).

        The caller owns the pages once this returns: one that must not lose them to an interrupt
        between the return and its own store uses `alloc_into`."""
        return self.alloc_array(n).tolist()

    def alloc_into(self, dest: list[int], n: int) -> None:
        """Append `n` free pages to the list `dest` (a holder's pages), each with refcount 1: the
        pages are the holder's in the same step as they leave the free list. All or nothing, also
        against an interrupt anywhere inside (OutOfPages: nothing allocated)."""
        pages = self._take(n)
        if n == 0:
            return
        top, size = self._top, len(dest)
        ids = pages.tolist()
        try:
            self._refs[pages] = 1
            dest.extend(ids)
            self._top = top - n
        except BaseException:
            del dest[size:]
            self._refs[pages] = 0
            self._top = top
            raise

    def alloc_each(self, dests: list[list[int]]) -> None:
        """Append one free page to each of the distinct lists `dests`, as alloc_into(d, 1) for
        each would, in one all-or-nothing step."""
        n = len(dests)
        pages = self._take(n)
        if n == 0:
            return
        top, sizes = self._top, [len(d) for d in dests]
        ids = pages.tolist()
        try:
            self._refs[pages] = 1
            for d, page in zip(dests, ids):
                d.append(page)
            self._top = top - n
        except BaseException:
            for d, size in zip(dests, sizes):
                del d[size:]
            self._refs[pages] = 0
            self._top = top
            raise

    def alloc_array(self, n: int) -> np.ndarray:
        """alloc(n) as a fresh int32 array [n] (no list of Python ints is built): the same
        pages in the same order, each with refcount 1; all or nothing (OutOfPages)."""
        pages = self._take(n).copy()  # a copy: frees reuse the stack
        top = self._top
        try:
            self._refs[pages] = 1
            self._top = top - n
        except BaseException:
            self._refs[pages] = 0
            self._top = top
            raise
        return pages

    def are_distinct(self, pages: np.ndarray) -> bool:
        """Whether an integer array of in-pool page ids lists no page twice."""
        n = pages.size
        if n > self.num_pages:
            return False
        if n > len(self._iota):
            self._iota = np.arange(max(n, 2 * len(self._iota)), dtype=np.int32)
        idx = self._iota[:n]
        self._mark[pages] = idx  # a repeated page keeps only its last position
        return bool((self._mark[pages] == idx).all())

    def check_held(self, pages: np.ndarray) -> np.ndarray:
        """Refcounts of `pages` (an integer array); raises IndexError / ValueError naming the
        page unless every page is in the pool and held."""
        try:
            held = self._refs[pages]
        except IndexError:
            held = None
        if held is None or (pages.dtype.kind == "i" and pages.size and pages.min() < 0):
            _check_range(pages, self.num_pages)  # past the end, or negative (numpy would wrap it)
        if held.size and held.min() <= 0:
            raise ValueError(f"page {int(pages[held <= 0][0])} is free (refcount 0)")
        return held

    def incref(self, pages: Iterable[int]) -> None:
        """Add one reference to each held page (a page listed twice gets two).

        Raises, changing nothing, if a page is outside the pool or free."""
        arr = _as_pages(pages, self.num_pages)
        if arr.size == 0:
            return
        held = self._refs[arr]
        if (held <= 0).any():
            raise ValueError(f"incref of free page {int(arr[held <= 0][0])}")
        self._add_refs(arr, held)

    def _add_refs(self, arr: np.ndarray, held: np.ndarray) -> None:
        """One more reference on each page of arr (held: their refcounts now): one numpy write."""
        if self.are_distinct(arr):
            self._refs[arr] = held + 1
        else:
            np.add.at(self._refs, arr, 1)  # (C: no bytecode boundary inside)

    def adopt(self, holder: object, pages: list[int]) -> None:
        """Take one reference on each held page of `pages` and make the list `holder.pages`, in one
        all-or-nothing step (a holder's pages until now are replaced, not released: they must be
        none). Raises, changing nothing, if a page is outside the pool or free."""
        arr = _as_pages(pages, self.num_pages)
        held = self._refs[arr]
        if held.size and held.min() <= 0:
            raise ValueError(f"incref of free page {int(arr[held <= 0][0])}")
        was = holder.pages
        try:
            if arr.size:
                self._add_refs(arr, held)
            holder.pages = pages
        except BaseException:
            self._refs[arr] = held
            holder.pages = was
            raise

    def incref_distinct(self, pages: np.ndarray, held: np.ndarray | None = None) -> None:
        """incref for an integer array known to hold no page twice (the tree's adoption path).

        `held`: the pages' refcounts as check_held just returned them (then not checked again)."""
        if held is None:
            held = self._refs[pages]
            if held.size and held.min() <= 0:
                raise ValueError(f"incref of free page {int(pages[held <= 0][0])}")
        self._refs[pages] = held + 1

    def _drops(self, arr: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """For a decref of arr: (distinct pages, their refcounts now, their refcounts after)."""
        if self.are_distinct(arr):
            held = self._refs[arr]
            return arr, held, held - 1
        uniq, counts = np.unique(arr, return_counts=True)
        held = self._refs[uniq]
        return uniq, held, held - counts

    def decref(self, pages: Iterable[int]) -> int:
        """Drop one reference from each page; a page reaching 0 returns to the free list.

        Returns how many pages were freed. Raises, changing nothing, if a page would go below
        zero (a double free) or lies outside the pool."""
        arr = _as_pages(pages, self.num_pages)
        if arr.size == 0:
            return 0
        return self._set_refs(*self._drops(arr))

    def decref_distinct(self, pages: np.ndarray) -> int:
        """decref for an integer array known to hold no page twice (the tree's eviction path)."""
        held = self._refs[pages]
        return self._set_refs(pages, held, held - 1)

    def release(self, holder: object) -> int:
        """Drop the references of every page in the list `holder.pages` and give the holder a new
        empty list, in one all-or-nothing step (the list itself is left as it was: a batch may
        still read it). Returns how many pages were freed; raises, changing nothing, as decref."""
        pages = holder.pages
        arr = _as_pages(pages, self.num_pages)
        if arr.size == 0:
            holder.pages = []
            return 0
        uniq, held, after = self._drops(arr)
        top = self._top
        try:
            freed = self._set_refs(uniq, held, after)
            holder.pages = []
        except BaseException:
            self._refs[uniq] = held
            self._top = top
            holder.pages = pages
            raise
        return freed

    def exchange(self, dest: list[int], index: list[int], new: list[int]) -> None:
        """dest[index[j]] = new[j] for each j, moving the references with the ids: one more on each
        new page (held already), one fewer on each page it replaces (freed at zero). All or nothing."""
        if len(index) != len(new):
            raise ValueError(f"exchange of {len(index)} positions for {len(new)} pages")
        if not index:
            return
        old = [dest[i] for i in index]
        new_arr, old_arr = _as_pages(new, self.num_pages), _as_pages(old, self.num_pages)
        touched = np.concatenate([new_arr, old_arr])
        held = self._refs[touched]  # a copy: what a failure puts back
        if (held[: len(new_arr)] <= 0).any():
            raise ValueError(f"incref of free page {int(new_arr[held[: len(new_arr)] <= 0][0])}")
        top = self._top
        try:
            self._add_refs(new_arr, held[: len(new_arr)])
            self._set_refs(*self._drops(old_arr))
            for i, page in zip(index, new):
                dest[i] = page
        except BaseException:
            for i, page in zip(index, old):
                dest[i] = page
            self._refs[touched] = held
            self._top = top
            raise

    def _set_refs(self, pages: np.ndarray, held: np.ndarray, after: np.ndarray) -> int:
        """Refcounts of the distinct `pages` go from `held` to `after` (all lower); pages at zero
        are pushed on the free list. All or nothing."""
        if after.size == 0:
            return 0
        if after.min() < 0:
            bad = int(pages[after < 0][0])
            raise ValueError(f"decref of page {bad} below zero (double free): "
                             f"refcount {int(self._refs[bad])}")
        if after.any():
            freed = pages[after == 0]
        else:
            freed = pages  # the common eviction case: every page was the tree's alone
        n = freed.size
        top = self._top
        try:
            self._refs[pages] = after
            if n:
                # Pushed in reverse so the lowest-positioned freed id is popped first; the slots
                # above the top are no one's, so writing them changes nothing until the top moves.
                self._free[top: top + n] = freed[::-1]
                self._top = top + n
        except BaseException:
            self._refs[pages] = held
            self._top = top
            raise
        return int(n)

    def refcount(self, page: int) -> int:
        if not 0 <= page < self.num_pages:
            raise IndexError(f"page {page} outside pool of {self.num_pages}")
        return int(self._refs[page])

    def refcounts(self, pages: Iterable[int]) -> np.ndarray:
        """Reference counts of several pages at once."""
        return self._refs[_as_pages(pages, self.num_pages)]

    def check_invariants(self) -> None:
        """Every page is free (refcount 0, on the free list once) or held, never both, never negative."""
        refs = self._refs
        assert 0 <= self._top <= self.num_pages, f"free-stack top {self._top} out of range"
        neg = np.flatnonzero(refs < 0)
        assert neg.size == 0, f"page {int(neg[0]) if neg.size else 0} has a negative refcount"
        on_free = np.bincount(self._free[: self._top], minlength=self.num_pages)
        twice = np.flatnonzero(on_free > 1)
        assert twice.size == 0, f"page {int(twice[0]) if twice.size else 0} is on the free list twice"
        held_and_free = np.flatnonzero((on_free == 1) & (refs != 0))
        assert held_and_free.size == 0, \
            f"page {int(held_and_free[0]) if held_and_free.size else 0} is held and also on the free list"
        lost = np.flatnonzero((on_free == 0) & (refs == 0))
        assert lost.size == 0, f"page {int(lost[0]) if lost.size else 0} has refcount 0 but is not on the free list"
