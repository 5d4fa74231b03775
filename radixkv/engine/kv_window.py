"""KVWindow: the full-precision copy of each running request's most recent tokens (KIVI's window).

With quantised pages (INT4, INT2, FP8) a query reads its `window` most recent keys (itself included)
in the compute dtype, and only older keys from the quantised pages (radixkv.kernels.window). The
copy lives in shadow pages: a small pool of compute-dtype pages, [capacity + 1, page_size, Hkv, D]
per layer for K and V, the last one scratch. `shadow_of` (int32 [num_pages], on the device) maps a
KV page to its shadow page, or to scratch when it has none.

Invariant (check_invariants): a mapped shadow page holds, for every slot its KV page has had written
since the mapping was made, the value the quantised page was written from (or, for slots written
before, their dequantised value: a fill). It holds because every store of a step also writes the
shadow of the slot's page (window_attention does it, in the same launch as it reads), and a mapping is
made only before a step, from the page's current content. Pages are written once and then shared
through the prefix tree, so a shadow never goes stale: a page freed and handed to another request
is written again, slot by slot, before anything reads those slots.

`prepare(batch)`, before each step (eager and CUDA-graph alike), maps the pages a row reads its
window from (positions start - window + 1 .. start - 1, before its new tokens) and the pages holding
its last window - 1 new tokens (read by its next step), evicting the least recently used mappings of
other pages. A newly mapped page that holds earlier tokens (a prefix-cache hit, or a mapping evicted
earlier) is filled by dequantising it: those tokens then come back at the page dtype's precision.
Capacity: each row needs at most 2 * ceil((window - 1) / page_size + 1) pages, so `max_rows` rows
always fit.

With a sink of S tokens (a multiple of the page size; attention sinks, kernels/window.py), the pages
holding every row's first S tokens are mapped too, at every step: a row's first chunk writes them in full
precision, and rows on a cached prefix share them (a prefix whose mapping was evicted comes back as a
fill). Each row needs S / page_size more pages.
"""
from __future__ import annotations

from collections import OrderedDict

import torch
from torch import Tensor

from radixkv.batch import Batch
from radixkv.kernels import reference_attention
from radixkv.plan import window_pages_per_row

from .device import host_to_device
from .kv_store import KVStore


