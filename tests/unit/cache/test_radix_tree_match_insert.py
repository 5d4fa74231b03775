"""RadixCache example tests, structure: match, insert, edge splits, bad input and the walk an
insert reuses from the match before it. One behaviour of the tree's contract (radixkv/cache/__init__.py, docs/cache.md) / issue 2 item 3 each."""
from __future__ import annotations

import numpy as np
import pytest

from radix_fixtures import PAGE_SIZES, blocks, cached_and_matched, cached_insert, make
from radixkv import MatchResult, PagePool, RadixCache


# ---- match / insert basics -------------------------------------------------------------------
@pytest.mark.parametrize("ps", PAGE_SIZES)
def test_match_returns_longest_block_aligned_prefix_with_its_pages(ps: int) -> None:
    pool, cache = make(ps=ps)
    pages = cached_insert(cache, blocks(1, 2, 3, ps=ps, tail=ps - 1))
    assert len(pages) == 3 and cache.num_cached_pages == 3
    m = cache.match(blocks(1, 2, 3, 4, ps=ps))
    assert isinstance(m, MatchResult) and (m.num_tokens, m.pages) == (3 * ps, pages)
    m = cache.match(blocks(1, 2, 9, ps=ps))
    assert (m.num_tokens, m.pages) == (2 * ps, pages[:2])
    # a partial last block never matches; nor does a prompt shorter than a block
    assert cache.match(blocks(1, 2, ps=ps) + [2000]).num_tokens == 2 * ps
    assert cache.match(blocks(1, ps=ps)[: ps - 1]).num_tokens == 0
    assert cache.match([]).pages == []
    cache.check_invariants()


@pytest.mark.parametrize("ps", [2, 4, 16])
def test_blocks_differing_only_in_their_last_token_do_not_match(ps: int) -> None:
    pool, cache = make(ps=ps)
    a = blocks(1, 2, ps=ps)
    cached_insert(cache, a)
    b = list(a)
    b[-1] += 1  # second block differs in its last token
    assert cache.match(b).num_tokens == ps
    b = list(a)
    b[ps - 1] += 1  # first block differs in its last token
    assert cache.match(b).num_tokens == 0


def test_insert_returns_already_cached_tokens_and_does_not_adopt_the_callers_pages() -> None:
    pool, cache = make(ps=4)
    tree_pages = cached_insert(cache, blocks(1, 2, ps=4))
    mine = pool.alloc(3)  # a request that computed all three blocks itself
    before = pool.refcounts(mine).tolist()
    assert cache.insert(blocks(1, 2, 3, ps=4), mine) == 8
    # blocks 1 and 2 keep the tree's pages; only the third page is adopted
    assert pool.refcounts(mine).tolist() == [before[0], before[1], before[2] + 1]
    assert pool.refcounts(tree_pages).tolist() == [1, 1]
    assert cache.match(blocks(1, 2, 3, ps=4)).pages == tree_pages + [mine[2]]
    pool.decref(mine)  # the caller drops its references: its first two pages are free again
    assert [pool.refcount(p) for p in mine] == [0, 0, 1]
    assert cache.num_cached_pages == 3
    cache.check_invariants()


def test_insert_of_a_fully_cached_prefix_changes_no_refcounts() -> None:
    pool, cache = make(ps=2)
    tree_pages = cached_insert(cache, blocks(5, 6, ps=2))
    m = cache.match(blocks(5, 6, ps=2))
    refs = pool.refcounts(range(pool.num_pages)).tolist()
    assert cache.insert(blocks(5, 6, ps=2), m.pages) == 4
    assert pool.refcounts(range(pool.num_pages)).tolist() == refs
    assert m.pages == tree_pages


def test_insert_accepts_extra_tail_page_and_numpy_inputs() -> None:
    pool, cache = make(ps=4)
    tokens = np.array(blocks(1, 2, ps=4, tail=3), dtype=np.int64)
    pages = np.array(pool.alloc(3))  # two full blocks + the private tail page
    assert cache.insert(tokens, pages) == 0
    assert cache.num_cached_pages == 2
    assert pool.refcounts(pages).tolist() == [2, 2, 1]
    cache.check_invariants()


# ---- splits ----------------------------------------------------------------------------------
def test_match_ending_inside_an_edge_splits_it_and_the_match_ends_at_the_cut() -> None:
    pool, cache = make(ps=2)
    pages = cached_insert(cache, blocks(1, 2, 3, 4, ps=2))
    root = cache.root()
    assert len(list(root.iter_children())) == 1 and next(root.iter_children()).num_tokens == 8
    m = cache.match(blocks(1, 2, 7, ps=2))
    assert (m.num_tokens, m.pages) == (4, pages[:2])
    upper = next(root.iter_children())
    assert upper is m.node and upper.num_tokens == 4
    (lower,) = upper.iter_children()
    assert lower.num_tokens == 4 and lower.parent is upper
    assert cache.match(blocks(1, 2, 3, 4, ps=2)).pages == pages  # the whole path still matches
    assert cache.num_cached_pages == 4
    cache.check_invariants()


def test_insert_ending_inside_an_edge_splits_it_and_branches() -> None:
    pool, cache = make(ps=2)
    a = cached_insert(cache, blocks(1, 2, 3, ps=2))
    b = cached_insert(cache, blocks(1, 2, 8, 9, ps=2))
    assert b[:2] == a[:2] and b[2] not in a
    (upper,) = cache.root().iter_children()
    assert upper.num_tokens == 4
    assert sorted(c.num_tokens for c in upper.iter_children()) == [2, 4]
    assert cache.match(blocks(1, 2, 3, ps=2)).pages == a
    assert cache.match(blocks(1, 2, 8, 9, ps=2)).pages == b
    assert cache.num_cached_pages == 5
    cache.check_invariants()


