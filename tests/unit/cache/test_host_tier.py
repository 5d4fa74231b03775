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


class Mover:
    """Records the copies the tree asks for."""

    def __init__(self) -> None:
        self.d2h: list[list[int]] = []
        self.h2d: list[list[int]] = []

    def demote(self, gpu_pages: np.ndarray, host_pages: np.ndarray) -> None:
        self.d2h.append(gpu_pages.tolist())

    def promote(self, host_pages: np.ndarray, gpu_pages: np.ndarray) -> None:
        self.h2d.append(host_pages.tolist())


def test_a_loaded_block_keeps_its_host_copy_and_demotes_onto_it_without_a_copy():
    pub, mover = QueuePublisher(), Mover()
    pool, host = PagePool(4), HostPool(4)
    cache = RadixCache(pool, page_size=2, host_pool=host, mover=mover, events=pub)
    t = arr(0, 1, 2, 3)
    cached(cache, t)
    cache.evict(2)
    assert len(mover.d2h) == 1 and cache.demoted_pages == 2
    pub.drain()
    m = cache.load(t, None, cache.match(t), 2)  # back on GPU, and still on host: both tiers
    cache.check_invariants()
    assert (m.num_tokens, m.host_tokens) == (4, 0)
    assert (cache.num_cached_pages, cache.num_host_pages, cache.num_host_copies, host.num_used) == (2, 2, 2, 2)
    assert [(type(e), e.medium) for e in pub.drain().events] == [(BlockStored, "GPU")]  # the CPU copy stays stored
    assert cache.evict(2) == 2  # GPU eviction: the GPU pages go, no device-to-host copy
    cache.check_invariants()
    assert len(mover.d2h) == 1 and cache.demoted_pages == 2 and cache.demotes_saved == 2
    assert [(type(e), e.medium) for e in pub.drain().events] == [(BlockRemoved, "GPU")]
    assert (cache.num_cached_pages, cache.num_host_pages, cache.num_host_copies) == (0, 2, 0)
    assert cache.match(t).host_tokens == 4


def test_host_room_gives_up_copies_before_it_forgets_a_block():
    """A demotion short of host pages takes them from host copies of blocks also on GPU (nothing is
    forgotten) before it drops a host-only block; evict_host does the same, tail blocks first."""
    pub = QueuePublisher()
    pool, host = PagePool(4), HostPool(4)
    cache = RadixCache(pool, page_size=1, host_pool=host, events=pub)
    a, b = arr(1, 2), arr(3, 4)
    cached(cache, a)
    cache.evict(2)
    cache.load(a, None, cache.match(a), 2)  # a: both tiers (2 host pages held as copies)
    cached(cache, b)
    cache.evict_host(0)
    cache.check_invariants()
    cache.match(a)  # a is the most recently used: b is the GPU's next victim
    pub.drain()
    host_free = host.num_free
    assert cache.evict(2) == 2  # b demotes: its 2 host pages are the free ones, no copy goes
    assert cache.num_host_copies == 2 and host_free == 2
    assert cache.evict_host(1) == 1  # a's tail block gives up its copy first; b (host-only) stays
    cache.check_invariants()
    assert (cache.num_host_copies, cache.num_host_pages) == (1, 3)
    assert cache.match(b).host_tokens == 2 and cache.match(a).num_tokens == 2
    removed = [e for e in pub.drain().events if isinstance(e, BlockRemoved)]
    assert [e.medium for e in removed] == ["GPU", "CPU"] and len(removed[-1].block_hashes) == 1
    cached(cache, arr(5, 6))
    assert cache.evict(2) == 2  # a goes: its tail block is copied, its head demotes onto the copy it kept
    cache.check_invariants()
    assert (cache.demoted_pages, cache.demotes_saved) == (2 + 2 + 1, 1)
    assert (cache.num_host_pages, cache.match(a).host_tokens, cache.match(b).host_tokens) == (4, 2, 2)
