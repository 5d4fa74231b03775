"""The step policy (issue 31 item 2): running decode rows go first every step and prompt chunks fill what is
left of the token budget, so a long prompt delays the decode rows by at most one budget's worth."""
from __future__ import annotations

import random

from radixkv import PagePool, RadixCache, SchedulerConfig
from radixkv.request import Request, Status
from radixkv.scheduler.scheduler import Scheduler


def _sched(num_pages: int, budget: int, page_size: int = 4) -> Scheduler:
    pool = PagePool(num_pages)
    return Scheduler(pool, RadixCache(pool, page_size=page_size), SchedulerConfig(max_batch_tokens=budget), page_size)


def _tokens(batch) -> list[int | None]:
    return [7 if s else None for s in batch.sample]


def test_an_older_prefilling_request_never_takes_a_decode_rows_place() -> None:
    s = _sched(64, budget=8)
    short = Request(rid=0, prompt=list(range(3, 8)), max_tokens=20)
    s.add(short, 0.0)
    b = s.schedule(0.0)
    s.update(b, _tokens(b), 0.0)  # short decodes from now on
    long = Request(rid=1, prompt=list(range(100, 140)), max_tokens=2)
    s.add(long, 0.0)
    b = s.schedule(0.0)
    assert b.requests == [short, long] and b.q_lens == [1, 7]
    s.update(b, _tokens(b), 0.0)
    s.running.reverse()  # as if the prefilling request were the older one
    for _ in range(4):
        b = s.schedule(0.0)
        assert b.requests[0] is short and b.q_lens[0] == 1  # the decode row, first, every step
        assert b.requests[1] is long and b.q_lens[1] == 7  # the chunk: what the budget leaves
        s.update(b, _tokens(b), 0.0)


def test_decode_rows_lead_every_batch_under_pressure() -> None:
    rng = random.Random(3)
    s = _sched(40, budget=24)
    rid = 0
    for step in range(400):
        if step < 200 and rng.random() < 0.3:
            n = rng.choice([3, 9, 30, 70])
            s.add(Request(rid=rid, prompt=[rng.randrange(3, 50) for _ in range(n)], max_tokens=rng.randint(1, 12)), 0.0)
            rid += 1
        if not s.has_work():
            continue
        decoding = [e.req for e in s.running if e.req.num_tokens - e.req.num_computed == 1]
        preempted = s.metrics.preemptions
        b = s.schedule(0.0)
        if b is None:
            continue
        b.check()
        lead = 0
        while lead < len(b.requests) and b.requests[lead] in decoding:
            lead += 1
        assert all(r not in decoding for r in b.requests[lead:]), "a decode row after a prompt chunk"
        assert b.q_lens[:lead] == [1] * lead
        if s.metrics.preemptions == preempted and len(decoding) <= 24:
            assert lead == len(decoding)  # every decoding request got its token
        assert sum(b.q_lens) <= 24
        s.update(b, _tokens(b), 0.0)
    while s.has_work():
        b = s.schedule(0.0)
        s.update(b, _tokens(b), 0.0)
    assert all(e.req.status is not Status.RUNNING for e in s.running)
    s.cache.check_invariants()
    s.cache.evict(s.pool.num_pages)
    assert s.pool.num_free == s.pool.num_pages
