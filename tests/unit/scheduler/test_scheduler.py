"""Scheduler unit tests: admission, chunked prefill, sharing, policies, starvation, preemption.

Every run goes through KVShadow, which checks each batch reads only pages holding its own
prefix and writes only pages nobody else holds.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from radixkv import PagePool, Policy, RadixCache, SchedulerConfig
from radixkv.scheduler.metrics import SchedulerMetrics, WaitStats, wait_stats
from radixkv.scheduler.policies import AdmissionRanker, policy_order
from radixkv.request import FinishReason, Request, Status
from radixkv.scheduler.scheduler import Scheduler
from radixkv.replay.simulator import KVShadow, fake_token, run_scheduler


class Harness:
    """A scheduler over a fresh pool and cache, with the KVShadow that follows its pages."""

    def __init__(self, num_pages: int = 64, ps: int = 4, **cfg) -> None:
        pool = PagePool(num_pages)
        self.s = Scheduler(pool, RadixCache(pool, page_size=ps), SchedulerConfig(**cfg), ps)
        self.shadow = KVShadow(pool, ps)

    def drive(self, reqs: list[Request], log: list | None = None) -> float:
        """Run to completion, one simulated second per step; log gets (now, [(rid, q_len)])."""
        clock = {"now": 0.0}

        def on_batch(batch):
            self.shadow.check(batch)
            if log is not None:
                log.append((clock["now"], [(r.rid, q) for r, q in zip(batch.requests, batch.q_lens)]))
            clock["now"] += 1.0

        return run_scheduler(self.s, sorted(reqs, key=lambda r: r.arrival_s), lambda b: 1.0, on_batch)


def assert_clean(s: Scheduler, reqs: list[Request]) -> None:
    for r in reqs:
        assert r.status is Status.FINISHED and r.pages == []
        assert r.output == [fake_token(r.rid, i) for i in range(r.max_tokens)]
    s.cache.check_invariants()
    assert s.cache.num_locked_pages == 0
    s.cache.evict(s.cache.num_cached_pages)
    assert s.pool.num_free == s.pool.num_pages


def first_admission(log: list) -> dict[int, float]:
    seen: dict[int, float] = {}
    for now, rows in log:
        for rid, _ in rows:
            seen.setdefault(rid, now)
    return seen


@pytest.mark.parametrize("policy", list(Policy))
def test_serves_everything_and_frees_every_page(policy):
    h = Harness(num_pages=40, max_batch_tokens=12, max_running=3, policy=policy)
    reqs = [Request(i, [i % 3] * 6 + list(range(50 + i, 50 + i + 5 + i)), max_tokens=3 + i % 4)
            for i in range(7)]
    h.drive(reqs)
    assert_clean(h.s, reqs)
    assert h.s.metrics.completed == 7 and len(h.s.metrics.waits_s) == 7
    assert h.s.metrics.prompt_tokens == sum(len(r.prompt) for r in reqs)


def test_second_request_hits_first_ones_blocks():
    h = Harness()
    a = Request(0, list(range(10)), max_tokens=2)
    h.drive([a])
    b = Request(1, list(range(10)) + [77, 78], max_tokens=2)
    same = Request(2, list(range(12)), max_tokens=2)
    h.drive([b, same])
    assert a.cached_tokens == 0
    assert b.cached_tokens == 8  # the two full blocks of a's prompt
    # a's finish cached prompt + output[:-1] = 11 tokens -> 2 blocks; b cached block 3 (8..11)
    # of its own prompt, so `same` (12 tokens, all cached) still recomputes its last block.
    assert same.cached_tokens == 8
    assert_clean(h.s, [a, b, same])


def test_chunked_prefill_splits_prompt_and_caches_each_chunk():
    h = Harness(max_batch_tokens=8)
    a = Request(0, list(range(20)), max_tokens=3)
    b = Request(1, list(range(20)) + [90, 91, 92, 93], max_tokens=2, arrival_s=0.5)
    log: list = []
    h.drive([a, b], log)
    a_rows = [q for _, rows in log for rid, q in rows if rid == 0]
    assert a_rows[:3] == [8, 8, 4]  # chunks of the budget, then decode
    # b arrives during a's prefill: it waits while a's block 16..19 is computed, then hits all
    # 20 prompt tokens a cached chunk by chunk.
    assert b.cached_tokens == 20
    assert_clean(h.s, [a, b])


def test_chunked_prefill_walks_each_prompt_token_a_bounded_number_of_times(monkeypatch):
    """Each chunk caches its blocks below the locked path: the tree walks O(prompt) tokens in
    all, not the whole prefix again per chunk (which is O(prompt^2 / chunk))."""
    walked = []
    descend = RadixCache._descend
    monkeypatch.setattr(RadixCache, "_descend", lambda self, t, top: walked.append(len(t)) or descend(self, t, top))
    h = Harness(num_pages=1600, max_batch_tokens=64)
    a = Request(0, list(range(6000)), max_tokens=2)
    h.drive([a], [])
    assert sum(walked) <= 5 * 6000, f"walked {sum(walked)} tokens for a 6000-token prompt in 94 chunks"
    assert_clean(h.s, [a])


def test_long_chunks_and_numpy_prompts_get_the_right_slots():
    h = Harness(num_pages=128, max_batch_tokens=150)
    a = Request(0, np.arange(1000, 1200, dtype=np.int32), max_tokens=3)  # a replayed trace prompt
    b = Request(1, list(range(1000, 1100)) + [7] * 30, max_tokens=2)
    log: list = []
    h.drive([a, b], log)  # KVShadow checks every slot, token and page of the 150-token chunks
    assert log[0][1] == [(0, 150)] and log[1][1][0] == (0, 50)
    assert b.cached_tokens == 100
    assert_clean(h.s, [a, b])


@pytest.mark.parametrize("sharing", [True, False])
def test_in_batch_sharing_computes_a_common_new_prefix_once(sharing):
    h = Harness(in_batch_sharing=sharing)
    common = list(range(100, 112))
    a, b = Request(0, common + [1, 2], max_tokens=2), Request(1, common + [3], max_tokens=2)
    log: list = []
    h.drive([a, b], log)
    if sharing:
        assert [rid for rid, _ in log[0][1]] == [0]  # b waits one step ...
        assert b.cached_tokens == 12  # ... and hits the 3 blocks a computed
    else:
        assert [rid for rid, _ in log[0][1]] == [0, 1]
        assert b.cached_tokens == 0
    assert_clean(h.s, [a, b])


def _warm(h: Harness, prompts: list[list[int]]) -> None:
    h.drive([Request(1000 + i, p, max_tokens=1) for i, p in enumerate(prompts)])


@pytest.mark.parametrize("policy,first", [(Policy.FCFS, 1), (Policy.LPM, 2), (Policy.DFS_WEIGHT, 2)])
def test_policy_picks_who_goes_first(policy, first):
    h = Harness(max_running=1, policy=policy)
    hot = list(range(200, 216))
    _warm(h, [hot])
    miss = Request(1, list(range(300, 316)), max_tokens=1)
    hit = Request(2, hot + [5], max_tokens=1)
    log: list = []
    h.drive([miss, hit], log)
    assert log[0][1][0][0] == first
    assert hit.cached_tokens == 16 and miss.cached_tokens == 0
    assert_clean(h.s, [miss, hit])


@pytest.mark.parametrize("policy", [Policy.LPM, Policy.DFS_WEIGHT])
def test_a_small_match_budget_still_finds_the_cached_prefix(policy):
    h = Harness(max_running=1, policy=policy, match_budget=1)
    hot = list(range(200, 216))
    _warm(h, [hot])
    blocker = Request(99, [9, 9, 9], max_tokens=4)
    misses = [Request(i, [300 + i] * 16, max_tokens=1, arrival_s=0.1 * i) for i in range(1, 6)]
    hit = Request(6, hot + [1], max_tokens=1, arrival_s=0.6)
    log: list = []
    h.drive([blocker, *misses, hit], log)
    order = list(first_admission(log))
    assert order[:2] == [99, 6]  # matched when queued, so it goes first once the slot frees
    assert hit.cached_tokens == 16
    assert_clean(h.s, [blocker, *misses, hit])


@dataclass(eq=False)
class FakeQueued:
    arrival: float
    truth: int = 0  # what a match would return now
    score: int | None = None
    node: object = None


def test_ranker_refresh_finds_a_newly_cached_prefix_within_its_bound():
    cands = [FakeQueued(float(i)) for i in range(12)]
    matched: list[int] = []

    def match(e):
        matched.append(int(e.arrival))
        e.score = e.truth

    ranker = AdmissionRanker(Policy.LPM, 3, match)
    for _ in range(4):  # 3 fresh candidates a round until all have a score
        ranker.order(cands, lambda e: False)
    assert all(e.score == 0 for e in cands) and len(matched) == 12
    cands[7].truth = 100  # its prefix got cached since its last match
    rounds = 0
    while ranker.order(cands, lambda e: False)[0][0] is not cands[7]:
        rounds += 1
        assert len(matched) <= 12 + 3 * (rounds + 1)  # never more than the budget per round
    assert rounds < 6  # ceil(12 / (3 - 3 // 2)) rounds at most
    order, head_starved = ranker.order(cands, lambda e: e.arrival < 2.0)
    assert head_starved and order[0] is cands[0] and order[1] is cands[7]


def test_dfs_weight_serves_the_heavier_subtree_first():
    h = Harness()
    a, b = list(range(10, 26)), list(range(40, 48))
    _warm(h, [a, b])
    cands = [a + [1], b + [2], b + [3], b + [4]]  # a matches 16 tokens, the b's only 8
    matches = [h.s.cache.match(c) for c in cands]
    assert policy_order(Policy.LPM, matches, 4) == [0, 1, 2, 3]
    assert policy_order(Policy.DFS_WEIGHT, matches, 4) == [1, 2, 3, 0]
    assert policy_order(Policy.FCFS, None, 4) == [0, 1, 2, 3]


@pytest.mark.parametrize("bound", [dict(starvation_s=3.0, starvation_steps=None),
                                   dict(starvation_s=None, starvation_steps=3)])
def test_starvation_guard_bounds_a_cache_miss_wait(bound):
    def run(**cfg):
        h = Harness(num_pages=128, max_running=1, policy=Policy.LPM, **cfg)
        hot = list(range(500, 516))
        _warm(h, [hot])
        blocker = Request(99, list(range(700, 705)), max_tokens=6, arrival_s=0.0)
        miss = Request(0, list(range(900, 916)), max_tokens=2, arrival_s=0.1)
        hits = [Request(i, hot + [i], max_tokens=2, arrival_s=0.1 + 0.5 * i) for i in range(1, 13)]
        log: list = []
        h.drive([blocker, miss, *hits], log)
        assert_clean(h.s, [blocker, miss, *hits])
        return first_admission(log), {r.rid: r.arrival_s for r in [miss, *hits]}

    admitted, _ = run(starvation_s=None, starvation_steps=None)
    unguarded = admitted[0]
    assert unguarded == max(admitted.values())  # plain lpm serves the miss after every hit
    admitted, arrival = run(**bound)
    assert admitted[0] < unguarded
    # One step lasts one second here, so both bounds mean "waiting more than 3 s": from then
    # on no later arrival is admitted before the miss.
    starved_at = arrival[0] + 3.0
    later = [r for r in arrival if arrival[r] > arrival[0]]
    assert all(admitted[r] <= starved_at or admitted[r] > admitted[0] for r in later)
    assert admitted[0] == 6.0  # the first free slot after it starved: the blocker ran steps 0..5


def test_preemption_requeues_newest_keeps_output_and_cached_tokens():
    h = Harness(num_pages=9, ps=2, max_running=2)
    _warm(h, [[7, 7, 7, 7]])
    a = Request(0, [7, 7, 7, 7, 1], max_tokens=8)
    b = Request(1, [7, 7, 7, 7, 2], max_tokens=8)
    cached: dict[int, int] = {}
    shadow = h.shadow

    def on_batch(batch):
        shadow.check(batch)
        for r in batch.requests:
            cached.setdefault(r.rid, r.cached_tokens)

    run_scheduler(h.s, [a, b], lambda batch: 1.0, on_batch)
    assert h.s.metrics.preemptions >= 1
    assert (a.cached_tokens, b.cached_tokens) == (cached[0], cached[1]) == (4, 4)
    assert_clean(h.s, [a, b])


def test_decode_reserve_admits_only_what_can_decode_to_the_end():
    def run(reserve: float) -> int:
        h = Harness(num_pages=9, ps=2, max_running=2, decode_reserve=reserve)
        reqs = [Request(i, [7, 7, 7, 7, i], max_tokens=8) for i in range(2)]
        h.drive(reqs)
        assert_clean(h.s, reqs)
        return h.s.metrics.preemptions

    assert run(0.0) >= 1  # both admitted, the newest is preempted when decode runs out
    assert run(1.0) == 0  # the second waits until the first's output pages are free


def test_bad_input_is_refused_before_any_change():
    h = Harness(num_pages=4, ps=4)
    with pytest.raises(ValueError, match="needs up to 5 pages"):
        h.s.add(Request(0, list(range(16)), max_tokens=5), 0.0)
    ok = Request(1, [1, 2, 3], max_tokens=2)
    h.s.add(ok, 0.0)
    with pytest.raises(ValueError, match="already queued"):
        h.s.add(Request(1, [4], max_tokens=1), 0.0)
    used = Request(2, [1], max_tokens=2, output=[5])
    with pytest.raises(ValueError, match="not fresh"):
        h.s.add(used, 0.0)
    with pytest.raises(ValueError, match="non-negative"):
        h.s.add(Request(3, [1, -2], max_tokens=1), 0.0)
    with pytest.raises(ValueError, match="int32"):
        h.s.add(Request(4, [1, 2**40], max_tokens=1), 0.0)
    assert h.s.num_waiting == 1 and h.s.pool.num_free == 4
    batch = h.s.schedule(0.0)
    with pytest.raises(RuntimeError, match="before update"):
        h.s.schedule(0.0)
    with pytest.raises(ValueError, match="2 rows|1 rows"):
        h.s.update(batch, [1, 2], 1.0)
    with pytest.raises(ValueError, match="samples but got no token"):
        h.s.update(batch, [None], 1.0)
    assert ok.output == [] and ok.num_computed == 0
    h.s.update(batch, [9], 1.0)
    assert ok.output == [9]
    with pytest.raises(ValueError, match="last schedule"):
        h.s.update(batch, [9], 2.0)


def test_metrics_record_waits_occupancy_and_hits():
    h = Harness(num_pages=32, max_running=1)
    reqs = [Request(i, [1, 2, 3, 4, 5, 6, 7, 8, i], max_tokens=2) for i in range(3)]
    h.drive(reqs)
    m = h.s.metrics
    assert m.hit_tokens == 16 and m.prompt_tokens == 27  # the 2nd and 3rd hit 8 tokens each
    assert m.hit_rate == pytest.approx(16 / 27)
    assert sorted(m.waits_s) == [0.0, 2.0, 4.0]  # each waits for the ones before (2 steps each)
    assert m.wait_stats() == wait_stats(m.waits_s) == WaitStats(2.0, pytest.approx(3.96), 4.0)
    assert wait_stats([]) == WaitStats(0.0, 0.0, 0.0)
    assert len(m.timeline) == m.steps == 6
    assert m.peak_pages == max(p.pages_in_use for p in m.timeline) <= 32
    assert m.timeline[-1].hit_rate == pytest.approx(16 / 27)


def test_timeline_stays_bounded_and_evenly_spaced():
    m = SchedulerMetrics(timeline_limit=10)
    for step in range(1, 101):
        m.record_step(float(step), pages_in_use=step % 7)
    assert [p.now for p in m.timeline] == [1.0, 17.0, 33.0, 49.0, 65.0, 81.0, 97.0]
    assert m.steps == 100 and m.peak_pages == 6


@pytest.mark.parametrize("where", ["alloc_into", "adopt", "lock"])  # the pool calls admission makes
def test_an_exception_inside_admission_undoes_the_steps_admissions(monkeypatch, where):
    """schedule() raising mid-admission (a Ctrl-C in the pool, an error in the tree) leaves
    every request waiting as before, no page or lock held; the next schedule() serves them."""
    h = Harness(num_pages=64)
    reqs = [Request(i, list(range(100 * i, 100 * i + 10)), max_tokens=3) for i in range(3)]
    for r in reqs:
        h.s.add(r, 0.0)
    target = h.s.cache if where == "lock" else h.s.pool
    real, calls = getattr(target, where), []

    def fail_on_third(*a, **k):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(*a, **k)
    monkeypatch.setattr(target, where, fail_on_third)
    with pytest.raises(KeyboardInterrupt):
        h.s.schedule(0.0)
    monkeypatch.undo()
    assert h.s.in_flight is None and h.s.num_running == 0 and h.s.num_waiting == 3
    assert all(r.status is Status.WAITING and not r.pages and r.num_computed == 0 for r in reqs)
    assert h.s.pool.num_free == 64 and h.s.cache.num_locked_pages == 0
    assert h.s.metrics.prompt_tokens == h.s.metrics.hit_tokens == 0  # an undone admission never counts
    h.s.cache.check_invariants()
    h.drive([])
    assert h.s.metrics.prompt_tokens == 30
    assert all(len(r.output) == 3 for r in reqs)
    assert_clean(h.s, reqs)


def test_finish_ends_a_running_request_as_completed():
    h = Harness(num_pages=64)
    a = Request(0, list(range(20)), max_tokens=8)
    h.s.add(a, 0.0)
    b = h.s.schedule(0.0)
    with pytest.raises(RuntimeError, match="in flight"):
        h.s.finish(0, FinishReason.STOP)
    h.s.update(b, [5], 1.0)
    assert h.s.finish(0, FinishReason.STOP) is a and a.finish_reason is FinishReason.STOP
    assert h.s.metrics.completed == 1 and not h.s.has_work()
    with pytest.raises(ValueError, match="not running"):
        h.s.finish(0, FinishReason.STOP)
    assert h.s.cache.num_cached_pages == 5  # its 20 computed tokens stay cached (page 4)
    assert a.status is Status.FINISHED and a.pages == [] and a.output == [5]
    h.s.cache.check_invariants()
    h.s.cache.evict(5)
    assert h.s.pool.num_free == h.s.pool.num_pages