class KVWindow:
    """Shadow pages of `kv` for a recent-token window of `window` tokens and a sink of `sink`, room for
    `max_rows` rows a step."""

    def __init__(self, kv: KVStore, window: int, max_rows: int, sink: int = 0):
        if isinstance(window, bool) or not isinstance(window, int) or window < 1:
            raise ValueError(f"KVWindow: window must be a positive int, got {window!r}")
        if not isinstance(max_rows, int) or max_rows < 1:
            raise ValueError(f"KVWindow: max_rows must be a positive int, got {max_rows!r}")
        if isinstance(sink, bool) or not isinstance(sink, int) or sink < 0 or sink % kv.page_size:
            raise ValueError(f"KVWindow: sink must be an int >= 0 and a multiple of the page size "
                             f"{kv.page_size}, got {sink!r}")
        self.kv = kv
        self.window = window
        self.sink = sink
        self.capacity = max_rows * window_pages_per_row(window, kv.page_size, sink)
        shape = (self.capacity + 1, kv.page_size, kv.num_kv_heads, kv.head_dim)
        dt, dev = kv.compute_dtype, kv.device
        self.k = [torch.zeros(shape, dtype=dt, device=dev) for _ in range(kv.num_layers)]
        self.v = [torch.zeros(shape, dtype=dt, device=dev) for _ in range(kv.num_layers)]
        self.scratch = self.capacity
        self.shadow_of = torch.full((kv.num_pages,), self.scratch, dtype=torch.int32, device=dev)
        self._map: OrderedDict[int, int] = OrderedDict()  # KV page -> shadow page, least recently used first
        self._free = list(range(self.capacity - 1, -1, -1))
        self.fills = 0  # pages filled by dequantising (for tests and benchmarks)
        self.evictions = 0

    @property
    def total_bytes(self) -> int:
        return 2 * sum(t.numel() * t.element_size() for t in self.k)

    def prepare(self, batch: Batch) -> None:
        """Map (and fill where needed) every page this step's window reads or its next step's will."""
        ps, W, S = self.kv.page_size, self.window, self.sink
        hot: dict[int, bool] = {}  # page -> needs a fill if it is not mapped yet
        for table, end, q_len in zip(batch.page_tables, batch.seq_lens, batch.q_lens):
            start = end - q_len
            for lo, hi in ((0, min(S, end)), (max(0, start - W + 1), start), (max(start, end - W + 1), end)):
                for j in range(lo // ps, -(-hi // ps)) if hi > lo else ():
                    page = table[j]
                    hot[page] = hot.get(page, False) or j * ps < start
        if len(hot) > self.capacity:
            raise RuntimeError(f"KVWindow: a step of {len(batch.seq_lens)} rows needs {len(hot)} shadow pages, "
                               f"capacity {self.capacity}")
        for page in hot:
            if page in self._map:
                self._map.move_to_end(page)
        changed: dict[int, int] = {}
        fills: list[tuple[int, int]] = []
        for page, fill in hot.items():
            if page in self._map:
                continue
            if not self._free:
                old, slot = self._map.popitem(last=False)  # least recent; never hot (those moved to the end)
                changed[old] = self.scratch
                self._free.append(slot)
                self.evictions += 1
            slot = self._free.pop()
            self._map[page] = slot
            changed[page] = slot
            if fill:
                fills.append((page, slot))
        if changed:  # pinned copies: a pageable one would wait for the step still running (async scheduling)
            dev = self.kv.device
            self.shadow_of[host_to_device(list(changed), torch.int64, dev)] = host_to_device(
                list(changed.values()), torch.int32, dev)
        if fills:
            self._fill(fills)

    def forget(self, pages: list[int]) -> None:
        """Unmap `pages`: their content is about to change other than through a step's stores (the host KV
        tier copies a block into them, engine/host_kv.py), so a shadow kept from before would be stale. A
        later `prepare` that needs them maps and fills them from their new content."""
        gone = [p for p in pages if p in self._map]
        if not gone:
            return
        for p in gone:
            self._free.append(self._map.pop(p))
        self.shadow_of[host_to_device(gone, torch.int64, self.kv.device)] = self.scratch

    def _fill(self, fills: list[tuple[int, int]]) -> None:
        """Shadow pages from their KV pages' current content, dequantised, in every layer."""
        kv, dev = self.kv, self.kv.device
        pages = host_to_device([p for p, _ in fills], torch.int32, dev)
        slots = host_to_device([s for _, s in fills], torch.int64, dev)
        n = len(fills) * kv.page_size
        for layer in range(kv.num_layers):
            k_scale, v_scale = kv.scales(layer)
            for cache, scale, shadow in ((kv.k_cache[layer], k_scale, self.k[layer]),
                                         (kv.v_cache[layer], v_scale, self.v[layer])):
                rows = reference_attention.gather_pages(cache, scale, pages, n, kv.compute_dtype, kv.head_dim)
                shadow[slots] = rows.view(len(fills), kv.page_size, kv.num_kv_heads, kv.head_dim)
        self.fills += len(fills)

    def layer(self, layer: int) -> tuple[Tensor, Tensor]:
        """(shadow_k, shadow_v) of a layer: [capacity + 1, page_size, Hkv, D] in the compute dtype."""
        return self.k[layer], self.v[layer]

    def check_invariants(self) -> None:
        """The host map, the free list and the device map agree; no shadow page is used twice."""
        used = list(self._map.values())
        assert len(set(used)) == len(used), "a shadow page mapped twice"
        assert not set(used) & set(self._free), "a mapped shadow page is on the free list"
        assert len(used) + len(self._free) == self.capacity
        want = torch.full_like(self.shadow_of, self.scratch)
        if self._map:
            want[torch.tensor(list(self._map), device=want.device)] = torch.tensor(
                used, dtype=torch.int32, device=want.device)
        assert torch.equal(self.shadow_of, want), "shadow_of differs from the host map"
