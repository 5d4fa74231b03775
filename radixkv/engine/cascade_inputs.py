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
and group rows buckets, its splits on the prefix bucket (the width of the prefix table view), the suffix
decode's splits on the suffix bucket. One int32 buffer holds, for R rows, W pages a row and
MAX_GROUPS groups (kernels/cascade.py names the tensors):

    group_start [MAX_GROUPS + 1]  group_rows [R]  prefix_lens [MAX_GROUPS]  suffix_lens [R]
    prefix_pages [MAX_GROUPS, W]  suffix_pages [R, W]

filled on the host in a pinned twin (two of them, alternate steps, as DecodeGraphs' inputs) and copied in
one transfer. Padding groups have no rows and no prefix; padding rows (past the batch, up to the bucket)
are in no group and attend one token of the scratch page, as plain decode's padding rows do.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import torch
from torch import Tensor

from radixkv.kernels.cascade import CascadeGroups, CascadePlan

MAX_GROUPS = 8  # a step with more groups runs eagerly


class CascadeKey(NamedTuple):
    """The bucketed shape of a cascade step (module docstring): what a graph is captured for."""

    groups: int
    group_rows: int
    prefix_pages: int
    suffix_len: int


def pow2_at_least(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


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

    def upload(self, turn: int, bucket: int) -> None:
        """Copy pinned buffer `turn` to the device buffer (stream-ordered, one transfer), up to the suffix
        table's first `bucket` rows: the rows past them are never read."""
        end = self._n - (self.max_rows - bucket) * self.max_pages
        self._dev[:end].copy_(self._hosts[turn][:end], non_blocking=True)

    def plan(self, bucket: int, key: CascadeKey) -> CascadePlan:
        """The CascadePlan of a `bucket`-row step of this key: views of the device buffer (static addresses)."""
        start, rows, plens, slens, ppages, spages = self._parts(self._dev)
        G = key.groups
        groups = CascadeGroups(start[:G + 1], rows[:bucket], ppages[:G, :min(key.prefix_pages, self.max_pages)],
                               plens[:G], key.group_rows)
        return CascadePlan(groups, spages[:bucket], slens[:bucket], key.suffix_len, False, all_rows_grouped=False)