def test_a_split_keeps_locks_on_both_halves() -> None:
    pool, cache, m = cached_and_matched(1, 2, 3)
    cache.lock(m)
    cache.match(blocks(1, 9, ps=2))  # splits the locked edge after one block
    assert cache.num_locked_pages == 3
    assert cache.evict(10) == 0
    cache.unlock(m)
    assert cache.num_locked_pages == 0 and cache.evict(10) == 3
    cache.check_invariants()


# ---- bad input -------------------------------------------------------------------------------
def _snapshot(pool: PagePool, cache: RadixCache) -> tuple:
    return (pool.num_free, pool.refcounts(range(pool.num_pages)).tolist(), cache.num_cached_pages)


@pytest.mark.parametrize("case", ["too_few", "free", "outside", "negative"])
def test_bad_insert_raises_before_any_change(case: str) -> None:
    pool, cache = make(num_pages=16, ps=2)
    cached = cached_insert(cache, blocks(1, 2, ps=2))
    mine = pool.alloc(3)
    toks = blocks(1, 2, 3, 4, 5, ps=2)
    good = cached + mine
    bad = {
        "too_few": good[:4],
        "free": cached + [mine[0], mine[1], next(p for p in range(16) if pool.refcount(p) == 0)],
        "outside": cached + [mine[0], 16, mine[2]],
        "negative": cached + [mine[0], -1, mine[2]],
    }[case]
    before = _snapshot(pool, cache)
    with pytest.raises((ValueError, IndexError)):
        cache.insert(toks, bad)
    assert _snapshot(pool, cache) == before
    cache.check_invariants()
    assert cache.insert(toks, good) == 4  # the tree still works afterwards


@pytest.mark.parametrize("case", ["twice", "cached"])
def test_check_invariants_reports_a_page_given_for_two_blocks(case: str) -> None:
    """insert does not look for these caller bugs (too costly on the hot path); the
    invariant check names them."""
    pool, cache = make(num_pages=16, ps=2)
    cached = cached_insert(cache, blocks(1, 2, ps=2))
    mine = pool.alloc(2)
    pages = cached + ([mine[0], mine[0]] if case == "twice" else [mine[0], cached[0]])
    cache.insert(blocks(1, 2, 3, 4, ps=2), pages)
    with pytest.raises(AssertionError, match="twice"):
        cache.check_invariants()


def test_bad_tokens_raise() -> None:
    pool, cache = make(ps=2)
    with pytest.raises(ValueError, match="one-dimensional"):
        cache.match(np.zeros((2, 2), dtype=np.int32))
    with pytest.raises(ValueError, match="non-negative"):
        cache.match([1, -2])
    with pytest.raises(ValueError):
        RadixCache(pool, page_size=0)


def test_read_only_tokens_may_be_kept_as_a_view_and_writable_ones_are_copied() -> None:
    pool, cache = make(ps=2)
    toks = np.array(blocks(1, 2, ps=2), dtype=np.int32)
    cached_insert(cache, toks)
    toks[:] = 0  # the caller reuses its buffer: the tree kept a copy
    assert cache.match(blocks(1, 2, ps=2)).num_tokens == 4
    ro = np.array(blocks(7, 8, ps=2), dtype=np.int32)
    ro.flags.writeable = False
    cached_insert(cache, ro)
    assert cache.match(blocks(7, 8, ps=2)).num_tokens == 4
    cache.check_invariants()


def test_check_invariants_names_a_corrupted_node() -> None:
    pool, cache = make(ps=2)
    cached_insert(cache, blocks(1, 2, ps=2))
    (node,) = cache.root().iter_children()
    node.lock_count = node.end_locks = 1  # a lock the counters never saw
    with pytest.raises(AssertionError, match="num_locked_pages"):
        cache.check_invariants()
    node.end_locks = 0  # a path lock no match ending here or below accounts for
    with pytest.raises(AssertionError, match="locks ending here plus its children"):
        cache.check_invariants()
    node.lock_count = 0
    node.pages = node.pages[:1]
    with pytest.raises(AssertionError, match="Node"):
        cache.check_invariants()


# ---- insert right after a match of the same read-only array (the walk is reused) -------------
def _read_only(tokens: list[int]) -> np.ndarray:
    arr = np.array(tokens, dtype=np.int32)
    arr.flags.writeable = False
    return arr


def test_insert_after_match_sees_an_insert_made_in_between() -> None:
    pool, cache = make(ps=2)
    toks = _read_only(blocks(1, 2, 3, ps=2))
    assert cache.match(toks).num_tokens == 0
    other = cached_insert(cache, blocks(1, 2, ps=2))  # extends the path the match saw
    mine = pool.alloc(3)
    assert cache.insert(toks, mine) == 4  # blocks 1, 2 are cached now: not adopted
    assert cache.match(toks).pages == other + [mine[2]]
    cache.check_invariants()


def test_insert_after_match_sees_an_eviction_made_in_between() -> None:
    pool, cache = make(ps=2)
    cached_insert(cache, blocks(1, 2, ps=2))
    toks = _read_only(blocks(1, 2, 3, ps=2))
    m = cache.match(toks)  # unlocked: its tail may go
    assert m.num_tokens == 4
    assert cache.evict(1) == 1  # block 2 leaves; m.node is truncated
    mine = pool.alloc(3)
    assert cache.insert(toks, m.pages[:1] + mine[1:]) == 2
    assert cache.match(toks).pages == m.pages[:1] + mine[1:]
    cache.check_invariants()
