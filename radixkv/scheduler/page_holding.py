"""The scheduler's page lifetime (a mixin of scheduler.Scheduler): pages for a running request's next
tokens (evicting LRU cache, preempting newer requests when short), and what a request leaving the
running queue releases (its computed blocks cached, its lock and references dropped).
The rules: scheduler.py's module docstring, "Page lifetime" and "Memory pressure"."""
from __future__ import annotations

import bisect

from radixkv.cache import PagePool, RadixCache
from radixkv.config import SchedulerConfig
from radixkv.request import Status

from .entry import Entry
from .metrics import SchedulerMetrics


class PageHolding:
    """Pages a running request holds: grown, preempted, released."""

    # state of the Scheduler this is mixed into (scheduler.py sets it up)
    pool: PagePool
    cache: RadixCache
    config: SchedulerConfig
    page_size: int
    metrics: SchedulerMetrics
    waiting: list[Entry]
    running: list[Entry]
    _entries: dict[int, Entry]

    def _room(self, pages: int) -> int:
        """Evict LRU cache until `pages` are free if possible; returns the free count."""
        free = self.pool.num_free
        if free < pages and self.cache.num_evictable_pages:
            self.cache.evict(pages - free)
            free = self.pool.num_free
        return free

    def _grow(self, e: Entry, want: int, index: int, now: float, keep: set[int] | frozenset[int] = frozenset()) -> int:
        """Give running[index] pages for up to `want` more tokens; returns how many it got.

        A prefill chunk shrinks to the pages there are; when not even one token fits, newer
        requests (running[index + 1:], newest first) are preempted, except those whose id is in
        `keep` (rows already in this step). 0 means still no room."""
        req, ps = e.req, self.page_size
        have = len(req.pages) * ps - req.num_computed  # free slots in pages it holds
        while True:
            if want <= have:
                return want
            free = self._room(-(-(want - have) // ps))
            q_len = min(want, have + free * ps)
            if q_len > 0:
                self.pool.alloc_into(req.pages, -(-(q_len - have) // ps))  # theirs in one step
                return q_len
            victim = next((v for v in reversed(self.running[index + 1:]) if id(v) not in keep), None)
            if victim is None:
                return 0
            self._preempt(victim, now)

    def _preempt(self, e: Entry, now: float) -> None:
        """Release a running request's pages (caching its computed blocks) and requeue it."""
        req = e.req
        self._release(e)
        req.num_computed = 0
        req.status = Status.WAITING
        e.wait_since = now
        e.score = e.node = e.last = None
        self.running.remove(e)
        bisect.insort(self.waiting, e, key=Entry.order_key)
        self.metrics.preemptions += 1

    def _finish(self, e: Entry) -> None:
        req = e.req
        self._release(e)
        req.status = Status.FINISHED
        self.running.remove(e)
        del self._entries[req.rid]
        self.metrics.completed += 1
        self.metrics.waits_s.append(e.wait_s)

    def _release(self, e: Entry) -> None:
        self._cache_progress(e)
        # The pages first, in one all-or-nothing step of the pool: an interrupt inside it leaves the
        # request as it was, still locked (the lock is dropped only after its pages are).
        self.pool.release(e.req)
        self.cache.unlock(e.locked)
        e.locked = None

    def _cache_progress(self, e: Entry) -> None:
        """Insert the full blocks computed past the locked path and lock the longer path (one
        `extend`: linear in the new blocks, so a long prompt's chunks cost O(prompt) in all),
        and swap in the tree's pages where another request cached a block first."""
        req, ps = e.req, self.page_size
        old = e.locked
        full = req.num_computed // ps * ps
        if full <= old.num_tokens or not self.config.prefix_caching:
            return
        start = old.num_tokens // ps
        m = self.cache.extend(old, e.token_slice(old.num_tokens, full), req.pages[start: full // ps])
        e.locked = m
        pages = req.pages
        at = [i for i, page in enumerate(m.pages, start) if pages[i] != page]
        if at:  # the ids and the references move together (all or nothing)
            self.pool.exchange(pages, at, [m.pages[i - start] for i in at])
