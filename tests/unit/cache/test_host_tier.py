"""The host tier of RadixCache (issue 37): demotion, host eviction, promotion, and the tier off by default."""
from __future__ import annotations

import numpy as np
import pytest

from radixkv.cache import PagePool, RadixCache
from radixkv.cache.events import BlockRemoved, BlockStored, QueuePublisher
from radixkv.cache.tree_host import HostPool


def arr(*xs: int) -> np.ndarray:
    return np.array(xs, dtype=np.int32)


def cached(cache: RadixCache, tokens: np.ndarray) -> None:
    pages = cache.pool.alloc(len(tokens) // cache.page_size)
    cache.insert(tokens, pages)
    cache.pool.decref(pages)


def test_tier_off_by_default_evicts_as_before():
    pool = PagePool(4)
    cache = RadixCache(pool, page_size=2)
    assert cache.host_pool is None and cache.num_host_pages == 0
    cached(cache, arr(0, 1, 2, 3))
    assert cache.evict(2) == 2
    m = cache.match(arr(0, 1, 2, 3))
    assert m.num_tokens == 0 and m.host_tokens == 0 and m.host_path == ()
    cache.check_invariants()


def test_demote_then_match_reports_host_part_and_promote_moves_it_back():
    pool, host = PagePool(4), HostPool(8)
    cache = RadixCache(pool, page_size=2, host_pool=host)
    t = arr(0, 1, 2, 3, 4, 5, 6, 7)
    cached(cache, t)
    assert cache.evict(3) == 3  # tail blocks first: the last three go to host
    cache.check_invariants()
    assert (cache.num_cached_pages, cache.num_host_pages, pool.num_free) == (1, 3, 3)
    m = cache.match(t)
    assert (m.num_tokens, m.host_tokens, len(m.pages)) == (2, 6, 1)
    with pytest.raises(ValueError, match="unlocked"):
        cache.promote(m, m.pages)
    cache.lock(m)
    longer = cache.promote(m, pool.alloc_array(2), donate=True)  # two of the three come back
    cache.check_invariants()
    assert (longer.num_tokens, longer.host_tokens, len(longer.pages)) == (6, 2, 2)
    # the two loaded blocks keep their host copies: on both tiers
    assert (cache.num_cached_pages, cache.num_locked_pages, cache.num_host_pages, cache.num_host_copies) == (3, 3, 3, 2)
    with pytest.raises(ValueError, match="holds 1"):
        cache.promote(longer, [0, 1])
    cache.unlock(longer)
    assert cache.promoted_pages == 2 and cache.demoted_pages == 3
    cache.clear()
    cache.check_invariants()
    assert pool.num_free == 4 and host.num_free == 8


def test_host_full_drops_least_recently_used_across_tiers():
    pool, host = PagePool(2), HostPool(2)
    cache = RadixCache(pool, page_size=1, host_pool=host)
    for t in (arr(1, 2), arr(3, 4), arr(5, 6)):  # each evicts (demotes) the one before
        m = cache.match(t)
        cache.lock(m)
        cache.evict(max(0, 2 - pool.num_free))
        cached(cache, t)
        cache.unlock(m)
        cache.check_invariants()
    # GPU: the newest; host: the one before; the oldest is gone
    assert cache.match(arr(5, 6)).num_tokens == 2
    assert cache.match(arr(3, 4)).host_tokens == 2
    m = cache.match(arr(1, 2))
    assert m.num_tokens == 0 and m.host_tokens == 0


def test_evict_host_and_insert_through_host_blocks():
    pool, host = PagePool(4), HostPool(4)
    cache = RadixCache(pool, page_size=2, host_pool=host)
    t = arr(0, 1, 2, 3)
    cached(cache, t)
    cache.evict(2)
    assert cache.num_host_pages == 2
    cached(cache, t)  # the caller computed them again: its pages are adopted, the host copy kept
    cache.check_invariants()
    assert (cache.num_cached_pages, cache.num_host_pages, cache.num_host_copies, cache.match(t).num_tokens) == (
        2, 2, 2, 4)
    cache.evict(2)
    assert (cache.demoted_pages, cache.demotes_saved) == (2, 2)
    assert cache.evict_host(1) == 1  # tail first
    cache.check_invariants()
    assert cache.match(t).host_tokens == 2
    with pytest.raises(ValueError, match="cannot evict -1 host"):
        cache.evict_host(-1)


def test_events_name_the_tier():
    pub = QueuePublisher()
    pool = PagePool(2)
    cache = RadixCache(pool, page_size=2, events=pub, host_pool=HostPool(2))
    cached(cache, arr(0, 1, 2, 3))
    pub.drain()
    cache.evict(1)
    removed, stored = pub.drain().events
    assert isinstance(removed, BlockRemoved) and removed.medium == "GPU"
    assert isinstance(stored, BlockStored) and stored.medium == "CPU" and stored.block_hashes == removed.block_hashes


def test_stale_match_after_demotion_is_refused():
    pool = PagePool(2)
    cache = RadixCache(pool, page_size=2, host_pool=HostPool(2))
    t = arr(0, 1, 2, 3)
    cached(cache, t)
    m = cache.match(t)
    cache.evict(2)
    with pytest.raises(ValueError, match="stale"):
        cache.lock(m)
    again = cache.match(t, since=m)
    assert again.num_tokens == 0 and again.host_tokens == 4


@pytest.mark.parametrize("bad", [-1, 2**31, 1.5, True, "8"])
def test_host_pool_size_refused(bad):
    with pytest.raises((ValueError, TypeError), match=str(bad) if not isinstance(bad, str) else "'8'"):
        HostPool(bad)
