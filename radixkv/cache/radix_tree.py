"""RadixCache: a radix tree over full token blocks mapping prefixes to KV pages. No torch.

This file: the tree's state and lookup (match); inserts are tree_insertion.py's, locks and eviction
tree_eviction.py's (mixins of RadixCache).

Each edge holds a whole number of `page_size`-token blocks (an int32 array) and one page
per block. Children are found by a hash of their first block (xxh3 by default); the block's
tokens are compared on every hit, so a hash collision can never return another prefix's
pages (colliding siblings are chained through `Node.next_sibling`).

Lifetime rules:
- The tree holds one reference on each page it adopted (`insert` increfs them); eviction
  drops that reference. The caller keeps, and later drops, its own references.
- A caller that keeps using matched pages `lock`s the match (its path is then never evicted
  and counts as locked) and `unlock`s it exactly once; a match whose path was since evicted
  is stale. unlock(m) undoes a lock of a match ending at m.node, never one of a longer match
  through it (lock(long); unlock(short) raises). `extend` grows a locked match in place.
- Only leaves' times order eviction. A match refreshes its whole path; `match(since=...)`
  (re-checking an earlier match) only the path's end, and `extend` only the nodes below the
  match it grows (the unlock of the longer match hands their time up). A leaf leaving the
  tree hands its time to its parent, so a node that becomes a leaf carries the latest use of
  its subtree: the order a refresh of every path node would give.
- `num_cached_pages == num_evictable_pages + num_locked_pages` at all times.
- A namespace's root stays in the tree only while it holds a block or an empty match's lock:
  when its last block leaves (eviction, clear) or its last such lock goes, so does the root, so
  that a salt per user or per request costs nothing once its blocks are gone. A root without
  either lives on only as long as some MatchResult refers to it (a lock through that match puts
  it back in the tree).
- Bad input (too few pages, a non-integer page id, one outside the pool or free, a stale,
  unlocked or other cache's match, a negative eviction count) raises before the tree or the
  pool changes; insert lets a bool id through as 0 or 1 (only a pass over the ids would see it).
  A page listed twice or cached elsewhere in the tree is the caller's bug that insert does not
  look for (a third of insert's time); check_invariants() reports it.
"""
from __future__ import annotations

import itertools
import weakref
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from .events import BlockChains, KVEventPublisher
from .lru import LruLeaves, gpu_leaf, host_leaf
from .node import _INT32, Descent, HashFn, MatchResult, Namespace, Node, as_tokens, xxhash_block
from .pages import PagePool
from .tree_insertion import TreeInsertion

if TYPE_CHECKING:
    from .tree_host import HostMover

__all__ = ["HashFn", "MatchResult", "Namespace", "Node", "RadixCache", "xxhash_block"]

_BYTES_COMPARE_MAX = 16384  # tokens: longer edges are compared with numpy instead of memcmp


class _LastMatch(NamedTuple):
    """The latest match of a read-only token array, so that an insert of the same array
    right after (the usual match -> compute -> insert) can skip the walk down the tree."""

    tokens: np.ndarray
    namespace: Namespace
    node: Node
    node_tokens: int  # len(node.key) then: a split or eviction of node since changes it
    matched: int
    adoptions: int  # RadixCache._adoptions then: any insert since may have extended the path


