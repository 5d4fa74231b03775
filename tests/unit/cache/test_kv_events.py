"""KV events of RadixCache (cache/events.py): what each tree change publishes, in vLLM's shape."""
from __future__ import annotations

import numpy as np
import pytest

from radixkv.cache import PagePool, RadixCache
from radixkv.cache import events as ev_mod
from radixkv.cache.events import (AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch, QueuePublisher,
                                  chain_hashes, namespace_seed)

PS = 4


def make(num_pages: int = 32) -> tuple[PagePool, RadixCache, QueuePublisher]:
    pub = QueuePublisher()
    pool = PagePool(num_pages)
    return pool, RadixCache(pool, page_size=PS, events=pub), pub


def put(pool: PagePool, cache: RadixCache, tokens: list[int], namespace: str | None = None) -> int:
    pages = pool.alloc(len(tokens) // PS)
    hit = cache.insert(tokens, pages, namespace)
    pool.decref(pages)
    return hit


def hashes(tokens: list[int], namespace: str | None = None) -> list[int]:
    return chain_hashes(np.asarray(tokens, dtype=np.int32), PS, namespace_seed(namespace))


def test_insert_publishes_block_stored_with_chain_hashes():
    pool, cache, pub = make()
    tokens = list(range(10))  # two full blocks and a partial tail
    put(pool, cache, tokens)
    batch = pub.drain(ts=1.5)
    assert isinstance(batch, KVEventBatch) and batch.ts == 1.5 and len(pub) == 0
    (e,) = batch.events
    assert e == BlockStored(hashes(tokens), None, tokens[:8], PS, namespace=None)
    assert e.medium == "GPU" and e.lora_id is None


def test_follow_up_chains_to_the_shared_prefix_and_splits_publish_nothing():
    pool, cache, pub = make()
    put(pool, cache, list(range(12)))
    pub.drain()
    follow = list(range(8)) + [7, 7, 7, 7, 9, 9, 9, 9]  # shares 2 blocks, then diverges inside the edge
    assert put(pool, cache, follow) == 8
    (e,) = pub.drain().events
    full = hashes(follow)
    assert e.parent_block_hash == full[1]
    assert e.block_hashes == full[2:]
    assert e.token_ids == follow[8:]
    assert put(pool, cache, list(range(8))) == 8  # already cached: nothing new
    assert pub.drain().events == []


def test_eviction_publishes_the_removed_tail_blocks():
    pool, cache, pub = make()
    tokens = list(range(12))
    put(pool, cache, tokens)
    pub.drain()
    h = hashes(tokens)
    assert cache.evict(1) == 1
    assert pub.drain().events == [BlockRemoved([h[2]])]
    assert cache.evict(5) == 2
    assert pub.drain().events == [BlockRemoved(h[:2])]


def test_clear_publishes_all_blocks_cleared_or_removals_around_a_lock():
    pool, cache, pub = make()
    put(pool, cache, list(range(8)))
    put(pool, cache, [5] * 8)
    pub.drain()
    cache.clear()
    assert pub.drain().events == [AllBlocksCleared()]
    put(pool, cache, list(range(8)))
    put(pool, cache, [5] * 8)
    pub.drain()
    m = cache.match([5] * 8)
    cache.lock(m)
    cache.clear()  # the locked path stays: only the other chain's blocks leave
    assert pub.drain().events == [BlockRemoved(hashes(list(range(8))))]
    cache.unlock(m)


def test_namespaces_seed_distinct_chains():
    pool, cache, pub = make()
    tokens = list(range(8))
    put(pool, cache, tokens)
    put(pool, cache, tokens, "tenant-a")
    plain, salted = pub.drain().events
    assert salted.namespace == "tenant-a" and plain.namespace is None
    assert salted.block_hashes == hashes(tokens, "tenant-a")
    assert not set(salted.block_hashes) & set(plain.block_hashes)


def test_serve_prompt_and_extend_publish_like_insert():
    pool, cache, pub = make()
    tokens = np.arange(9, dtype=np.int32)
    cache.serve_prompt(tokens, 1)
    (e,) = pub.drain().events
    assert e.block_hashes == hashes(tokens.tolist())
    m = cache.match(list(range(8)))
    cache.lock(m)
    more = [40, 41, 42, 43]
    pages = pool.alloc(1)
    m2 = cache.extend(m, more, pages)
    pool.decref(pages)
    cache.unlock(m2)
    (e,) = pub.drain().events
    assert e.block_hashes == hashes(list(range(8)) + more)[2:]
    assert e.parent_block_hash == hashes(list(range(8)))[-1]


def test_no_publisher_never_reaches_the_events_code(monkeypatch):
    def boom(*args, **kwargs):
        raise AssertionError("events code ran without a publisher")

    for name in ("stored", "split", "removed", "cleared"):
        monkeypatch.setattr(ev_mod.BlockChains, name, boom)
    monkeypatch.setattr(ev_mod, "chain_hashes", boom)
    pool = PagePool(16)
    cache = RadixCache(pool, page_size=PS)
    put(pool, cache, list(range(12)))
    put(pool, cache, list(range(4)) + [9] * 8)  # a split
    cache.serve_prompt(np.arange(20, 33, dtype=np.int32), 1)
    cache.evict(2)
    cache.clear()
    cache.check_invariants()
    assert pool.num_free == pool.num_pages


@pytest.mark.parametrize("limit", [None, 1])
def test_chain_hashes_limit_and_partial_blocks(limit):
    tokens = np.arange(11, dtype=np.int32)
    out = chain_hashes(tokens, PS, 7, limit)
    assert len(out) == (2 if limit is None else 1)
    assert out[0] == chain_hashes(tokens[:4], PS, 7)[0]
    assert chain_hashes(tokens, PS, 8)[0] != out[0]  # the parent seeds the chain
