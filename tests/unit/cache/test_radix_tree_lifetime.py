"""RadixCache example tests, lifetime: locks, LRU eviction, namespaces, forced hash
collisions, counters and clear. One behaviour of the tree's contract (radixkv/cache/__init__.py, docs/cache.md) / issue 2 item 3 each."""
from __future__ import annotations

import pytest

from radix_fixtures import PAGE_SIZES, blocks, cached_and_matched, cached_insert, make


# ---- locks -----------------------------------------------------------------------------------
def test_locked_path_survives_eviction_and_unlock_makes_it_evictable() -> None:
    pool, cache = make(num_pages=8, ps=2)
    keep = cached_insert(cache, blocks(1, 2, ps=2))
    cached_insert(cache, blocks(3, 4, ps=2))
    m = cache.match(blocks(1, 2, ps=2))
    cache.lock(m)
    assert (cache.num_locked_pages, cache.num_evictable_pages) == (2, 2)
    assert cache.evict(4) == 2  # only the unlocked path can go
    assert cache.match(blocks(1, 2, ps=2)).pages == keep
    assert cache.match(blocks(3, 4, ps=2)).num_tokens == 0
    assert pool.num_free == 6
    cache.unlock(m)
    assert cache.num_locked_pages == 0 and cache.evict(4) == 2
    assert pool.num_free == 8
    cache.check_invariants()


def test_locks_nest_per_match_and_a_longer_lock_covers_its_prefix() -> None:
    pool, cache = make(ps=2)
    cached_insert(cache, blocks(1, 2, 3, ps=2))
    short, full = cache.match(blocks(1, ps=2)), cache.match(blocks(1, 2, 3, ps=2))
    cache.lock(full)
    cache.lock(short)
    cache.unlock(full)
    assert cache.num_locked_pages == 1  # block 1 still locked by `short`
    assert cache.evict(3) == 2 and cache.match(blocks(1, ps=2)).num_tokens == 2
    cache.unlock(short)
    assert cache.evict(3) == 1
    cache.check_invariants()


def test_unlock_of_an_unlocked_path_raises_and_changes_nothing() -> None:
    pool, cache, m = cached_and_matched(1, 2, 3)
    with pytest.raises(ValueError, match="unlock of an unlocked path"):
        cache.unlock(m)
    short = cache.match(blocks(1, ps=2))  # splits; then lock only the first block
    cache.lock(short)
    with pytest.raises(ValueError, match="unlock of an unlocked path"):
        cache.unlock(m)  # deeper part unlocked: the shared first block must keep its lock
    assert cache.num_locked_pages == 1
    cache.unlock(short)
    with pytest.raises(ValueError):
        cache.unlock(short)
    cache.check_invariants()


def test_lock_of_a_stale_match_raises() -> None:
    pool, cache = make(ps=2)
    cached_insert(cache, blocks(1, 2, ps=2))
    gone = cache.match(blocks(1, 2, ps=2))
    assert cache.evict(2) == 2  # the whole path
    with pytest.raises(ValueError, match="stale"):
        cache.lock(gone)
    with pytest.raises(ValueError, match="stale"):
        cache.unlock(gone)
    # the same prefix cached again is a new path: the old match stays stale
    cached_insert(cache, blocks(1, 2, ps=2))
    with pytest.raises(ValueError, match="stale"):
        cache.lock(gone)
    assert cache.num_locked_pages == 0
    cache.check_invariants()


def test_lock_of_a_match_whose_tail_was_evicted_raises() -> None:
    pool, cache, m = cached_and_matched(1, 2, 3)
    assert cache.evict(1) == 1  # only the last block goes; m's node survives, shorter
    with pytest.raises(ValueError, match="stale"):
        cache.lock(m)
    assert cache.num_locked_pages == 0
    cache.lock(cache.match(blocks(1, 2, 3, ps=2)))  # a fresh match locks fine
    assert cache.num_locked_pages == 2


