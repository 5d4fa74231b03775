"""Scheduler: waiting and running queues, cache-aware admission, chunked prefill, preemption. No torch.

Each step (`schedule`) shares a token budget (`max_batch_tokens`) between
1. running requests, oldest admission first: one decode token each, or the next chunk of a
   prompt still being prefilled (chunked prefill);
2. waiting requests, admitted in policy order (policies.py) behind the starvation guard (the
   oldest request waiting longer than the bound is offered a place first), while `max_running`
   and the budget allow and free + evictable pages cover the next chunk; the first request
   that does not fit stops admission for the step (head of line: nobody jumps ahead of it).
`update` applies the step's sampled tokens, caches completed prefill chunks in the radix tree
and finishes requests.

Overlap (the engine's async scheduling): while a batch whose rows all sample runs on the device,
`schedule_ahead` emits the next decode step of the same rows before their tokens are known
(`Batch.follows`: each row's input is the previous batch's token of that row, read on the device),
so the host prepares step N+1 while the GPU runs step N. It admits nobody, preempts nobody and
leaves out rows that reach max_tokens at step N; it declines (None) when a request waits for a
place, a row still prefills, or pages run short, and the next step is scheduled after `update` as
usual. A row of a batch scheduled ahead whose request finished meanwhile (a stop token at step N,
a stop string, an abort) is dropped by that batch's `update`: the K/V it stored lies at the
position after the request's last token, in a page no tree block holds.

Page lifetime (the contract with RadixCache and PagePool):
- A running request holds one pool reference on every page in `req.pages` (one page per block
  of its computed tokens, the last possibly partial and private) and a lock on its cached path
  (`Entry.locked`), so `cache.num_evictable_pages` counts exactly the pages eviction can free.
- Completed full blocks are added to the tree after each prefill chunk and at finish, below
  the locked path (`RadixCache.extend`), and the lock moves to the longer path. Blocks another
  request cached first are swapped for the tree's pages (same tokens, same K/V) and ours freed.
- Finishing or preemption inserts the computed full blocks, unlocks the path and drops every
  reference the request holds. Nothing else holds pages, so once every request has finished
  and the cache is evicted, the pool is whole again.

Memory pressure: pages come from the free list, then from LRU eviction of unlocked cache.
When a running request still cannot get a page, the most recently admitted request is
preempted (pages released, generated tokens kept, recomputed on re-admission); a request is
never dropped. A request that could not fit the pool even alone is refused at `add`.
"""
from __future__ import annotations

import bisect
import itertools
import operator

import numpy as np

from radixkv.batch import Batch, BatchBuilder
from radixkv.cache import MatchResult, PagePool, RadixCache
from radixkv.config import Policy, SchedulerConfig
from radixkv.request import FinishReason, Request, Status

from .cascade_groups import RULE_16BIT, CascadeRule, find_cascade_groups
from .entry import Entry, ShareKey, share_key, worst_case_pages
from .metrics import SchedulerMetrics
from .policies import AdmissionRanker