class RadixCache(TreeInsertion):
    """Block-keyed radix tree over a PagePool, with LRU eviction and namespaces."""

    def __init__(self, pool: PagePool, page_size: int = 16, hash_fn: HashFn = xxhash_block,
                 events: KVEventPublisher | None = None, host_pool: PagePool | None = None,
                 mover: HostMover | None = None) -> None:
        """events: a publisher of KV events (cache/events.py) told of every block that enters or
        leaves the tree, with chain hashes; None publishes nothing and costs nothing.
        host_pool: the host tier's pages (tree_host.py: GPU eviction demotes blocks there, a match
        reports the host part, `promote` brings it back and the block keeps its host copy: both tiers);
        None (the default): one tier.
        mover: copies the host tier's bytes as blocks are demoted and loaded (tree_host.HostMover); None:
        bookkeeping only (the simulator)."""
        if page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {page_size}")
        if host_pool is not None and host_pool is pool:
            raise ValueError("host_pool must be a pool of its own, not the GPU pool")
        self._chains = None if events is None else BlockChains(events, page_size)
        self.pool = pool
        self.page_size = page_size
        self._hash = hash_fn
        self._roots: dict[Namespace, Node] = {}  # each holds a block or an empty match's lock
        # roots with neither, while a MatchResult still refers to them
        self._bare_roots: weakref.WeakValueDictionary[Namespace, Node] = weakref.WeakValueDictionary()
        self._clock = 0
        self.host_pool = host_pool
        self.num_host_pages = 0  # host pages the tree holds (one per block with a host copy)
        self.num_host_copies = 0  # of those, the pages of blocks on GPU too (loaded back: both tiers)
        self._copies: dict[Node, None] = {}  # the nodes on both tiers, oldest copy first (tree_host.py)
        self.demoted_pages = self.promoted_pages = 0  # blocks copied GPU -> host / host -> GPU
        self.demotes_saved = 0  # blocks whose GPU eviction kept their host copy: demoted with no copy
        self._demote = True  # clear() turns it off: eviction then drops
        self.mover = mover
        self.failed_demotes = self.failed_promotes = 0  # copies the mover failed (blocks dropped / recomputed)
        if host_pool is None:
            self._lru = LruLeaves()
            self._host_lru = None
        else:
            seq = itertools.count()  # one sequence: a node's heap_seq names one entry in either heap
            self._lru = LruLeaves(gpu_leaf, seq)
            self._host_lru = LruLeaves(host_leaf, seq)
        self._num_nodes = 0
        self._adoptions = 0  # inserts that added a node
        self._last_match: _LastMatch | None = None
        self.num_cached_pages = 0
        self.num_locked_pages = 0

    # ---- sizes -------------------------------------------------------------------------------
    @property
    def num_evictable_pages(self) -> int:
        """Pages on unlocked nodes: an upper bound on what evict() can return to the pool."""
        return self.num_cached_pages - self.num_locked_pages

    @property
    def namespaces(self) -> list[Namespace]:
        """Namespaces holding a cached block or a lock (each has its own root; None is the default)."""
        return list(self._roots)

    def root(self, namespace: Namespace = None) -> Node:
        """The root of `namespace`'s subtree (made empty on first use; the tree keeps it only
        while it holds a block or a lock, see the module docstring)."""
        node = self._roots.get(namespace)
        if node is None:
            node = self._bare_roots.get(namespace)
            if node is None:
                empty = np.zeros(0, dtype=np.int32)
                node = self._bare_roots[namespace] = Node(empty, b"", empty, None, 0, namespace)
        return node

    # ---- lookup ------------------------------------------------------------------------------
    def _find_child(self, node: Node, block: np.ndarray) -> Node | None:
        child = node.children.get(self._hash(block))
        if child is None:
            return None
        want = block.tobytes()
        while child is not None and child.first != want:
            child = child.next_sibling
        return child

    def _common_blocks(self, edge: np.ndarray, tokens: np.ndarray, pos: int) -> int:
        """Whole blocks shared by `edge` and tokens[pos:] (the first block is known equal)."""
        ps = self.page_size
        n = min(len(edge), (len(tokens) - pos) // ps * ps)
        if n == ps:
            return 1
        ours, theirs = (edge if n == len(edge) else edge[:n]), tokens[pos: pos + n]
        # Equal edges are the common case: memcmp of the bytes is the cheapest test while
        # the copies stay small (big ones would cost fresh pages from the allocator).
        if n <= _BYTES_COMPARE_MAX and ours.tobytes() == theirs.tobytes():
            return n // ps
        diff = ours != theirs
        if n > _BYTES_COMPARE_MAX and not diff.any():
            return n // ps
        return int(diff.argmax()) // ps

    def _descend(self, tokens: np.ndarray, root: Node, pos: int = 0) -> Descent:
        """Walk down from `root`, which holds tokens[:pos] (path and matched count from there)."""
        ps = self.page_size
        limit = len(tokens) // ps * ps
        node, path = root, []
        while pos < limit:
            child = self._find_child(node, tokens[pos: pos + ps])
            if child is None:
                break
            edge = len(child.key)
            blocks = self._common_blocks(child.key, tokens, pos)
            if blocks * ps < edge:
                return Descent(path, pos + blocks * ps, child, blocks)
            path.append(child)
            node = child
            pos += edge
        return Descent(path, pos, None, 0)

    def _touch(self, d: Descent, root: Node) -> Node:
        """Split the edge the prefix ends inside (if any) and refresh the path's LRU time.

        Returns the node that ends the matched prefix."""
        path = d.path
        if d.split_node is not None:
            path.append(self._split(d.split_node, d.split_blocks))
        clock = self._clock = self._clock + 1
        for node in path:
            node.last_access = clock
        root.last_access = clock
        return path[-1] if path else root

    def match(self, tokens: Sequence[int] | np.ndarray, namespace: Namespace = None, *,
              since: MatchResult | None = None) -> MatchResult:
        """Longest cached prefix of `tokens` in whole blocks; refreshes its LRU time.

        Splits an edge the prefix ends inside, so the result's `node` ends exactly there.

        since: an earlier `match` by this cache of the same leading tokens in this namespace
        (the tokens may have grown since). When its end is still in the tree at the same depth
        and no child of it takes the next block of `tokens`, it is still the longest match: it
        is refreshed (the same LRU order as a fresh match gives) and returned as it is, in O(1)
        instead of a walk over the tokens (a scheduler re-ranking its queue every step).
        Otherwise the tree is walked as without it."""
        tokens = as_tokens(tokens)
        if since is not None:
            m = self._rematch(tokens, namespace, since)
            if m is not None:
                return m
        root = self.root(namespace)
        d = self._descend(tokens, root)
        end = self._touch(d, root)
        path = d.path
        if self.host_pool is not None and path and path[-1].host_only:
            return self._match_tiers(path, d.matched, root)
        if len(path) == 1:
            pages = path[0].pages.tolist()
        elif path:
            pages = np.concatenate([node.pages for node in path]).tolist()
        else:
            pages = []
        self._push_if_evictable(end)
        if not tokens.flags.writeable:
            self._last_match = _LastMatch(tokens, namespace, end, len(end.key), d.matched, self._adoptions)
        return MatchResult(d.matched, pages, end)

    def _match_tiers(self, path: list[Node], matched: int, root: Node) -> MatchResult:
        """match's result for a path that reaches host nodes: the GPU prefix, then the host part."""
        i = next(k for k, node in enumerate(path) if node.host_only)
        end = path[i - 1] if i else root
        gpu = end.depth if i else 0
        pages = np.concatenate([node.pages for node in path[:i]]).tolist() if i else []
        self._push_if_evictable(end)
        self._host_lru.push(path[-1])  # a host leaf queues at its new time (push checks it is one)
        return MatchResult(gpu, pages, end, 0, matched - gpu, tuple(path[i:]))

    def match_many(self, queries: Iterable[tuple[Sequence[int] | np.ndarray, Namespace, MatchResult | None]]
                   ) -> list[MatchResult]:
        """[match(tokens, namespace, since=since) for tokens, namespace, since in queries], the
        same results and the same LRU refreshes in the same order, with the O(1) re-check of
        `since` done inline (a scheduler re-ranks its whole queue every step this way)."""
        out: list[MatchResult] = []
        ps, roots, lru = self.page_size, self._roots, self._lru
        for tokens, namespace, since in queries:
            if since is not None and type(tokens) is np.ndarray and tokens.dtype is _INT32:
                n, end = since.num_tokens, since.node
                root = roots.get(namespace)
                # _rematch's tests, in its order (see there)
                if (root is not None and not since.pages_from and n <= len(tokens) and end.depth == n
                        and (end.host is None or len(end.pages)) and not since.host_tokens
                        and (end.parent is not None or end is root) and end.namespace == namespace
                        and tokens.ndim == 1 and tokens.flags.c_contiguous
                        and not (end.children and n + ps <= len(tokens)
                                 and self._find_child(end, tokens[n: n + ps]) is not None)):
                    clock = self._clock = self._clock + 1
                    end.last_access = clock
                    root.last_access = clock
                    if not end.children and not end.lock_count and end.parent is not None:
                        lru.push_leaf(end)
                    out.append(since)
                    continue
            out.append(self.match(tokens, namespace, since=since))
        if len(self._lru) > 4 * self._num_nodes + 1024:
            self._lru.rebuild(self._roots.values())
        return out

    def _rematch(self, tokens: np.ndarray, namespace: Namespace, prev: MatchResult) -> MatchResult | None:
        """The longest match of `tokens` starting from `prev` (see match's `since`), or None when
        only a walk from the root can tell (prev's end left the tree)."""
        ps, n, end = self.page_size, prev.num_tokens, prev.node
        root = self._roots.get(namespace)
        if prev.pages_from or n > len(tokens) or root is None or end.namespace != namespace:
            return None
        if self.host_pool is not None and (end.host_only or prev.host_tokens or end.children):
            return None  # a walk from the root splits GPU and host parts
        # End still in the tree (an evicted node's parent is None, and only a leaf leaves) at the
        # same depth (a node's depth drops only when its own tail is evicted; a split keeps the
        # lower part's) is the same path with the same pages.
        if end.parent is None and end is not root:
            return None
        depth = end.depth
        if depth != n:  # its tail was evicted since: the rest of it still matches
            if depth > n:
                return None
            prev = MatchResult(depth, prev.pages[: depth // ps], end)
            n = depth
        if end.children and n + ps <= len(tokens) and self._find_child(end, tokens[n: n + ps]) is not None:
            # cached since below the end: walk on from there only, not from the root
            d = self._descend(tokens, end, n)
            new_end = self._touch(d, end)  # splits where the match ends inside an edge
            root.last_access = self._clock
            self._push_if_evictable(new_end)
            more = np.concatenate([x.pages for x in d.path]).tolist() if d.path else []
            return MatchResult(d.matched, prev.pages + more, new_end)
        # Refresh the end only: the nodes above it keep older times, which eviction never reads
        # while they have children, and a child leaving the tree hands its time to its parent
        # (_take_victims), so every leaf is evicted at the time a full-path refresh would give it.
        clock = self._clock = self._clock + 1
        end.last_access = clock
        root.last_access = clock
        if not end.children and not end.lock_count and end.parent is not None:
            self._push_if_evictable(end)
        return prev

    def _descend_again(self, tokens: np.ndarray, namespace: Namespace, root: Node) -> Descent | None:
        """The latest match's descent if it still holds for `tokens` (None otherwise)."""
        last = self._last_match
        if (last is None or last.tokens is not tokens or last.namespace != namespace
                or last.adoptions != self._adoptions):
            return None
        node = last.node
        if node is root:
            return Descent([], 0, None, 0)
        if node.parent is None or len(node.key) != last.node_tokens:
            return None  # evicted or split since
        path = []
        while node is not root:
            path.append(node)
            node = node.parent
        path.reverse()
        return Descent(path, last.matched, None, 0)

    # ---- invariants --------------------------------------------------------------------------
    def check_invariants(self) -> None:
        """Raise AssertionError naming the node and the broken invariant (invariants 1-6 of docs/cache.md)."""
        # imported here: the check is on no hot path, and each command's start-up skips it
        from .check import TreeView, check_tree

        check_tree(TreeView(self.page_size, self.pool, self._roots, self._lru, self._hash, self.num_cached_pages,
                            self.num_locked_pages, self._num_nodes, self.host_pool, self._host_lru,
                            self.num_host_pages, self._copies, self.num_host_copies))
