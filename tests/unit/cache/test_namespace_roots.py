"""A namespace (cache_salt) costs nothing once its blocks are gone (issue 33 item 7): its root leaves
the tree with its last block or its last lock, and check_invariants() reports a root left behind."""
from __future__ import annotations

import gc

import numpy as np
import pytest

from radixkv import PagePool, RadixCache, SchedulerConfig
from radixkv.cache.node import Node
from radixkv.request import Request
from radixkv.scheduler.scheduler import Scheduler


def _roots(cache: RadixCache) -> int:
    """Root nodes the cache still refers to, in the tree or not."""
    gc.collect()
    return len(cache._roots) + len(cache._bare_roots)


def _serve(cache: RadixCache, tokens: list[int], ns: str) -> None:
    """match -> lock -> alloc -> insert -> unlock -> release, as a request does."""
    pool, ps = cache.pool, cache.page_size
    m = cache.match(tokens, ns)
    cache.lock(m)
    new = pool.alloc(len(tokens) // ps - m.num_tokens // ps)
    cache.insert(tokens, m.pages + new, ns)
    cache.unlock(m)
    pool.decref(new)


@pytest.mark.parametrize("how", ["clear", "evict", "evict_some"])
def test_many_salts_leave_no_root_once_their_blocks_go(how) -> None:
    pool = PagePool(64)
    cache = RadixCache(pool, page_size=2)
    for salt in range(2000):
        _serve(cache, [1, 2, 3, 4, salt % 7], f"user-{salt}")
        if pool.num_free < 4:
            cache.evict(8)  # the pool is small: old salts' blocks are evicted as new ones come
    assert len(cache.namespaces) <= 32  # only the salts with blocks still cached
    if how == "clear":
        cache.clear()
    elif how == "evict":
        cache.evict(cache.num_cached_pages)
    else:  # one block at a time, the roots go one by one
        while cache.num_cached_pages:
            cache.evict(1)
            cache.check_invariants()
    assert cache.namespaces == [] and _roots(cache) == 0
    cache.check_invariants()
    assert pool.num_free == 64


def test_a_match_of_a_new_salt_adds_no_root_and_a_lock_keeps_one() -> None:
    pool = PagePool(16)
    cache = RadixCache(pool, page_size=2)
    m = cache.match([1, 2, 3], "a")  # a miss: the tree does not grow
    assert m.num_tokens == 0 and cache.namespaces == [] and m.node is cache.root("a")
    cache.check_invariants()
    again = cache.match([1, 2], "a")
    assert again.node is m.node
    cache.lock(m)  # an empty match's lock keeps its root
    assert cache.namespaces == ["a"]
    cache.check_invariants()
    cache.unlock(m)
    assert cache.namespaces == []
    cache.lock(again)  # a match still refers to it: it may be locked again
    assert cache.namespaces == ["a"]
    cache.unlock(again)
    cache.check_invariants()
    del m, again
    assert _roots(cache) == 0
    with pytest.raises(ValueError, match="another RadixCache"):  # another cache's root is still refused
        cache.lock(RadixCache(pool, page_size=2).match([1, 2], "a"))


def test_a_stale_match_of_a_dropped_root_locks_it_again() -> None:
    pool = PagePool(16)
    cache = RadixCache(pool, page_size=2)
    _serve(cache, [1, 2, 3, 4], "a")
    miss = cache.match([9, 9], "a")  # ends at the root
    cache.clear()
    assert cache.namespaces == []
    cache.lock(miss)
    _serve(cache, [1, 2], "a")
    cache.unlock(miss)
    assert cache.namespaces == ["a"] and cache.match([1, 2], "a").num_tokens == 2
    cache.check_invariants()


def test_check_invariants_reports_an_empty_root() -> None:
    cache = RadixCache(PagePool(4), page_size=2)
    empty = np.zeros(0, dtype=np.int32)
    cache._roots["x"] = Node(empty, b"", empty, None, 0, "x")
    with pytest.raises(AssertionError, match="no block and no lock"):
        cache.check_invariants()


def test_a_salt_per_request_through_the_scheduler_leaves_nothing() -> None:
    pool = PagePool(48)
    cache = RadixCache(pool, page_size=4)
    s = Scheduler(pool, cache, SchedulerConfig(max_batch_tokens=64, max_running=8), 4)
    reqs = [Request(i, [1, 2, 3, 4, 5, 6, 7, 8, 9, i % 5], max_tokens=3, namespace=f"salt-{i}") for i in range(300)]
    for r in reqs:
        s.add(r, 0.0)
    now = 0.0
    while s.has_work():
        batch = s.schedule(now)
        now += 1.0
        s.update(batch, [7 if smp else None for smp in batch.sample], now)
    assert all(r.finished for r in reqs)
    assert len(cache.namespaces) <= 48 // 2  # the salts whose blocks are cached still: bounded by the pool
    cache.clear()
    del batch
    assert cache.namespaces == [] and _roots(cache) == 0
    cache.check_invariants()
