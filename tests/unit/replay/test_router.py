"""Routers (replay/router.py), the global prefix index (replay/prefix_index.py) and the fleet simulator."""
from __future__ import annotations

import numpy as np
import pytest

from radixkv.cache import PagePool, RadixCache
from radixkv.cache.events import BlockRemoved, KVEventBatch, QueuePublisher, chain_hashes, namespace_seed
from radixkv.config import SchedulerConfig
from radixkv.replay.cost_model import CostModel
from radixkv.replay.fleet import replay_fleet, simulate_fleet
from radixkv.replay.prefix_index import PrefixIndex
from radixkv.replay.replay import ReplayConfig, run_replay
from radixkv.replay.router import (LeastLoadedRouter, PrefixRouter, ReplicaLoad, RoundRobinRouter, RouterKind,
                                   make_router)
from radixkv.request import Request
from radixkv.workloads.traces import TraceRequest

PS = 4
IDLE = ReplicaLoad(0, 0, 0, 0)


def cached(tokens: list[int], pub: QueuePublisher, namespace: str | None = None) -> RadixCache:
    pool = PagePool(64)
    cache = RadixCache(pool, page_size=PS, events=pub)
    pages = pool.alloc(len(tokens) // PS)
    cache.insert(tokens, pages, namespace)
    pool.decref(pages)
    return cache


def arr(tokens: list[int]) -> np.ndarray:
    return np.asarray(tokens, dtype=np.int32)


def test_round_robin_cycles():
    r = RoundRobinRouter()
    assert [r.route(arr([1]), None, [IDLE] * 3) for _ in range(7)] == [0, 1, 2, 0, 1, 2, 0]


def test_least_loaded_takes_fewest_outstanding_then_backlog():
    loads = [ReplicaLoad(2, 1, 10, 5), ReplicaLoad(0, 2, 900, 5), ReplicaLoad(1, 1, 100, 5)]
    assert LeastLoadedRouter().route(arr([1]), None, loads) == 2
    assert LeastLoadedRouter().route(arr([1]), None, [ReplicaLoad(1, 0, 9, 0), ReplicaLoad(0, 1, 3, 0)]) == 1


def test_index_follows_stored_removed_cleared():
    pubs = [QueuePublisher(), QueuePublisher()]
    idx = PrefixIndex(2)
    caches = [cached(list(range(12)), pubs[0]), cached(list(range(8)) + [9] * 4, pubs[1])]
    for r, p in enumerate(pubs):
        idx.apply(r, p.drain())
    assert idx.block_size == PS
    assert idx.matched_blocks(arr(list(range(14)))) == [3, 2]
    assert idx.matched_blocks(arr([9] * 8)) == [0, 0]
    caches[0].evict(2)
    idx.apply(0, pubs[0].drain())
    assert idx.matched_blocks(arr(list(range(14)))) == [1, 2]
    caches[1].clear()
    idx.apply(1, pubs[1].drain())
    assert idx.num_blocks(1) == 0 and idx.matched_blocks(arr(list(range(14)))) == [1, 0]
    with pytest.raises(IndexError, match="replica 2"):
        idx.apply(2, pubs[0].drain())


def test_index_is_per_namespace_and_ignores_unknown_removals():
    pub = QueuePublisher()
    cached(list(range(8)), pub, "a")
    idx = PrefixIndex(1)
    batch = pub.drain()
    idx.apply(0, batch)
    assert idx.matched_blocks(arr(list(range(8))), "a") == [2]
    assert idx.matched_blocks(arr(list(range(8)))) == [0]
    idx.apply(0, type(batch)(0.0, [BlockRemoved([12345])]))  # never stored here: nothing changes
    assert idx.num_blocks(0) == 2


def test_prefix_router_prefers_the_replica_holding_the_prefix():
    pubs = [QueuePublisher() for _ in range(3)]
    router = PrefixRouter(3)
    cached([7] * 16, pubs[2])
    for r, p in enumerate(pubs):
        router.observe(r, p.drain())
    assert router.route(arr([7] * 16 + [1, 2, 3]), None, [IDLE] * 3) == 2
    # a far larger backlog there outweighs the hit: 16 tokens saved against 1,000 queued
    busy = [IDLE, IDLE, ReplicaLoad(3, 1, 1000, 0)]
    assert router.route(arr([7] * 16 + [1, 2, 3]), None, busy) == 0
    # a replica past the cap on requests served is passed over
    capped = [ReplicaLoad(0, 0, 0, 1), ReplicaLoad(0, 0, 0, 1), ReplicaLoad(0, 0, 0, 10)]
    assert router.route(arr([7] * 16), None, capped) == 0


def test_a_burst_sharing_a_prefix_follows_the_first_request_before_any_event():
    """Nothing has run yet (no events): the prefix router expects the first prompt's blocks where it sent it,
    so followers with the same prefix go there too (within the cap), and other prefixes go elsewhere."""
    router = PrefixRouter(2, block_size=16, balance=10.0)
    loads = [IDLE, IDLE]
    shared = [7] * 32
    first = router.route(arr(shared + [1]), None, loads)
    assert [router.route(arr(shared + [i, 9]), None, loads) for i in range(3)] == [first] * 3
    other = router.route(arr([5] * 32), None, loads)
    assert router.index.matched_blocks(arr([5] * 32))[other] == 2
    # an eviction event of the expected blocks ends the expectation
    router.observe(first, KVEventBatch(0.0, [BlockRemoved(chain_hashes(arr(shared), 16, namespace_seed(None)))]))
    assert router.index.matched_blocks(arr(shared))[first] == 0


def test_make_router_and_bad_settings():
    assert isinstance(make_router(RouterKind.PREFIX, 2), PrefixRouter)
    assert make_router(RouterKind.ROUND_ROBIN, 2).kind is RouterKind.ROUND_ROBIN
    with pytest.raises(ValueError, match="num_replicas"):
        make_router(RouterKind.LEAST_LOADED, 0)
    with pytest.raises(ValueError, match="balance"):
        PrefixRouter(2, balance=0.5)
    with pytest.raises(ValueError, match="3 replica loads"):
        PrefixRouter(2).route(arr([1]), None, [IDLE] * 3)


def shared_prefix_requests(groups: int = 4, per_group: int = 6, gap_s: float = 5.0) -> list[Request]:
    """Groups of requests sharing a 64-token prefix, arriving one by one, gap_s apart, groups interleaved
    in a rotating order (so that round-robin over `groups` replicas scatters each group)."""
    reqs = []
    for i in range(groups * per_group):
        g = (i + i // groups) % groups
        prompt = [100 + g] * 64 + [i] * 8
        reqs.append(Request(i, prompt, max_tokens=2, arrival_s=i * gap_s))
    return reqs


def test_fleet_prefix_routing_sends_follow_ups_where_their_prefix_is():
    reqs = shared_prefix_requests()
    cost = CostModel()
    sched = SchedulerConfig()
    prefix = simulate_fleet(reqs, 4, make_router(RouterKind.PREFIX, 4), 200, PS, sched, cost)
    rr = simulate_fleet(reqs, 4, make_router(RouterKind.ROUND_ROBIN, 4), 200, PS, sched, cost)
    # each group's first request misses; every follow-up finds its group's 64 tokens
    assert prefix.metrics.hit_tokens == 64 * (len(reqs) - 4)
    assert prefix.metrics.completed == len(reqs) and prefix.leaked_pages == 0
    assert [r.requests for r in prefix.replicas] == [6, 6, 6, 6] and prefix.load_max_over_mean == 1.0
    assert prefix.per_replica_hit_rate == [r.hit_tokens / r.prompt_tokens for r in prefix.replicas]
    assert rr.metrics.hit_tokens < prefix.metrics.hit_tokens


def test_fleet_checks_requests():
    reqs = shared_prefix_requests(1, 2)
    router = make_router(RouterKind.ROUND_ROBIN, 2)
    with pytest.raises(ValueError, match="distinct"):
        simulate_fleet(reqs + reqs[:1], 2, router, 100, PS, SchedulerConfig(), CostModel())
    with pytest.raises(ValueError, match="pool has 5"):
        simulate_fleet(reqs, 2, router, 5, PS, SchedulerConfig(), CostModel())


def test_one_replica_fleet_equals_the_plain_simulated_replay():
    trace = [TraceRequest(float(i), arr([i % 3] * 40 + [i] * 5), 3) for i in range(12)]
    cfg = ReplayConfig(page_size=PS, num_pages=60)
    plain = run_replay(trace, cfg)
    one = replay_fleet(trace, cfg, 1, RouterKind.LEAST_LOADED).result
    for key in ("completed", "prompt_tokens", "hit_tokens", "hit_rate", "peak_pages", "preemptions",
                "wait_p50_s", "wait_max_s", "leaked_pages", "sim_seconds", "output_tokens"):
        assert getattr(one, key) == getattr(plain, key), key
    with pytest.raises(ValueError, match="sequential"):
        replay_fleet(trace, ReplayConfig(sequential=True), 2, RouterKind.PREFIX)


def test_index_stores_after_a_clear_in_the_same_batch():
    pub = QueuePublisher()
    cache = cached(list(range(8)), pub)
    cache.clear()
    cache.serve_prompt(arr(list(range(8))), 0)
    idx = PrefixIndex(1)
    idx.apply(0, pub.drain())  # stored, cleared, stored again
    assert idx.matched_blocks(arr(list(range(8)))) == [2]
