"""Launcher helpers shared by the kernel files: tile configs and launch options (argument checks: checks.py).

Which kernel runs and with how many splits is dispatch.py's; the figures behind the tile tables are
in benchmarks/RESULTS.md ("Why the kernel defaults are what they are").
"""
from __future__ import annotations

import enum
import os
from collections.abc import Callable
from typing import Any, NamedTuple

import torch
from torch import Tensor

from .fp8 import is_fp8

# a step's attention launch for one layer: launch(q, k_cache, v_cache, k_scale, v_scale, out=None) -> out, its
# checks and choices made once (decode.decode_launcher, prefill.prefill_launcher)
LayerLaunch = Callable[..., Tensor]

LOG2E = 1.4426950408889634


class KernelConfig(NamedTuple):
    """Tile sizes and launch options of an attention kernel (block_m is unused by decode).

    k_first (decode only): compute the scores as K.q^T, so K tiles feed the tensor cores in their
    memory order. max_registers: ptxas's cap per thread (Triton's maxnreg), to fit more programs
    on each multiprocessor.
    """

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    k_first: bool = False
    max_registers: int | None = None


# GPU defaults (D = 128, bf16/fp8), picked with benchmarks/kernels/bench_kernels.py's sweep on an H200;
# CPU (interpreter) runs use small tiles so tests stay fast.
DECODE_GPU = KernelConfig(block_m=16, block_n=64, num_warps=4, num_stages=3)
# FP8 (the Triton kernel, where paged_decode_fp8 does not run): 2 warps x 64-token tiles, the best of
# the sweep's configs and of CUDA-core and fp16-dot variants tried later.
DECODE_FP8_GPU = KernelConfig(block_m=16, block_n=64, num_warps=2, num_stages=2)
# Prefill tiles by the longest row of new tokens (the first whose bound holds), from
# benchmarks/kernels/profile_extend.py at 8 x 4k cached: 64 x 64 tiles for short extends (rows past the
# new tokens are padding in taller tiles); 128 x 64 capped at 128 registers (two programs per SM) up to
# 128 new; 256 x 64 beyond. FP8 pages skip the capped tier (it spills there).
PREFILL_GPU_BY_LEN = ((64, KernelConfig(block_m=64, block_n=64, num_warps=4, num_stages=3)),
                      (128, KernelConfig(block_m=128, block_n=64, num_warps=8, num_stages=3, max_registers=128)),
                      (None, KernelConfig(block_m=256, block_n=64, num_warps=8, num_stages=3)))
PREFILL_FP8_GPU_BY_LEN = (PREFILL_GPU_BY_LEN[0], PREFILL_GPU_BY_LEN[2])
# INT4/INT2 pages (uint8): not yet timed on a GPU. Decode as the bf16 kernel; extends of up to 64 new
# tokens in 64 x 64 tiles (4 warps), longer ones in 128 x 64 (8 warps): compiled for sm_90 with Triton
# 3.9's ptxas these fit in 197 / 192 registers, where 256-row tiles spill (200 bytes of stack) and
# 128-row tiles at 4 warps (344).
DECODE_INT_GPU = KernelConfig(block_m=16, block_n=64, num_warps=4, num_stages=3)
PREFILL_INT_GPU_BY_LEN = ((64, PREFILL_GPU_BY_LEN[0][1]),
                          (None, KernelConfig(block_m=128, block_n=64, num_warps=8, num_stages=3)))
# fp32 q or pages: 4-byte tiles, kept small so the pipeline stages fit in shared memory.
DECODE_FP32_GPU = KernelConfig(block_m=16, block_n=32, num_warps=4, num_stages=2)
PREFILL_FP32_GPU = KernelConfig(block_m=64, block_n=32, num_warps=4, num_stages=2)
CPU_TILES = KernelConfig(block_m=16, block_n=16, num_warps=1, num_stages=1)


def merge_warps(block_s: int, block_d: int) -> int:
    """Warps of a split-merge program (block_s partials of block_d values): up to 64 values a thread
    below the cap of 8 warps. The merge is latency-bound, so one warp beat four at a few splits
    (benchmarks/RESULTS.md)."""
    return max(1, min(8, block_s * block_d // (32 * 64)))


class KernelKind(enum.Enum):
    DECODE = "decode"
    PREFILL = "prefill"


def default_config(kind: KernelKind, q: Tensor, k_cache: Tensor, max_q_len: int | None = None) -> KernelConfig:
    """Tiles for this launch: small ones in the interpreter, dtype-dependent ones on the GPU;
    prefill also by its longest row of new tokens (max_q_len)."""
    if q.device.type == "cpu":
        return CPU_TILES
    wide = q.element_size() == 4 or k_cache.element_size() == 4
    packed = k_cache.dtype == torch.uint8  # INT4/INT2 pages
    if kind is KernelKind.DECODE:
        if wide:
            return DECODE_FP32_GPU
        return DECODE_INT_GPU if packed else (DECODE_FP8_GPU if is_fp8(k_cache.dtype) else DECODE_GPU)
    if wide:
        return PREFILL_FP32_GPU
    by_len = (PREFILL_INT_GPU_BY_LEN if packed else
              PREFILL_FP8_GPU_BY_LEN if is_fp8(k_cache.dtype) else PREFILL_GPU_BY_LEN)
    return next(cfg for bound, cfg in by_len if bound is None or (max_q_len is not None and max_q_len <= bound))


def launch_options(config: KernelConfig, device: torch.device) -> dict:
    """Triton launch keywords (the interpreter takes none)."""
    if device.type == "cpu":
        return {}
    opts = {"num_warps": config.num_warps, "num_stages": config.num_stages}
    if config.max_registers:
        opts["maxnreg"] = config.max_registers
    return opts


def for_device(kernel: Any, device: torch.device) -> Any:
    """The kernel itself, after checking it can run on `device`.

    CPU tensors need Triton's interpreter, which Triton picks when it is imported: TRITON_INTERPRET=1
    must be set before the first `import triton` (tests/kernels/conftest.py does so).
    """
    if device.type == "cpu":
        from triton.runtime.interpreter import InterpretedFunction

        if not isinstance(kernel, InterpretedFunction):
            raise RuntimeError(
                "Triton kernel called on CPU tensors but Triton was imported in compiled mode "
                f"(TRITON_INTERPRET={os.environ.get('TRITON_INTERPRET')!r}); set TRITON_INTERPRET=1 before "
                "importing triton, or use radixkv.kernels.reference_attention on CPU")
    return kernel
