"""KV cache events in vLLM's shape, so a router can follow which block chains a replica holds. No torch.

    BlockStored(block_hashes, parent_block_hash, token_ids, block_size, ...)   blocks entered the tree
    BlockRemoved(block_hashes, ...)                                              blocks left it
    (`medium`: "GPU", or "CPU" for the host tier: a demotion is BlockRemoved GPU + BlockStored CPU;
    a load back is BlockStored GPU (the CPU copy stays stored) and a later GPU eviction of it
    BlockRemoved GPU only; giving up that CPU copy is BlockRemoved CPU)
    AllBlocksCleared()                                                           the whole tree emptied

Names and fields follow vLLM's `vllm/distributed/kv_events.py` (plus `namespace`, radixkv's
cache-isolation key, which vLLM folds into `extra_keys`). Block hashes are chain hashes: block i's
hash is xxh3-64 of its int32 token bytes seeded with block i-1's hash, the first block seeded with
`namespace_seed(namespace)`; so equal hashes mean equal prefixes in the same namespace (up to a 64-bit
collision), whichever replica computed them, and `chain_hashes` lets a router hash a prompt itself.

Who calls what:
- RadixCache(pool, page_size, events=publisher) builds a `BlockChains` over the publisher and calls it
  whenever blocks enter the tree (stored), an edge is cut (split), blocks leave (removed) or the tree
  is emptied in one pass (cleared). Without a publisher the tree never calls here: no cost.
- A publisher is anything with `emit(event)` (the `KVEventPublisher` protocol); `QueuePublisher` keeps
  them in order in memory and hands them out as one `KVEventBatch` per `drain()`. Delivery is in
  emission order; a consumer that applies every batch in order holds exactly the tree's blocks.

No ZMQ publisher here: pyzmq is not a dependency (a ZMQ one would `emit` into a buffer and send a
`KVEventBatch` per engine step).
"""
from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import numpy as np
import xxhash

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from .node import Namespace, Node

MEDIUM_GPU = "GPU"
MEDIUM_CPU = "CPU"  # a block on the host tier's pages (vLLM's name for its CPU offloading medium)


@dataclass(frozen=True, slots=True)
class BlockStored:
    """Consecutive full blocks now cached: `block_hashes[i]` covers token_ids[i*block_size:(i+1)*block_size],
    the first one chained to `parent_block_hash` (None: the namespace root)."""

    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None = None
    medium: str | None = MEDIUM_GPU
    namespace: str | None = None


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    """Blocks no longer cached (each the tail of its chain at the time it left)."""

    block_hashes: list[int]
    medium: str | None = MEDIUM_GPU


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    """Every block of every namespace left the tree."""


KVCacheEvent = BlockStored | BlockRemoved | AllBlocksCleared


@dataclass(frozen=True, slots=True)
class KVEventBatch:
    """Events in emission order, as vLLM's publishers send them (`ts`: the publisher's clock)."""

    ts: float
    events: list[KVCacheEvent]
    data_parallel_rank: int | None = None


class KVEventPublisher(Protocol):
    def emit(self, event: KVCacheEvent) -> None: ...


@dataclass
class QueuePublisher:
    """In-process publisher: events wait in order until `drain` hands them out (the simulator's)."""

    data_parallel_rank: int | None = None
    _pending: deque[KVCacheEvent] = field(default_factory=deque, repr=False)

    def emit(self, event: KVCacheEvent) -> None:
        self._pending.append(event)

    def __len__(self) -> int:
        return len(self._pending)

    def drain(self, ts: float = 0.0) -> KVEventBatch:
        """Everything emitted since the last drain, oldest first; the queue is left empty."""
        events = list(self._pending)
        self._pending.clear()
        return KVEventBatch(ts, events, self.data_parallel_rank)


# ---- chain hashes ---------------------------------------------------------------------------------
def namespace_seed(namespace: Namespace) -> int:
    """The seed of a namespace's first block: 0 for the default namespace, else xxh3-64 of its UTF-8 name."""
    return 0 if namespace is None else xxhash.xxh3_64_intdigest(namespace.encode("utf-8"))


