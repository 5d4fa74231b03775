"""Which kernel runs, with how many splits: the dispatch rules of the attention launchers
(decode.py, prefill.py) and of the engine's plan (radixkv.engine.attention), in one place.

- FP8 decode runs paged_decode_fp8's one-warp Gluon kernel (decode_fp8_gluon.py) where
  fp8_decode_gluon holds, else decode.py's Triton kernel. That kernel's register cap
  (max_registers) and the programs an SM holds (resident_warps_per_sm) are plain arithmetic kept
  here, so this module never imports a Gluon file: decode_fp8_gluon imports from here, never the reverse.
- INT4 decode (KVStore's groups at head_dim 64 or 128) runs paged_decode_int4's one-warp Gluon kernel
  (decode_int4_gluon.py) where int4_decode_gluon holds, else decode.py's Triton INT kernel; its register
  cap and residency are FP8's at the same head_dim (max_registers).
- Extends run paged_prefill_hopper's Gluon kernel (prefill_hopper_gluon.py) where
  hopper_prefill_supported holds (16-bit, FP8 and INT4 pages at head_dim 128), else prefill.py's Triton kernel.
- choose_num_splits: the flash-decoding split count PagedAttention.plan passes to paged_decode,
  by the kernel that will run (decode_warps_per_sm).

Environment switches, each read once (at its first use, then cached for the process; a test that
changes one calls its reader's cache_clear()):
    RADIXKV_HOPPER_PREFILL=0 (or false/off/no): extends never take paged_prefill_hopper's kernel.

Imports torch only: Triton is imported inside the GPU checks, at their first call. The figures behind
each threshold are in benchmarks/RESULTS.md ("Why the kernel defaults are what they are").
"""
from __future__ import annotations

import functools
import os

import torch
from torch import Tensor

from .fp8 import is_fp8

# ----------------------------------------------------------------------------- environment switches
HOPPER_PREFILL_ENV = "RADIXKV_HOPPER_PREFILL"
_OFF = ("0", "false", "off", "no")


def switch_on(value: str | None) -> bool:
    """An on/off environment value: off when 0, false, off or no (any case, surrounding spaces
    ignored); on when unset, empty or anything else."""
    return (value or "").strip().lower() not in _OFF


@functools.cache
def hopper_prefill_enabled() -> bool:
    """RADIXKV_HOPPER_PREFILL, read once: False when it turns paged_prefill_hopper off."""
    return switch_on(os.environ.get(HOPPER_PREFILL_ENV))


EXTEND_DEQUANT_ENV = "RADIXKV_EXTEND_DEQUANT"


# FP8 extends of at most this many new tokens a row widen their tiles in-kernel (one 128-row query block a
# head: few widenings a tile to save); measured on the H200, benchmarks/RESULTS.md "Extends over widened copies"
EXTEND_DEQUANT_MIN_NEW_FP8 = 128
# ... or where each copy is read by this many rows on average (a shared prefix: dequant_page_list widens a
# page once for every row that reads it, where the kernel would widen it in each of their programs)
EXTEND_DEQUANT_MIN_REUSE = 2


@functools.cache
def extend_dequant_enabled() -> bool:
    """RADIXKV_EXTEND_DEQUANT, read once: False keeps the Hopper extend widening FP8 / INT4 tiles itself
    instead of reading dequant_pages' fp16 copies (kernels/prefill.py)."""
    return switch_on(os.environ.get(EXTEND_DEQUANT_ENV))


def widen_first(int4: bool, max_q_len: int, reuse: float = 1.0) -> bool:
    """Whether the Hopper extend over FP8 (int4 False) or INT4 pages reads fp16 copies that dequant_pages
    widened once a layer: INT4 always (its in-kernel widening costs 274 instructions a tile a thread), FP8
    above EXTEND_DEQUANT_MIN_NEW_FP8 new tokens a row or where a copy is read EXTEND_DEQUANT_MIN_REUSE times
    (reuse: the launch's page reads over its distinct pages); never with RADIXKV_EXTEND_DEQUANT=0."""
    return extend_dequant_enabled() and (int4 or max_q_len > EXTEND_DEQUANT_MIN_NEW_FP8
                                         or reuse >= EXTEND_DEQUANT_MIN_REUSE)


FUSED_DECODE_ROWS_ENV = "RADIXKV_FUSED_DECODE_ROWS"
# decode batches up to this many rows take the fused layer kernels (decode_linear.py); 64 adds the tall path
# (model.decode_rows_tall) for 33-64 rows, off by default: at best 1% faster than cuBLAS at 64 rows
# (benchmarks/RESULTS.md, 2026-12-03)
FUSED_DECODE_ROWS = 16


