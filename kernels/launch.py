"""Launcher helpers shared by the kernel files: device dispatch and argument checks."""
from __future__ import annotations

import enum
import functools
import os
from typing import Any, NamedTuple

import torch
from torch import Tensor

from .reference import is_fp8

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


# GPU defaults (H200, D = 128, bf16/fp8), picked with benchmarks/kernels/bench_kernels.py's sweep;
# CPU (interpreter) runs use small tiles so tests stay fast.
DECODE_GPU = KernelConfig(block_m=16, block_n=64, num_warps=4, num_stages=3)
# FP8: 2 warps x 64-token tiles was the best of 10 configs at 64 x 16k (1001 us vs 1142 for 4 x 128),
# and of CUDA-core and fp16-dot variants tried later (benchmarks/RESULTS.md).
DECODE_FP8_GPU = KernelConfig(block_m=16, block_n=64, num_warps=2, num_stages=2)
# Prefill tiles by the longest row of new tokens (first whose bound holds; benchmarks/kernels/profile_extend.py,
# 8 x 4k cached, TFLOP/s). 512 new: 256 x 64 390-392 (fp8 159); 128 x 64 capped at 128 registers (two
# programs per SM) 378-401 (fp8 126: spills); 128 x 128 at 255 registers 339-342 (fp8 143). 64 new:
# 64 x 64 / 4 warps 278, 128 x 64 capped 197, 256 x 64 101 (rows past the new tokens are padding).
PREFILL_GPU_BY_LEN = ((64, KernelConfig(block_m=64, block_n=64, num_warps=4, num_stages=3)),
                      (128, KernelConfig(block_m=128, block_n=64, num_warps=8, num_stages=3, max_registers=128)),
                      (None, KernelConfig(block_m=256, block_n=64, num_warps=8, num_stages=3)))
PREFILL_FP8_GPU_BY_LEN = (PREFILL_GPU_BY_LEN[0], PREFILL_GPU_BY_LEN[2])
# fp32 q or pages: 4-byte tiles, kept small so the pipeline stages fit in shared memory.
DECODE_FP32_GPU = KernelConfig(block_m=16, block_n=32, num_warps=4, num_stages=2)
PREFILL_FP32_GPU = KernelConfig(block_m=64, block_n=32, num_warps=4, num_stages=2)
CPU_TILES = KernelConfig(block_m=16, block_n=16, num_warps=1, num_stages=1)


def fp8_decode_kernel_supported(device: torch.device, head_dim: int, group: int) -> bool:
    """Whether FP8 decode on `device` runs paged_decode_fp8's one-warp Gluon kernel (else the Triton one):
    a CUDA GPU with FP8 converts (sm_89+), head_dim 64 or 128 (at 256 the register pipeline spills),
    a GQA group of at most 16."""
    if device.type != "cuda" or head_dim not in (64, 128) or not 1 <= group <= 16:
        return False
    return _gluon_fp8_gpu(device.index if device.index is not None else torch.cuda.current_device())


# An unsplit FP8 decode launch of at least this many programs per SM runs paged_decode_fp8 at 200
# registers (8 resident per SM, about two whole waves): 256 x 1k and 256 x 4k took 146 and 515 us
# so, against 179 and 547 us at 168 registers with the 3 splits that 12 resident programs need.
FP8_WIDE_PROGRAMS_PER_SM = 15


def fp8_offsets_64(k_cache: Tensor, k_scale: Tensor) -> bool:
    """Whether paged_decode_fp8 needs 64-bit offsets: the largest int32-word offset of the (possibly
    strided) FP8 cache view, or element offset of its scales, passes int32."""
    words = k_cache.view(torch.int32)
    return max(sum((n - 1) * st for n, st in zip(t.shape, t.stride())) for t in (words, k_scale)) >= 2**31


def fp8_decode_warps_per_sm(device: torch.device, head_dim: int, group: int, off64: bool = False,
                            page_size: int = 16) -> int:
    """One-warp programs of paged_decode_fp8 resident per SM where FP8 decode runs it, else 0
    (for attention.choose_num_splits). off64: the caches need 64-bit offsets (fp8_offsets_64)."""
    if not fp8_decode_kernel_supported(device, head_dim, group):
        return 0
    from .decode_fp8_gluon import resident_warps_per_sm

    return resident_warps_per_sm(head_dim, group, off64, page_size)