def chain_hashes(tokens: np.ndarray, block_size: int, parent: int, limit: int | None = None) -> list[int]:
    """Chain hashes of the full blocks of `tokens` (int32 [L]), the first chained to `parent`
    (`namespace_seed(ns)` for a prompt's first block); at most `limit` blocks when given."""
    raw = np.ascontiguousarray(tokens, dtype=np.int32).tobytes()
    step = 4 * block_size
    n = len(tokens) // block_size if limit is None else min(limit, len(tokens) // block_size)
    out: list[int] = []
    h = parent
    digest = xxhash.xxh3_64_intdigest
    for i in range(n):
        h = digest(raw[i * step: (i + 1) * step], h)
        out.append(h)
    return out


class BlockChains:
    """The chain hash of every cached block, per tree node, and the events that report them.

    Invariant: for every node in the tree, `hashes[node]` lists one chain hash per block of its key;
    the emitted events, applied in order, give exactly the set of those hashes.
    """

    def __init__(self, publisher: KVEventPublisher, block_size: int) -> None:
        self.publisher = publisher
        self.dropped = 0  # events the publisher raised on (lost to its consumers; the tree is unaffected)
        self.block_size = block_size
        self.hashes: dict[Node, list[int]] = {}

    def _publish(self, event: KVCacheEvent) -> None:
        """Hand one event to the publisher. One that raises (a socket gone) loses the event, counted in
        `dropped` and logged, but never interrupts the tree change that emitted it: an observer cannot
        leave the cache (or the step that changes it) half done."""
        try:
            self.publisher.emit(event)
        except Exception:  # noqa: BLE001 - any publisher failure is the observer's, not the tree's
            self.dropped += 1
            if self.dropped == 1 or self.dropped % 1000 == 0:
                log.warning("KV event publisher raised; %d event(s) dropped so far", self.dropped, exc_info=True)

    def _tail(self, parent: Node) -> int:
        own = self.hashes.get(parent)
        return own[-1] if own else namespace_seed(parent.namespace)  # a root holds no block

    def stored(self, leaf: Node) -> None:
        """`leaf` (with all its blocks) was just attached below its parent."""
        parent = leaf.parent
        assert parent is not None
        prev = self._tail(parent)
        hashes = self.hashes[leaf] = chain_hashes(leaf.key, self.block_size, prev)
        self._publish(BlockStored(hashes, None if parent.parent is None else prev, leaf.key.tolist(),
                                        self.block_size, namespace=leaf.namespace))

    def split(self, upper: Node, lower: Node, blocks: int) -> None:
        """`lower`'s first `blocks` blocks moved to the new node `upper` above it (no event: the
        cached blocks are the same)."""
        hashes = self.hashes[lower]
        self.hashes[upper] = hashes[:blocks]
        self.hashes[lower] = hashes[blocks:]

    def removed(self, node: Node, keep: int, medium: str = MEDIUM_GPU) -> None:
        """`node`'s blocks past the first `keep` left the tree (keep=0: the node itself left) from
        `medium` (its tier: MEDIUM_CPU for a host node)."""
        hashes = self.hashes[node]
        if keep:
            self.hashes[node] = hashes[:keep]
        else:
            del self.hashes[node]
        self._publish(BlockRemoved(hashes[keep:], medium))

    def moved(self, node: Node, src: str, dst: str) -> None:
        """All of `node`'s blocks moved from tier `src` to tier `dst` (a demotion to host): BlockRemoved on
        src, then BlockStored on dst. A consumer that keys blocks by (hash, medium) and applies every event
        in order holds exactly each tier's blocks; one that ignores `medium` sees the block leave and come
        back (still cached)."""
        self.dropped_from(node, src)
        self.stored_on(node, dst)

    def stored_on(self, node: Node, medium: str) -> None:
        """All of `node`'s blocks (in the tree) are now held on `medium` too (a load back to the GPU that
        keeps the host copy): BlockStored on medium."""
        parent = node.parent
        assert parent is not None
        prev = self._tail(parent)
        self._publish(BlockStored(list(self.hashes[node]), None if parent.parent is None else prev,
                                  node.key.tolist(), self.block_size, medium=medium, namespace=node.namespace))

    def dropped_from(self, node: Node, medium: str) -> None:
        """All of `node`'s blocks left `medium` but stay in the tree on the other tier (a GPU eviction
        of a block with a host copy, or a host copy given up): BlockRemoved on medium."""
        self._publish(BlockRemoved(list(self.hashes[node]), medium))

    def cleared(self) -> None:
        """Every node left the tree."""
        self.hashes.clear()
        self._publish(AllBlocksCleared())
