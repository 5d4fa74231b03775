"""Replay drivers against independent brute-force counters written here.

The unlimited counter keeps a set of chained full-page keys: page k of a prompt is keyed by
(key of page k-1, tokens of page k), so a key names the whole prefix up to that page. A
request hits its longest run of leading keys already in the set. The LRU counter bounds that
set: keys are touched deepest first (so a prefix is never older than its extensions) and the
least recently used keys go first when a request needs room.
"""
from __future__ import annotations

import hashlib
from collections import OrderedDict
from pathlib import Path

import numpy as np
import pytest

from radixkv.cache.pages import PagePool
from radixkv.config import Policy
from radixkv.replay.cost_model import CostModel, ServiceTime
from radixkv.replay.replay import (
    ReplayConfig, ReplayMode, ReplayResult, admit, fit_vocab, replay_sequential, replay_simulated,
    run_replay,
)
from radixkv.scheduler.metrics import SchedulerMetrics, TimelinePoint, wait_stats
from radixkv.workloads.few_shot import FewShotConfig, few_shot
from radixkv.workloads.multi_turn import MultiTurnConfig, multi_turn
from radixkv.workloads.shared_prefix import SharedPrefixConfig, shared_prefix
from radixkv.workloads.trace_loading import load_trace
from radixkv.workloads.traces import TraceRequest

DATA = Path(__file__).resolve().parents[3] / "workloads" / "data" / "mooncake_sample.jsonl"
MOONCAKE = Path(__file__).resolve().parents[3].parent / "shared" / "traces" / "mooncake" / "synthetic_trace.jsonl"


def _page_keys(tokens: np.ndarray, ps: int) -> list[bytes]:
    n = len(tokens) // ps
    pages = np.ascontiguousarray(tokens[: n * ps], dtype=np.int32).reshape(n, ps)
    keys, key = [], b""
    for k in range(n):
        key = hashlib.blake2b(key + pages[k].tobytes(), digest_size=16).digest()
        keys.append(key)
    return keys


def _leading_cached(keys: list[bytes], cached: set[bytes] | OrderedDict[bytes, None]) -> int:
    """How many leading page keys are cached."""
    k = 0
    while k < len(keys) and keys[k] in cached:
        k += 1
    return k


def brute_unlimited(requests: list[TraceRequest], ps: int) -> tuple[int, int]:
    """(hit_tokens, prompt_tokens) with an unlimited cache."""
    seen: set[bytes] = set()
    hit = total = 0
    for r in requests:
        t = r.tokens()
        total += len(t)
        keys = _page_keys(t, ps)
        hit += _leading_cached(keys, seen) * ps
        seen.update(keys)
    return hit, total


