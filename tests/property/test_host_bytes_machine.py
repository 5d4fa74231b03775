"""Hypothesis state machine: the host tier's bytes (issue 37). A RadixCache with a host pool and a mover that
copies a model of the pages' contents (each page holds the identity of the block written into it), driven
like the engine drives it: requests load host blocks through `RadixCache.load` (make room, copy up, promote)
and compute the rest into pages of their own; eviction demotes through the mover; the mover fails now and
then. After every step every cached block's pages (GPU, host, or both for a block loaded back, which keeps its
host copy) hold that block's bytes: no demoted page is reused before its bytes were copied out, no loaded block
is read from a page its bytes never reached, a failed copy leaves no block behind on the pages it did not
reach, and no block is copied device-to-host while a host page the tree holds already has its bytes."""
from __future__ import annotations

import numpy as np
from hypothesis import event
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from radixkv import PagePool, RadixCache
from radixkv.cache.tree_host import HostPool

Block = tuple  # (namespace, block ids from the root): what a page holds


class BytesMover:
    """Copies page contents between the two dicts at once (the engine's fence then orders them); fails on
    request. A GPU page must still be held when its demotion is asked for, and its block must not be on a
    held host page already (a block loaded back demotes onto its kept copy)."""

    def __init__(self, pool: PagePool, host_pool: PagePool) -> None:
        self.pool, self.host_pool = pool, host_pool
        self.gpu: dict[int, Block] = {}
        self.host: dict[int, Block] = {}
        self.fail = False

    def demote(self, gpu_pages: np.ndarray, host_pages: np.ndarray) -> None:
        assert all(self.pool.refcount(int(p)) > 0 for p in gpu_pages), "demotion asked for after a free"
        dst = set(host_pages.tolist())  # (just taken for this copy: any bytes there are stale)
        held = {block for h, block in self.host.items() if h not in dst and self.host_pool.refcount(h) > 0}
        again = [self.gpu[g] for g in gpu_pages.tolist() if self.gpu[g] in held]
        assert not again, f"blocks {again} copied device-to-host while a held host page has their bytes"
        if self.fail:
            raise RuntimeError("injected")
        for g, h in zip(gpu_pages.tolist(), host_pages.tolist()):
            self.host[h] = self.gpu[g]

    def promote(self, host_pages: np.ndarray, gpu_pages: np.ndarray) -> None:
        if self.fail:
            raise RuntimeError("injected")
        for h, g in zip(host_pages.tolist(), gpu_pages.tolist()):
            self.gpu[g] = self.host[h]


class HostBytesMachine(RuleBasedStateMachine):
    PAGE_SIZE = 2
    NUM_PAGES = 8
    HOST_PAGES = 6
    NUM_BLOCK_IDS = 4

    def __init__(self) -> None:
        super().__init__()
        self.pool = PagePool(self.NUM_PAGES)
        self.host_pool = HostPool(self.HOST_PAGES)
        self.mover = BytesMover(self.pool, self.host_pool)
        self.cache = RadixCache(self.pool, page_size=self.PAGE_SIZE, host_pool=self.host_pool, mover=self.mover)

    def tokens(self, bids: list[int]) -> np.ndarray:
        ps = self.PAGE_SIZE
        return np.array([t for b in bids for t in ([b % 2] * (ps - 1) + [b])], dtype=np.int32)

    @rule(ns=st.sampled_from([None, None, "a"]), bids=st.lists(st.integers(0, NUM_BLOCK_IDS - 1), max_size=5),
          load=st.integers(0, 5), fail=st.sampled_from([False, False, False, True]))
    def request(self, ns: str | None, bids: list[int], load: int, fail: bool) -> None:
        cache, pool, ps = self.cache, self.pool, self.PAGE_SIZE
        tokens = self.tokens(bids)
        self.mover.fail = fail
        try:
            m = cache.match(tokens, ns)
            if m.host_tokens and load:
                m = cache.load(tokens, ns, m, load)
                event("request: loaded" if m.num_tokens else "request: load gave nothing")
        finally:
            self.mover.fail = False
        for i, page in enumerate(m.pages):  # what the request reads: its blocks' bytes
            assert self.mover.gpu.get(page) == (ns, tuple(bids[: i + 1])), f"block {i} read from a page without it"
        cache.lock(m)
        try:
            rest = len(bids) - m.num_tokens // ps
            if rest > pool.num_free + cache.num_evictable_pages:
                return
            if rest > pool.num_free:
                cache.evict(rest - pool.num_free)
            if rest:
                pages = pool.alloc(rest)
                for j, page in enumerate(pages):  # the request computes its blocks into its own pages
                    self.mover.gpu[page] = (ns, tuple(bids[: m.num_tokens // ps + j + 1]))
                m = cache.extend(m, tokens[m.num_tokens:], pages)
                pool.decref(pages)
        finally:
            cache.unlock(m)

    @rule(n=st.integers(0, 8), fail=st.sampled_from([False, False, True]))
    def evict(self, n: int, fail: bool) -> None:
        self.mover.fail = fail
        try:
            self.cache.evict(n)
        finally:
            self.mover.fail = False

    @rule(n=st.integers(0, 6))
    def host_evict(self, n: int) -> None:
        self.cache.evict_host(n)

    @invariant()
    def every_block_on_its_bytes(self) -> None:
        self.cache.check_invariants()
        ps = self.PAGE_SIZE
        for ns in self.cache.namespaces:
            stack = [(self.cache.root(ns), ())]
            while stack:
                node, prefix = stack.pop()
                for child in node.iter_children():
                    p = prefix
                    for i in range(len(child.key) // ps):
                        p = p + (int(child.key[(i + 1) * ps - 1]),)
                        if len(child.pages):
                            where = self.mover.gpu.get(int(child.pages[i]))
                            assert where == (ns, p), f"{child}: block {i} is on a GPU page holding {where}"
                        if child.host is not None:
                            where = self.mover.host.get(int(child.host[i]))
                            assert where == (ns, p), f"{child}: block {i} is on a host page holding {where}"
                    stack.append((child, p))

    def teardown(self) -> None:
        self.cache.clear()
        assert self.pool.num_free == self.pool.num_pages and self.host_pool.num_free == self.host_pool.num_pages


class HostBytesMachinePage1(HostBytesMachine):
    PAGE_SIZE = 1
    NUM_PAGES = 5
    HOST_PAGES = 4


TestHostBytes = HostBytesMachine.TestCase
TestHostBytesPage1 = HostBytesMachinePage1.TestCase
