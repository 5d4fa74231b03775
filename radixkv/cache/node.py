"""Node and MatchResult: the pieces of a RadixCache that callers see. No torch.

A Node is one edge of the tree: `key` holds a whole number of `page_size`-token blocks and
`pages` one physical page per block. MatchResult names the node that ends a matched path,
which is what `RadixCache.lock`/`unlock` take. attach_child / detach_child / replace_child
keep a parent's hash-keyed collision chains linked; as_tokens checks and packs token input.
"""
from __future__ import annotations

from array import array
from collections.abc import Callable, Iterator, Sequence
from typing import NamedTuple

import numpy as np
import xxhash

HashFn = Callable[[np.ndarray], int]
Namespace = str | None
_UINT32 = "I" if array("I").itemsize == 4 else "L"  # array's 4-byte unsigned type code
_INT32 = np.dtype(np.int32)


def xxhash_block(block: np.ndarray) -> int:
    """Default child key: xxh3-64 of the block's int32 bytes."""
    return xxhash.xxh3_64_intdigest(block)


def as_tokens(tokens: Sequence[int] | np.ndarray) -> np.ndarray:
    """tokens as a C-contiguous int32 [L] array (no copy when it already is one)."""
    if (type(tokens) is np.ndarray and tokens.dtype is _INT32 and tokens.ndim == 1  # the hot path: cheap tests
            and tokens.flags.c_contiguous):
        return tokens
    if (isinstance(tokens, np.ndarray) and tokens.dtype == np.int32 and tokens.ndim == 1
            and tokens.flags.c_contiguous):
        return tokens
    if type(tokens) is list and tokens and type(tokens[0]) is int:
        # One pass in C: array('I') takes Python or numpy integers only (TypeError for a float,
        # string, None or nested list) in [0, 2**32) (OverflowError); an id >= 2**31 reads as a
        # negative int32, so one min() finishes the range check. 'I' converts with
        # PyLong_AsUnsignedLong (~14 ns a token here), 'i' through PyArg_Parse (~40 ns), numpy's
        # asarray/fromiter at 35-65 ns. A bool packs as 0 or 1 (as insert's pages).
        try:
            arr = np.frombuffer(array(_UINT32, tokens), dtype=np.int32)
        except (TypeError, OverflowError):
            arr = None  # the general path below names what is wrong
        if arr is not None and arr.min() >= 0:
            return arr
    arr = np.asarray(tokens)
    if arr.ndim != 1:
        raise ValueError(f"tokens must be one-dimensional, got shape {arr.shape}")
    if arr.size and (arr.dtype.kind not in "iu" or arr.min() < 0 or arr.max() > np.iinfo(np.int32).max):
        raise ValueError("tokens must be non-negative integers below 2**31")
    return np.ascontiguousarray(arr, dtype=np.int32)