@functools.cache
def _gluon_fp8_gpu(index: int) -> bool:
    if torch.cuda.get_device_capability(index) < (8, 9) or not _gluon_tested():
        return False
    try:
        from triton.experimental.gluon.language.nvidia.ampere import mma_v2  # noqa: F401
    except ImportError:
        return False
    return True


def merge_warps(block_s: int, block_d: int) -> int:
    """Warps of a split-merge program (block_s partials of block_d values): up to 64 values a thread
    below the cap of 8 warps.
    The merge is latency-bound: at 3 splits of 128 dims (64 x 32 programs, H200) one warp took 3.0 us
    alone, four 9.8, and 64 x 16k FP8 decode with its merge 524 us against 529."""
    return max(1, min(8, block_s * block_d // (32 * 64)))


# paged_prefill_hopper's Gluon kernel (sm_90): 8 x (4k + 512) at 450 TFLOP/s against 390 for the
# Triton kernel, bit-identical output on the GPU checks' random ragged cases (benchmarks/RESULTS.md);
# 460 against 382 at 128 new tokens. At 64 and fewer the Triton kernel's 64-row tiles win (277 against
# 244 TFLOP/s at 64), so those keep the tiles above. RADIXKV_HOPPER_PREFILL=0 (or false/off/no) turns it off.
HOPPER_PREFILL_ENV = "RADIXKV_HOPPER_PREFILL"
HOPPER_PREFILL_MIN_NEW = 64


def hopper_prefill_enabled() -> bool:
    return os.environ.get(HOPPER_PREFILL_ENV, "").strip().lower() not in ("0", "false", "off", "no")


# The Gluon kernels were written against Triton 3.6 (the H200's) and 3.9 (the CPU machine's compile
# tests); older Gluon APIs differ, so those Tritons keep the Triton kernels.
GLUON_MIN_TRITON = (3, 6)


@functools.cache
def _gluon_tested() -> bool:
    import triton

    try:
        version = tuple(int(x) for x in triton.__version__.split(".")[:2])
    except ValueError:
        return False
    return version >= GLUON_MIN_TRITON


def hopper_prefill_supported(q: Tensor, k_cache: Tensor, v_cache: Tensor, out: Tensor, max_q_len: int) -> bool:
    """Whether paged_prefill runs paged_prefill_hopper's kernel: an sm_90 GPU, 16-bit q and pages of
    the same dtype, head_dim 128, unit head-dim strides, pages whose rows cp.async can copy in 16-byte
    pieces (strides of 16 elements, aligned base), more than HOPPER_PREFILL_MIN_NEW new tokens, and
    RADIXKV_HOPPER_PREFILL not set to turn it off."""
    if q.device.type != "cuda" or max_q_len <= HOPPER_PREFILL_MIN_NEW or q.shape[2] != 128:
        return False
    if q.dtype not in (torch.float16, torch.bfloat16) or k_cache.dtype != q.dtype:
        return False
    if q.stride(2) != 1 or k_cache.stride(3) != 1 or out.stride(2) != 1:
        return False
    if any(st % 16 for st in k_cache.stride()[:3]) or k_cache.data_ptr() % 16 or v_cache.data_ptr() % 16:
        return False
    if not hopper_prefill_enabled():
        return False
    return _gluon_hopper_gpu(q.device.index if q.device.index is not None else torch.cuda.current_device())


@functools.cache
def _gluon_hopper_gpu(index: int) -> bool:
    if torch.cuda.get_device_capability(index) != (9, 0) or not _gluon_tested():
        return False
    try:
        from triton.experimental.gluon.language.nvidia.hopper import warpgroup_mma  # noqa: F401
    except ImportError:
        return False
    return True


class KernelKind(enum.Enum):
    DECODE = "decode"
    PREFILL = "prefill"


def default_config(kind: KernelKind, q: Tensor, k_cache: Tensor, max_q_len: int | None = None) -> KernelConfig:
    """Tiles for this launch: small ones in the interpreter, dtype-dependent ones on the GPU;
    prefill also by its longest row of new tokens (max_q_len)."""
    if q.device.type == "cpu":
        return CPU_TILES
    wide = q.element_size() == 4 or k_cache.element_size() == 4
    if kind is KernelKind.DECODE:
        return DECODE_FP32_GPU if wide else (DECODE_FP8_GPU if is_fp8(k_cache.dtype) else DECODE_GPU)
    if wide:
        return PREFILL_FP32_GPU
    by_len = PREFILL_FP8_GPU_BY_LEN if is_fp8(k_cache.dtype) else PREFILL_GPU_BY_LEN
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
                "importing triton, or use radixkv.kernels.reference on CPU")
    return kernel


class PagedArgs(NamedTuple):
    """Checked launcher arguments: index tensors as contiguous int32, and whether pages are FP8."""

    page_table: Tensor  # int32 [B, max_pages]
    seq_lens: Tensor  # int32 [B]
    fp8: bool


def as_index(fn: str, name: str, t: Tensor, shape: tuple[int, ...] | None, dim: int) -> Tensor:
    """An integer tensor as contiguous int32 (int64 inputs are converted on the device, no host sync)."""
    if not isinstance(t, Tensor) or t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool:
        raise ValueError(f"{fn}: {name} must be an integer tensor (int32), got {getattr(t, 'dtype', type(t))}")
    if t.dim() != dim or (shape is not None and tuple(t.shape) != shape):
        want = shape if shape is not None else f"{dim}-D"
        raise ValueError(f"{fn}: {name} must have shape {want}, got {tuple(t.shape)}")
    if t.dtype != torch.int32 or not t.is_contiguous():
        t = t.to(torch.int32).contiguous()
    return t


def check_paged_args(fn: str, q: Tensor, k_cache: Tensor, v_cache: Tensor, page_table: Tensor, seq_lens: Tensor,
                     k_scale: Tensor | None, v_scale: Tensor | None) -> PagedArgs:
    """Shared checks of the attention launchers (raise ValueError naming the problem)."""
    if q.dim() != 3 or k_cache.dim() != 4:
        raise ValueError(f"{fn}: q must be 3-D and caches [P, S, Hkv, D], got {tuple(q.shape)} / {tuple(k_cache.shape)}")
    _, _, hkv, d = k_cache.shape
    if v_cache.shape != k_cache.shape or v_cache.dtype != k_cache.dtype or v_cache.stride() != k_cache.stride():
        raise ValueError(f"{fn}: k_cache and v_cache must share shape, dtype and strides")
    if q.shape[2] != d or q.shape[1] % hkv != 0:
        raise ValueError(f"{fn}: q {tuple(q.shape)} does not fit caches with {hkv} KV heads of dim {d}")
    if q.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise ValueError(f"{fn}: q dtype {q.dtype} not supported (fp32/fp16/bf16)")
    page_table = as_index(fn, "page_table", page_table, None, 2)
    seq_lens = as_index(fn, "seq_lens", seq_lens, (page_table.shape[0],), 1)
    fp8 = is_fp8(k_cache.dtype)
    if fp8:
        for name, s in (("k_scale", k_scale), ("v_scale", v_scale)):
            if s is None or s.shape != k_cache.shape[:3] or s.dtype not in (torch.float32, torch.float16):
                raise ValueError(f"{fn}: FP8 cache needs {name} float32 or float16 {tuple(k_cache.shape[:3])}")
        if k_scale.stride() != v_scale.stride() or k_scale.dtype != v_scale.dtype:
            raise ValueError(f"{fn}: k_scale and v_scale must share dtype and strides")
    elif k_scale is not None or v_scale is not None:
        raise ValueError(f"{fn}: scales given for a non-FP8 cache ({k_cache.dtype})")
    if len({t.device for t in (q, k_cache, v_cache, page_table, seq_lens)}) != 1:
        raise ValueError(f"{fn}: all tensors must be on one device")
    return PagedArgs(page_table, seq_lens, fp8)
