"""PrefixIndex: an approximate global view of which replica holds which block chains. No torch.

Fed only by the KV events each replica's RadixCache publishes (radixkv/cache/events.py): a
BlockStored adds its block hashes to the replica's set, a BlockRemoved takes them out, an
AllBlocksCleared empties it. Chain hashes identify a whole prefix, so "replica r holds the hash of
block i of a prompt" means r has cached the prompt's first i + 1 blocks (up to a 64-bit collision).

Invariant: once every event a replica emitted has been applied, in order, the index holds for it
exactly the chain hashes of the blocks in its tree. Between deliveries it lags (approximate): it may
claim blocks evicted since the last delivery, or miss blocks stored since.

Expectations (`expect`): a router that sends a prompt to a replica may record the prompt's blocks as
expected there before any event says so (SGLang's cache-aware router does the same), so a burst of
requests sharing a prefix follows the first one instead of scattering while no event has arrived yet.
`matched_blocks` counts expected blocks as held; an expectation ends when the replica's BlockStored
or BlockRemoved of that hash arrives, its AllBlocksCleared, or `ttl` later expectations.
"""
from __future__ import annotations

from collections import deque

import numpy as np
import xxhash

from radixkv.cache.events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
    chain_hashes,
    namespace_seed,
)
from radixkv.cache.node import Namespace


class PrefixIndex:
    """Chain hash -> replicas holding that block (a bit mask), and each replica's hashes."""

    def __init__(self, num_replicas: int, block_size: int | None = None, ttl: int = 4096) -> None:
        """block_size: the replicas' page size (else learnt from the first BlockStored; `expect` needs it);
        ttl: expectations a recorded one outlives."""
        if num_replicas < 1:
            raise ValueError(f"num_replicas must be >= 1, got {num_replicas}")
        if block_size is not None and block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.num_replicas = num_replicas
        self.block_size = block_size
        self._holders: dict[int, int] = {}  # chain hash -> bit r set when replica r holds it
        self._blocks: list[set[int]] = [set() for _ in range(num_replicas)]
        self._expected: dict[int, int] = {}  # chain hash -> bit r set when it is expected on replica r
        self._recent: deque[tuple[int, list[int]]] = deque(maxlen=ttl)  # (replica, hashes) expected, oldest first

    def expect(self, replica: int, tokens: np.ndarray, namespace: Namespace = None) -> None:
        """Record the full blocks of `tokens` as expected on `replica` (a request was just sent there)."""
        if self.block_size is None:
            return
        if len(self._recent) == self._recent.maxlen:  # the oldest expectation expires
            old_r, old = self._recent[0]
            self._unexpect(old_r, old)
        hashes = chain_hashes(np.asarray(tokens), self.block_size, namespace_seed(namespace))
        bit = 1 << replica
        for h in hashes:
            self._expected[h] = self._expected.get(h, 0) | bit
        self._recent.append((replica, hashes))

    def _unexpect(self, replica: int, hashes) -> None:
        bit = 1 << replica
        for h in hashes:
            left = self._expected.get(h, 0) & ~bit
            if left:
                self._expected[h] = left
            else:
                self._expected.pop(h, None)

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
                if self._expected:
                    self._unexpect(replica, ev.block_hashes)
            elif type(ev) is BlockRemoved:
                if self._expected:
                    self._unexpect(replica, ev.block_hashes)
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
        for h in [h for h, bits in self._expected.items() if bits & bit]:
            self._unexpect(replica, (h,))
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
        holders, expected, digest = self._holders, self._expected, xxhash.xxh3_64_intdigest
        n = len(tokens) // bs
        i = 0
        while i < n:
            h = digest(raw[i * step: (i + 1) * step], h)
            still = (holders.get(h, 0) | expected.get(h, 0)) & alive
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