def test_lock_of_an_empty_match_is_a_no_op() -> None:
    pool, cache = make(ps=2)
    m = cache.match(blocks(1, ps=2))
    assert m.num_tokens == 0 and m.node is cache.root()
    cache.lock(m)
    cache.unlock(m)
    assert cache.num_locked_pages == 0


# ---- eviction / LRU --------------------------------------------------------------------------
def test_evict_frees_least_recently_used_leaf_first() -> None:
    pool, cache = make(ps=2)
    a = cached_insert(cache, blocks(1, ps=2))
    b = cached_insert(cache, blocks(2, ps=2))
    c = cached_insert(cache, blocks(3, ps=2))
    cache.match(blocks(1, ps=2))  # a is now the most recently used
    assert cache.evict(1) == 1 and pool.refcount(b[0]) == 0
    assert cache.evict(1) == 1 and pool.refcount(c[0]) == 0
    assert pool.refcount(a[0]) == 1
    cache.check_invariants()


def test_evict_takes_tail_blocks_of_a_leaf_first() -> None:
    pool, cache = make(ps=2)
    pages = cached_insert(cache, blocks(1, 2, 3, 4, ps=2))
    assert cache.evict(3) == 3
    assert [pool.refcount(p) for p in pages] == [1, 0, 0, 0]
    m = cache.match(blocks(1, 2, 3, 4, ps=2))
    assert (m.num_tokens, m.pages) == (2, pages[:1])
    cache.check_invariants()


def test_a_parent_becomes_evictable_after_its_children_in_lru_order() -> None:
    pool, cache = make(ps=1)
    a = cached_insert(cache, [1, 2])
    b = cached_insert(cache, [1, 3])
    c = cached_insert(cache, [9])
    cache.match([1, 3])  # refresh [1] and [1,3]: [1,2]'s leaf is now the oldest
    assert cache.evict(1) == 1 and pool.refcount(a[1]) == 0
    assert cache.evict(1) == 1 and pool.refcount(c[0]) == 0  # [9] (t3) is older than [1,3] (t4)
    assert cache.evict(1) == 1 and pool.refcount(b[1]) == 0
    assert cache.evict(1) == 1 and pool.refcount(a[0]) == 0  # the parent, now a leaf
    assert cache.num_cached_pages == 0 and pool.num_free == pool.num_pages
    cache.check_invariants()


def test_evict_skips_pages_a_caller_still_holds_and_keeps_going() -> None:
    pool, cache = make(num_pages=8, ps=2)
    held = cached_insert(cache, blocks(1, ps=2))
    other = cached_insert(cache, blocks(2, ps=2))
    pool.incref(held)  # a running request still uses the page (without a lock)
    assert cache.evict(1) == 1  # held's page leaves the tree but is not free: other goes too
    assert cache.num_cached_pages == 0
    assert pool.refcount(held[0]) == 1 and pool.refcount(other[0]) == 0
    pool.decref(held)
    assert pool.num_free == 8
    cache.check_invariants()


def test_lru_heap_stays_bounded_under_repeated_matches() -> None:
    """Each match re-queues its leaf (lazy deletion); stale entries are dropped in bulk
    before they outnumber the nodes 4 to 1, and eviction order is unaffected."""
    pool, cache = make(num_pages=16, ps=2)
    a = cached_insert(cache, blocks(1, ps=2))
    b = cached_insert(cache, blocks(2, ps=2))
    for _ in range(3000):
        cache.match(blocks(1, ps=2))
    assert len(cache._lru) <= 4 * 2 + 1024 + 1
    cache.check_invariants()
    assert cache.evict(1) == 1 and pool.refcount(b[0]) == 0 and pool.refcount(a[0]) == 1


