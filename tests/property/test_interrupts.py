"""A KeyboardInterrupt at any bytecode boundary inside the page pool (issue 33 item 3).

`Interrupt(k)` raises KeyboardInterrupt before the k-th bytecode executed in the pool's code
(cache/pages.py: the operation and every helper it calls), as a Ctrl-C landing there would. For every
k up to the operation's length:
- each pool operation leaves the pool exactly as before it or exactly as after it, invariants whole,
  and a holder's list of pages moves with the references (never a page held by nobody);
- the scheduler (Hypothesis workloads of test_scheduler_props) survives an interrupt inside any pool
  call it makes while scheduling: every reference is accounted for at once (the tree's, and one per
  occurrence in a live request's pages), every request then completes with the right tokens, and no
  page is leaked.
"""
from __future__ import annotations

import copy
import sys
from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, event, given, settings
from hypothesis import strategies as st

import radixkv.cache.pages as pages_module
from radixkv import PagePool, RadixCache
from radixkv.request import Status
from radixkv.replay.simulator import fake_token
from radixkv.scheduler.scheduler import Scheduler

from test_scheduler_props import expected_output, workloads

POOL_FILE = pages_module.__file__
SCHEDULER_DIR = Scheduler.__module__  # frames of radixkv.scheduler.* call the pool


class Interrupt:
    """Raise KeyboardInterrupt before the k-th bytecode run in pages.py (k >= 1); with `callers`, only
    in pool calls made from a module whose name starts with it (nested pool helpers included).
    Raising from the trace function also unsets it, so it fires once."""

    def __init__(self, k: int, callers: str | None = None) -> None:
        self.k, self.callers, self.count, self.fired = k, callers, 0, False

    def _call(self, frame, event, arg):
        if frame.f_code.co_filename != POOL_FILE:
            return None
        if self.callers is not None:
            outer = frame.f_back
            while outer is not None and outer.f_code.co_filename == POOL_FILE:
                outer = outer.f_back
            if outer is None or not outer.f_globals.get("__name__", "").startswith(self.callers):
                return None
        frame.f_trace_opcodes = True
        return self._opcode

    def _opcode(self, frame, event, arg):
        if event == "opcode":
            self.count += 1
            if self.count == self.k:
                self.fired = True
                raise KeyboardInterrupt(f"injected before bytecode {self.k} of the pool")
        return self._opcode

    def __enter__(self) -> Interrupt:
        sys.settrace(self._call)
        return self

    def __exit__(self, *exc) -> None:
        sys.settrace(None)


class Holder:
    def __init__(self, pages: list[int]) -> None:
        self.pages = pages


def _snapshot(pool: PagePool, lists: list[list[int]], holders: list[Holder]) -> tuple:
    return (pool._refs.tolist(), pool._free[: pool._top].tolist(),
            [list(x) for x in lists], [list(h.pages) for h in holders])


def _setup() -> tuple[PagePool, list[list[int]], list[Holder]]:
    """A pool of 12 pages: a holds 3, b holds 2 (one shared with a), the rest free; c is empty."""
    pool = PagePool(12)
    a = pool.alloc(3)
    b = pool.alloc(1)
    pool.incref(a[1:2])
    b = [a[1]] + b
    return pool, [a, b, []], [Holder(list(a)), Holder(list(b)), Holder([])]


OPS: dict[str, Callable[[PagePool, list[list[int]], list[Holder]], object]] = {
    "alloc": lambda pool, ls, hs: pool.alloc(4),
    "alloc_array": lambda pool, ls, hs: pool.alloc_array(4),
    "alloc_into": lambda pool, ls, hs: pool.alloc_into(ls[0], 4),
    "alloc_each": lambda pool, ls, hs: pool.alloc_each([ls[0], ls[2]]),
    "incref": lambda pool, ls, hs: pool.incref(ls[0] + ls[0][:1]),
    "decref": lambda pool, ls, hs: pool.decref(ls[1]),
    "decref_dup": lambda pool, ls, hs: pool.decref(ls[0][1:2] * 2),
    "decref_distinct": lambda pool, ls, hs: pool.decref_distinct(np.array(ls[0], dtype=np.int64)),
    "adopt": lambda pool, ls, hs: pool.adopt(hs[2], ls[0][:2]),
    "release": lambda pool, ls, hs: pool.release(hs[0]),
    "release_shared": lambda pool, ls, hs: pool.release(hs[1]),
    "exchange": lambda pool, ls, hs: pool.exchange(ls[0], [0, 2], [ls[1][1], ls[0][1]]),
}


