"""Shared set-up for the RadixCache example tests (test_radix_tree_*.py)."""
from __future__ import annotations

from radixkv import MatchResult, PagePool, RadixCache

PAGE_SIZES = [1, 2, 4, 16]


def blocks(*ids: int, ps: int, tail: int = 0) -> list[int]:
    """Tokens made of whole blocks: block id b is ps tokens b*1000 + i; plus `tail` extra tokens."""
    out = [b * 1000 + i for b in ids for i in range(ps)]
    return out + [999_000 + i for i in range(tail)]


def cached_insert(cache: RadixCache, tokens: list[int], namespace: str | None = None) -> list[int]:
    """What a request does: match, alloc the missing full-block pages, insert, release its own.

    Returns the pages the tree now holds for the full blocks of `tokens`."""
    ps = cache.page_size
    m = cache.match(tokens, namespace)
    new = cache.pool.alloc(len(tokens) // ps - len(m.pages))
    assert cache.insert(tokens, m.pages + new, namespace) == m.num_tokens
    cache.pool.decref(new)
    cache.check_invariants()
    return m.pages + new


def make(num_pages: int = 64, ps: int = 4, **kw) -> tuple[PagePool, RadixCache]:
    pool = PagePool(num_pages)
    return pool, RadixCache(pool, page_size=ps, **kw)


def cached_and_matched(*ids: int, ps: int = 2) -> tuple[PagePool, RadixCache, MatchResult]:
    """A fresh cache holding the blocks `ids` (one edge) and an unlocked match of all of them."""
    pool, cache = make(ps=ps)
    cached_insert(cache, blocks(*ids, ps=ps))
    return pool, cache, cache.match(blocks(*ids, ps=ps))
