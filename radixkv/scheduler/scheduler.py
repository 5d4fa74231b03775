"""Scheduler: waiting and running queues, cache-aware admission, chunked prefill, preemption. No torch.

Each step (`schedule`) shares a token budget (`max_batch_tokens`) between
1. running requests that decode, oldest admission first: one token each (they lead the batch);
2. running requests still prefilling, oldest admission first: the next chunk of the prompt, as much
   of it as the budget left allows (chunked prefill), so a long prompt delays the decode rows by at
   most one budget's worth of tokens a step;
3. waiting requests, admitted in policy order (policies.py) behind the starvation guard (the
   oldest request waiting longer than the bound is offered a place first), while `max_running`
   and the budget allow and free + evictable pages cover the next chunk; the first request
   that does not fit stops admission for the step (head of line: nobody jumps ahead of it).
`update` applies the step's sampled tokens, caches completed prefill chunks in the radix tree
and finishes requests.

Overlap (the engine's async scheduling): while a batch runs on the device, `schedule_ahead` plans the
step after it before its tokens are known, as `schedule` would once that batch is updated: the rows that
sample in it continue as decode rows whose input is its token of that row, read on the device
(`Batch.follows`; they lead the batch), its other rows with their next prompt chunk, then running requests
it left out, then admission, on the same budget. So the host prepares step N+1 (admissions, chunks and all)
while the GPU runs step N. Differences from `schedule`: it preempts nobody (when a row would need it, it
declines: None, and the next step is scheduled after `update` as usual); rows that reach max_tokens at step N
are left out; blocks step N computes are not cached until its update, so a waiting request whose next block
step N computes waits a step (in-batch sharing's rule), and pages step N's finishing requests free are not
free yet. A row of a batch scheduled ahead whose request finished meanwhile (a stop token at step N, a stop
string, an abort) is dropped by that batch's `update`: the K/V it stored lies past the request's computed
tokens, in a page no tree block holds.

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

Host tier (a RadixCache with a host pool and a mover, issue 37): GPU eviction demotes blocks to host pages
instead of dropping them; admission loads the host blocks a waiting request's match reaches back onto GPU
pages before admitting it (admission.py `_load_host`: as many as the pool spares beyond the running
requests' decode reserve), so the request starts from the longer GPU match; the engine orders the copies
before the step (engine/host_kv.py).

Files: this one (the queues and the step), admission.py (who joins a step), page_holding.py (pages a
running request holds: grown, preempted, released).
"""
from __future__ import annotations

import bisect
import itertools
import operator

import numpy as np

from radixkv.batch import Batch, BatchBuilder
from radixkv.cache import PagePool, RadixCache
from radixkv.config import Policy, SchedulerConfig
from radixkv.request import FinishReason, Request, Status

from .admission import Admission
from .cascade_groups import RULE_16BIT, CascadeRule, find_cascade_groups
from .entry import Entry, ShareKey, worst_case_pages
from .metrics import SchedulerMetrics
from .policies import AdmissionRanker