def brute_lru(requests: list[TraceRequest], ps: int, capacity: int) -> tuple[int, int]:
    """(hit_tokens, prompt_tokens) with at most `capacity` pages (cache + the running request)."""
    lru: OrderedDict[bytes, None] = OrderedDict()
    hit = total = 0
    for r in requests:
        t = r.tokens()
        total += len(t)
        keys = _page_keys(t, ps)
        k = _leading_cached(keys, lru)
        need = -(-len(t) // ps) - k  # this request's own pages (tail included)
        hit += k * ps
        for key in reversed(keys[:k]):  # a lookup touches the matched prefix, deepest first
            lru.move_to_end(key)
        if need > capacity - k:
            continue  # cannot run even with everything else evicted: evicts and caches nothing
        while len(lru) + need > capacity:
            victim = next(iter(lru))
            if victim in keys[:k]:
                break
            lru.popitem(last=False)
        for key in reversed(keys):  # deepest first: the root-side pages end up newest
            lru[key] = None
            lru.move_to_end(key)
    return hit, total


def _generated() -> dict[str, list[TraceRequest]]:
    return {
        "multi_turn": multi_turn(MultiTurnConfig(sessions=6, max_turns=4, system_len=40, user_len=20,
                                                 reply_len=30, seed=1)),
        "few_shot": few_shot(FewShotConfig(templates=2, shots=3, prompts_per_template=6, example_len=50,
                                           question_len=20, seed=2)),
        "shared_prefix": shared_prefix(SharedPrefixConfig(groups=3, prompts_per_group=5, system_len=100,
                                                          question_len=30, seed=3)),
    }


@pytest.mark.parametrize("kind", ["multi_turn", "few_shot", "shared_prefix"])
@pytest.mark.parametrize("ps", [1, 7, 16])
def test_sequential_unlimited_equals_brute_force(kind, ps):
    reqs = _generated()[kind]
    hit, total = brute_unlimited(reqs, ps)
    r = replay_sequential(reqs, ReplayConfig(page_size=ps, sequential=True), CostModel())
    assert (r.hit_tokens, r.prompt_tokens) == (hit, total)
    assert r.hit_rate == pytest.approx(hit / total)
    assert hit > 0 and r.completed == r.requests == len(reqs)
    assert r.leaked_pages == 0 and r.mode is ReplayMode.SEQUENTIAL and r.unlimited


@pytest.mark.parametrize("ps", [16, 64])
def test_sequential_mooncake_sample_equals_brute_force(ps):
    reqs = load_trace(DATA).requests
    hit, total = brute_unlimited(reqs, ps)
    r = replay_sequential(reqs, ReplayConfig(page_size=ps, sequential=True), CostModel())
    assert (r.hit_tokens, r.prompt_tokens) == (hit, total)
    assert round(r.hit_rate, 4) == round(hit / total, 4)


@pytest.mark.skipif(not MOONCAKE.exists(), reason="shared Mooncake trace not present")
def test_sequential_public_mooncake_slice_equals_brute_force():
    reqs = load_trace(MOONCAKE).requests[3000:3250]
    hit, total = brute_unlimited(reqs, 16)
    r = replay_sequential(reqs, ReplayConfig(sequential=True), CostModel())
    assert (r.hit_tokens, r.prompt_tokens) == (hit, total)


@pytest.fixture(scope="module")
def sample_unlimited():
    reqs = load_trace(DATA).requests
    return reqs, replay_sequential(reqs, ReplayConfig(sequential=True), CostModel())


@pytest.mark.parametrize("capacity_frac", [0.004, 0.015, 0.1, 0.3])
def test_sequential_lru_close_to_brute_force_lru(capacity_frac, sample_unlimited):
    """Required: within 0.02. Observed: equal (tests allow 0.002 for tie-breaking changes)."""
    reqs, unlimited = sample_unlimited
    ps = 16
    cap = int(unlimited.peak_pages * capacity_frac)
    hit, total = brute_lru(reqs, ps, cap)
    r = replay_sequential(reqs, ReplayConfig(num_pages=cap, sequential=True), CostModel())
    assert r.peak_pages <= cap and r.leaked_pages == 0 and not r.unlimited
    assert r.prompt_tokens == total
    assert abs(r.hit_rate - hit / total) <= 0.002
    assert r.hit_rate < unlimited.hit_rate


def test_lru_evicts_least_recent_exactly():
    ps = 4
    a, b, c = (np.arange(8, dtype=np.int32) + base for base in (0, 100, 200))
    reqs = [TraceRequest(0, x, 1) for x in (a, b, a, c, a, b)]
    # capacity 4: a(2) b(2) full; a hits, touching a; c evicts b (LRU); a hits again; b misses
    r = replay_sequential(reqs, ReplayConfig(page_size=ps, num_pages=4, sequential=True), CostModel())
    assert r.hit_tokens == 16 and r.prompt_tokens == 48
    assert brute_lru(reqs, ps, 4) == (16, 48)


def test_request_larger_than_pool_is_rejected_not_crashed():
    # file order: the 10-token request runs and caches 2 full pages; the 100-token one needs
    # 23 more pages than its cached 8 tokens, more than the 5-page pool: it hits 8 tokens,
    # counts all 100, runs nowhere and caches nothing
    reqs = [TraceRequest(0, np.arange(10, dtype=np.int32), 1), TraceRequest(0, np.arange(100, dtype=np.int32), 1)]
    r = replay_sequential(reqs, ReplayConfig(page_size=4, num_pages=5, sequential=True), CostModel())
    assert (r.rejected, r.completed, r.prompt_tokens, r.hit_tokens, r.leaked_pages) == (1, 1, 110, 8, 0)
    assert brute_lru(reqs, 4, 5) == (8, 110)


def test_sequential_clock_waits_follow_cost_model():
    cost = CostModel()
    svc = ServiceTime(cost)
    toks = np.arange(64, dtype=np.int32)
    reqs = [TraceRequest(0.0, toks, 5), TraceRequest(0.0, toks, 5), TraceRequest(1000.0, toks, 5)]
    r = replay_sequential(reqs, ReplayConfig(sequential=True), cost)
    first = svc.serve(64, 0, 5)
    second = svc.serve(64, 64, 5)
    assert second < first  # cached prompt: only the last token is recomputed
    assert r.wait_max_s == pytest.approx(first)  # the second waited for the first
    assert r.sim_seconds == pytest.approx(1000.0 + second)
    assert [p.now for p in r.timeline] == pytest.approx([first, first + second, 1000.0 + second])
    assert r.timeline[-1].hit_rate == pytest.approx(r.hit_rate)
    burst = replay_sequential(reqs, ReplayConfig(sequential=True, burst=True), cost)
    assert burst.wait_max_s == pytest.approx(first + second)  # the third arrived at 0 too
    assert burst.hit_tokens == r.hit_tokens


def test_simulated_single_lane_matches_sequential():
    reqs = _generated()["shared_prefix"]
    seq = replay_sequential(reqs, ReplayConfig(sequential=True), CostModel())
    sim = replay_simulated(reqs, ReplayConfig(concurrency=1, policy=Policy.FCFS), CostModel())
    assert sim.completed == len(reqs) and sim.leaked_pages == 0 and sim.mode is ReplayMode.SIMULATE
    assert sim.prompt_tokens == seq.prompt_tokens
    assert abs(sim.hit_rate - seq.hit_rate) < 0.01


def test_simulated_burst_with_small_pool_completes():
    reqs = _generated()["multi_turn"]
    r = run_replay(reqs, ReplayConfig(num_pages=80, page_size=4, burst=True, concurrency=8))
    assert r.completed + r.rejected == len(reqs) and r.leaked_pages == 0
    assert r.peak_pages <= 80 and r.wait_max_s > 0


def test_config_validation():
    with pytest.raises(ValueError, match="page_size"):
        ReplayConfig(page_size=0)
    with pytest.raises(ValueError, match="num_pages"):
        ReplayConfig(num_pages=0)
    with pytest.raises(TypeError, match="policy"):
        ReplayConfig(policy="lpm")


def test_fit_vocab_keeps_distinct_blocks_distinct():
    from radixkv.workloads.traces import expand_hash_ids

    small = np.array([0, 5, 31999], dtype=np.int32)
    np.testing.assert_array_equal(fit_vocab(small, 32000), small)  # ids inside the vocabulary stay
    toks = expand_hash_ids(np.arange(2000), 2000 * 512)  # 2000 distinct blocks
    mapped = fit_vocab(toks, 32000)
    assert mapped.min() >= 0 and mapped.max() < 32000
    np.testing.assert_array_equal(fit_vocab(toks[:512], 32000), mapped[:512])  # a function of the id
    pages = {mapped[i:i + 16].tobytes() for i in range(0, len(mapped), 16)}
    assert len(pages) == len(mapped) // 16  # no two 16-token pages became equal (modulo would: 125 apart)
    assert np.array_equal(toks[:16] % 32000, toks[125 * 512:125 * 512 + 16] % 32000)


def test_build_derives_rates_waits_and_leaks():
    m = SchedulerMetrics(prompt_tokens=200, hit_tokens=50, preemptions=3, completed=4, peak_pages=9,
                         waits_s=[0.0, 1.0, 2.0, 10.0], timeline=[TimelinePoint(1.0, 0.25, 9)])
    pool = PagePool(12)
    pool.alloc(2)  # two pages still held: leaked
    r = ReplayResult.build(ReplayMode.SIMULATE, ReplayConfig(page_size=8), requests=6, metrics=m, pool=pool,
                           started=0.0, clock_s=5.0, output_tokens=7, rejected=2)
    w = wait_stats(m.waits_s)
    assert (r.requests, r.completed, r.prompt_tokens, r.hit_tokens, r.hit_rate) == (6, 4, 200, 50, 0.25)
    assert (r.wait_p50_s, r.wait_p99_s, r.wait_max_s) == (w.p50, w.p99, w.max) == (1.5, w.p99, 10.0)
    assert (r.leaked_pages, r.num_pages, r.page_size, r.unlimited, r.rejected, r.too_long) == (2, 12, 8, True, 2, 0)
    assert (r.peak_pages, r.preemptions, r.sim_seconds, r.output_tokens) == (9, 3, 5.0, 7)
    assert r.timeline == m.timeline and r.timeline is not m.timeline and r.wall_s > 0
    real = ReplayResult.build(ReplayMode.REAL, ReplayConfig(), requests=1, metrics=SchedulerMetrics(),
                              pool=PagePool(4), started=0.0, clock_s=0.0, output_tokens=0, too_long=1,
                              model_context=64)
    assert (real.hit_rate, real.wait_max_s, real.unlimited, real.too_long, real.model_context) == (0.0, 0.0, False, 1, 64)
    assert {"too_long", "model_context", "rejected"} <= real.to_json().keys()


def test_every_mode_reports_waits_through_wait_stats():
    reqs = _generated()["multi_turn"]
    for r in (replay_sequential(reqs, ReplayConfig(sequential=True, burst=True), CostModel()),
              replay_simulated(reqs, ReplayConfig(burst=True, concurrency=4), CostModel())):
        assert r.completed == len(reqs) and r.wait_max_s > 0
        assert r.wait_p50_s <= r.wait_p99_s <= r.wait_max_s


def test_admit_counts_too_long_before_too_large():
    reqs = [TraceRequest(0, np.arange(n, dtype=np.int32), 4) for n in (10, 60, 100, 200)]
    ok, too_large, too_long = admit(reqs, page_size=8, num_pages=10, context=150)  # 10 pages = 80 tokens
    assert [r.num_prompt_tokens for r in ok] == [10, 60] and (too_large, too_long) == (1, 1)
    assert admit(reqs, 8, None).too_large == 0 and len(admit(reqs, 8, None).ok) == 4