class Scheduler:
    """Decides each step's work; see the module docstring for the page lifetime rules."""

    def __init__(self, pool: PagePool, cache: RadixCache, config: SchedulerConfig,
                 page_size: int, cascade_rule: CascadeRule = RULE_16BIT) -> None:
        """cascade_rule: when a group of decode rows is worth a cascade launch (cascade_groups.rule_for
        of the KV dtype), used only with config.cascade."""
        if cache.page_size != page_size:
            raise ValueError(f"page_size {page_size} differs from the cache's {cache.page_size}")
        if cache.pool is not pool:
            raise ValueError("the cache must be built over the scheduler's pool")
        self.pool = pool
        self.cache = cache
        self.config = config
        self.page_size = page_size
        self.metrics = SchedulerMetrics()
        self.waiting: list[Entry] = []  # sorted by (arrival, seq)
        self.running: list[Entry] = []  # admission order, oldest first
        self._entries: dict[int, Entry] = {}  # rid -> live entry
        self._seq = itertools.count()
        self._admit_seq = itertools.count()
        self._step = 0
        self._ranker = AdmissionRanker(config.policy, config.match_budget, self._match, self._match_all)
        self._inflight: Batch | None = None  # the oldest batch not yet updated
        self._ahead: Batch | None = None  # the batch scheduled ahead of it (schedule_ahead)
        self.cascade_rule = cascade_rule

    # ---- queue --------------------------------------------------------------------------------
    def add(self, req: Request, now: float) -> None:
        """Queue a fresh request (WAITING). Raises ValueError, changing nothing, when it is not
        fresh, its rid is live, or it could not fit the pool even alone."""
        if req.rid in self._entries:
            raise ValueError(f"request {req.rid} is already queued or running")
        if req.status is not Status.WAITING or req.output or req.num_computed or req.pages:
            raise ValueError(f"request {req.rid} is not fresh: status {req.status.value}, "
                             f"{len(req.output)} output tokens, {len(req.pages)} pages")
        ps = self.page_size
        worst = worst_case_pages(req, ps)
        if worst > self.pool.num_pages:
            raise ValueError(f"request {req.rid} needs up to {worst} pages ({len(req.prompt)} prompt "
                             f"+ {req.max_tokens} max_tokens, page_size {ps}) but the pool has "
                             f"{self.pool.num_pages}")
        try:
            arr = np.asarray(req.prompt, dtype=np.int32)
        except (OverflowError, TypeError, ValueError) as err:
            raise ValueError(f"request {req.rid}: prompt tokens must be int32 ids: {err}") from None
        if arr.ndim != 1 or (arr.size and int(arr.min()) < 0):
            raise ValueError(f"request {req.rid}: prompt must be a flat list of non-negative ids")
        e = Entry(req, next(self._seq), now, self._step, arr, wait_since=now)
        if self.config.policy is not Policy.FCFS:
            self._match(e)  # a score from the start: rounds then only refresh
        self._entries[req.rid] = e
        bisect.insort(self.waiting, e, key=Entry.order_key)

    def abort(self, rid: int) -> Request | None:
        """Withdraw a waiting or running request now: its computed full blocks are cached, its
        pages and lock released; it ends FINISHED with FinishReason.ABORT. None when rid is not
        live. Refused (RuntimeError, nothing changed) for a row of the batch in flight: `update`
        or `abandon` that batch first; a batch scheduled ahead drops the row instead."""
        self._refuse_in_flight(rid)
        e = self._entries.pop(rid, None)
        if e is None:
            return None
        req = e.req
        if req.status is Status.RUNNING:
            self._release(e)
            self.running.remove(e)
        else:
            self.waiting.remove(e)
        req.status = Status.FINISHED
        req.finish_reason = FinishReason.ABORT
        return req

    def finish(self, rid: int, reason: FinishReason) -> Request:
        """End a running request now as a natural finish (the engine found a stop string in its
        text): cached, released and counted as completed, like a stop token. Refused (RuntimeError)
        for a row of the batch in flight (not one scheduled ahead), ValueError unless rid is running."""
        self._refuse_in_flight(rid)
        e = self._entries.get(rid)
        if e is None or e.req.status is not Status.RUNNING:
            raise ValueError(f"request {rid} is not running")
        self._finish(e)
        e.req.finish_reason = reason
        return e.req

    def _refuse_in_flight(self, rid: int) -> None:
        """RuntimeError when rid is a row of an in-flight batch that was not scheduled ahead (its
        update would then apply a token to a request that no longer runs)."""
        for batch in (self._inflight, self._ahead):
            if batch is not None and batch.follows is None and any(r.rid == rid for r in batch.requests):
                raise RuntimeError(f"request {rid} is in the batch in flight; update() or abandon() it first")

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    @property
    def in_flight(self) -> Batch | None:
        """The oldest batch `schedule` or `schedule_ahead` returned that has not been updated or
        abandoned yet."""
        return self._inflight

    @property
    def ahead(self) -> Batch | None:
        """The batch `schedule_ahead` returned while `in_flight` ran, until in_flight's update makes it
        the one in flight."""
        return self._ahead

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def num_running(self) -> int:
        return len(self.running)

    # ---- one step -----------------------------------------------------------------------------
    def schedule(self, now: float) -> Batch | None:
        """The next step's work, or None when nothing can run. Call `update` before the next."""
        if self._inflight is not None:
            raise RuntimeError("schedule() called again before update() of the previous batch")
        self._step += 1
        rows = BatchBuilder(self.page_size)
        shared: set[ShareKey] = set()
        budget = self.config.max_batch_tokens
        i = 0
        while i < len(self.running) and budget > 0:
            e = self.running[i]
            start = e.req.num_computed
            q_len = self._grow(e, min(e.req.num_tokens - start, budget), i, now)
            if q_len == 0:  # no page even after preempting every newer request
                self._preempt(e, now)
                continue
            self._add_row(rows, e, start, q_len, shared)
            budget -= q_len
            i += 1
        if budget > 0 and self.waiting and len(self.running) < self.config.max_running:
            self._admit(rows, budget, shared, now)  # all-or-nothing when it raises
        if not rows.requests:
            return None
        batch = rows.build()
        if self.config.cascade and len(batch.requests) > 1:
            batch.cascade = find_cascade_groups(batch.page_tables, batch.seq_lens, self.page_size,
                                                rule=self.cascade_rule, q_lens=batch.q_lens)
        self._inflight = batch
        return batch

    def schedule_ahead(self, now: float) -> Batch | None:
        """While the batch in flight runs: the next decode step of its rows, their input tokens still on
        the device (Batch.follows), or None when it cannot be planned now (see the module docstring).
        Call it at most once per batch in flight; the batch it returns is updated after that one."""
        cur = self._inflight
        if cur is None or self._ahead is not None:
            raise RuntimeError("schedule_ahead() needs one batch in flight and none scheduled ahead of it")
        cfg, ps = self.config, self.page_size
        # rows of cur whose request still runs (a step ahead keeps rows that finished before it is updated)
        live = [b for b, r in enumerate(cur.requests) if r.status is Status.RUNNING]
        if (not all(cur.sample) or len(live) != len(self.running)
                or any(e.req is not cur.requests[b] for e, b in zip(self.running, live))
                or (self.waiting and len(self.running) < cfg.max_running)):
            return None
        rows = [b for b in live if len(cur.requests[b].output) + 1 < cur.requests[b].max_tokens]
        if not rows or len(rows) > cfg.max_batch_tokens:
            return None
        reqs = [cur.requests[b] for b in rows]
        positions = [cur.seq_lens[b] for b in rows]  # of the token step N samples
        short = [r for r, p in zip(reqs, positions) if p >= len(r.pages) * ps]
        if short and self._room(len(short)) < len(short):
            return None
        for r, page in zip(short, self.pool.alloc(len(short))):
            r.pages.append(page)
        n = len(rows)
        batch = Batch(reqs, [0] * n, positions, list(range(n)), [1] * n, [p + 1 for p in positions],
                      [r.pages for r in reqs], [r.pages[p // ps] * ps + p % ps for r, p in zip(reqs, positions)],
                      [True] * n, ps, follows=rows)
        if cfg.cascade and n > 1:
            batch.cascade = find_cascade_groups(batch.page_tables, batch.seq_lens, ps, rule=self.cascade_rule,
                                                q_lens=batch.q_lens)
        self._step += 1
        self._ahead = batch
        return batch

    def abandon(self, batch: Batch) -> None:
        """The step of `batch` failed before `update`: it never happened. Its rows keep their
        pages and computed tokens; the K/V the failed step may have stored lies past each row's
        computed tokens, in pages the row owns alone (never a cached block), and is written again
        when the next `schedule` offers the same work. Abandoning the batch in flight abandons the
        batch scheduled ahead of it too (its inputs were that batch's tokens)."""
        if batch is self._ahead and batch is not None:
            self._ahead = None
            return
        if batch is not self._inflight:
            raise ValueError("abandon() takes the batch returned by the last schedule() (or schedule_ahead())")
        self._inflight = self._ahead = None

    def update(self, batch: Batch, tokens: list[int | None], now: float) -> list[Request]:
        """Apply a step's results: tokens[b] is row b's sampled token when batch.sample[b]
        (None otherwise). Returns the requests that finished this step."""
        if batch is not self._inflight:
            raise ValueError("update() takes the batch returned by the last schedule() (with schedule_ahead(): "
                             "the oldest batch in flight)")
        if len(tokens) != len(batch.requests):
            raise ValueError(f"update() got {len(tokens)} tokens for {len(batch.requests)} rows")
        for b, (s, t) in enumerate(zip(batch.sample, tokens)):
            if s and t is None:
                raise ValueError(f"row {b} (request {batch.requests[b].rid}) samples but got no token")
            if s:
                operator.index(t)  # TypeError for a non-integer token
        self._inflight, self._ahead = self._ahead, None
        finished: list[Request] = []
        for b, req in enumerate(batch.requests):
            e = self._entries.get(req.rid)
            if e is None or e.req is not req:  # scheduled ahead, and finished or aborted since
                continue
            req.num_computed = batch.seq_lens[b]
            if batch.sample[b] and req.append_token(operator.index(tokens[b])):
                self._finish(e)
                finished.append(req)
                continue
            if batch.q_lens[b] > 1 or not batch.sample[b]:  # a prefill chunk
                self._cache_progress(e)
        self.metrics.record_step(now, self.pool.num_used)
        return finished

    # ---- admission ----------------------------------------------------------------------------
    def _starved(self, e: Entry, now: float) -> bool:
        cfg = self.config
        return ((cfg.starvation_s is not None and now - e.arrival > cfg.starvation_s)
                or (cfg.starvation_steps is not None
                    and self._step - e.arrival_step > cfg.starvation_steps))

    def _match(self, e: Entry) -> None:
        """Match a queued request against the tree now; the ranker orders by the result."""
        tokens = e.waiting_tokens() if self.config.prefix_caching else e.prompt_arr[:0]
        m = e.last = self.cache.match(tokens, e.req.namespace, since=e.last)
        e.score, e.node = m.num_tokens, m.node

    def _match_all(self, entries: list[Entry]) -> None:
        """_match for each of entries, in order, through one RadixCache.match_many call."""
        if self.config.prefix_caching:
            queries = [(e.prompt_arr if not e.req.output else e.waiting_tokens(), e.req.namespace, e.last)
                       for e in entries]
        else:
            queries = [(e.prompt_arr[:0], e.req.namespace, e.last) for e in entries]
        for e, m in zip(entries, self.cache.match_many(queries)):
            e.last = m
            e.score, e.node = m.num_tokens, m.node

    def _lookup(self, tokens: np.ndarray, namespace: str | None, since: MatchResult | None = None) -> MatchResult:
        """The cached prefix of tokens; with prefix caching off, always the empty one. `since`: the
        request's previous match (while it still holds, re-checking it skips the walk)."""
        return self.cache.match(tokens if self.config.prefix_caching else tokens[:0], namespace, since=since)

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
        self.cache.unlock(e.locked)
        e.locked = None
        self.pool.decref(req.pages)
        req.pages = []
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
            m = e.last = self._lookup(tokens, req.namespace, e.last)
            usable = min(m.num_tokens, (total - 1) // ps * ps)  # leave >= 1 token to compute
            if (cfg.in_batch_sharing and cfg.prefix_caching and shared and usable == m.num_tokens
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
            pages = m.pages[: usable // ps]
            pool.incref(pages)
            req.pages = pages
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
            e.wait_s += now - e.wait_since
        if admitted:
            ids = {id(e) for e, _ in admitted}
            self.waiting = [e for e in self.waiting if id(e) not in ids]

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
        if not (self.config.in_batch_sharing and self.config.prefix_caching) or q_len == 1:
            return
        ps, base = self.page_size, e.locked.num_tokens
        if start + q_len >= base + ps:  # this chunk completes the first block past the cached path
            shared.add(share_key(e.locked, e.token_array(base + ps), ps))

    # ---- pages --------------------------------------------------------------------------------
    def _room(self, pages: int) -> int:
        """Evict LRU cache until `pages` are free if possible; returns the free count."""
        free = self.pool.num_free
        if free < pages and self.cache.num_evictable_pages:
            self.cache.evict(pages - free)
            free = self.pool.num_free
        return free

    def _grow(self, e: Entry, want: int, index: int, now: float) -> int:
        """Give running[index] pages for up to `want` more tokens; returns how many it got.

        A prefill chunk shrinks to the pages there are; when not even one token fits, newer
        requests (running[index + 1:], newest first) are preempted. 0 means still no room."""
        req, ps = e.req, self.page_size
        have = len(req.pages) * ps - req.num_computed  # free slots in pages it holds
        while True:
            if want <= have:
                return want
            free = self._room(-(-(want - have) // ps))
            q_len = min(want, have + free * ps)
            if q_len > 0:
                req.pages.extend(self.pool.alloc(-(-(q_len - have) // ps)))
                return q_len
            if len(self.running) - 1 <= index:
                return 0
            self._preempt(self.running[-1], now)

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
        self.cache.unlock(e.locked)
        e.locked = None
        self.pool.decref(e.req.pages)
        e.req.pages = []

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
        theirs: list[int] = []
        ours: list[int] = []
        for i, page in enumerate(m.pages, start):
            if pages[i] != page:
                theirs.append(page)
                ours.append(pages[i])
                pages[i] = page
        if ours:
            self.pool.incref(theirs)
            self.pool.decref(ours)
