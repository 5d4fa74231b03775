"""LruLeaves: the evictable leaves of a RadixCache, least recently used first. No torch.

A binary heap of (last_access, seq, node) with lazy deletion: an entry is live while
`node.heap_seq == seq`; a node that changed since (gained a child, got locked, was evicted,
was pushed again with a newer time) leaves a stale entry that `pop` skips. Push and pop are
O(log n); `rebuild` (O(n), when stale entries outnumber live nodes 4 to 1) keeps memory
bounded, amortised over the pushes that made the stale entries.
"""
from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Iterable, Iterator

from .node import Node


def _evictable(node: Node) -> bool:
    return not node.children and not node.lock_count and node.parent is not None


def gpu_leaf(node: Node) -> bool:
    """With a host tier: an unlocked node on GPU pages (its host copy, if any, aside) in the tree whose
    children (if any) are all host-only."""
    if node.host_only or node.lock_count or node.parent is None:
        return False
    return all(c.host_only for c in node.iter_children())


def host_leaf(node: Node) -> bool:
    """A host-only node in the tree without children (host-only nodes are never locked)."""
    return node.host_only and not node.children and node.parent is not None


class LruLeaves:
    """evictable: which nodes this heap holds (default: the unlocked leaves of a one-tier tree).
    seq: a sequence shared with another heap over the same nodes (a node's `heap_seq` then names
    one live entry across both)."""

    def __init__(self, evictable: Callable[[Node], bool] = _evictable,
                 seq: Iterator[int] | None = None) -> None:
        self._heap: list[tuple[int, int, Node]] = []  # (last_access, seq, leaf)
        self._seq = itertools.count() if seq is None else seq
        self.evictable = evictable

    def __len__(self) -> int:
        """Entries, stale ones included."""
        return len(self._heap)

    def push(self, node: Node) -> bool:
        """Queue `node` at its current last_access if it is an evictable leaf; returns whether
        it was queued (any older entry of it becomes stale)."""
        if not self.evictable(node):
            return False
        node.heap_seq = seq = next(self._seq)
        heapq.heappush(self._heap, (node.last_access, seq, node))
        return True

    def push_leaf(self, node: Node) -> None:
        """push() for a node the caller just checked to be an evictable leaf."""
        node.heap_seq = seq = next(self._seq)
        heapq.heappush(self._heap, (node.last_access, seq, node))

    def pop(self) -> Node | None:
        """Remove and return the least recently used evictable leaf (None when there is none)."""
        heap = self._heap
        while heap:
            _, seq, node = heapq.heappop(heap)
            if seq == node.heap_seq and self.evictable(node):
                node.heap_seq = None
                return node
        return None

    def peek(self) -> Node | None:
        """The node pop() would return, left in the heap (stale entries above it are dropped)."""
        heap = self._heap
        while heap:
            _, seq, node = heap[0]
            if seq == node.heap_seq and self.evictable(node):
                return node
            heapq.heappop(heap)
        return None

    def requeue(self, node: Node) -> None:
        """Put back a leaf just popped whose tail was evicted (at its unchanged last_access)."""
        self.push(node)

    def rebuild(self, roots: Iterable[Node]) -> None:
        """Forget stale entries: one entry per evictable leaf under `roots`."""
        heap = []
        for root in roots:
            stack = list(root.iter_children())
            while stack:
                node = stack.pop()
                if node.children:
                    stack.extend(node.iter_children())
                if self.evictable(node):
                    node.heap_seq = seq = next(self._seq)
                    heap.append((node.last_access, seq, node))
        heapq.heapify(heap)
        self._heap = heap

    def live_times(self) -> dict[int, int]:
        """id(node) -> queued last_access, for the live entries (for invariant checks)."""
        return {id(n): t for t, s, n in self._heap if s == n.heap_seq}
