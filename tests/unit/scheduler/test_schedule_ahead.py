"""Scheduler.schedule_ahead: the next decode step planned while the batch in flight runs, its
input tokens unknown on the host (Batch.follows). It declines what it cannot plan exactly, drops
rows whose request finished meanwhile, and leaves pool and tree as consistent as plain steps."""
from __future__ import annotations

import pytest

from radixkv import PagePool, RadixCache, SchedulerConfig
from radixkv.request import FinishReason, Request, Status
from radixkv.replay.simulator import fake_token
from radixkv.scheduler.scheduler import Scheduler


def _sched(num_pages: int = 32, **cfg) -> Scheduler:
    pool = PagePool(num_pages)
    return Scheduler(pool, RadixCache(pool, page_size=4), SchedulerConfig(**cfg), 4)


def _req(rid: int, n: int = 6, max_tokens: int = 6, stop: frozenset[int] = frozenset()) -> Request:
    return Request(rid=rid, prompt=list(range(3 + rid, 3 + rid + n)), max_tokens=max_tokens, stop_token_ids=stop)


def _tokens(batch) -> list[int | None]:
    """fake_token of each sampling row (called once the batch before it is updated)."""
    return [fake_token(r.rid, len(r.output)) if s else None for r, s in zip(batch.requests, batch.sample)]


def _whole(s: Scheduler) -> None:
    s.cache.check_invariants()
    assert s.cache.num_locked_pages == 0
    s.cache.evict(s.pool.num_pages)
    assert s.pool.num_free == s.pool.num_pages


def _decoding(s: Scheduler, *reqs: Request):
    """Add reqs, run their prefill step; returns the next (decode) batch, in flight."""
    for r in reqs:
        s.add(r, 0.0)
    b = s.schedule(0.0)
    s.update(b, _tokens(b), 0.0)
    return s.schedule(0.0)


def test_a_step_ahead_continues_every_row_and_gives_the_same_tokens() -> None:
    s = _sched()
    a, b = _req(0), _req(1, n=7)  # b's position 8, sampled by cur, goes to a third page
    cur = _decoding(s, a, b)
    ahead = s.schedule_ahead(0.0)
    assert ahead.follows == [0, 1] and ahead.input_ids == [0, 0]
    assert ahead.positions == cur.seq_lens and ahead.seq_lens == [n + 1 for n in cur.seq_lens]
    assert len(b.pages) == 3 and ahead.slots[1] == b.pages[2] * 4  # page allocated for position 9
    assert s.in_flight is cur and s.ahead is ahead
    with pytest.raises(RuntimeError, match="schedule_ahead"):
        s.schedule_ahead(0.0)
    with pytest.raises(RuntimeError, match="before update"):
        s.schedule(0.0)
    with pytest.raises(ValueError, match="oldest batch in flight"):
        s.update(ahead, [1, 1], 0.0)
    s.update(cur, _tokens(cur), 0.0)
    assert s.in_flight is ahead and s.ahead is None
    s.update(ahead, _tokens(ahead), 0.0)
    while s.has_work():
        bt = s.schedule(0.0)
        s.update(bt, _tokens(bt), 0.0)
    for r in (a, b):
        assert r.output == [fake_token(r.rid, i) for i in range(6)]
    _whole(s)


def test_rows_that_reach_max_tokens_now_are_left_out() -> None:
    s = _sched()
    a, b = _req(0, max_tokens=2), _req(1, max_tokens=5)
    cur = _decoding(s, a, b)  # a's second (last) token is drawn in cur
    ahead = s.schedule_ahead(0.0)
    assert [r.rid for r in ahead.requests] == [1] and ahead.follows == [1]


def _drain(s: Scheduler, cur, ahead) -> None:
    """Update cur then ahead (the engine's order), then run plain steps until no work is left."""
    s.update(cur, _tokens(cur), 0.0)
    if ahead is not None:
        s.update(ahead, [fake_token(r.rid, len(r.output)) if smp else None
                         for r, smp in zip(ahead.requests, ahead.sample)], 0.0)
    while s.has_work():
        bt = s.schedule(0.0)
        s.update(bt, _tokens(bt), 0.0)


def test_a_step_ahead_admits_waiting_requests_behind_the_rows_that_follow() -> None:
    s = _sched(max_batch_tokens=8, max_running=4)
    a, b = _req(0), _req(1)
    cur = _decoding(s, a)
    s.add(b, 0.0)
    ahead = s.schedule_ahead(0.0)
    assert [r.rid for r in ahead.requests] == [0, 1] and ahead.follows == [0]
    assert ahead.input_ids == [0, *b.prompt] and ahead.q_lens == [1, 6] and ahead.sample == [True, True]
    assert b.status is Status.RUNNING and s.num_waiting == 0
    ahead.check()
    _drain(s, cur, ahead)
    for r in (a, b):
        assert r.output == [fake_token(r.rid, i) for i in range(6)]
    _whole(s)


def test_a_step_ahead_continues_prompt_chunks_from_where_the_step_in_flight_ends() -> None:
    s = _sched(max_batch_tokens=8, max_running=4)
    a, b = _req(0), _req(1, n=20)
    cur = _decoding(s, a)
    s.update(cur, _tokens(cur), 0.0)
    s.add(b, 0.0)
    mixed = s.schedule(0.0)  # a decodes, b's first chunk of 7 does not sample
    assert mixed.q_lens == [1, 7] and mixed.sample == [True, False]
    ahead = s.schedule_ahead(0.0)
    assert ahead.follows == [0] and ahead.positions[1:] == list(range(7, 14))
    assert ahead.input_ids[1:] == b.prompt[7:14] and ahead.sample == [True, False]
    ahead.check()
    _drain(s, mixed, ahead)
    assert b.output == [fake_token(1, i) for i in range(6)]
    _whole(s)


