"""RadixCache.extend: chunked prefill's insert below a locked match, linear in the new blocks."""
from __future__ import annotations

import numpy as np
import pytest

from radix_fixtures import blocks, cached_insert, make


def test_extend_caches_the_new_blocks_and_moves_the_lock() -> None:
    pool, cache = make(ps=2)
    first = pool.alloc(2)
    cache.insert(blocks(1, 2, ps=2), first)
    m = cache.match(blocks(1, 2, ps=2))
    cache.lock(m)
    more = pool.alloc(3)
    longer = cache.extend(m, blocks(3, 4, ps=2, tail=1), more)  # the tail token is not cached
    assert (longer.num_tokens, longer.pages, longer.pages_from) == (8, more[:2], 2)
    assert cache.match(blocks(1, 2, 3, 4, ps=2)).pages == first + more[:2]
    assert cache.num_locked_pages == 4 and cache.num_evictable_pages == 0
    cache.check_invariants()
    with pytest.raises(ValueError, match="unlocked"):
        cache.unlock(m)  # the lock moved: m's path is locked only through the longer match
    cache.unlock(longer)
    assert cache.num_locked_pages == 0
    cache.check_invariants()  # the unlock handed the new blocks' use time up to the root
    pool.decref(first + more)
    assert cache.evict(4) == 4 and pool.num_free == pool.num_pages


def test_extend_keeps_the_trees_pages_for_blocks_cached_below_first() -> None:
    pool, cache = make(ps=2)
    theirs = cached_insert(cache, blocks(1, 2, 3, ps=2))  # another request got further first
    m = cache.match(blocks(1, ps=2))
    cache.lock(m)
    ours = pool.alloc(3)
    longer = cache.extend(m, blocks(2, 3, 4, ps=2), ours)
    assert longer.pages == theirs[1:] + [ours[2]]  # ours[0], ours[1] not adopted
    assert pool.refcounts(ours).tolist() == [1, 1, 2]
    cache.unlock(longer)
    cache.check_invariants()


def test_extend_with_nothing_new_keeps_the_lock_where_it_was() -> None:
    pool, cache = make(ps=4)
    cached_insert(cache, blocks(1, ps=4))
    m = cache.match(blocks(1, ps=4))
    cache.lock(m)
    same = cache.extend(m, np.zeros(3, dtype=np.int32), [])  # a partial block: nothing to cache
    assert (same.num_tokens, same.pages, same.node) == (4, [], m.node)
    cache.unlock(same)
    cache.check_invariants()


def test_extend_refuses_an_unlocked_match_and_bad_pages_changing_nothing() -> None:
    pool, cache = make(num_pages=8, ps=2)
    cached_insert(cache, blocks(1, ps=2))
    m = cache.match(blocks(1, ps=2))
    with pytest.raises(ValueError, match="unlocked match"):
        cache.extend(m, blocks(2, ps=2), pool.alloc(1))
    cache.lock(m)
    with pytest.raises(ValueError, match="one page per full block"):
        cache.extend(m, blocks(2, 3, ps=2), [])
    with pytest.raises(ValueError):  # a free page
        cache.extend(m, blocks(2, ps=2), [7])
    assert cache.num_cached_pages == 1 and cache.num_locked_pages == 1
    cache.check_invariants()


def test_extend_donate_hands_the_callers_references_to_the_tree() -> None:
    pool, cache = make(ps=2)
    theirs = cached_insert(cache, blocks(1, 2, ps=2))  # block 2 is cached below the match of block 1
    m = cache.match(blocks(1, ps=2))
    cache.lock(m)
    ours = pool.alloc(4)  # blocks 2, 3, 4 and a tail page
    longer = cache.extend(m, blocks(2, 3, 4, ps=2, tail=1), ours, donate=True)
    assert longer.pages == [theirs[1]] + ours[1:3]
    # ours[1:3] adopted without an incref; ours[0] (block 2 was cached) and the tail stay ours
    assert pool.refcounts(ours).tolist() == [1, 1, 1, 1]
    cache.unlock(longer)
    cache.check_invariants()
    pool.decref([ours[0], ours[3]])
    assert pool.refcounts(ours).tolist() == [0, 1, 1, 0]
    assert cache.clear() == 4  # the tree's references were the last on theirs and ours[1:3]
    assert pool.num_free == pool.num_pages
    pool.check_invariants()