@functools.cache
def fused_decode_rows() -> int:
    """RADIXKV_FUSED_DECODE_ROWS, read once: the most rows a step may have to run its projections as the
    fused decode kernels (kernels/decode_linear.py), 0 for never; FUSED_DECODE_ROWS (their most) when unset.
    A power of two up to 16, or 64 (the tall path, TALL_MIN_ROWS and up), or 0: the CUDA graphs' batch
    buckets fall on each, so a step and the bucket it is replayed in fall on the same side."""
    value = os.environ.get(FUSED_DECODE_ROWS_ENV, "").strip()
    if not value:
        return FUSED_DECODE_ROWS
    if value not in ("0", "1", "2", "4", "8", "16", "64"):
        raise ValueError(f"{FUSED_DECODE_ROWS_ENV}={value!r}: expected 0, 1, 2, 4, 8, 16 or 64 (rows)")
    return int(value)


PDL_ENV = "RADIXKV_PDL"


@functools.cache
def pdl_enabled(device: torch.device) -> bool:
    """Whether kernels written for it launch with programmatic dependent launch (decode_linear.py): a CUDA
    device of sm_90 or later, a Triton that offers it, and RADIXKV_PDL=1 (read once; off by default until
    measured on the H200)."""
    if device.type != "cuda" or os.environ.get(PDL_ENV, "").strip() != "1":
        return False
    if torch.cuda.get_device_capability(device)[0] < 9:
        return False
    try:
        from triton.backends.nvidia.compiler import CUDAOptions
    except ImportError:
        return False
    return "launch_pdl" in getattr(CUDAOptions, "__dataclass_fields__", {})


# ----------------------------------------------------------------------------- the GPU
DEFAULT_NUM_SMS = 132  # an H200's: what launches off a CUDA device (the interpreter) plan for


@functools.cache
def sm_count(device: torch.device) -> int:
    """Multiprocessors of a CUDA device; DEFAULT_NUM_SMS for any other (CPU runs split as an H200 would)."""
    if device.type != "cuda":
        return DEFAULT_NUM_SMS
    return torch.cuda.get_device_properties(device).multi_processor_count


def _index(device: torch.device) -> int:
    return device.index if device.index is not None else torch.cuda.current_device()


# The Gluon kernels were written against Triton 3.6 (the GPU's) and 3.9 (the CPU machine's compile
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


@functools.cache
def _gluon_mma_v2_gpu(index: int, min_capability: tuple[int, int]) -> bool:
    """GPU `index` is at least `min_capability` and this Triton has the Gluon API (mma_v2) the one-warp
    decode kernels use."""
    if torch.cuda.get_device_capability(index) < min_capability or not _gluon_tested():
        return False
    try:
        from triton.experimental.gluon.language.nvidia.ampere import mma_v2  # noqa: F401
    except ImportError:
        return False
    return True


def _gluon_fp8_gpu(index: int) -> bool:
    """GPU `index` has FP8 converts (sm_89+) and this Triton has the Gluon API decode_fp8_gluon uses."""
    return _gluon_mma_v2_gpu(index, (8, 9))


def _gluon_int4_gpu(index: int) -> bool:
    """GPU `index` has mma.m16n8k16 (sm_80+) and this Triton has the Gluon API decode_int4_gluon uses."""
    return _gluon_mma_v2_gpu(index, (8, 0))


@functools.cache
def _gluon_hopper_gpu(index: int) -> bool:
    """GPU `index` is sm_90 and this Triton has the Gluon API prefill_hopper_gluon uses."""
    if torch.cuda.get_device_capability(index) != (9, 0) or not _gluon_tested():
        return False
    try:
        from triton.experimental.gluon.language.nvidia.hopper import warpgroup_mma  # noqa: F401
    except ImportError:
        return False
    return True


# ----------------------------------------------------------------------------- FP8 decode
# An unsplit FP8 decode launch of at least this many programs per SM fills the GPU by itself: it runs
# unsplit at 200 registers (8 resident per SM, about two whole waves) rather than split into whole
# waves of 12 at 168 registers (measured on the H200; benchmarks/RESULTS.md).
FP8_WIDE_PROGRAMS_PER_SM = 15


def fp8_wide_launch(programs: int, num_sms: int) -> bool:
    """Whether `programs` one-warp programs of paged_decode_fp8, unsplit, are a wide launch
    (FP8_WIDE_PROGRAMS_PER_SM or more per SM): no split, and max_registers(wide=True)."""
    return programs >= FP8_WIDE_PROGRAMS_PER_SM * num_sms


