"""Input the cache must refuse before changing anything (issue 16, defects 4 and 5):
unlock of a shorter match than the one locked, matches of another cache, and page ids
that are not integers."""
from __future__ import annotations

import numpy as np
import pytest

from radix_fixtures import blocks, cached_and_matched, cached_insert, make
from radixkv import PagePool


def _tree_state(cache) -> tuple:
    """What a refused call must leave as it was: counters, pool and every node's lock counts."""
    nodes, stack = [], [cache.root(ns) for ns in cache.namespaces]
    while stack:
        node = stack.pop()
        nodes.append((id(node), node.lock_count, node.end_locks, len(node.pages)))
        stack.extend(node.iter_children())
    pool = cache.pool
    return (cache.num_cached_pages, cache.num_locked_pages, pool.num_free,
            pool.refcounts(range(pool.num_pages)).tolist(), sorted(nodes))


# ---- defect 4: unlock must undo a lock taken on that very match ------------------------------
def test_unlock_of_a_shorter_match_than_the_locked_one_raises_and_changes_nothing() -> None:
    pool, cache, long = cached_and_matched(1, 2, 3)
    cache.lock(long)
    short = cache.match(blocks(1, 2, ps=2))  # the same path, one block shorter (splits the edge)
    before = _tree_state(cache)
    with pytest.raises(ValueError, match="unlocked path.*only longer matches"):
        cache.unlock(short)
    assert _tree_state(cache) == before
    cache.check_invariants()
    cache.unlock(long)  # the real owner still unlocks, and everything becomes evictable
    assert cache.num_locked_pages == 0 and cache.num_evictable_pages == 3
    assert cache.evict(3) == 3 and pool.num_free == pool.num_pages
    cache.check_invariants()


def test_unlock_of_the_empty_prefix_of_a_locked_match_raises() -> None:
    pool, cache, long = cached_and_matched(1, 2)
    cache.lock(long)
    empty = cache.match(blocks(9, ps=2))
    assert empty.num_tokens == 0
    with pytest.raises(ValueError, match="unlocked"):
        cache.unlock(empty)
    cache.lock(empty)  # an empty match's lock counts too: lock, then unlock, once
    cache.unlock(empty)
    with pytest.raises(ValueError, match="unlocked"):
        cache.unlock(empty)
    cache.unlock(long)
    cache.check_invariants()


def test_a_lock_on_a_prefix_and_one_on_the_whole_path_unlock_in_any_order() -> None:
    pool, cache, long = cached_and_matched(1, 2, 3)
    short = cache.match(blocks(1, ps=2))
    cache.lock(short)
    cache.lock(long)
    with pytest.raises(ValueError, match="unlocked"):
        cache.unlock(cache.match(blocks(1, 2, ps=2)))  # a match in between was never locked
    cache.unlock(short)
    assert cache.num_locked_pages == 3  # long still covers the whole path
    cache.check_invariants()
    with pytest.raises(ValueError, match="unlocked"):
        cache.unlock(short)  # its one lock is spent, though long's path still goes through it
    cache.unlock(long)
    assert cache.num_locked_pages == 0 and cache.evict(3) == 3
    cache.check_invariants()


def test_a_split_keeps_each_lock_with_the_match_that_took_it() -> None:
    pool, cache, long = cached_and_matched(1, 2, 3, 4)
    cache.lock(long)
    mid = cache.match(blocks(1, 2, ps=2))  # splits the locked edge above long's end
    cache.lock(mid)
    cache.check_invariants()
    cache.unlock(long)
    assert cache.num_locked_pages == 2  # mid keeps blocks 1-2
    assert cache.evict(4) == 2 and cache.match(blocks(1, 2, 3, 4, ps=2)).num_tokens == 4
    cache.unlock(mid)
    cache.check_invariants()


def test_lock_and_unlock_refuse_another_caches_match_and_change_nothing() -> None:
    pool, cache, ours = cached_and_matched(1, 2)
    other_pool, other, theirs = cached_and_matched(1, 2)  # same tokens, another cache
    empty_theirs = other.match(blocks(9, ps=2))
    before, other_before = _tree_state(cache), _tree_state(other)
    for m in (theirs, empty_theirs):
        with pytest.raises(ValueError, match="another RadixCache"):
            cache.lock(m)
        assert _tree_state(cache) == before and _tree_state(other) == other_before
    other.lock(theirs)
    other_before = _tree_state(other)
    with pytest.raises(ValueError, match="another RadixCache"):
        cache.unlock(theirs)  # locked over there, not here
    assert _tree_state(cache) == before and _tree_state(other) == other_before
    assert cache.evict(2) == 2 and pool.num_free == pool.num_pages
    other.unlock(theirs)
    cache.check_invariants()
    other.check_invariants()


