"""Cascade planning on the host (no Triton): which rows share which prefix pages, as the tensors the
cascade kernels (cascade.py) read, and how many key splits each launch takes.

One cascade level is a set of groups; group g is a set of decode rows whose first prefix_lens[g] tokens
are the same pages (a node of the radix tree several running requests sit under). Layout (CascadeGroups):

    group_start   int32 [G + 1]              CSR offsets: group g owns group_rows[group_start[g] : group_start[g + 1]]
    group_rows    int32 [R]                  batch rows (indices into q), each in at most one group of a level;
                                             entries past group_start[G] are unused (a static plan's padding)
    prefix_pages  int32 [G, max_prefix_pages] group g's shared page run (a page-table row)
    prefix_lens   int32 [G]                  tokens of the run (a multiple of page_size when suffix tables
                                             start after it, as plan_cascade builds them)
    suffix_pages  int32 [B, max_suffix_pages] (CascadePlan) each row's pages after its group's run (all of
                                             them for a row in no group), suffix_lens int32 [B] their tokens

Two levels (CascadePlan.outer): the outer groups' runs start at token 0, the inner groups' prefix tables
then start where their rows' outer run ends (plan_cascade). Tile configs of the shared-prefix kernel live
here too, since its split count depends on them.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch
from torch import Tensor

from .checks import host_int
from .dispatch import choose_num_splits, decode_warps_per_sm, sm_count
from .launch import CPU_TILES, KernelConfig

# Shared-prefix tiles on the GPU (head_dim 128): 128 stacked query rows (two warpgroups) x 64 keys, 32 over
# FP8 pages (the widening converts need the registers: 64-key FP8 tiles spill in an sm_90 compile). Not yet
# timed on the H200 (benchmarks/kernels/bench_cascade.py --sweep does).
PREFIX_GPU = KernelConfig(block_m=128, block_n=64, num_warps=8, num_stages=3)
PREFIX_FP8_GPU = KernelConfig(block_m=128, block_n=32, num_warps=8, num_stages=3)
PREFIX_FP32_GPU = KernelConfig(block_m=64, block_n=32, num_warps=4, num_stages=2)
MIN_PREFIX_KEYS_PER_SPLIT = 256


class CascadeGroups(NamedTuple):
    """One cascade level's groups (device tensors; shapes in the module docstring) and host bounds."""

    group_start: Tensor  # int32 [G + 1]
    group_rows: Tensor  # int32 [R]
    prefix_pages: Tensor  # int32 [G, max_prefix_pages]
    prefix_lens: Tensor  # int32 [G]
    max_group_rows: int  # rows of the largest group: sizes the grid without a host sync


class CascadePlan(NamedTuple):
    """A decode batch as one cascade level (or two: `outer`) plus each row's own pages after it
    (plan_cascade builds it)."""

    groups: CascadeGroups
    suffix_pages: Tensor  # int32 [B, max_suffix_pages]
    suffix_lens: Tensor  # int32 [B]
    max_suffix_len: int  # host: the longest suffix (picks the suffix split count)
    empty_suffix: bool  # host: some row has suffix_lens 0 (all its tokens shared)
    # host: every row is in a group (prefix states need no -inf init); None: len(group_rows) >= B decides.
    # A CUDA graph's static plan (engine/cuda_graphs.py) has padding rows and says False.
    all_rows_grouped: bool | None = None
    # host: split counts frozen in the plan (a CUDA graph's, engine/cascade_inputs.py); None: cascade_decode
    # picks them (default_prefix_splits, suffix_num_splits)
    prefix_splits: int | None = None
    suffix_splits: int | None = None
    # a second level above `groups` (two-level cascade, eager plans only): its runs start at token 0, each
    # group's run where its rows' outer run ends, and suffix tables after both
    outer: CascadeGroups | None = None
    # host: the most memory cascade_decode may widen FP8 prefix pages into (fp16 copies) for this plan, below
    # the caller's budget: a CUDA graph's static plan sets what its pool may hold (0 over a whole-context
    # table); None: the caller's budget alone
    widen_max_bytes: int | None = None