def fp8_decode_kernel_supported(device: torch.device, head_dim: int, group: int) -> bool:
    """Whether FP8 decode on `device` can run paged_decode_fp8's one-warp Gluon kernel (else the Triton
    one): a CUDA GPU with FP8 converts (sm_89+), a Triton with the Gluon API it was written for, head_dim
    64 or 128 (at 256 the register pipeline spills), a GQA group of at most 16."""
    if device.type != "cuda" or head_dim not in (64, 128) or not 1 <= group <= 16:
        return False
    return _gluon_fp8_gpu(_index(device))


def fp8_offsets_64(k_cache: Tensor, k_scale: Tensor) -> bool:
    """Whether paged_decode_fp8 needs 64-bit offsets: the largest int32-word offset of the (possibly
    strided) FP8 cache view, or element offset of its scales, passes int32."""
    words = k_cache.view(torch.int32)
    return max(sum((n - 1) * st for n, st in zip(t.shape, t.stride())) for t in (words, k_scale)) >= 2**31


def max_registers(head_dim: int, group: int, off64: bool = False, wide: bool = False, page_size: int = 16) -> int:
    """Register cap (maxnreg) of a paged_decode_fp8 program. Each of an SM's four sub-partitions holds
    16K registers: 168 a thread fits three one-warp programs there (12 per SM), 200 or 255 two. 168
    does not spill with 32-bit offsets, a group <= 8 (or head_dim 64) and pages of a multiple of 4
    tokens; 64-bit offsets or other page sizes (a page id per token) need 200, 16 heads of 128 dims
    255. 168 with more splits beat the earlier kernel at 200 (benchmarks/RESULTS.md). wide: an
    unsplit launch that fills the GPU by itself (fp8_wide_launch), which runs best at 8 per SM."""
    if group > 8 and head_dim > 64:
        return 255
    return 200 if off64 or wide or page_size % 4 else 168


