"""check_tree: RadixCache's invariant check (invariants 1-6 of docs/cache.md), kept apart from the
hot paths it verifies. It reads the cache's internals (a TreeView of them) on purpose. No torch."""
from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

import numpy as np

from .lru import LruLeaves
from .node import HashFn, Namespace, Node
from .pages import PagePool


class TreeView(NamedTuple):
    """What the check reads of a RadixCache: its roots, pool, LRU heap, hash and counters."""

    page_size: int
    pool: PagePool
    roots: Mapping[Namespace, Node]
    lru: LruLeaves
    hash: HashFn
    num_cached_pages: int
    num_locked_pages: int
    num_nodes: int
    host_pool: PagePool | None = None  # the host tier (tree_host.py), if any
    host_lru: LruLeaves | None = None
    num_host_pages: int = 0
    copies: Mapping[Node, None] = {}  # the nodes on both tiers
    num_host_copies: int = 0


def check_tree(cache: TreeView) -> None:
    """Raise AssertionError naming the node and the broken invariant.

    Pool pages free xor held (1); keys whole blocks with one page each, siblings with
    distinct first blocks, hash keys right (2, which with token comparison gives 3); lock
    counts consistent (a node's locks are the locks of matches ending at it plus its
    children's) and every evictable leaf in the LRU heap at its last-use time (4; a node with
    children may show an older time than its subtree: `match(since=...)` refreshes only a
    match's end, and a leaf's time passes to its parent when it leaves, so only leaves' times
    order eviction, and the state machine checks that order against a naive LRU); depths
    (tokens from the root) add up; each node in its namespace's subtree and no
    page in two places (5); counters equal to what the tree holds (6 follows: a cleared tree
    with no other holders leaves every page free). With a host tier: both pools, each block's
    host copy one host page held by the tree alone, host-only nodes unlocked with host-only
    descendants (GPU residency prefix-closed), every host-only leaf in the host LRU heap, the
    nodes on both tiers exactly those listed as host copies.
    """
    ps = cache.page_size
    cache.pool.check_invariants()  # invariant 1
    live = cache.lru.live_times()
    uses = np.zeros(cache.pool.num_pages, dtype=np.int64)  # [num_pages] blocks holding each page
    hp = cache.host_pool
    if hp is not None:
        hp.check_invariants()
        host_live = cache.host_lru.live_times()
        host_uses = np.zeros(hp.num_pages, dtype=np.int64)
    cached = locked = nodes = hosted = copies = both = 0
    for ns, root in cache.roots.items():
        assert root.parent is None and len(root.key) == 0 and root.depth == 0, f"namespace {ns!r}: malformed root"
        assert root.namespace == ns, f"namespace {ns!r}: root says {root.namespace!r}"
        assert root.children or root.end_locks > 0, \
            f"namespace {ns!r}: its root stays in the tree with no block and no lock"
        stack = [root]
        while stack:
            node = stack.pop()
            firsts: set[bytes] = set()
            child_locks = 0
            for child in node.iter_children():
                assert child.parent is node, f"{child}: parent pointer is not {node}"
                assert child.namespace == ns, f"{child}: in namespace {ns!r} but says {child.namespace!r}"
                k = len(child.key)
                assert k > 0 and k % ps == 0, f"{child}: key of {k} tokens is not a positive whole number of blocks"
                assert child.depth == node.depth + k, \
                    f"{child}: depth {child.depth} is not its parent's {node.depth} + its {k} tokens"
                first = child.key[:ps]
                assert child.hkey == cache.hash(first), f"{child}: stored hash is not its first block's"
                fb = first.tobytes()
                assert child.first == fb, f"{child}: stored first block is not its key's"
                assert fb not in firsts, f"{child}: shares its first block with a sibling"
                firsts.add(fb)
                if child.host is not None:  # a host copy (tree_host.py)
                    assert hp is not None, f"{child}: on host pages in a tree without a host tier"
                    assert len(child.host) == k // ps, f"{child}: {len(child.host)} host pages for {k // ps} blocks"
                    hpages = child.host
                    np.add.at(host_uses, hpages, 1)
                    twice = hpages[host_uses[hpages] > 1]
                    assert twice.size == 0, f"{child}: host page {int(twice[0]) if twice.size else 0} appears twice"
                    refs = hp.refcounts(hpages)
                    assert (refs == 1).all(), f"{child}: a host page's refcount is not 1 (the tree's alone)"
                    hosted += len(hpages)
                    if len(child.pages):  # on both tiers: checked as a GPU node below
                        assert child in cache.copies, f"{child}: on both tiers but not listed among the host copies"
                        copies += len(hpages)
                        both += 1
                if child.host_only:
                    assert child.lock_count == 0 and child.end_locks == 0, f"{child}: a host-only node is locked"
                    for c in child.iter_children():
                        assert c.host_only, f"{c}: a node on GPU pages below the host-only node {child}"
                    if not child.children:
                        assert host_live.get(id(child)) == child.last_access, \
                            f"{child}: host leaf has no host-LRU entry at its last access time"
                    nodes += 1
                    stack.append(child)
                    continue
                assert len(child.pages) == k // ps, f"{child}: {len(child.pages)} pages for {k // ps} blocks"
                assert child.lock_count >= 0, f"{child}: negative lock count"
                child_locks += child.lock_count
                pages = child.pages
                np.add.at(uses, pages, 1)
                twice = pages[uses[pages] > 1]
                assert twice.size == 0, f"{child}: page {int(twice[0]) if twice.size else 0} appears twice in the tree"
                refs = cache.pool.refcounts(pages)
                assert refs.min() >= 1, f"{child}: holds free page {int(pages[refs < 1][0])}"
                cached += len(pages)
                locked += len(pages) if child.lock_count else 0
                nodes += 1
                stack.append(child)
            for h, head in node.children.items():
                assert head.parent is node, f"{node}: hash chain holds a node of another parent"
                assert head.hkey == h, f"{head}: filed under another hash than its own"
            assert node.end_locks >= 0, f"{node}: negative count of locks ending here"
            if node.parent is None:
                assert node.lock_count == 0, f"{node}: a root counts path locks (its lock_count is not 0)"
            else:
                assert node.lock_count == node.end_locks + child_locks, \
                    f"{node}: lock_count is not its locks ending here plus its children's locks"
                gpu_leaf = not node.lock_count and not node.host_only and (
                    not node.children if hp is None else all(c.host_only for c in node.iter_children()))
                if gpu_leaf:
                    assert live.get(id(node)) == node.last_access, \
                        f"{node}: evictable leaf has no LRU-heap entry at its last access time"
    assert cached == cache.num_cached_pages, f"num_cached_pages {cache.num_cached_pages} != {cached} in tree"
    assert locked == cache.num_locked_pages, f"num_locked_pages {cache.num_locked_pages} != {locked} in tree"
    assert nodes == cache.num_nodes, f"node count {cache.num_nodes} != {nodes} in tree"
    assert hosted == cache.num_host_pages, f"num_host_pages {cache.num_host_pages} != {hosted} in tree"
    assert copies == cache.num_host_copies, f"num_host_copies {cache.num_host_copies} != {copies} in tree"
    assert both == len(cache.copies), f"{len(cache.copies)} nodes listed on both tiers, {both} in tree"
    if hp is not None:
        assert hp.num_used == hosted, f"host pool has {hp.num_used} pages in use, the tree holds {hosted}"
    assert cache.pool.num_free + cached <= cache.pool.num_pages, "free + cached pages exceed the pool"
