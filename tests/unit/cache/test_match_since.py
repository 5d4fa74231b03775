"""RadixCache.match(since=...) and match_many: the same answers and the same LRU order as a
fresh match, whatever happened to the tree since the earlier match."""
from __future__ import annotations

import numpy as np
import pytest

from radixkv import PagePool, RadixCache

PS = 4


def toks(*blocks: int, tail: int = 0) -> np.ndarray:
    """Block b holds tokens 100*b .. 100*b + PS - 1; `tail` extra tokens of a partial block."""
    out = [100 * b + i for b in blocks for i in range(PS)] + [7] * tail
    return np.asarray(out, dtype=np.int32)


def cache_with(*prompts: np.ndarray, num_pages: int = 64) -> RadixCache:
    cache = RadixCache(PagePool(num_pages), page_size=PS)
    for t in prompts:
        m = cache.match(t)
        new = cache.pool.alloc(len(t) // PS - m.num_tokens // PS)
        cache.insert(t, m.pages + new)
        cache.pool.decref(new)
    return cache


def same(a, b) -> None:
    assert (a.num_tokens, a.pages, a.node) == (b.num_tokens, b.pages, b.node)


def alike(a, b) -> None:
    """Matches in two caches fed the same operations (the same page ids, their own nodes)."""
    assert (a.num_tokens, a.pages, a.node.depth) == (b.num_tokens, b.pages, b.node.depth)


def test_still_valid_returns_the_earlier_match_itself():
    cache = cache_with(toks(1, 2, 3), toks(1, 2, 4))
    t = toks(1, 2, 3, 5, tail=2)
    m = cache.match(t)
    again = cache.match(t, since=m)
    assert again is m
    same(again, cache.match(t))
    cache.check_invariants()


def test_grown_tokens_are_matched_further_when_cached_since():
    cache = cache_with(toks(1, 2))
    m = cache.match(toks(1, 2, 3))
    assert m.num_tokens == 2 * PS
    new = cache.pool.alloc(1)  # cache the third block below the earlier end
    cache.insert(toks(1, 2, 3), m.pages + new)
    cache.pool.decref(new)
    longer = cache.match(toks(1, 2, 3, 9), since=m)
    same(longer, cache.match(toks(1, 2, 3, 9)))
    assert longer.num_tokens == 3 * PS
    cache.check_invariants()


def test_an_end_split_since_still_ends_there():
    cache = cache_with(toks(1, 2, 3, 4))
    m = cache.match(toks(1, 2, 3, 4))
    cache.match(toks(1, 2, 9))  # splits the edge after two blocks
    again = cache.match(toks(1, 2, 3, 4), since=m)
    assert again is m
    same(again, cache.match(toks(1, 2, 3, 4)))
    cache.check_invariants()


def test_a_trimmed_end_gives_the_shorter_match():
    cache = cache_with(toks(1, 2, 3, 4), num_pages=4)
    m = cache.match(toks(1, 2, 3, 4))
    assert cache.evict(1) == 1  # the leaf's last block
    short = cache.match(toks(1, 2, 3, 4), since=m)
    assert short.num_tokens == 3 * PS and short.pages == m.pages[:3]
    same(short, cache.match(toks(1, 2, 3, 4)))
    cache.check_invariants()


def test_an_evicted_end_is_walked_afresh():
    cache = cache_with(toks(1, 2), toks(5, 6))
    m = cache.match(toks(1, 2))
    cache.match(toks(5, 6))  # (5, 6) is now the most recent: (1, 2) goes first
    assert cache.evict(2) == 2
    fresh = cache.match(toks(1, 2), since=m)
    assert fresh.num_tokens == 0
    same(fresh, cache.match(toks(1, 2)))
    with pytest.raises(ValueError, match="stale"):
        cache.lock(m)
    cache.check_invariants()


def test_other_namespace_is_not_reused():
    cache = cache_with(toks(1, 2))
    m = cache.match(toks(1, 2))
    other = cache.match(toks(1, 2), "b", since=m)
    assert other.num_tokens == 0 and other.node is cache.root("b")


@pytest.mark.parametrize("seed", range(6))
def test_refreshing_through_since_keeps_the_lru_order_of_fresh_matches(seed):
    """Two caches fed the same operations, one re-matching through since= (or match_many),
    the other afresh: every match agrees and eviction frees the same pages in the same order."""
    rng = np.random.default_rng(seed)
    prompts = [toks(*rng.integers(0, 4, size=rng.integers(1, 6)).tolist(), tail=int(rng.integers(0, PS)))
               for _ in range(12)]
    a, b = cache_with(num_pages=24), cache_with(num_pages=24)
    earlier: dict[int, object] = {}
    for step in range(200):
        op = rng.integers(0, 4)
        i = int(rng.integers(0, len(prompts)))
        if op == 0:  # a request is served and cached in both
            for cache in (a, b):
                t = prompts[i]
                m = cache.match(t)
                need = len(t) // PS - m.num_tokens // PS
                cache.lock(m)
                if need > cache.pool.num_free:
                    cache.evict(need - cache.pool.num_free)
                if need <= cache.pool.num_free:
                    new = cache.pool.alloc(need)
                    cache.insert(t, m.pages + new)
                    cache.pool.decref(new)
                cache.unlock(m)
        elif op == 1:  # the queue re-ranked: since= in a, fresh in b
            ks = rng.choice(len(prompts), size=3, replace=False).tolist()
            got = a.match_many([(prompts[k], None, earlier.get(k)) for k in ks])
            for k, m in zip(ks, got):
                alike(m, b.match(prompts[k]))
                earlier[k] = m
        elif op == 2:
            m = a.match(prompts[i], since=earlier.get(i))
            alike(m, b.match(prompts[i]))
            earlier[i] = m
        else:
            n = int(rng.integers(0, 5))
            before_a, before_b = a.pool.refcounts(range(24)).copy(), b.pool.refcounts(range(24)).copy()
            assert a.evict(n) == b.evict(n)
            freed_a = np.flatnonzero((before_a > 0) & (a.pool.refcounts(range(24)) == 0))
            freed_b = np.flatnonzero((before_b > 0) & (b.pool.refcounts(range(24)) == 0))
            assert freed_a.tolist() == freed_b.tolist(), f"step {step}: evicted other pages"
        a.check_invariants()
        b.check_invariants()