def resident_warps_per_sm(head_dim: int, group: int, off64: bool = False, page_size: int = 16) -> int:
    """One-warp paged_decode_fp8 programs an SM holds at once (by registers; the kernel uses no shared
    memory), at the cap of a split launch."""
    regs = -(-max_registers(head_dim, group, off64, page_size=page_size) // 8) * 8
    return 4 * (16384 // (32 * regs))


def fp8_decode_warps_per_sm(device: torch.device, head_dim: int, group: int, off64: bool = False,
                            page_size: int = 16) -> int:
    """One-warp programs of paged_decode_fp8 resident per SM where FP8 decode of this shape can run it,
    else 0 (choose_num_splits' warps_per_sm). off64: the caches need 64-bit offsets (fp8_offsets_64)."""
    if not fp8_decode_kernel_supported(device, head_dim, group):
        return 0
    return resident_warps_per_sm(head_dim, group, off64, page_size)


def _fp8_gluon_caches(q_dtype: torch.dtype, k_cache: Tensor, v_cache: Tensor, group: int) -> bool:
    # The Gluon kernel takes 16-bit q and reads the caches as int32 words: unit head-dim stride,
    # word-aligned rows.
    if not is_fp8(k_cache.dtype) or q_dtype == torch.float32:
        return False
    words = (k_cache.stride(3) == 1 and all(st % 4 == 0 for st in k_cache.stride()[:3])
             and k_cache.data_ptr() % 4 == 0 and v_cache.data_ptr() % 4 == 0)
    return words and fp8_decode_kernel_supported(k_cache.device, k_cache.shape[3], group)


def fp8_decode_gluon(q: Tensor, k_cache: Tensor, v_cache: Tensor, out: Tensor) -> bool:
    """Whether paged_decode (given no explicit config) runs paged_decode_fp8's Gluon kernel for these
    checked arguments: FP8 pages it can read as words, fp16/bf16 q, unit head-dim strides of q and
    out, and fp8_decode_kernel_supported."""
    if q.stride(2) != 1 or out.stride(2) != 1:
        return False
    return _fp8_gluon_caches(q.dtype, k_cache, v_cache, q.shape[1] // k_cache.shape[2])


def decode_warps_per_sm(q_dtype: torch.dtype, k_cache: Tensor, v_cache: Tensor, k_scale: Tensor | None,
                        group: int, head_dim: int = 0) -> int:
    """choose_num_splits' warps_per_sm for decode of q_dtype queries (GQA group `group`) over caches of
    this layout (one layer's; every layer shares it): the one-warp programs of paged_decode_fp8 or
    paged_decode_int4 resident per SM where paged_decode runs one of them, else 0 (the Triton kernel's
    split rule). head_dim: q's (needed to tell INT4 pages from INT2 ones of the same width)."""
    if _int4_gluon_caches(q_dtype, head_dim, k_cache, v_cache, k_scale, k_scale, group):
        return resident_warps_per_sm(head_dim, group, fp8_offsets_64(k_cache, k_scale.view(torch.int32)),
                                     k_cache.shape[1])
    if not _fp8_gluon_caches(q_dtype, k_cache, v_cache, group):
        return 0
    return resident_warps_per_sm(k_cache.shape[3], group, fp8_offsets_64(k_cache, k_scale), k_cache.shape[1])


# ----------------------------------------------------------------------------- INT4 decode
def _int4_gluon_caches(q_dtype: torch.dtype, head_dim: int, k_cache: Tensor, v_cache: Tensor,
                       k_scale: Tensor | None, v_scale: Tensor | None, group: int) -> bool:
    # INT4 pages in KVStore's groups (radixkv.plan.kv_int_groups: 4 of 16 values at head_dim 64, 2 of 64 at
    # 128; the formats the GPU checks cover) read as int32 words, each group's (scale, zero) one int32 word
    # (decode_int4_gluon.group_words); at head_dim 64 a bit-plane's two groups are one 8-byte word a token.
    if head_dim not in (64, 128) or k_cache.dtype != torch.uint8 or k_cache.device.type != "cuda":
        return False
    if q_dtype == torch.float32 or k_cache.shape[3] != head_dim // 2 or k_scale is None or v_scale is None:
        return False
    if not 1 <= group <= 16:
        return False
    for pages in (k_cache, v_cache):
        if pages.stride(3) != 1 or any(st % 4 for st in pages.stride()[:3]) or pages.data_ptr() % 4:
            return False
    groups = {64: 4, 128: 2}[head_dim]
    for pairs in (k_scale, v_scale):
        if pairs.dim() != 5 or tuple(pairs.shape[3:]) != (groups, 2) or pairs.stride(4) != 1 or pairs.stride(3) != 2:
            return False
        align = 8 if groups == 4 else 4  # bytes
        if any(2 * st % align for st in pairs.stride()[:3]) or pairs.data_ptr() % align:
            return False
    return _gluon_int4_gpu(_index(k_cache.device))


def int4_decode_gluon(q: Tensor, k_cache: Tensor, v_cache: Tensor, k_scale: Tensor, v_scale: Tensor,
                      out: Tensor) -> bool:
    """Whether paged_decode (given no explicit config) runs paged_decode_int4's Gluon kernel for these
    checked INT arguments: INT4 pages of head_dim 64 or 128 in KVStore's groups (16 values at head_dim 64,
    64 at 128; other group sizes take the Triton INT kernel) whose (scale, zero) pairs read as int32 words,
    fp16/bf16 q, unit head-dim strides of q and out, a GQA group of at most 16, an sm_80+ GPU and a Triton
    with the Gluon API it was written for."""
    if q.stride(2) != 1 or out.stride(2) != 1:
        return False
    return _int4_gluon_caches(q.dtype, q.shape[2], k_cache, v_cache, k_scale, v_scale, q.shape[1] // k_cache.shape[2])


# ----------------------------------------------------------------------------- splits
def choose_num_splits(batch_size: int, num_kv_heads: int, max_seq_len: int, num_sms: int = DEFAULT_NUM_SMS,
                      min_tokens_per_split: int | None = None, max_splits: int = 128, warps_per_sm: int = 0) -> int:
    """Flash-decoding split count for the decode kernel (one program per KV head, row and split).

    Triton kernel (warps_per_sm 0): with at least two programs per multiprocessor the rows already
    fill the GPU: no split (the merge would cost a launch). Below that, aim at about four programs
    per multiprocessor, each with at least `min_tokens_per_split` tokens (default 64: 1 x 32k gets 66
    splits, 16 x 4k 4 on 132 SMs, the best of benchmarks/kernels/bench_kernels.py's sweep; a 640-token
    row 10, whose attention is latency, not bytes: 256 tokens a split left Llama-3-8B's batch-1 decode
    step 4% slower, benchmarks/RESULTS.md "Attention splits for short rows").
    warps_per_sm > 0: the programs are paged_decode_fp8's single warps, that many resident per
    multiprocessor (decode_warps_per_sm). Their programs all take about as long, so the count is
    chosen by waves: the fewest splits whose ceil(programs / resident) / splits (the time in
    unsplit programs) is within 5% of the best, since a last wave a quarter full costs nearly a
    whole one. A wide launch (fp8_wide_launch) is not split (paged_decode_fp8 then runs 8 per SM).
    """
    programs = max(1, batch_size * num_kv_heads)
    if min_tokens_per_split is None:
        min_tokens_per_split = 256 if warps_per_sm > 0 else 64
    cap = int(max(1, min(max_splits, max_seq_len // min_tokens_per_split)))
    if warps_per_sm > 0:
        if fp8_wide_launch(programs, num_sms):
            return 1  # paged_decode_fp8 runs such launches at 8 programs per SM: about two whole waves
        slots = warps_per_sm * num_sms
        cost = [-(-programs * s // slots) / s for s in range(1, cap + 1)]
        best = min(cost)
        return next(s for s, c in enumerate(cost, 1) if c <= best * 1.05)
    if programs >= 2 * num_sms:
        return 1
    return int(max(1, min(4 * num_sms // programs, cap)))


# ----------------------------------------------------------------------------- extends
# paged_prefill_hopper's Gluon kernel (sm_90) is faster than the Triton kernel on long extends (measured
# at 128 and 512 new tokens) with the same output; at 64 and fewer the Triton kernel's 64-row tiles win,
# so those keep launch.PREFILL_GPU_BY_LEN's tiles (figures in benchmarks/RESULTS.md).
# RADIXKV_HOPPER_PREFILL=0 (or false/off/no) turns it off.
HOPPER_PREFILL_MIN_NEW = 64


def _hopper_prefill_host(device: torch.device, head_dim: int, max_q_len: int) -> bool:
    """hopper_prefill_supported's conditions that need no tensor: device, head_dim, length, switch, GPU."""
    return (device.type == "cuda" and head_dim == 128 and max_q_len > HOPPER_PREFILL_MIN_NEW
            and hopper_prefill_enabled() and _gluon_hopper_gpu(_index(device)))


def extend_copies_wanted(device: torch.device, head_dim: int, max_q_len: int) -> bool:
    """Host-only: whether an extend over FP8 / INT4 pages on `device` may read dequant_pages' fp16 copies (the
    Hopper kernel's host conditions and RADIXKV_EXTEND_DEQUANT), so the engine lists a step's distinct pages
    (radixkv/engine/page_copies.py) only where they can be used."""
    return extend_dequant_enabled() and _hopper_prefill_host(device, head_dim, max_q_len)


def hopper_prefill_supported(q: Tensor, k_cache: Tensor, v_cache: Tensor, out: Tensor, max_q_len: int,
                             k_scale: Tensor | None = None) -> bool:
    """Whether paged_prefill (given no explicit config) runs paged_prefill_hopper's kernel: an sm_90 GPU,
    16-bit q, pages of q's dtype, FP8 (with float16 scales, KVStore's: the kernel multiplies in fp16, where a
    float32 scale would be rounded again) or INT4 (uint8 rows of head_dim / 2 bytes, with KVStore's two
    (scale, zero) groups a row: k_scale [P, S, Hkv, 2, 2] float16), head_dim 128, unit head-dim
    strides, pages whose rows cp.async can copy in 16-byte pieces (strides of 16 elements, aligned base),
    more than HOPPER_PREFILL_MIN_NEW new tokens, a Triton with the Gluon API it was written for, and
    RADIXKV_HOPPER_PREFILL not set to turn it off."""
    if q.device.type != "cuda" or max_q_len <= HOPPER_PREFILL_MIN_NEW or q.shape[2] != 128:
        return False
    half_scales = k_scale is not None and k_scale.dtype == torch.float16
    int4 = (k_cache.dtype == torch.uint8 and k_cache.shape[3] == 64 and half_scales and k_scale.dim() == 5
            and tuple(k_scale.shape[3:]) == (2, 2) and k_scale.stride(4) == 1 and k_scale.stride(3) == 2)
    fp8 = is_fp8(k_cache.dtype) and half_scales
    if q.dtype not in (torch.float16, torch.bfloat16) or not (k_cache.dtype == q.dtype or fp8 or int4):
        return False
    if q.stride(2) != 1 or k_cache.stride(3) != 1 or out.stride(2) != 1:
        return False
    if any(st % 16 for st in k_cache.stride()[:3]) or k_cache.data_ptr() % 16 or v_cache.data_ptr() % 16:
        return False
    return _hopper_prefill_host(q.device, q.shape[2], max_q_len)  # the switch and the GPU, asked last
