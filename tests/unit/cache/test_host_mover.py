"""The tree's HostMover calls (issue 37): a demotion's copy is queued while the GPU pages are still held, a load
copies exactly the host pages of the blocks it promotes, and a mover that raises leaves no page behind."""
from __future__ import annotations

import numpy as np

from radixkv.cache import PagePool, RadixCache
from radixkv.cache.tree_host import HostPool


class Recorder:
    """A mover that checks when it is called and remembers which page went where."""

    def __init__(self, pool: PagePool, fail: str = "") -> None:
        self.pool, self.fail, self.calls = pool, fail, []

    def demote(self, gpu_pages: np.ndarray, host_pages: np.ndarray) -> None:
        assert all(self.pool.refcount(int(p)) > 0 for p in gpu_pages), "demote called after the pages were freed"
        if self.fail == "demote":
            raise RuntimeError("injected")
        self.calls.append(("d2h", gpu_pages.tolist(), host_pages.tolist()))

    def promote(self, host_pages: np.ndarray, gpu_pages: np.ndarray) -> None:
        if self.fail == "promote":
            raise RuntimeError("injected")
        self.calls.append(("h2d", host_pages.tolist(), gpu_pages.tolist()))


def tree(fail: str = "") -> tuple[RadixCache, Recorder]:
    pool = PagePool(4)
    mover = Recorder(pool, fail)
    return RadixCache(pool, page_size=2, host_pool=HostPool(8), mover=mover), mover


def fill(cache: RadixCache, tokens: np.ndarray) -> list[int]:
    pages = cache.pool.alloc(len(tokens) // 2)
    cache.insert(tokens, pages)
    cache.pool.decref(pages)
    return pages


def test_load_copies_the_demoted_blocks_back():
    cache, mover = tree()
    t = np.arange(8, dtype=np.int32)
    gpu = fill(cache, t)
    assert cache.evict(3) == 3
    (kind, src, host), = mover.calls
    assert kind == "d2h" and src == gpu[1:]  # tail blocks first, their GPU pages to the host pages
    m = cache.match(t)
    assert (m.num_tokens, m.host_tokens) == (2, 6)
    out = cache.load(t, None, m, 2)
    cache.check_invariants()
    assert (out.num_tokens, out.host_tokens) == (6, 2)
    kind, back, dst = mover.calls[-1]
    assert kind == "h2d" and back == host[:2] and dst == out.pages[1:3]
    cache.clear()
    assert cache.pool.num_free == 4 and cache.host_pool.num_free == 8


def test_failed_copies_drop_or_recompute_without_a_leak():
    cache, mover = tree("demote")
    t = np.arange(8, dtype=np.int32)
    fill(cache, t)
    assert cache.evict(2) == 2 and cache.num_host_pages == 0 and cache.failed_demotes == 1
    cache.check_invariants()
    assert cache.match(t).num_tokens == 4 and cache.host_pool.num_free == 8

    cache, mover = tree("promote")
    fill(cache, t)
    cache.evict(3)
    m = cache.match(t)
    out = cache.load(t, None, m, 3)
    cache.check_invariants()
    assert (out.num_tokens, out.host_tokens) == (2, 6) and cache.failed_promotes == 1
    assert cache.pool.num_free == 3 and cache.num_locked_pages == 0  # the pages it took went back
    cache.clear()
    assert cache.pool.num_free == 4 and cache.host_pool.num_free == 8
