"""Hypothesis: random arrivals into a tiny pool, every policy and budget.

Checks that every request completes with the tokens an unconstrained run gives, that every
batch reads only K/V of its own prefix and writes only private pages (KVShadow), that the pool
and tree invariants hold after every step, that no page leaks, that cached_tokens survives
preemption, and the starvation bound: while a request has waited longer than the bound, every
step that admits a later arrival also admits the oldest starved request.
"""
from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from radixkv import PagePool, Policy, RadixCache, SchedulerConfig
from radixkv.batch import Batch
from radixkv.request import Request, Status
from radixkv.scheduler.entry import worst_case_pages
from radixkv.scheduler.scheduler import Scheduler
from radixkv.replay.simulator import KVShadow, fake_token

PREFIXES = ([1, 2, 3, 4, 5, 6, 7, 8], [1, 2, 3, 4, 9, 9], [5, 5, 5, 5, 5])


@st.composite
def workloads(draw):
    ps = draw(st.sampled_from([1, 2, 4]))
    reqs, arrivals = [], {}
    for rid in range(draw(st.integers(1, 8))):
        prompt = list(draw(st.sampled_from(PREFIXES)))[: draw(st.integers(0, 8))]
        prompt += draw(st.lists(st.integers(0, 3), min_size=0 if prompt else 1, max_size=5))
        max_tokens = draw(st.integers(1, 5))
        stop = draw(st.none() | st.integers(0, max_tokens - 1))
        stops = frozenset() if stop is None else frozenset({fake_token(rid, stop)})
        reqs.append(Request(rid, prompt, max_tokens, namespace=draw(st.sampled_from([None, "b"])),
                            stop_token_ids=stops))
        arrivals[rid] = float(draw(st.integers(0, 6)))
    worst = max(worst_case_pages(r, ps) for r in reqs)
    num_pages = worst + draw(st.integers(0, 6))
    cfg = SchedulerConfig(
        policy=draw(st.sampled_from(list(Policy))),
        max_batch_tokens=draw(st.integers(1, 12)),
        max_running=draw(st.integers(1, 4)),
        starvation_steps=draw(st.none() | st.integers(1, 6)),
        starvation_s=draw(st.none() | st.sampled_from([0.5, 2.0, 5.0])),
        in_batch_sharing=draw(st.booleans()),
        decode_reserve=draw(st.sampled_from([0.0, 0.5, 1.0])),
        policy_window=draw(st.sampled_from([1, 3, 4096])),
        match_budget=draw(st.sampled_from([1, 2, 256])))
    return reqs, arrivals, ps, num_pages, cfg


def expected_output(r: Request) -> list[int]:
    out = []
    for i in range(r.max_tokens):
        out.append(fake_token(r.rid, i))
        if out[-1] in r.stop_token_ids:
            break
    return out


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads())
def test_random_arrivals_into_a_tiny_pool(work):
    reqs, arrivals, ps, num_pages, cfg = work
    pool = PagePool(num_pages)
    cache = RadixCache(pool, page_size=ps)
    s = Scheduler(pool, cache, cfg, ps)
    shadow = KVShadow(pool, ps)
    added: dict[int, tuple[float, int]] = {}  # rid -> (arrival time, steps scheduled before)
    first_cached: dict[int, int] = {}
    pending = sorted(reqs, key=lambda r: arrivals[r.rid])
    step, now, running = 0, 0.0, set()
    while pending or s.has_work():
        while pending and arrivals[pending[0].rid] <= now:
            r = pending.pop(0)
            s.add(r, now)
            added[r.rid] = (now, step)
        batch = s.schedule(now)
        step += 1
        assert step < 2000, "no progress"
        if batch is None:
            assert not s.has_work() and pending, "stalled with work left"
            now = arrivals[pending[0].rid]
            continue
        shadow.check(batch)
        rows = {r.rid for r in batch.requests}
        admitted = rows - running  # this step: first admissions and re-admissions
        for rid in admitted:
            req = next(r for r in batch.requests if r.rid == rid)
            assert first_cached.setdefault(rid, req.cached_tokens) == req.cached_tokens
        # Starvation bound: while a request has waited longer than the bound, every step that
        # admits a later arrival also admits one of the earliest-arriving starved requests.
        queued = [x for x in reqs if x.rid in added and (x.rid in admitted or x.status is Status.WAITING)]
        starved = [x for x in queued if
                   (cfg.starvation_s is not None and now - added[x.rid][0] > cfg.starvation_s)
                   or (cfg.starvation_steps is not None and step - added[x.rid][1] > cfg.starvation_steps)]
        if starved:
            oldest = min(added[x.rid][0] for x in starved)
            if any(added[rid][0] > oldest for rid in admitted):
                assert any(x.rid in admitted and added[x.rid][0] == oldest for x in starved), \
                    f"step {step}: admitted {sorted(admitted)} but no starved request of arrival {oldest}"
        now += 1.0
        tokens = [fake_token(r.rid, len(r.output)) if smp else None
                  for r, smp in zip(batch.requests, batch.sample)]
        done = s.update(batch, tokens, now)
        running = {e.req.rid for e in s.running}
        assert all(r.finished for r in done)
        cache.check_invariants()
    for r in reqs:
        assert r.status is Status.FINISHED and r.pages == []
        assert r.output == expected_output(r)
    assert s.metrics.completed == len(reqs)
    assert cache.num_locked_pages == 0
    cache.evict(cache.num_cached_pages)
    assert pool.num_free == num_pages


