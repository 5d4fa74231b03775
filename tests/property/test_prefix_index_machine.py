"""Hypothesis state machine: the router's PrefixIndex against the replicas' trees it follows.

Two replicas (PagePool + RadixCache publishing KV events into a QueuePublisher each) insert, serve,
match-and-lock, evict and clear prompts drawn from a tiny block alphabet in two namespaces; a rule
delivers one replica's pending events to the index. Invariant: for every replica whose events were all
delivered, the index claims exactly the chain hashes of the blocks in its tree (so never one it
evicted), computed here independently by walking the tree; and the index's match of a prompt is the
tree's own `match`, in blocks.
"""
from __future__ import annotations

import numpy as np
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from radixkv import MatchResult, PagePool, RadixCache
from radixkv.cache.events import QueuePublisher, chain_hashes, namespace_seed
from radixkv.replay.prefix_index import PrefixIndex

PS = 2
NUM_PAGES = 10
REPLICAS = 2
NAMESPACES = st.sampled_from([None, None, "a"])
REPLICA = st.integers(0, REPLICAS - 1)
BLOCKS = st.lists(st.integers(0, 3), max_size=6)


def tokens_of(blocks: list[int], tail: int = 0) -> np.ndarray:
    return np.asarray([t for b in blocks for t in (b % 2, b)] + [9] * tail, dtype=np.int32)


def tree_hashes(cache: RadixCache) -> set[int]:
    """Chain hashes of every cached block, from the tree's keys (not from the events)."""
    out: set[int] = set()
    for ns in cache.namespaces:
        stack = [(child, namespace_seed(ns)) for child in cache.root(ns).iter_children()]
        while stack:
            node, parent = stack.pop()
            hashes = chain_hashes(node.key, PS, parent)
            out.update(hashes)
            stack.extend((child, hashes[-1]) for child in node.iter_children())
    return out


class IndexMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.pubs = [QueuePublisher() for _ in range(REPLICAS)]
        self.pools = [PagePool(NUM_PAGES) for _ in range(REPLICAS)]
        self.caches = [RadixCache(pool, page_size=PS, events=pub) for pool, pub in zip(self.pools, self.pubs)]
        self.index = PrefixIndex(REPLICAS)
        self.locked: list[tuple[int, MatchResult]] = []

    @rule(r=REPLICA, ns=NAMESPACES, blocks=BLOCKS, tail=st.integers(0, PS - 1))
    def insert(self, r: int, ns: str | None, blocks: list[int], tail: int) -> None:
        pool, cache = self.pools[r], self.caches[r]
        need = len(blocks)
        if need > pool.num_free:
            cache.evict(need - pool.num_free)
        if need > pool.num_free:
            return
        pages = pool.alloc(need)
        cache.insert(tokens_of(blocks, tail), pages, ns)
        pool.decref(pages)

    @rule(r=REPLICA, blocks=BLOCKS, tail=st.integers(0, PS - 1))
    def serve(self, r: int, blocks: list[int], tail: int) -> None:
        self.caches[r].serve_prompt(tokens_of(blocks, tail), int(tail > 0))

    @rule(r=REPLICA, ns=NAMESPACES, blocks=BLOCKS)
    def lock(self, r: int, ns: str | None, blocks: list[int]) -> None:
        m = self.caches[r].match(tokens_of(blocks), ns)
        self.caches[r].lock(m)
        self.locked.append((r, m))

    @rule()
    def unlock_oldest(self) -> None:
        if self.locked:
            r, m = self.locked.pop(0)
            self.caches[r].unlock(m)

    @rule(r=REPLICA, n=st.integers(0, NUM_PAGES))
    def evict(self, r: int, n: int) -> None:
        self.caches[r].evict(n)

    @rule(r=REPLICA)
    def clear(self, r: int) -> None:
        self.caches[r].clear()

    @rule(r=REPLICA)
    def deliver(self, r: int) -> None:
        self.index.apply(r, self.pubs[r].drain())

    @invariant()
    def delivered_replicas_match_their_trees(self) -> None:
        for r, (pub, cache) in enumerate(zip(self.pubs, self.caches)):
            if len(pub):
                continue  # not delivered yet: the index may lag
            assert self.index.blocks_of(r) == tree_hashes(cache), f"replica {r}"

    @rule(r=REPLICA, ns=NAMESPACES, blocks=BLOCKS)
    def index_match_is_the_tree_match(self, r: int, ns: str | None, blocks: list[int]) -> None:
        if len(self.pubs[r]) or self.index.block_size is None:
            return  # not delivered yet, or nothing ever stored
        toks = tokens_of(blocks)
        m = self.caches[r].match(toks, ns)  # refreshes LRU times only: no event
        assert self.index.matched_blocks(toks, ns)[r] == m.num_tokens // PS

    def teardown(self) -> None:
        for r, m in self.locked:
            self.caches[r].unlock(m)
        for r, cache in enumerate(self.caches):
            cache.clear()
            self.index.apply(r, self.pubs[r].drain())
            assert self.index.num_blocks(r) == 0
            assert self.pools[r].num_free == NUM_PAGES


TestPrefixIndex = IndexMachine.TestCase
