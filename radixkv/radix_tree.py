"""RadixCache: a radix tree over full token blocks mapping prefixes to KV pages. No torch.

Each edge holds a whole number of `page_size`-token blocks (an int32 array) and one page
per block. Children are found by an xxhash of their first block; the block's tokens are
compared on every hit, so a hash collision can never return another prefix's pages
(colliding siblings are chained through `Node.next_sibling`).

Lifetime rules:
- The tree holds one reference on each page it adopted (`insert` increfs them); eviction
  drops that reference. The caller keeps, and later drops, its own references.
- A caller that keeps using matched pages must `lock` the match (its path is then never
  evicted and counts as locked, not evictable) and `unlock` it exactly once when done.
- `num_cached_pages == num_evictable_pages + num_locked_pages` at all times.
"""
from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Iterator, Sequence
from typing import NamedTuple

import numpy as np
import xxhash

from .pages import PagePool

HashFn = Callable[[np.ndarray], int]


def xxhash_block(block: np.ndarray) -> int:
    """Default child key: xxh3-64 of the block's int32 bytes."""
    return xxhash.xxh3_64_intdigest(block)


class Node:
    __slots__ = ("key", "pages", "children", "parent", "next_sibling", "hkey",
                 "lock_count", "last_access", "heap_seq", "namespace")

    def __init__(self, key: np.ndarray, pages: np.ndarray, parent: Node | None, hkey: int,
                 namespace: str | None) -> None:
        self.key = key  # int32 [num_blocks * page_size]
        self.pages = pages  # int32 [num_blocks], one physical page per block
        self.children: dict[int, Node] = {}  # first-block hash -> first node of a collision chain
        self.parent = parent  # None for a namespace root and for a node evicted from the tree
        self.next_sibling: Node | None = None  # next sibling whose first block has the same hash
        self.hkey = hkey
        self.lock_count = 0
        self.last_access = 0
        self.heap_seq = -1  # sequence number of this node's live entry in the LRU heap
        self.namespace = namespace

    def iter_children(self) -> Iterator[Node]:
        for head in self.children.values():
            node: Node | None = head
            while node is not None:
                yield node
                node = node.next_sibling

    @property
    def is_leaf(self) -> bool:
        return not self.children

    @property
    def num_tokens(self) -> int:
        return len(self.key)

    def __repr__(self) -> str:
        head = self.key[:4].tolist()
        return (f"Node(ns={self.namespace!r}, tokens={len(self.key)}, first={head}, "
                f"pages={len(self.pages)}, locks={self.lock_count})")


class MatchResult(NamedTuple):
    """Longest cached block-aligned prefix. `node` ends the path (a root when nothing matched)."""

    num_tokens: int
    pages: list[int]
    node: Node


def _as_tokens(tokens: Sequence[int] | np.ndarray) -> np.ndarray:
    if isinstance(tokens, np.ndarray) and tokens.dtype == np.int32:
        return tokens
    arr = np.asarray(tokens)
    if arr.ndim != 1:
        raise ValueError(f"tokens must be one-dimensional, got shape {arr.shape}")
    if arr.size and (arr.dtype.kind not in "iu" or arr.min() < 0 or arr.max() > np.iinfo(np.int32).max):
        raise ValueError("tokens must be non-negative integers below 2**31")
    return arr.astype(np.int32, copy=False)