def test_a_waiting_request_whose_next_block_the_step_in_flight_computes_waits_a_step() -> None:
    s = _sched(max_batch_tokens=64, max_running=4)
    shared = list(range(100, 112))  # three blocks of 4
    a = Request(rid=0, prompt=shared + [1, 2], max_tokens=4)
    b = Request(rid=1, prompt=shared + [3], max_tokens=4)
    s.add(a, 0.0)
    cur = s.schedule(0.0)  # a's whole prompt: its blocks are cached by cur's update
    s.add(b, 0.0)
    ahead = s.schedule_ahead(0.0)
    assert [r.rid for r in ahead.requests] == [0] and b.status is Status.WAITING
    s.update(cur, _tokens(cur), 0.0)
    nxt = s.schedule_ahead(0.0)  # now the tree holds a's blocks: b starts from them
    assert [r.rid for r in nxt.requests] == [0, 1] and b.cached_tokens == 12
    s.update(ahead, _tokens(ahead), 0.0)
    _drain(s, nxt, None)
    assert b.output == [fake_token(1, i) for i in range(4)]
    _whole(s)


def test_declines_when_a_chunk_would_need_a_preemption() -> None:
    s = _sched(num_pages=8, max_batch_tokens=5, max_running=4)
    a, b = _req(0, n=3, max_tokens=3), _req(1, n=12, max_tokens=2)
    cur = _decoding(s, a)
    s.update(cur, _tokens(cur), 0.0)
    s.add(b, 0.0)
    mixed = s.schedule(0.0)  # a's position 4 and b's first chunk of 4 take a page each
    assert mixed.q_lens == [1, 4]
    held = s.pool.alloc(s.pool.num_free)  # someone else holds the rest of the pool
    assert s.schedule_ahead(0.0) is None  # b's next chunk needs a page: a plain step preempts for it
    s.pool.decref(held)
    _drain(s, mixed, None)
    assert a.output == [fake_token(0, i) for i in range(3)] and b.output == [fake_token(1, i) for i in range(2)]
    _whole(s)


def test_declines_when_pages_run_short_and_allocates_nothing() -> None:
    s = _sched(num_pages=4)
    a, b = _req(0, n=7, max_tokens=4), _req(1, n=7, max_tokens=4)  # two pages each: positions 0..7
    cur = _decoding(s, a, b)
    assert s.pool.num_free == 0 and cur.seq_lens == [8, 8]
    held = [list(r.pages) for r in (a, b)]
    assert s.schedule_ahead(0.0) is None  # position 8 needs a page: none free, none evictable
    assert [r.pages for r in (a, b)] == held
    s.update(cur, _tokens(cur), 0.0)
    while s.has_work():  # plain steps preempt to make room
        bt = s.schedule(0.0)
        s.update(bt, _tokens(bt), 0.0)
    assert s.metrics.preemptions > 0
    for r in (a, b):
        assert r.output == [fake_token(r.rid, i) for i in range(4)]
    _whole(s)


def test_a_row_that_finished_meanwhile_is_dropped_and_its_page_freed() -> None:
    stop = fake_token(0, 1)  # a stops at its second token, drawn in cur
    s = _sched()
    a, b = _req(0, stop=frozenset({stop})), _req(1)
    cur = _decoding(s, a, b)
    ahead = s.schedule_ahead(0.0)
    assert len(ahead.requests) == 2
    done = s.update(cur, _tokens(cur), 0.0)
    assert done == [a] and a.finish_reason is FinishReason.STOP and a.pages == []
    s.update(ahead, [999, fake_token(1, 2)], 0.0)  # a's row: whatever it drew, nothing applies
    assert a.output == [fake_token(0, 0), stop] and b.output == [fake_token(1, i) for i in range(3)]
    assert b.num_computed == ahead.seq_lens[1]


def test_abort_and_finish_drop_rows_of_a_step_ahead_but_not_of_a_plain_one() -> None:
    s = _sched()
    a, b, c = _req(0), _req(1), _req(2)
    cur = _decoding(s, a, b, c)
    with pytest.raises(RuntimeError, match="in flight"):
        s.abort(a.rid)  # cur was planned by schedule(): its update would apply a's token
    ahead = s.schedule_ahead(0.0)
    s.update(cur, _tokens(cur), 0.0)
    assert s.abort(a.rid) is a and a.status is Status.FINISHED and a.pages == []
    assert s.finish(b.rid, FinishReason.STOP) is b
    assert s.update(ahead, _tokens(ahead), 0.0) == []
    assert len(a.output) == len(b.output) == 2 and len(c.output) == 3
    while s.has_work():
        bt = s.schedule(0.0)
        s.update(bt, _tokens(bt), 0.0)
    _whole(s)


def test_abandoning_the_batch_in_flight_abandons_the_step_ahead() -> None:
    s = _sched()
    a = _req(0)
    cur = _decoding(s, a)
    s.schedule_ahead(0.0)
    s.abandon(cur)
    assert s.in_flight is None and s.ahead is None
    while s.has_work():  # the same work is offered again
        bt = s.schedule(0.0)
        s.update(bt, _tokens(bt), 0.0)
    assert a.output == [fake_token(0, i) for i in range(6)]
    _whole(s)


def test_abandoning_only_the_step_ahead_keeps_the_batch_in_flight() -> None:
    s = _sched()
    cur = _decoding(s, _req(0))
    ahead = s.schedule_ahead(0.0)
    s.abandon(ahead)
    assert s.in_flight is cur and s.ahead is None
    s.update(cur, _tokens(cur), 0.0)
    assert s.in_flight is None
