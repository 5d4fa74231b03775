"""The simulator's host tier (issue 37): a RadixCache whose admission lookups load host blocks. No torch.

`LoadingCache` is a RadixCache with a host pool (radixkv.cache.tree_host) that, when a `match`
reaches host-resident blocks, makes room on the GPU pool (LRU eviction, which demotes), promotes
as many of them as fit onto fresh pages and returns the longer GPU match: what an engine does when
it admits a request whose prefix was written back to host memory (it copies the bytes host-to-device
before the prefill reads them). The scheduler sees an ordinary match. `match_many` (the scheduler
ranking its whole queue every step) does not load: it ranks by the GPU prefix, as before.

`TransferTimer` adds the host-to-device copies to the cost model's step time: the blocks promoted
since the previous step, at `CostModel.pcie_bytes_per_s` (write-back copies overlap the steps and
are only counted in bytes).
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from radixkv.cache.node import MatchResult, Namespace
from radixkv.cache.radix_tree import RadixCache

from .cost_model import CostModel

if TYPE_CHECKING:
    from radixkv.batch import Batch


class LoadingCache(RadixCache):
    """RadixCache(pool, page_size, host_pool=...) whose match promotes the host part it reaches."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if self.host_pool is None:
            raise ValueError("LoadingCache needs a host_pool")
        self._loading = True

    def match_many(self, queries: Iterable[tuple[Sequence[int] | np.ndarray, Namespace, MatchResult | None]]
                   ) -> list[MatchResult]:
        self._loading = False  # ranking the queue: no copies
        try:
            return super().match_many(queries)
        finally:
            self._loading = True

    def match(self, tokens: Sequence[int] | np.ndarray, namespace: Namespace = None, *,
              since: MatchResult | None = None) -> MatchResult:
        m = super().match(tokens, namespace, since=since)
        if not m.host_tokens or not self._loading:
            return m
        return self._load(tokens, namespace, m)

    def _load(self, tokens: Sequence[int] | np.ndarray, namespace: Namespace, m: MatchResult) -> MatchResult:
        """Promote as many of m's host blocks as the GPU pool can take (free + evictable pages)."""
        ps, pool = self.page_size, self.pool
        want = min(m.host_tokens // ps, pool.num_free + self.num_evictable_pages)
        if want <= 0:
            return m
        self.lock(m)  # our own GPU prefix is never a victim
        cur = m
        try:
            if want > pool.num_free:
                self.evict(want - pool.num_free)  # demotes; may drop old host blocks of our path
            now = RadixCache.match(self, tokens, namespace)  # same GPU end; what is left on host
            n = min(want, now.host_tokens // ps, pool.num_free)
            if n > 0:
                cur = self.promote(m._replace(host_tokens=now.host_tokens, host_path=now.host_path),
                                   pool.alloc_array(n), donate=True)
        finally:
            self.unlock(cur)
        return RadixCache.match(self, tokens, namespace)


class TransferTimer:
    """A StepTimer: `cost`'s step time plus the host-to-device copies of the blocks `cache` promoted
    since the previous step (they are read by this step's prefills)."""

    def __init__(self, cost: CostModel, cache: RadixCache) -> None:
        self.cost = cost
        self.cache = cache
        self._seen = cache.promoted_pages
        self.transfer_s = 0.0  # total seconds of copies added

    def step_seconds(self, batch: Batch) -> float:
        moved = self.cache.promoted_pages - self._seen
        self._seen = self.cache.promoted_pages
        s = self.cost.step_seconds(batch)
        if moved:
            t = self.cost.transfer_seconds(moved * self.cache.page_size)
            self.transfer_s += t
            s += t
        return s