def _live_rows(batch):
    """The rows of a batch scheduled ahead whose request still runs, with the input tokens the device
    would have read (the previous step's for the rows that follow it), as a plain Batch for KVShadow."""
    keep = [b for b, r in enumerate(batch.requests) if r.status is Status.RUNNING]
    ids, positions, slots, q_start = [], [], [], []
    for b in keep:
        lo, hi = batch.q_start[b], batch.q_start[b] + batch.q_lens[b]
        q_start.append(len(ids))
        ids += [batch.requests[b].output[-1]] if b < len(batch.follows) else batch.input_ids[lo:hi]
        positions += batch.positions[lo:hi]
        slots += batch.slots[lo:hi]
    return Batch([batch.requests[b] for b in keep], ids, positions, q_start, [batch.q_lens[b] for b in keep],
                 [batch.seq_lens[b] for b in keep], [batch.page_tables[b] for b in keep], slots,
                 [batch.sample[b] for b in keep], batch.page_size)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads(), st.lists(st.booleans(), min_size=1, max_size=20))
def test_scheduling_ahead_gives_the_same_tokens_and_keeps_pages_exact(work, aheads):
    """The engine's async loop: while batch N is in flight, maybe schedule N+1 ahead; update N, then
    N+1 (its rows' inputs are N's tokens). Tokens, cached K/V reads, page ownership and the pool end
    exactly as with plain steps."""
    reqs, arrivals, ps, num_pages, cfg = work
    pool = PagePool(num_pages)
    cache = RadixCache(pool, page_size=ps)
    s = Scheduler(pool, cache, cfg, ps)
    shadow = KVShadow(pool, ps)
    pending = sorted(reqs, key=lambda r: arrivals[r.rid])
    now, cur, step, ahead_steps = 0.0, None, 0, 0
    while pending or s.has_work() or cur is not None:
        while pending and arrivals[pending[0].rid] <= now:
            r = pending.pop(0)
            s.add(r, now)
        step += 1
        assert step < 2000, "no progress"
        if cur is None:
            cur = s.schedule(now)
            if cur is None:
                assert not s.has_work() and pending, "stalled with work left"
                now = arrivals[pending[0].rid]
                continue
            shadow.check(cur)
        nxt = s.schedule_ahead(now) if aheads[step % len(aheads)] else None
        now += 1.0
        tokens = [fake_token(r.rid, len(r.output)) if smp else None for r, smp in zip(cur.requests, cur.sample)]
        s.update(cur, tokens, now)
        cache.check_invariants()
        if nxt is not None:
            ahead_steps += 1
            live = _live_rows(nxt)
            if live.requests:
                shadow.check(live)
        cur = nxt
    for r in reqs:
        assert r.status is Status.FINISHED and r.pages == []
        assert r.output == expected_output(r)
    assert cache.num_locked_pages == 0
    cache.evict(cache.num_cached_pages)
    assert pool.num_free == num_pages