def plan_cascade(page_tables: Sequence[Sequence[int]], seq_lens: Sequence[int],
                 groups: Sequence[tuple[Sequence[int], int]], page_size: int, device: torch.device | str,
                 outer: Sequence[tuple[Sequence[int], int]] = ()) -> CascadePlan:
    """Host lists -> a CascadePlan on `device`. page_tables[b] / seq_lens[b]: row b's whole sequence;
    groups: (rows, shared_tokens) pairs, shared_tokens a multiple of page_size that every row of the group
    has, on the same pages. Rows in no group attend their whole sequence as the suffix. ValueError names
    the group or row that does not fit.
    outer: a second level above `groups`, the same (rows, shared_tokens from token 0) pairs: its runs are
    read once per outer group, and a group's run then starts where its rows' outer run ends (all its rows
    in one outer group, or all in none); an outer row in no group attends from there as its own pages."""
    fn = "plan_cascade"
    page_size = host_int(fn, "page_size", page_size, lo=1)
    B = len(page_tables)
    if len(seq_lens) != B:
        raise ValueError(f"{fn}: {B} page tables but {len(seq_lens)} seq_lens")
    i32 = {"dtype": torch.int32, "device": device}
    outer_groups, outer_end = None, [0] * B
    if outer:
        outer_groups, outer_end = _plan_level(fn, "outer", page_tables, seq_lens, outer, page_size, outer_end, i32)
    inner, shared = _plan_level(fn, "groups", page_tables, seq_lens, groups, page_size, outer_end, i32)
    suffix = [list(page_tables[b][shared[b] // page_size: -(-seq_lens[b] // page_size)]) for b in range(B)]
    suffix_lens = [seq_lens[b] - shared[b] for b in range(B)]
    return CascadePlan(inner, _table(suffix).to(device), torch.tensor(suffix_lens, **i32), max(suffix_lens + [0]),
                       min(suffix_lens + [1]) == 0, outer=outer_groups)


def _table(rows: list[list[int]]) -> Tensor:
    """Ragged host lists -> int32 [len(rows), longest] (zero-padded; at least one column)."""
    width = max([len(r) for r in rows] + [1])
    return torch.tensor([r + [0] * (width - len(r)) for r in rows] or [[0]], dtype=torch.int32)[: len(rows)]


def _plan_level(fn: str, name: str, page_tables: Sequence[Sequence[int]], seq_lens: Sequence[int],
                groups: Sequence[tuple[Sequence[int], int]], page_size: int, start: list[int],
                i32: dict) -> tuple[CascadeGroups, list[int]]:
    """One level of plan_cascade: groups' runs from their rows' start[r] (tokens, the level above's end) to
    their shared_tokens. Returns its CascadeGroups and each row's end (start[b] for a row in no group)."""
    B = len(page_tables)
    end, in_group = list(start), [False] * B
    starts, flat, runs, lens = [0], [], [], []
    for gi, (rows, n) in enumerate(groups):
        rows, n = [int(r) for r in rows], int(n)
        if not rows:
            raise ValueError(f"{fn}: {name}[{gi}] has no rows")
        if n < 0 or n % page_size:
            raise ValueError(f"{fn}: {name}[{gi}] shares {n} tokens, not a whole number of {page_size}-token pages")
        lead = list(page_tables[rows[0]][: n // page_size]) if 0 <= rows[0] < B else []
        lo = start[rows[0]] if 0 <= rows[0] < B else 0
        for r in rows:
            if not 0 <= r < B:
                raise ValueError(f"{fn}: {name}[{gi}] names row {r} outside the batch of {B}")
            if in_group[r]:
                raise ValueError(f"{fn}: row {r} is in two groups ({name}[{gi}] and an earlier one)")
            if n > seq_lens[r] or list(page_tables[r][: n // page_size]) != lead:
                raise ValueError(f"{fn}: row {r} of {name}[{gi}] does not hold the group's {n} shared tokens "
                                 "on the same pages")
            if start[r] != lo or n < lo:
                raise ValueError(f"{fn}: row {r} of {name}[{gi}] starts at token {start[r]} of the outer level, "
                                 f"not {lo} as row {rows[0]}, or the group's {n} tokens end before it")
            in_group[r], end[r] = True, n
        flat += rows
        starts.append(len(flat))
        runs.append(lead[lo // page_size:])
        lens.append(n - lo)
    sizes = [starts[g + 1] - starts[g] for g in range(len(lens))]
    return CascadeGroups(torch.tensor(starts, **i32), torch.tensor(flat, **i32), _table(runs).to(i32["device"]),
                         torch.tensor(lens, **i32), max(sizes + [0])), end


def prefix_num_splits(tiles: int, num_kv_heads: int, max_prefix_len: int, num_sms: int,
                      min_keys: int = MIN_PREFIX_KEYS_PER_SPLIT, max_splits: int = 64) -> int:
    """Key splits of the shared-prefix kernel: none when its tiles x KV heads programs already fill two
    waves; else the fewest splits (each of >= min_keys keys) whose waves of one program per SM waste
    within 5% of the best (one 128-row program fills an SM)."""
    programs = max(1, tiles * num_kv_heads)
    cap = int(max(1, min(max_splits, max_prefix_len // min_keys)))
    if programs >= 2 * num_sms:
        return 1
    cost = [-(-programs * s // num_sms) / s for s in range(1, cap + 1)]
    return next(s for s, c in enumerate(cost, 1) if c <= min(cost) * 1.05)


def suffix_num_splits(q: Tensor, k_cache: Tensor, v_cache: Tensor, k_scale: Tensor | None, plan: CascadePlan) -> int:
    """Splits of the suffix decode, by paged_decode's rule (dispatch.choose_num_splits for the kernel that
    runs: the Gluon FP8 one unless a suffix is empty) over the plan's longest suffix."""
    hkv = k_cache.shape[2]
    warps = 0 if plan.empty_suffix else decode_warps_per_sm(q.dtype, k_cache, v_cache, k_scale, q.shape[1] // hkv,
                                                            q.shape[2])
    return choose_num_splits(q.shape[0], hkv, plan.max_suffix_len, sm_count(q.device), warps_per_sm=warps)


def default_prefix_config(q_dtype: torch.dtype, k_cache: Tensor) -> KernelConfig:
    """The shared-prefix kernel's tiles for q's dtype and the pages' (CPU: the interpreter's)."""
    if k_cache.device.type == "cpu":
        return CPU_TILES
    if q_dtype.itemsize == 4 or k_cache.element_size() == 4:
        return PREFIX_FP32_GPU
    return PREFIX_FP8_GPU if k_cache.element_size() == 1 else PREFIX_GPU


def default_prefix_splits(q_dtype: torch.dtype, k_cache: Tensor, num_q_heads: int, groups: int, rows: int,
                          max_prefix_len: int, config: KernelConfig | None = None) -> int:
    """cascade_prefix_attention's split count when given none (host arithmetic): `groups` groups over a
    group_rows buffer of `rows` rows, q of num_q_heads heads, prefix tables max_prefix_len tokens wide."""
    config = config or default_prefix_config(q_dtype, k_cache)
    hkv = k_cache.shape[2]
    tiles = max(groups, -(-rows * (num_q_heads // hkv) // config.block_m))
    return prefix_num_splits(tiles, hkv, max_prefix_len, sm_count(k_cache.device))
