"""The scheduler's admission (a mixin of scheduler.Scheduler): waiting requests matched against the
radix tree, ranked by the policy behind the starvation guard, and admitted while the token budget,
max_running and free + evictable pages allow (head of line); in-batch prefix sharing defers a request
whose next block another row computes this step. Rules: scheduler.py's module docstring."""
from __future__ import annotations

import itertools

import numpy as np

from radixkv.batch import BatchBuilder
from radixkv.cache import MatchResult
from radixkv.request import Status

from .entry import Entry, ShareKey, share_key
from .page_holding import PageHolding
from .policies import AdmissionRanker


class Admission(PageHolding):
    """Which waiting requests join a step, and from which cached prefix."""

    # state beyond PageHolding's (scheduler.py sets it up)
    _admit_seq: itertools.count
    _step: int
    _ranker: AdmissionRanker

    def _starved(self, e: Entry, now: float) -> bool:
        cfg = self.config
        return ((cfg.starvation_s is not None and now - e.arrival > cfg.starvation_s)
                or (cfg.starvation_steps is not None
                    and self._step - e.arrival_step > cfg.starvation_steps))

    def _match(self, e: Entry) -> None:
        """Match a queued request against the tree now; the ranker orders by the result."""
        tokens = e.waiting_tokens() if self._reads_cache(e) else e.prompt_arr[:0]
        m = e.last = self.cache.match(tokens, e.req.namespace, since=e.last)
        e.score, e.node = m.num_tokens, m.node

    def _match_all(self, entries: list[Entry]) -> None:
        """_match for each of entries, in order, through one RadixCache.match_many call."""
        queries = [((e.prompt_arr if not e.req.output else e.waiting_tokens()) if self._reads_cache(e)
                    else e.prompt_arr[:0], e.req.namespace, e.last) for e in entries]
        for e, m in zip(entries, self.cache.match_many(queries)):
            e.last = m
            e.score, e.node = m.num_tokens, m.node

    def _reads_cache(self, e: Entry) -> bool:
        """Whether e may start from a cached prefix: prefix caching is on and the request reads the cache."""
        return self.config.prefix_caching and e.req.read_cache

    def _lookup(self, e: Entry, tokens: np.ndarray) -> MatchResult:
        """The cached prefix of tokens for e; the empty one when e does not read the cache. Re-checks
        e's previous match first (while it still holds, that skips the walk)."""
        return self.cache.match(tokens if self._reads_cache(e) else tokens[:0], e.req.namespace, since=e.last)

    def _admit(self, rows: BatchBuilder, budget: int, shared: set[ShareKey], now: float) -> None:
        """Admit waiting requests into this step. If anything raises (a Ctrl-C in the pool, an
        error in the tree), the requests admitted so far go back to waiting untouched and the
        exception propagates: `schedule` then returns nothing and the state is as before."""
        first = len(self.running)
        try:
            self._admit_all(rows, budget, shared, now)
        except BaseException:
            undone = self.running[first:]
            del self.running[first:]
            for e in undone:
                self._unadmit(e)
            for e in self.waiting:  # the one it raised on may be locked but not running yet
                if e.locked is not None:
                    self.cache.unlock(e.locked)
                    e.locked = None
            raise

    def _unadmit(self, e: Entry) -> None:
        """Undo an admission of this step: its lock and pages released, back to WAITING."""
        req = e.req
        self.pool.release(req)
        self.cache.unlock(e.locked)
        e.locked = None
        req.num_computed = 0
        req.status = Status.WAITING

    def _admit_all(self, rows: BatchBuilder, budget: int, shared: set[ShareKey], now: float) -> None:
        cfg, pool, cache, ps = self.config, self.pool, self.cache, self.page_size
        reserve = sum(self._decode_reserve(r) for r in self.running)
        admitted: list[tuple[Entry, int]] = []  # (entry, cached tokens it starts from)
        order, head_starved = self._ranker.order(self.waiting[: cfg.policy_window],
                                                 lambda e: self._starved(e, now))
        deferred: float | None = None  # arrival of the starved head when it defers
        for e in order:
            if len(self.running) >= cfg.max_running or budget <= 0:
                break
            if deferred is not None and e.arrival > deferred:
                continue  # no later arrival goes ahead of the starved head
            req = e.req
            total = req.num_tokens
            tokens = e.token_array(total)
            m = e.last = self._lookup(e, tokens)
            if m.host_tokens and self._reads_cache(e):  # the host tier holds more: load what fits
                m = e.last = self._load_host(e, tokens, m, reserve if self.running else None)
            usable = min(m.num_tokens, (total - 1) // ps * ps)  # leave >= 1 token to compute
            if (cfg.in_batch_sharing and self._reads_cache(e) and shared and usable == m.num_tokens
                    and share_key(m, tokens, ps) in shared):
                # Another row computes this block now: hit it next step instead. The starved
                # head defers too (one step), but then nothing that arrived later is admitted.
                if head_starved and e is order[0]:
                    deferred = e.arrival
                continue
            if usable < m.num_tokens:  # all cached: lock only the blocks it will use
                m = cache.match(tokens[:usable], req.namespace)
            cache.lock(m)
            e.locked = m
            want = min(total - usable, budget)
            need = -(-(usable + want) // ps) - usable // ps
            avail = pool.num_free + cache.num_evictable_pages
            own = self._decode_reserve(e)
            if self.running:
                if need + own + reserve > avail:
                    cache.unlock(m)
                    e.locked = None
                    break  # head of line: nothing behind it jumps ahead
            else:  # alone: it may take the whole pool, a chunk at a time
                want = min(want, avail * ps)
            self.running.append(e)  # from here on, an exception is undone by _unadmit
            pool.adopt(req, m.pages[: usable // ps])  # references and list in one step
            req.num_computed = usable
            req.status = Status.RUNNING
            e.admit_seq = next(self._admit_seq)
            q_len = self._grow(e, want, len(self.running) - 1, now)
            assert q_len > 0, f"request {req.rid} admitted without room for a token"
            self._add_row(rows, e, usable, q_len, shared)
            admitted.append((e, usable))
            budget -= q_len
            reserve += own
        # Every admission stands: count them now (an admission undone by an exception never counts).
        for e, usable in admitted:
            if not e.admitted_once:
                e.admitted_once = True
                e.req.cached_tokens = usable
                self.metrics.prompt_tokens += len(e.req.prompt)
                self.metrics.hit_tokens += usable
                self.metrics.host_hit_tokens += min(e.host_loaded, usable)
            e.wait_s += now - e.wait_since
        if admitted:
            ids = {id(e) for e, _ in admitted}
            self.waiting = [e for e in self.waiting if id(e) not in ids]

    def _load_host(self, e: Entry, tokens: np.ndarray, m: MatchResult, reserve: int | None) -> MatchResult:
        """The host tier (RadixCache with a host pool and a mover): bring m's host blocks back to GPU pages
        before e is admitted, as many as leave room for the running requests' decode `reserve` (None: e
        would run alone) and e's own, and leave >= 1 token to compute. Returns the longer match (unlocked);
        the blocks loaded count as e's host hits (`Entry.host_loaded`). The copies are queued; the engine
        fences them before the step that reads them (engine/host_kv.py)."""
        ps, cache = self.page_size, self.cache
        room = self.pool.num_free + cache.num_evictable_pages
        if reserve is not None:
            room -= reserve + self._decode_reserve(e)
        limit = (len(tokens) - 1) // ps - m.num_tokens // ps
        n = min(m.host_tokens // ps, room, limit)
        if n <= 0:
            return m
        before = cache.promoted_pages
        out = cache.load(tokens, e.req.namespace, m, n)
        e.host_loaded += (cache.promoted_pages - before) * ps
        return out

    def _decode_reserve(self, e: Entry) -> int:
        """Pages admission keeps free for a running request's coming decode tokens: a share
        (`decode_reserve`) of its remaining output, and at least one page while it decodes."""
        req = e.req
        remaining = req.max_tokens - len(req.output)
        pages = -(-int(self.config.decode_reserve * remaining) // self.page_size)
        decoding = req.num_tokens - req.num_computed == 1 and req.status is Status.RUNNING
        return max(pages, 1 if decoding else 0)

    def _add_row(self, rows: BatchBuilder, e: Entry, start: int, q_len: int,
                 shared: set[ShareKey]) -> None:
        rows.add(e.req, start, q_len)
        self._share(e, start, q_len, shared)

    def _share(self, e: Entry, start: int, q_len: int, shared: set[ShareKey]) -> None:
        """In-batch sharing: when e's tokens [start, start + q_len) complete the first block past its cached
        path, that block's key joins `shared` (a waiting request whose next block it is waits a step)."""
        if not (self.config.in_batch_sharing and self._reads_cache(e)) or q_len == 1:
            return
        ps, base = self.page_size, e.locked.num_tokens
        if start + q_len >= base + ps:  # this chunk completes the first block past the cached path
            shared.add(share_key(e.locked, e.token_array(base + ps), ps))