@pytest.mark.parametrize("op", sorted(OPS))
def test_every_pool_operation_is_all_or_nothing_at_every_bytecode(op: str) -> None:
    pool, lists, holders = _setup()
    before = _snapshot(pool, lists, holders)
    OPS[op](pool, lists, holders)
    pool.check_invariants()
    after = _snapshot(pool, lists, holders)
    assert after != before
    k = 0
    while True:
        k += 1
        pool, lists, holders = _setup()
        with Interrupt(k) as trap:
            try:
                OPS[op](pool, lists, holders)
            except KeyboardInterrupt:
                assert trap.fired
        if not trap.fired:
            break  # k is past the operation's last bytecode: every boundary was tried
        pool.check_invariants()
        got = _snapshot(pool, lists, holders)
        assert got in (before, after), f"{op}: an interrupt before bytecode {k} left a half-done pool"
    assert k > 10


def _references_add_up(s: Scheduler, pool: PagePool, cache: RadixCache) -> None:
    """Every page's refcount is the tree's reference plus one per occurrence in a live request's
    pages (no page held by nobody, none listed without its reference)."""
    cache.check_invariants()
    want = np.zeros(pool.num_pages, dtype=np.int64)
    for root in cache._roots.values():
        stack = list(root.iter_children())
        while stack:
            node = stack.pop()
            stack.extend(node.iter_children())
            want[node.pages] += 1
    for e in s.running + s.waiting:
        np.add.at(want, np.asarray(e.req.pages, dtype=np.int64), 1)
        if e.req.status is Status.WAITING:
            assert not e.req.pages and e.locked is None, f"waiting request {e.req.rid} holds pages"
    got = pool.refcounts(range(pool.num_pages))
    bad = np.flatnonzero(got != want)
    assert bad.size == 0, (f"page {int(bad[0])}: refcount {int(got[bad[0]])}, "
                           f"{int(want[bad[0]])} holders" if bad.size else "")


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow],
          phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink])  # no explain: it traces too
@given(workloads(), st.integers(1, 3000), st.booleans())
def test_an_interrupt_inside_the_schedulers_pool_calls_loses_nothing(work, k, ahead) -> None:
    """Steps as the engine runs them (schedule, maybe schedule_ahead, update); the k-th bytecode of the
    pool calls the scheduler makes in schedule / schedule_ahead raises KeyboardInterrupt. The engine
    then drops the step (a failed schedule leaves nothing in flight; a failed schedule_ahead leaves
    the batch in flight alone) and steps on."""
    reqs, arrivals, ps, num_pages, cfg = work
    reqs = copy.deepcopy(reqs)
    pool = PagePool(num_pages)
    cache = RadixCache(pool, page_size=ps)
    s = Scheduler(pool, cache, cfg, ps)
    pending = sorted(reqs, key=lambda r: arrivals[r.rid])
    trap = Interrupt(k, callers="radixkv.scheduler")
    now, cur, step, fired = 0.0, None, 0, False
    sys.settrace(trap._call)
    try:
        while pending or s.has_work() or cur is not None:
            while pending and arrivals[pending[0].rid] <= now:
                s.add(pending.pop(0), now)
            step += 1
            assert step < 2000, "no progress"
            nxt = None
            try:
                if cur is None:
                    cur = s.schedule(now)
                    if cur is None:
                        assert not s.has_work() and pending, "stalled with work left"
                        now = arrivals[pending[0].rid]
                        continue
                if ahead:
                    nxt = s.schedule_ahead(now)
            except KeyboardInterrupt:
                sys.settrace(None)
                assert trap.fired and not fired
                fired = True
                assert s.ahead is None and (s.in_flight is None) == (cur is None)
                _references_add_up(s, pool, cache)
                continue
            if not fired:
                sys.settrace(None)  # nothing traced in update (not a stage this test interrupts)
            now += 1.0
            tokens = [fake_token(r.rid, len(r.output)) if smp else None for r, smp in zip(cur.requests, cur.sample)]
            s.update(cur, tokens, now)
            if not fired:
                sys.settrace(trap._call)
            cur = nxt
            _references_add_up(s, pool, cache)
    finally:
        sys.settrace(None)
    event(f"interrupted: {fired}")
    for r in reqs:
        assert r.status is Status.FINISHED and r.pages == []
        assert r.output == expected_output(r)
    assert cache.num_locked_pages == 0
    cache.evict(cache.num_cached_pages)
    assert pool.num_free == num_pages