class Node:
    """One edge of the tree: `key` tokens (whole blocks) and one page per block."""

    __slots__ = ("key", "first", "pages", "children", "parent", "next_sibling", "hkey",
                 "lock_count", "end_locks", "last_access", "heap_seq", "namespace", "depth",
                 "host", "__weakref__")  # (a namespace root without blocks or locks is weakly held)

    def __init__(self, key: np.ndarray, first: bytes, pages: np.ndarray, parent: Node | None,
                 hkey: int, namespace: Namespace) -> None:
        self.key = key  # int32 [num_blocks * page_size]
        self.first = first  # bytes of key's first block (compared on every hash hit)
        self.pages = pages  # int32 [num_blocks], one physical page per block
        self.children: dict[int, Node] = {}  # first-block hash -> first node of a collision chain
        self.parent = parent  # None for a namespace root and for a node evicted from the tree
        self.next_sibling: Node | None = None  # next sibling whose first block has the same hash
        self.hkey = hkey
        # Locks come in two counts. lock_count: locks whose path passes through this node
        # (what keeps it from eviction); end_locks: those of them taken on a match that ends
        # exactly here, the only ones an unlock of such a match may undo. lock_count equals
        # end_locks plus the children's lock_counts.
        self.lock_count = 0
        self.end_locks = 0
        self.last_access = 0
        self.heap_seq: int | None = None  # sequence number of its live LRU-heap entry, if any
        self.namespace = namespace
        # Tokens from the root to the end of this key. Changes only when the node's own tail is
        # evicted (a split leaves the lower part ending where it did), so an earlier match ending
        # here with `depth` tokens still spells the same path while the node is in the tree.
        self.depth = (parent.depth if parent is not None else 0) + len(key)
        # Host tier (RadixCache(..., host_pool=...)): host page ids holding a copy of the blocks' KV,
        # one per block, or None. A block lives on GPU pages (`pages`; host None), on host pages only
        # (`pages` empty: `host_only`), or on both (a block loaded back keeps its host copy). GPU residency
        # is prefix-closed: a host-only node's descendants are host-only; a host-only node is never locked.
        self.host: np.ndarray | None = None

    def iter_children(self) -> Iterator[Node]:
        for head in self.children.values():
            node: Node | None = head
            while node is not None:
                yield node
                node = node.next_sibling

    @property
    def host_only(self) -> bool:
        """On host pages and not on GPU pages (a demoted block: what a match reports as its host part)."""
        return self.host is not None and not len(self.pages)

    @property
    def is_leaf(self) -> bool:
        return not self.children

    @property
    def num_tokens(self) -> int:
        return len(self.key)

    def __repr__(self) -> str:
        head = self.key[:4].tolist()
        where = f"pages={len(self.pages)}" if self.host is None else (
            f"host_pages={len(self.host)}" if self.host_only else f"pages={len(self.pages)}+host")
        return (f"Node(ns={self.namespace!r}, tokens={len(self.key)}, first={head}, "
                f"{where}, locks={self.lock_count} ({self.end_locks} ending here))")


# ---- a parent's children: a dict from first-block hash to the head of a collision chain ----
def attach_child(parent: Node, child: Node) -> None:
    """File `child` under parent.children[child.hkey], at the head of its collision chain."""
    head = parent.children.get(child.hkey)
    if head is not None:
        child.next_sibling = head
    parent.children[child.hkey] = child
    child.parent = parent


def detach_child(child: Node) -> None:
    """Unlink `child` from its parent's collision chain; it keeps its own children."""
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


def replace_child(parent: Node, old: Node, new: Node) -> None:
    """Put `new` in `old`'s place in parent's collision chain (same hash key); `old` is left
    unlinked but its own fields (parent, next_sibling) are not reset."""
    head = parent.children[old.hkey]
    new.next_sibling = old.next_sibling
    new.parent = parent
    if head is old:
        parent.children[old.hkey] = new
    else:
        while head.next_sibling is not old:
            head = head.next_sibling
        head.next_sibling = new


class MatchResult(NamedTuple):
    """Longest cached block-aligned prefix. `node` ends the path (a root when nothing matched).

    `pages` lists the path's pages from block `pages_from` on: all of them (0) for `match`,
    only the new blocks' for `RadixCache.extend`.

    With a host tier, `num_tokens` / `pages` / `node` are the GPU-resident prefix only (what a
    caller can lock and read); `host_tokens` more tokens follow it on host pages, along the host
    nodes `host_path` (`RadixCache.promote` moves them onto GPU pages). 0 and () without a tier."""

    num_tokens: int
    pages: list[int]
    node: Node
    pages_from: int = 0
    host_tokens: int = 0
    host_path: tuple[Node, ...] = ()


class Descent(NamedTuple):
    """Where tokens leave the tree, found without changing it."""

    path: list[Node]  # whole edges matched, root excluded
    matched: int  # tokens matched, including `split_blocks` blocks of `split_node`
    split_node: Node | None  # an edge the prefix ends inside (it must be split), if any
    split_blocks: int