def test_check_invariants_reports_a_lock_count_out_of_step_with_the_locks_ending_at_nodes() -> None:
    pool, cache, m = cached_and_matched(1, 2)
    cache.lock(m)
    m.node.end_locks = 0  # the path's lock no longer belongs to any match
    with pytest.raises(AssertionError, match="locks ending here"):
        cache.check_invariants()
    m.node.end_locks = -1
    with pytest.raises(AssertionError, match="negative"):
        cache.check_invariants()


# ---- defect 5: page ids must be integers -----------------------------------------------------
NOT_PAGE_IDS = [
    pytest.param([1.9], id="float"),
    pytest.param([1.0], id="whole-float"),
    pytest.param([np.float64(1.0)], id="numpy-float"),
    pytest.param([0, True], id="bool-among-ints"),
    pytest.param([True], id="bool"),
    pytest.param([np.True_], id="numpy-bool"),
    pytest.param(["1"], id="str"),
    pytest.param([None], id="None"),
    pytest.param([[1]], id="nested-list"),
    pytest.param(np.array([1.0]), id="float-array"),
    pytest.param(np.array([True]), id="bool-array"),
    pytest.param(np.array(["1"]), id="str-array"),
]


@pytest.mark.parametrize("bad", NOT_PAGE_IDS)
def test_incref_decref_refcounts_refuse_non_integer_page_ids(bad) -> None:
    pool = PagePool(4)
    pool.alloc(3)
    pool.incref([1])
    before = (pool.num_free, pool.refcounts(range(4)).tolist())
    for op in (pool.incref, pool.decref, pool.refcounts):
        with pytest.raises(ValueError, match="integer"):
            op(bad)
        with pytest.raises(ValueError, match="integer"):
            op(iter(bad))  # any iterable is read the same way
        assert (pool.num_free, pool.refcounts(range(4)).tolist()) == before
    pool.check_invariants()


def test_decref_of_a_float_id_does_not_free_the_truncated_page() -> None:
    pool = PagePool(4)
    pages = pool.alloc(2)  # [0, 1]
    with pytest.raises(ValueError, match=r"pages\[1\] is 1.9 \(float\)"):
        pool.decref([pages[0], 1.9])
    assert pool.refcount(1) == 1 and pool.refcount(0) == 1 and pool.num_free == 2
    with pytest.raises(ValueError, match=r"pages\[0\] is True \(bool\)"):
        pool.decref([True])
    assert pool.refcount(1) == 1


def test_integer_page_ids_of_every_spelling_are_accepted() -> None:
    pool = PagePool(8)
    pages = pool.alloc(8)
    spellings = [pages, tuple(pages), iter(pages), range(8), [np.int32(p) for p in pages],
                 [np.int64(p) for p in pages], np.array(pages, dtype=np.int32),
                 np.array(pages, dtype=np.uint16)]
    for spelled in spellings:
        pool.incref(spelled)
        assert pool.refcounts(range(8)).tolist() == [2] * 8
        assert pool.decref(list(range(8))) == 0
    long = list(range(8)) * 8  # past the short-list path: numpy reduces it
    pool.incref(long)
    assert pool.refcounts(range(8)).tolist() == [9] * 8
    assert pool.decref(long) == 0
    with pytest.raises(IndexError, match="page 8"):
        pool.incref(long + [8])
    assert pool.decref(pages) == 8
    pool.check_invariants()


@pytest.mark.parametrize("bad", [[1.9, 0.5], [0, 1.0], ["a", "b"], [None, 0], [np.float64(1), 0]])
def test_insert_refuses_non_integer_page_ids_naming_them(bad) -> None:
    pool, cache = make(ps=2)
    pool.alloc(2)
    cache.root()  # made on first use: not a change of the tree
    before = _tree_state(cache)
    with pytest.raises(ValueError, match="integer"):
        cache.insert(blocks(1, 2, ps=2), bad)
    assert _tree_state(cache) == before
    cached_insert(cache, blocks(1, 2, ps=2))  # a good insert still works
    cache.check_invariants()
