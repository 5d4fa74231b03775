"""Which tile a decode_linear launch takes (rows, columns, K steps, splits over K) and the scratch its
splits share. Tiles come from benchmarks/kernels/bench_decode_linear.py --sweep on the H200."""
from __future__ import annotations

from typing import Literal, NamedTuple

import torch
import triton
from torch import Tensor

from .launch import KernelConfig

Epilogue = Literal["store", "residual", "silu_mul", "rope"]

# Rows a launch takes: one row tile of 16 (1-16 rows) or of 64 (17-64 rows, TALL_TILES).
MAX_ROWS = 64
SHORT_ROWS = 16
# The model's tall decode path (model.decode_rows_tall, with RADIXKV_FUSED_DECODE_ROWS=64) from this many
# rows: against cuBLAS plus the elementwise kernels it lost at 32, 48 and 56 rows and tied or won by 1% at
# 64 (H200, 2026-12-03, benchmarks/RESULTS.md). 33 is the first row count whose CUDA-graph buckets are all
# tall: cascade graphs come in powers of two, so 33-64 rows replay the 64-row one.
TALL_MIN_ROWS = 33


class Tile(NamedTuple):
    """A launch's tile: config (block_m rows, block_n columns, warps, stages), block_k, and split_k: K cut
    into that many shares, each its own program; the share that finishes last sums the partials (in
    share order: deterministic) and runs the epilogue."""

    config: KernelConfig
    block_k: int
    split_k: int = 1


# GPU tiles by epilogue, the best of benchmarks/kernels/bench_decode_linear.py --sweep on the H200 (2026-12-02,
# 8B shapes, at 1 and 16 rows); rows are one tile of 16 (padded) for the tensor cores.
GPU_TILES: dict[str, Tile] = {
    "store": Tile(KernelConfig(block_m=16, block_n=32, num_warps=4, num_stages=4), 512),
    "residual": Tile(KernelConfig(block_m=16, block_n=32, num_warps=4, num_stages=4), 512),
    "silu_mul": Tile(KernelConfig(block_m=16, block_n=32, num_warps=4, num_stages=3), 256),
    "rope": Tile(KernelConfig(block_m=16, block_n=32, num_warps=4, num_stages=4), 256),
}
# 17-64 rows: one tile of 64 rows, the best of bench_decode_linear.py --sweep --sweep-rows 64 --prenorm-only on
# the H200 (2026-12-03), over the tall chain (model.decode_rows_tall: the norms stay rms_norm's kernel).
TALL_TILES: dict[str, Tile] = {
    "store": Tile(KernelConfig(block_m=64, block_n=64, num_warps=4, num_stages=3), 256, split_k=2),
    "residual": Tile(KernelConfig(block_m=64, block_n=32, num_warps=4, num_stages=3), 256),
    "silu_mul": Tile(KernelConfig(block_m=64, block_n=64, num_warps=8, num_stages=4), 128),
    "rope": Tile(KernelConfig(block_m=64, block_n=64, num_warps=8, num_stages=4), 128, split_k=2),
}
CPU_TILE = Tile(KernelConfig(block_m=16, block_n=16, num_warps=1, num_stages=1), 32)


def tile(epilogue: Epilogue, device: torch.device, rows: int = 1) -> Tile:
    """The tile of a launch over `rows` rows on `device`."""
    if device.type != "cuda":
        return CPU_TILE
    return (GPU_TILES if rows <= SHORT_ROWS else TALL_TILES)[epilogue]


def rope_block_n(head_dim: int, block_n: int) -> int:
    """The "rope" epilogue's columns a tile for heads of head_dim under a tile of block_n: the largest power
    of two <= min(block_n, head_dim / 2) that divides half a head, or 0 when that is under 16 (and under
    min(block_n, head_dim / 2)): the tensor cores' narrowest tile."""
    half = head_dim // 2
    if head_dim % 2 or half < 1:
        return 0
    bn = 1 << (min(block_n, half).bit_length() - 1)
    while half % bn:
        bn //= 2
    return bn if bn >= min(16, block_n, half) else 0


def rope_fits(head_dim: int, device: torch.device) -> bool:
    """Whether the "rope" epilogue takes heads of head_dim on device at every row count."""
    return all(rope_block_n(head_dim, tile("rope", device, rows).config.block_n) for rows in (1, MAX_ROWS))


def partials(n: int, device: torch.device, rows: int = 1) -> int:
    """Sums of squares a row that the "residual" epilogue writes for n output columns over `rows` rows
    (ssq_out's width)."""
    return triton.cdiv(n, tile("residual", device, rows)[0].block_n)


class SplitScratch:
    """What a split launch's shares leave for the last one: partials (float32) and one counter a column
    tile and row tile (int32). The counters start at 0 and each launch's last share puts its counter back,
    so one scratch serves every launch on one stream, CUDA-graph replays included, while it lives: give a
    graph-captured launch a scratch that outlives the graph (the model keeps one, `for_weights`)."""

    def __init__(self, device: torch.device, partials: int, counters: int) -> None:
        self.partials = torch.empty(partials, dtype=torch.float32, device=device)
        self.counters = torch.zeros(counters, dtype=torch.int32, device=device)

    @staticmethod
    def need(epilogue: Epilogue, n_w: int, device: torch.device, rows: int = MAX_ROWS,
             split_k: int | None = None, block_n: int | None = None) -> tuple[int, int]:
        """(partials, counters) a launch over w of n_w rows needs at up to `rows` rows (split_k / block_n:
        overrides of the device's tile). Counters: at most one a column tile of block_n, at most
        cdiv(n_w, block_n) tiles (rope's half-head tiles are no more)."""
        t = tile(epilogue, device, rows)
        splits = t.split_k if split_k is None else split_k
        bn, bm = block_n or t.config.block_n, t.config.block_m
        if splits <= 1:
            return 0, 0
        return splits * rows * n_w, triton.cdiv(n_w, bn) * triton.cdiv(rows, bm)

    @classmethod
    def for_weights(cls, device: torch.device, launches: list[tuple[Epilogue, Tensor]]) -> SplitScratch:
        """A scratch big enough for each (epilogue, w) launch at up to MAX_ROWS rows on device's tiles
        (the short tiles' and the tall ones')."""
        needs = [cls.need(e, w.shape[0], device, rows) for e, w in launches for rows in (SHORT_ROWS, MAX_ROWS)]
        return cls(device, max((p for p, _ in needs), default=0), max((c for _, c in needs), default=0))