class RadixCache:
    """Block-keyed radix tree over a PagePool, with LRU eviction and namespaces."""

    def __init__(self, pool: PagePool, page_size: int = 16, hash_fn: HashFn = xxhash_block) -> None:
        if page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {page_size}")
        self.pool = pool
        self.page_size = page_size
        self._hash = hash_fn
        self._roots: dict[str | None, Node] = {}
        self._clock = 0
        self._seq = itertools.count()
        self._heap: list[tuple[int, int, Node]] = []  # (last_access, seq, leaf); stale entries skipped
        self._num_nodes = 0
        self.num_cached_pages = 0
        self.num_locked_pages = 0

    # ---- sizes -------------------------------------------------------------------------------
    @property
    def num_evictable_pages(self) -> int:
        """Pages on unlocked nodes: an upper bound on what evict() can return to the pool."""
        return self.num_cached_pages - self.num_locked_pages

    @property
    def namespaces(self) -> list[str | None]:
        return list(self._roots)

    def root(self, namespace: str | None = None) -> Node:
        node = self._roots.get(namespace)
        if node is None:
            empty = np.zeros(0, dtype=np.int32)
            node = self._roots[namespace] = Node(empty, empty, None, 0, namespace)
        return node

    # ---- lookup ------------------------------------------------------------------------------
    def _find_child(self, node: Node, block: np.ndarray, h: int) -> Node | None:
        child = node.children.get(h)
        if child is None:
            return None
        want = block.tobytes()
        while child is not None and child.key[: self.page_size].tobytes() != want:
            child = child.next_sibling
        return child

    def _common_blocks(self, edge: np.ndarray, tokens: np.ndarray, pos: int) -> int:
        """Whole blocks shared by `edge` and tokens[pos:] (the first block is known equal)."""
        n = min(len(edge), (len(tokens) - pos) // self.page_size * self.page_size)
        other = tokens[pos: pos + n]
        if n == len(edge) and np.array_equal(edge, other):
            return n // self.page_size
        diff = edge[:n] != other
        first = int(diff.argmax()) if diff.any() else n
        return first // self.page_size

    def _walk(self, tokens: np.ndarray, namespace: str | None) -> tuple[Node, int, list[Node]]:
        """Follow tokens down from the namespace root, splitting an edge the prefix ends inside.

        Returns (last node, matched tokens, path nodes below the root)."""
        ps = self.page_size
        node = self.root(namespace)
        limit = len(tokens) // ps * ps
        pos = 0
        path: list[Node] = []
        clock = self._clock = self._clock + 1
        while pos < limit:
            block = tokens[pos: pos + ps]
            child = self._find_child(node, block, self._hash(block))
            if child is None:
                break
            blocks = self._common_blocks(child.key, tokens, pos)
            if blocks * ps < len(child.key):
                child = self._split(child, blocks)
            child.last_access = clock
            path.append(child)
            node = child
            pos += blocks * ps
        node.last_access = clock
        return node, pos, path

    def match(self, tokens: Sequence[int] | np.ndarray, namespace: str | None = None) -> MatchResult:
        """Longest cached prefix of `tokens` in whole blocks; refreshes its LRU time."""
        tokens = _as_tokens(tokens)
        node, matched, path = self._walk(tokens, namespace)
        if len(path) == 1:
            pages = path[0].pages.tolist()
        elif path:
            pages = np.concatenate([n.pages for n in path]).tolist()
        else:
            pages = []
        self._push_if_evictable(node)
        return MatchResult(matched, pages, node)

    # ---- insert ------------------------------------------------------------------------------
    def insert(self, tokens: Sequence[int] | np.ndarray, pages: Sequence[int],
               namespace: str | None = None) -> int:
        """Cache the full blocks of `tokens` with `pages` (one per full block).

        Blocks already cached keep the tree's pages (the caller's are not adopted); the tree
        increfs each page it adopts. Returns how many leading tokens were already cached."""
        tokens = _as_tokens(tokens)
        ps = self.page_size
        nblocks = len(tokens) // ps
        if len(pages) < nblocks:
            raise ValueError(f"insert needs one page per full block: {nblocks} blocks, {len(pages)} pages")
        node, matched, _ = self._walk(tokens, namespace)
        if matched < nblocks * ps:
            new_pages = np.asarray(pages[matched // ps: nblocks], dtype=np.int32)
            self.pool.incref_distinct(new_pages)
            key = tokens[matched: nblocks * ps]
            # A read-only array cannot change under us: keep a view of it when that does not
            # pin much more memory than a copy would.
            if key.flags.writeable or 2 * len(key) < len(tokens):
                key = key.copy()
            first = key[:ps]
            leaf = Node(key, new_pages, node, self._hash(first), namespace)
            leaf.last_access = self._clock
            self._attach(node, leaf)
            self.num_cached_pages += len(new_pages)
            self._num_nodes += 1
            node = leaf
        self._push_if_evictable(node)
        return matched

    def _attach(self, parent: Node, child: Node) -> None:
        head = parent.children.get(child.hkey)
        if head is not None:
            child.next_sibling = head
        parent.children[child.hkey] = child
        child.parent = parent

    def _detach(self, child: Node) -> None:
        parent = child.parent
        assert parent is not None
        head = parent.children[child.hkey]
        if head is child:
            if child.next_sibling is None:
                del parent.children[child.hkey]
            else:
                parent.children[child.hkey] = child.next_sibling
        else:
            while head.next_sibling is not child:
                head = head.next_sibling
            head.next_sibling = child.next_sibling
        child.next_sibling = None
        child.parent = None

    def _split(self, node: Node, blocks: int) -> Node:
        """Cut `node`'s edge after `blocks` blocks; returns the new upper node (node stays below)."""
        ps = self.page_size
        parent = node.parent
        assert parent is not None and 0 < blocks < len(node.pages)
        upper = Node(node.key[: blocks * ps], node.pages[:blocks], None, node.hkey, node.namespace)
        upper.lock_count = node.lock_count  # every lock on node's path also covers its prefix
        upper.last_access = node.last_access
        # upper takes node's place in the parent's child chain.
        self._replace_child(parent, node, upper)
        node.key = node.key[blocks * ps:]
        node.pages = node.pages[blocks:]
        node.hkey = self._hash(node.key[:ps])
        node.next_sibling = None
        self._attach(upper, node)
        self._num_nodes += 1
        return upper

    def _replace_child(self, parent: Node, old: Node, new: Node) -> None:
        head = parent.children[old.hkey]
        new.next_sibling = old.next_sibling
        new.parent = parent
        if head is old:
            parent.children[old.hkey] = new
        else:
            while head.next_sibling is not old:
                head = head.next_sibling
            head.next_sibling = new

    # ---- locks -------------------------------------------------------------------------------
    def lock(self, m: MatchResult) -> None:
        """Protect the path root..m.node from eviction until unlock(m)."""
        node = m.node
        if node.parent is None and self._roots.get(node.namespace) is not node:
            raise ValueError(f"lock of a stale match: {node} was evicted")
        while node.parent is not None:
            if node.lock_count == 0:
                self.num_locked_pages += len(node.pages)
            node.lock_count += 1
            node = node.parent

    def unlock(self, m: MatchResult) -> None:
        node = m.node
        leaf = node
        while node.parent is not None:
            if node.lock_count <= 0:
                raise ValueError(f"unlock of an unlocked path at {node}")
            node.lock_count -= 1
            if node.lock_count == 0:
                self.num_locked_pages -= len(node.pages)
            node = node.parent
        self._push_if_evictable(leaf)

    # ---- eviction ----------------------------------------------------------------------------
    def _push_if_evictable(self, node: Node) -> None:
        if node.children or node.lock_count or node.parent is None:
            return
        seq = next(self._seq)
        node.heap_seq = seq
        heapq.heappush(self._heap, (node.last_access, seq, node))
        if len(self._heap) > 4 * self._num_nodes + 1024:
            self._rebuild_heap()

    def _rebuild_heap(self) -> None:
        self._heap = []
        for root in self._roots.values():
            stack = list(root.iter_children())
            while stack:
                node = stack.pop()
                if node.children:
                    stack.extend(node.iter_children())
                elif node.lock_count == 0:
                    node.heap_seq = seq = next(self._seq)
                    self._heap.append((node.last_access, seq, node))
        heapq.heapify(self._heap)

    def evict(self, num_pages: int) -> int:
        """Free at least `num_pages` pages (if possible), least recently used leaves first,
        tail blocks of a leaf first. Returns pages actually returned to the pool."""
        freed = 0
        heap = self._heap
        pool = self.pool
        while freed < num_pages and heap:
            _, seq, node = heapq.heappop(heap)
            if seq != node.heap_seq or node.children or node.lock_count or node.parent is None:
                continue  # stale entry
            keep = len(node.pages) - (num_pages - freed)
            if keep > 0:
                dropped = node.pages[keep:]
                node.pages = node.pages[:keep]
                node.key = node.key[: keep * self.page_size]
                heapq.heappush(heap, (node.last_access, seq, node))
            else:
                dropped = node.pages
                parent = node.parent
                self._detach(node)
                node.heap_seq = -1
                self._num_nodes -= 1
                self._push_if_evictable(parent)
            freed += pool.decref_distinct(dropped)
            self.num_cached_pages -= len(dropped)
        return freed

    def clear(self) -> int:
        """Evict every unlocked page; returns pages returned to the pool."""
        return self.evict(self.num_cached_pages)

    # ---- invariants --------------------------------------------------------------------------
    def check_invariants(self) -> None:
        """Raise AssertionError naming the node and the broken invariant."""
        ps = self.page_size
        self.pool.check_invariants()
        seen_pages: set[int] = set()
        cached = locked = nodes = 0
        for ns, root in self._roots.items():
            assert root.parent is None and len(root.key) == 0, f"namespace {ns!r}: malformed root"
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
                    assert len(child.pages) == k // ps, f"{child}: {len(child.pages)} pages for {k // ps} blocks"
                    first = child.key[:ps]
                    assert child.hkey == self._hash(first), f"{child}: stored hash is not its first block's"
                    assert node.children.get(child.hkey) is not None, f"{child}: hash chain broken"
                    fb = first.tobytes()
                    assert fb not in firsts, f"{child}: shares its first block with a sibling"
                    firsts.add(fb)
                    assert child.lock_count >= 0, f"{child}: negative lock count"
                    child_locks += child.lock_count
                    assert child.last_access <= node.last_access or node.parent is None, \
                        f"{child}: used more recently than its parent {node}"
                    for p in child.pages.tolist():
                        assert p not in seen_pages, f"{child}: page {p} appears twice in the tree"
                        seen_pages.add(p)
                        assert self.pool.refcount(p) >= 1, f"{child}: holds free page {p}"
                    cached += len(child.pages)
                    locked += len(child.pages) if child.lock_count else 0
                    nodes += 1
                    stack.append(child)
                if node.parent is not None:
                    assert node.lock_count >= child_locks, f"{node}: fewer locks than its children together"
                    if not node.children and not node.lock_count:
                        assert node.heap_seq >= 0, f"{node}: evictable leaf missing from the LRU heap"
        assert cached == self.num_cached_pages, f"num_cached_pages {self.num_cached_pages} != {cached} in tree"
        assert locked == self.num_locked_pages, f"num_locked_pages {self.num_locked_pages} != {locked} in tree"
        assert nodes == self._num_nodes, f"node count {self._num_nodes} != {nodes} in tree"
        assert self.pool.num_free + cached <= self.pool.num_pages + 0, "free + cached pages exceed the pool"
        live = {id(n) for _, s, n in self._heap if s == n.heap_seq}
        assert len(live) <= nodes, "LRU heap holds more live entries than nodes"
