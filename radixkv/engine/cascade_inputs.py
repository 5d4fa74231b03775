"""CascadeInputs: the static cascade plan a CUDA graph of a cascade decode step reads (cuda_graphs.py).

A cascade step (Batch.cascade, one level: groups of rows sharing a page run, then each row's own pages)
is replayed from a graph keyed by buckets of its shape, so one graph serves every step of a workload:

    key = (groups G rounded up to a power of two <= MAX_GROUPS, the rows' bucket (a group may hold all
           of them), the longest prefix in pages rounded up to a power of two, the longest suffix in
           tokens rounded up to a power of two)

and DecodeGraphs pads a cascade step's rows to a power-of-two bucket: a graph is captured on the first
step of each new key, so the key has few values a workload can reach (a batch shrinking one row a step
as its requests finish would otherwise capture a graph a step).

The kernels' launch grids and split counts depend only on the key: the prefix kernel's grid on the groups
and group rows buckets, its splits on those and the prefix bucket, the suffix decode's splits on the rows
and suffix buckets. What a graph freezes is only that: grids, split counts (CascadePlan.prefix_splits /
suffix_splits) and buffer views (the prefix table MAX_GROUPS x W, or x prefix_width, read up to each
prefix's length), so graphs are keyed by (bucket, CascadeGraphKey(groups, prefix splits, suffix splits, prefix
width)): steps of different prefix or suffix buckets with the same splits replay one graph (over FP8 pages,
those whose prefixes fit a narrower table, for the fp16 copies kernels/cascade.py widens them into, replay one
of their own), and the keys an engine can reach are few enough to capture at start-up (cascade_keys lists
them; DecodeGraphs.warm_cascade). One int32 buffer holds, for R rows, W pages a row and MAX_GROUPS groups
(kernels/cascade.py names the tensors):

    group_start [MAX_GROUPS + 1]  group_rows [R]  prefix_lens [MAX_GROUPS]  suffix_lens [R]
    prefix_pages [MAX_GROUPS, W]  suffix_pages [R, W]

filled on the host in a pinned twin (two of them, alternate steps, as DecodeGraphs' inputs) and copied in
one transfer. Padding groups have no rows and no prefix; padding rows (past the batch, up to the bucket)
are in no group and attend one token of the scratch page, as plain decode's padding rows do
(fill_padding: a step of padding rows only, for start-up captures).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import torch
from torch import Tensor

from radixkv.kernels.cascade_plan import CascadeGroups, CascadePlan

MAX_GROUPS = 8  # a step with more groups runs eagerly


class CascadeKey(NamedTuple):
    """The bucketed shape of a cascade step (module docstring): what a graph is captured for."""

    groups: int
    group_rows: int
    prefix_pages: int
    suffix_len: int


class CascadeGraphKey(NamedTuple):
    """What a cascade graph freezes besides its rows bucket (module docstring)."""

    groups: int  # a power of two <= MAX_GROUPS
    prefix_splits: int
    suffix_splits: int
    prefix_width: int = 0  # pages of the prefix table the graph reads (FP8 prefixes widened to fp16 copies
                           # take a narrower table, so the copies are small); 0: all W


def pow2_at_least(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def cascade_keys(buckets: Sequence[int], max_pages: int, page_size: int, min_rows: int,
                 min_prefix_tokens: int) -> list[tuple[int, CascadeKey]]:
    """Every (bucket, CascadeKey) a step of a group of >= min_rows rows sharing >= min_prefix_tokens tokens
    can have, over the rows buckets a cascade step may take (DecodeGraphs: powers of two and the largest):
    g groups need >= (g // 2 + 1) * min_rows rows; prefixes and suffixes of up to max_pages pages (a few
    keys too many: a prefix and a suffix are not checked to fit one sequence together)."""
    p_lo = pow2_at_least(-(-max(1, min_prefix_tokens) // page_size))
    prefixes = [1 << i for i in range(p_lo.bit_length() - 1, pow2_at_least(max_pages).bit_length())]
    suffixes = [1 << i for i in range(pow2_at_least(max_pages * page_size).bit_length())]
    groups = [1 << i for i in range(MAX_GROUPS.bit_length())]
    return [(b, CascadeKey(g, b, p, s)) for b in buckets for g in groups if b >= (g // 2 + 1) * max(1, min_rows)
            for p in prefixes for s in suffixes]


class CascadeInputs:
    """Static cascade plan buffers for up to `max_rows` rows of up to `max_pages` pages."""

    def __init__(self, max_rows: int, max_pages: int, page_size: int, scratch_page: int,
                 device: torch.device) -> None:
        self.max_rows, self.max_pages, self.page_size = max_rows, max_pages, page_size
        self.scratch_page = scratch_page
        G, R, W = MAX_GROUPS, max_rows, max_pages
        self._n = (G + 1) + R + G + R + G * W + R * W
        pin = device.type == "cuda"
        self._hosts = [torch.zeros(self._n, dtype=torch.int32, pin_memory=pin) for _ in range(2)]
        self._hosts_np = [h.numpy() for h in self._hosts]
        self._dev = torch.zeros(self._n, dtype=torch.int32, device=device)

    def _parts(self, buf: Tensor | np.ndarray) -> tuple:
        """group_start, group_rows, prefix_lens, suffix_lens, prefix_pages [G, W], suffix_pages [R, W] of buf."""
        G, R, W = MAX_GROUPS, self.max_rows, self.max_pages
        cuts = np.cumsum([G + 1, R, G, R, G * W])
        start, rows, plens, slens, ppages, spages = (buf[a:b] for a, b in zip([0, *cuts], [*cuts, self._n]))
        return start, rows, plens, slens, ppages.reshape(G, W), spages.reshape(R, W)

    def fits(self, groups: Sequence[tuple[Sequence[int], int]]) -> bool:
        return 0 < len(groups) <= MAX_GROUPS

    def fill(self, turn: int, bucket: int, groups: Sequence[tuple[Sequence[int], int]],
             page_tables: Sequence[Sequence[int]], seq_lens: Sequence[int]) -> CascadeKey:
        """Write the step's groups ((rows, shared tokens), plan_cascade's input) and every row's own pages
        into pinned buffer `turn`; returns the step's key."""
        ps, B = self.page_size, len(page_tables)
        start, rows, plens, slens, ppages, spages = self._parts(self._hosts_np[turn])
        shared = [0] * bucket
        flat: list[int] = []
        start[0] = 0
        for g, (members, tokens) in enumerate(groups):
            flat += members
            start[g + 1] = len(flat)
            plens[g] = tokens
            run = page_tables[members[0]][: tokens // ps]
            ppages[g, :len(run)] = run
            for r in members:
                shared[r] = tokens
        G = len(groups)
        key_groups = pow2_at_least(G)
        start[G + 1:key_groups + 1] = len(flat)  # padding groups: no rows, no prefix
        plens[G:key_groups] = 0
        rows[:len(flat)] = flat
        longest = 1
        for b in range(B):
            own = page_tables[b][shared[b] // ps: -(-seq_lens[b] // ps)]
            spages[b, :len(own)] = own
            slens[b] = seq_lens[b] - shared[b]
            longest = max(longest, int(slens[b]))
        slens[B:bucket] = 1  # padding rows: one token on the scratch page
        spages[B:bucket, 0] = self.scratch_page
        return CascadeKey(key_groups, bucket, pow2_at_least(max(n for _, n in groups) // ps), pow2_at_least(longest))

    def fill_padding(self, turn: int, bucket: int) -> None:
        """Pinned buffer `turn` as a step of padding rows only: no group has rows or a prefix (the kernels
        launch in any key's shape and write only the scratch page)."""
        start, _, plens, slens, _, spages = self._parts(self._hosts_np[turn])
        start[:], plens[:] = 0, 0
        slens[:bucket], spages[:bucket, 0] = 1, self.scratch_page

    def upload(self, turn: int, bucket: int) -> None:
        """Copy pinned buffer `turn` to the device buffer (stream-ordered, one transfer), up to the suffix
        table's first `bucket` rows: the rows past them are never read."""
        end = self._n - (self.max_rows - bucket) * self.max_pages
        self._dev[:end].copy_(self._hosts[turn][:end], non_blocking=True)

    def plan(self, bucket: int, key: CascadeGraphKey) -> CascadePlan:
        """The CascadePlan of a `bucket`-row step of this graph key: views of the device buffer (static
        addresses) and the key's split counts."""
        start, rows, plens, slens, ppages, spages = self._parts(self._dev)
        G = key.groups
        groups = CascadeGroups(start[:G + 1], rows[:bucket], ppages[:G, :key.prefix_width or None], plens[:G],
                               bucket)
        return CascadePlan(groups, spages[:bucket], slens[:bucket], self.max_pages * self.page_size, False,
                           all_rows_grouped=False, prefix_splits=key.prefix_splits, suffix_splits=key.suffix_splits,
                           widen_max_bytes=None if key.prefix_width else 0)  # whole-context copies: never
