"""PrefixIndex: an approximate global view of which replica holds which block chains. No torch.

Fed only by the KV events each replica's RadixCache publishes (radixkv/cache/events.py): a
BlockStored adds its block hashes to the replica's set, a BlockRemoved takes them out, an
AllBlocksCleared empties it. Chain hashes identify a whole prefix, so "replica r holds the hash of
block i of a prompt" means r has cached the prompt's first i + 1 blocks (up to a 64-bit collision).

Invariant: once every event a replica emitted has been applied, in order, the index holds for it
exactly the chain hashes of the blocks in its tree. Between deliveries it lags (approximate): it may
claim blocks evicted since the last delivery, or miss blocks stored since.
"""
from __future__ import annotations

import numpy as np
import xxhash

from radixkv.cache.events import AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch, namespace_seed
from radixkv.cache.node import Namespace


class PrefixIndex:
    """Chain hash -> replicas holding that block (a bit mask), and each replica's hashes."""

    def __init__(self, num_replicas: int) -> None:
        if num_replicas < 1:
            raise ValueError(f"num_replicas must be >= 1, got {num_replicas}")
        self.num_replicas = num_replicas
        self.block_size: int | None = None  # learnt from the first BlockStored
        self._holders: dict[int, int] = {}  # chain hash -> bit r set when replica r holds it
        self._blocks: list[set[int]] = [set() for _ in range(num_replicas)]

    def apply(self, replica: int, batch: KVEventBatch) -> None:
        """Apply one replica's events, in their order."""
        if not 0 <= replica < self.num_replicas:
            raise IndexError(f"replica {replica} outside 0..{self.num_replicas - 1}")
        bit = 1 << replica
        holders, mine = self._holders, self._blocks[replica]
        for ev in batch.events:
            if type(ev) is BlockStored:
                if self.block_size is None:
                    self.block_size = ev.block_size
                elif ev.block_size != self.block_size:
                    raise ValueError(f"replica {replica} stores blocks of {ev.block_size} tokens, "
                                     f"others {self.block_size}: one index needs one block size")
                for h in ev.block_hashes:
                    holders[h] = holders.get(h, 0) | bit
                mine.update(ev.block_hashes)
            elif type(ev) is BlockRemoved:
                for h in ev.block_hashes:
                    if h in mine:
                        mine.discard(h)
                        left = holders[h] & ~bit
                        if left:
                            holders[h] = left
                        else:
                            del holders[h]
            elif type(ev) is AllBlocksCleared:
                self._forget(replica)
            else:
                raise TypeError(f"not a KV cache event: {ev!r}")

    def _forget(self, replica: int) -> None:
        bit = 1 << replica
        mine = self._blocks[replica]
        for h in mine:
            left = self._holders[h] & ~bit
            if left:
                self._holders[h] = left
            else:
                del self._holders[h]
        mine.clear()  # in place: apply() holds this set

    def blocks_of(self, replica: int) -> frozenset[int]:
        """The chain hashes the index says `replica` holds."""
        return frozenset(self._blocks[replica])

    def num_blocks(self, replica: int) -> int:
        return len(self._blocks[replica])

    def matched_blocks(self, tokens: np.ndarray, namespace: Namespace = None) -> list[int]:
        """Per replica, how many leading full blocks of `tokens` (int32 [L]) it holds by the index.
        Hashes the prompt block by block and stops at the first block no replica holds."""
        out = [0] * self.num_replicas
        bs = self.block_size
        if bs is None:
            return out
        raw = np.ascontiguousarray(tokens, dtype=np.int32).tobytes()
        step = 4 * bs
        alive = (1 << self.num_replicas) - 1  # replicas still matching every block so far
        h = namespace_seed(namespace)
        holders, digest = self._holders, xxhash.xxh3_64_intdigest
        n = len(tokens) // bs
        i = 0
        while i < n:
            h = digest(raw[i * step: (i + 1) * step], h)
            still = holders.get(h, 0) & alive
            if still != alive:
                _set_bits(out, alive & ~still, i)
                alive = still
                if not alive:
                    return out
            i += 1
        _set_bits(out, alive, n)
        return out


def _set_bits(out: list[int], mask: int, value: int) -> None:
    r = 0
    while mask:
        if mask & 1:
            out[r] = value
        mask >>= 1
        r += 1