class Scheduler(Admission):
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
        scheduled: set[int] = set()  # ids of the entries with a row in this step (never preempted for another)
        for decoding in (True, False):  # decode rows first, then prefill chunks in what is left
            i = 0
            while i < len(self.running) and budget > 0:
                e = self.running[i]
                start = e.req.num_computed
                if (e.req.num_tokens - start == 1) != decoding or id(e) in scheduled:
                    i += 1
                    continue
                q_len = self._grow(e, min(e.req.num_tokens - start, budget), i, now, scheduled)
                if q_len == 0:  # no page even after preempting every newer request not in this step
                    self._preempt(e, now)
                    continue
                self._add_row(rows, e, start, q_len, shared)
                scheduled.add(id(e))
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
        """While the batch in flight runs: the next step, planned as `schedule` would plan it once that batch's
        update has run, or None when it cannot be planned now (see the module docstring). The in-flight batch's
        sampling rows continue as decode rows whose input is still on the device (Batch.follows; they lead the
        batch), its other rows with their next prompt chunk, then running requests it left out, then admission.
        Call it at most once per batch in flight; the batch it returns is updated after that one."""
        cur = self._inflight
        if cur is None or self._ahead is not None:
            raise RuntimeError("schedule_ahead() needs one batch in flight and none scheduled ahead of it")
        cfg, ps = self.config, self.page_size
        row_of = {id(r): b for b, r in enumerate(cur.requests)}
        drawn_of = list(itertools.accumulate(cur.sample, initial=0))  # row -> its index in cur's drawn tokens
        # decode rows whose input is cur's token of their row: requests, positions, indices in cur's drawn tokens
        follow: list[Request] = []
        positions: list[int] = []
        drawn: list[int] = []
        decode: list[Entry] = []  # decode rows cur left out: input on the host
        chunks: list[tuple[Entry, int]] = []  # (entry, first position): prompt chunks
        for e in self.running:
            req = e.req
            b = row_of.get(id(req))
            if b is None:
                (decode.append(e) if req.num_tokens - req.num_computed == 1 else chunks.append((e, req.num_computed)))
            elif not cur.sample[b]:
                chunks.append((e, cur.seq_lens[b]))
            elif len(req.output) + 1 < req.max_tokens:  # else its last token is drawn in cur
                follow.append(req)
                positions.append(cur.seq_lens[b])
                drawn.append(drawn_of[b])
        budget = cfg.max_batch_tokens - len(follow) - len(decode)
        if budget < 0 or not (follow or decode or chunks or self.waiting):
            return None
        short = [r for r, p in zip(follow, positions) if p >= len(r.pages) * ps]
        short += [e.req for e in decode if e.req.num_computed >= len(e.req.pages) * ps]
        if short and self._room(len(short)) < len(short):
            return None  # a plain step preempts to make room
        self.pool.alloc_each([r.pages for r in short])  # a page each, theirs in the same step
        rows = BatchBuilder(ps)
        shared: set[ShareKey] = set()
        rows.follow(follow, positions, drawn)
        for e in decode:
            self._add_row(rows, e, e.req.num_computed, 1, shared)
        # blocks cur computes are cached only by its update: a waiting request that would hit them waits a step
        for b, q_len in enumerate(cur.q_lens):
            if q_len == 1:
                continue
            r = cur.requests[b]
            e = self._entries.get(r.rid)
            if e is not None and e.req is r and r.status is Status.RUNNING:
                self._share(e, cur.seq_lens[b] - q_len, q_len, shared)
        for e, start in chunks:
            if budget <= 0:
                break
            q_len = self._grow_from(e, start, min(e.req.num_tokens - start, budget))
            if q_len == 0:
                return None  # (the pages taken stay the rows' own: the next plain step uses them)
            self._add_row(rows, e, start, q_len, shared)
            budget -= q_len
        if budget > 0 and self.waiting and len(self.running) < cfg.max_running:
            self._admit(rows, budget, shared, now)  # never preempts: each admission is the newest row
        if not rows.requests:
            return None
        batch = rows.build(ahead=True)
        if cfg.cascade and len(batch.requests) > 1:
            batch.cascade = find_cascade_groups(batch.page_tables, batch.seq_lens, ps, rule=self.cascade_rule,
                                                q_lens=batch.q_lens)
        self._step += 1
        self._ahead = batch
        return batch

    def _grow_from(self, e: Entry, start: int, want: int) -> int:
        """Pages for up to `want` tokens of e from position `start` (past what cur computes), evicting cache but
        preempting nobody; returns how many tokens fit (a chunk shrinks to the pages there are)."""
        ps, pages = self.page_size, e.req.pages
        have = len(pages) * ps - start
        if want <= have:
            return want
        free = self._room(-(-(want - have) // ps))
        q_len = min(want, have + free * ps)
        if q_len > 0:
            self.pool.alloc_into(pages, -(-(q_len - have) // ps))
        return max(q_len, 0)

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
