"""Scheduler.abort and Scheduler.abandon: a request withdrawn or a step undone leaves the pool,
the tree and the other requests exactly as consistent as before."""
from __future__ import annotations

import pytest

from radixkv import PagePool, RadixCache, SchedulerConfig
from radixkv.request import FinishReason, Request, Status
from radixkv.scheduler.scheduler import Scheduler


def _sched(num_pages: int = 32) -> Scheduler:
    pool = PagePool(num_pages)
    return Scheduler(pool, RadixCache(pool, page_size=4), SchedulerConfig(max_batch_tokens=8), 4)


def _req(rid: int, n: int = 10) -> Request:
    return Request(rid=rid, prompt=list(range(3 + rid, 3 + rid + n)), max_tokens=4)


def _tokens(batch) -> list[int | None]:
    return [7 if s else None for s in batch.sample]


def _drain(s: Scheduler) -> None:
    while s.has_work():
        b = s.schedule(0.0)
        s.update(b, _tokens(b), 0.0)


def _whole(s: Scheduler) -> None:
    s.cache.check_invariants()
    s.cache.evict(s.pool.num_pages)
    assert s.pool.num_free == s.pool.num_pages


def test_abort_a_waiting_and_a_running_request() -> None:
    s = _sched()
    a, b, c = _req(0), _req(1), _req(2)
    for r in (a, b, c):
        s.add(r, 0.0)
    batch = s.schedule(0.0)  # an 8-token budget: a's first chunk only
    s.update(batch, _tokens(batch), 0.0)
    assert a.status is Status.RUNNING and c.status is Status.WAITING
    assert s.abort(a.rid) is a and s.abort(c.rid) is c
    assert a.finish_reason is c.finish_reason is FinishReason.ABORT and not a.pages
    assert s.abort(a.rid) is None  # no longer live
    _drain(s)
    assert b.finished and len(b.output) == 4
    _whole(s)


def test_a_row_of_the_batch_in_flight_is_not_aborted() -> None:
    s = _sched()
    s.add(_req(0), 0.0)
    batch = s.schedule(0.0)
    with pytest.raises(RuntimeError, match="in flight"):
        s.abort(0)
    s.abandon(batch)
    assert s.abort(0) is not None
    _whole(s)


def test_an_abandoned_step_is_offered_again_unchanged() -> None:
    s = _sched()
    s.add(_req(0, n=6), 0.0)
    first = s.schedule(0.0)
    s.abandon(first)
    again = s.schedule(0.0)
    assert (again.input_ids, again.positions, again.slots) == (first.input_ids, first.positions, first.slots)
    with pytest.raises(ValueError):
        s.abandon(first)  # not the batch in flight any more
    s.update(again, _tokens(again), 0.0)
    _drain(s)
    _whole(s)
