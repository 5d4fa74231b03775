"""Node and MatchResult: the pieces of a RadixCache that callers see. No torch.

A Node is one edge of the tree: `key` holds a whole number of `page_size`-token blocks and
`pages` one physical page per block. MatchResult names the node that ends a matched path,
which is what `RadixCache.lock`/`unlock` take.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import NamedTuple

import numpy as np
import xxhash

HashFn = Callable[[np.ndarray], int]
Namespace = str | None


def xxhash_block(block: np.ndarray) -> int:
    """Default child key: xxh3-64 of the block's int32 bytes."""
    return xxhash.xxh3_64_intdigest(block)


class Node:
    """One edge of the tree: `key` tokens (whole blocks) and one page per block."""

    __slots__ = ("key", "first", "pages", "children", "parent", "next_sibling", "hkey",
                 "lock_count", "last_access", "heap_seq", "namespace")

    def __init__(self, key: np.ndarray, first: bytes, pages: np.ndarray, parent: Node | None,
                 hkey: int, namespace: Namespace) -> None:
        self.key = key  # int32 [num_blocks * page_size]
        self.first = first  # bytes of key's first block (compared on every hash hit)
        self.pages = pages  # int32 [num_blocks], one physical page per block
        self.children: dict[int, Node] = {}  # first-block hash -> first node of a collision chain
        self.parent = parent  # None for a namespace root and for a node evicted from the tree
        self.next_sibling: Node | None = None  # next sibling whose first block has the same hash
        self.hkey = hkey
        self.lock_count = 0
        self.last_access = 0
        self.heap_seq: int | None = None  # sequence number of its live LRU-heap entry, if any
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