def test_evict_more_than_cached_and_bad_counts() -> None:
    pool, cache = make(ps=2)
    cached_insert(cache, blocks(1, 2, ps=2))
    assert cache.evict(0) == 0
    with pytest.raises(ValueError):
        cache.evict(-1)
    assert cache.evict(100) == 2 and cache.evict(1) == 0


# ---- namespaces ------------------------------------------------------------------------------
def test_namespaces_are_disjoint_and_none_is_the_default() -> None:
    pool, cache = make(ps=2)
    toks = blocks(1, 2, ps=2)
    default = cached_insert(cache, toks)
    assert cache.match(toks, None).pages == default
    assert cache.match(toks, "tenant-a").num_tokens == 0
    a = cached_insert(cache, toks, "tenant-a")
    assert not set(a) & set(default)
    assert cache.match(toks, "tenant-a").pages == a
    assert cache.match(toks).pages == default
    assert cache.match(toks, "tenant-b").num_tokens == 0
    assert cache.root("tenant-a") is not cache.root()
    assert cache.num_cached_pages == 4
    # evicting one namespace's pages leaves the other's
    cache.match(toks)  # default is more recent
    assert cache.evict(2) == 2
    assert cache.match(toks).pages == default and cache.match(toks, "tenant-a").num_tokens == 0
    cache.check_invariants()


# ---- hash collisions -------------------------------------------------------------------------
@pytest.mark.parametrize("ps", [1, 2, 16])
def test_forced_hash_collisions_never_return_another_prefixs_pages(ps: int) -> None:
    pool, cache = make(num_pages=64, ps=ps, hash_fn=lambda block: 0)
    seqs = [blocks(1, 2, ps=ps), blocks(2, 1, ps=ps), blocks(3, ps=ps), blocks(1, 3, ps=ps)]
    pages = [cached_insert(cache, s) for s in seqs]
    for s, p in zip(seqs, pages):
        assert cache.match(s).pages == p
    assert cache.match(blocks(4, ps=ps)).num_tokens == 0
    assert cache.match(blocks(2, 2, ps=ps)).pages == pages[1][:1]
    assert pages[3][0] == pages[0][0]  # shares block 1 with the first sequence
    # eviction under collisions removes the right sibling from its hash chain
    cache.match(seqs[0])
    cache.match(seqs[3])
    cache.match(seqs[2])
    cache.evict(1)  # seqs[1]'s last block, the least recently used leaf
    assert cache.match(seqs[1]).num_tokens == ps
    for s, p in zip((seqs[0], seqs[2], seqs[3]), (pages[0], pages[2], pages[3])):
        assert cache.match(s).pages == p
    cache.check_invariants()
    assert cache.num_cached_pages == 5  # 2 + 2 + 1 + 1 (block 1 shared), one evicted
    assert cache.clear() == 5
    assert pool.num_free == pool.num_pages


# ---- counters and clear ----------------------------------------------------------------------
@pytest.mark.parametrize("ps", PAGE_SIZES)
def test_counters_stay_consistent_and_clear_returns_everything(ps: int) -> None:
    pool, cache = make(num_pages=40, ps=ps)
    for seq in ([1, 2, 3], [1, 2, 4], [5], [1, 6, 7, 8]):
        cached_insert(cache, blocks(*seq, ps=ps, tail=ps // 2))
        assert cache.num_cached_pages == cache.num_evictable_pages + cache.num_locked_pages
        assert pool.num_free + cache.num_cached_pages <= pool.num_pages
    assert cache.num_cached_pages == 8
    m = cache.match(blocks(1, 2, 3, ps=ps))
    cache.lock(m)
    assert (cache.num_locked_pages, cache.num_evictable_pages) == (3, 5)
    assert cache.clear() == 5  # locked pages stay
    assert cache.num_cached_pages == 3 and cache.match(blocks(1, 2, 3, ps=ps)).pages == m.pages
    cache.unlock(m)
    assert cache.clear() == 3
    assert cache.num_cached_pages == 0 and pool.num_free == pool.num_pages
    cache.check_invariants()
