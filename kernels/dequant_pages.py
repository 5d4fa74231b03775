"""dequant_pages: a step's FP8 or INT4 pages widened to fp16 once a layer, for the Hopper extend kernel.

The Hopper extend kernel (prefill_hopper_gluon.py) widens each FP8 or INT4 tile in every program that reads
it: with a GQA group of 4 and 128-row query blocks, a cached page is widened once per query head and
block, and the products wait for it (that kernel ran at 0.74-0.81 (FP8) and 0.77 (INT4) of its own bf16
speed). Here each page a step's extend rows read is widened once, into a scratch copy in fp16, and the
kernel then runs its 16-bit path over the copy (fp16 operands, as its widening path uses).

    dequant_pages(k_cache, v_cache, k_scale, v_scale, page_table, seq_lens, head_dim) -> (k16, v16)
        k_cache, v_cache: FP8 [P, S, Hkv, D] or INT4 uint8 [P, S, Hkv, D / 2] (KVStore's two (scale, zero)
        groups a row: k_scale [P, S, Hkv, 2, 2] float16; FP8: [P, S, Hkv] float16)
        page_table [B, W] int32, seq_lens [B] int32
        -> k16, v16: fp16 [B * W, S, Hkv, D]: row b's slot w at page b * W + w (its pages up to
           ceil(seq_lens[b] / S); the rest are left unwritten and never read): the page table over them is
           scratch_table(B, W)

The values are the widening path's: FP8 x * scale as one fp16 product (exact convert, rounded once); INT4
(c - 8) s + (z + 8 s) with s and z + 8 s rounded to fp16 first, rounded once more to fp16 (the kernel's fp16
fma: the same up to the last bit in rare ties). Shared prefix pages are widened once per row that reads them
(the table stays a static arange; dequant_page_list below widens each distinct page once). The scratch is
2 * B * W * S * Hkv * D * 2 bytes (scratch_bytes): W is the step's widest row, so prefill.py takes this path
only within a budget (DEQUANT_MAX_BYTES unless the caller gives one) and for launches of extend rows (>= 64 new
tokens a row on average: decode rows in the launch would have their whole contexts widened for one query each).

    dequant_page_list(k_cache, v_cache, k_scale, v_scale, pages, head_dim) -> (k16, v16)
        pages [U] int32: distinct pages (radixkv/engine/page_copies.py deduplicates a step's tables on the
        host) -> fp16 [U, S, Hkv, D], page pages[u] widened whole into u: rows sharing a prefix widen it once
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl
from torch import Tensor

# the copies of one layer's K and V when the caller gives no budget (an engine gives the activation memory its
# step reserve holds free during attention: radixkv/engine/runner.py); above it the extend widens in-kernel
DEQUANT_MAX_BYTES = 256 << 20
WIDEN_MIN_NEW_PER_ROW = 64  # a launch's new tokens a row, on average, for the copies to pay


class PageCopies(NamedTuple):
    """A launch's distinct pages on the device (radixkv/engine/page_copies.py deduplicates them on the host):
    dequant_page_list widens `pages` and the extend reads the copies through `table`."""

    pages: Tensor  # int32 [U]
    table: Tensor  # int32 [B, W]: the launch's rows' slots -> indices into pages
    reads: int  # slots the rows read: reads / U is how often a copy is read


def widen_budget(widen_max_bytes: int | None) -> int:
    """The memory dequant_pages' copies may take: widen_max_bytes, or DEQUANT_MAX_BYTES where it is None."""
    return DEQUANT_MAX_BYTES if widen_max_bytes is None else widen_max_bytes


@triton.jit
def _widen_rows(c_ptr, x_ptr, o_ptr, src, xsrc, dst, ok, HEAD_DIM: tl.constexpr, IS_INT4: tl.constexpr):
    """Rows [ROWS] of one cache (src: their offsets; xsrc: their scales'; dst: their fp16 copies')."""
    m = ok[:, None]
    if IS_INT4:
        HALF: tl.constexpr = HEAD_DIM // 2
        j = tl.arange(0, HALF)
        byte = tl.load(c_ptr + src[:, None] + j[None, :], mask=m, other=0).to(tl.int32)  # [ROWS, D / 2]
        s0 = tl.load(x_ptr + xsrc, mask=ok, other=0.0).to(tl.float32)  # (s0, z0, s1, z1) a row
        z0 = tl.load(x_ptr + xsrc + 1, mask=ok, other=0.0).to(tl.float32)
        s1 = tl.load(x_ptr + xsrc + 2, mask=ok, other=0.0).to(tl.float32)
        z1 = tl.load(x_ptr + xsrc + 3, mask=ok, other=0.0).to(tl.float32)
        t0 = (z0 + 8.0 * s0).to(tl.float16).to(tl.float32)
        t1 = (z1 + 8.0 * s1).to(tl.float16).to(tl.float32)
        lo = ((byte & 15) - 8).to(tl.float32) * s0[:, None] + t0[:, None]  # values j: plane 0
        hi = ((byte >> 4) - 8).to(tl.float32) * s1[:, None] + t1[:, None]  # values D / 2 + j: plane 1
        tl.store(o_ptr + dst[:, None] + j[None, :], lo.to(tl.float16), mask=m)
        tl.store(o_ptr + dst[:, None] + HALF + j[None, :], hi.to(tl.float16), mask=m)
    else:
        d = tl.arange(0, HEAD_DIM)
        x = tl.load(c_ptr + src[:, None] + d[None, :], mask=m, other=0.0).to(tl.float32)  # exact
        s = tl.load(x_ptr + xsrc, mask=ok, other=0.0).to(tl.float32)
        tl.store(o_ptr + dst[:, None] + d[None, :], (x * s[:, None]).to(tl.float16), mask=m)


@triton.jit(do_not_specialize=["stride_ptb", "W"])  # table widths vary by step: one compile for all
def _dequant_kernel(kc_ptr, vc_ptr, ks_ptr, vs_ptr, pt_ptr, lens_ptr, ko_ptr, vo_ptr,
                    stride_cp, stride_cs, stride_ch, stride_xp, stride_xs, stride_xh, stride_ptb, W,
                    PAGE_SIZE: tl.constexpr, HKV: tl.constexpr, HEAD_DIM: tl.constexpr, ROWS: tl.constexpr,
                    IS_INT4: tl.constexpr, WHOLE: tl.constexpr):
    """Program (b * W + w, i): rows i * ROWS.. of slot w of row b's page table (a row: one token's head),
    widened into page b * W + w (one grid axis for both: W alone may pass CUDA's 65,535 of the others).
    WHOLE: every slot is read (a page list: lens_ptr unused)."""
    slot = tl.program_id(0)
    b = slot // W
    w = slot % W
    if WHOLE or w * PAGE_SIZE < tl.load(lens_ptr + b):
        page = tl.load(pt_ptr + b * stride_ptb + w).to(tl.int64)
        r = tl.program_id(1) * ROWS + tl.arange(0, ROWS)  # token-head rows: token r // HKV, head r % HKV
        ok = r < PAGE_SIZE * HKV
        tok = r // HKV
        head = r % HKV
        src = page * stride_cp + tok * stride_cs + head * stride_ch  # [ROWS]
        xsrc = page * stride_xp + tok * stride_xs + head * stride_xh
        dst = (slot.to(tl.int64) * PAGE_SIZE * HKV + r) * HEAD_DIM  # [ROWS]
        _widen_rows(kc_ptr, ks_ptr, ko_ptr, src, xsrc, dst, ok, HEAD_DIM, IS_INT4)
        _widen_rows(vc_ptr, vs_ptr, vo_ptr, src, xsrc, dst, ok, HEAD_DIM, IS_INT4)


def scratch_bytes(page_table: Tensor, k_cache: Tensor, head_dim: int) -> int:
    """Bytes of dequant_pages' fp16 K and V copies for this page table."""
    B, W = page_table.shape
    _, S, hkv, _ = k_cache.shape
    return 2 * B * W * S * hkv * head_dim * 2


def page_list_bytes(pages: int, k_cache: Tensor, head_dim: int) -> int:
    """Bytes of dequant_page_list's fp16 K and V copies of `pages` pages."""
    _, S, hkv, _ = k_cache.shape
    return 2 * pages * S * hkv * head_dim * 2


def scratch_table(batch: int, width: int, device: torch.device) -> Tensor:
    """The page table over dequant_pages' copies: int32 [batch, width], row b's slot w at b * width + w."""
    return torch.arange(batch * width, dtype=torch.int32, device=device).view(batch, width)


def dequant_pages(k_cache: Tensor, v_cache: Tensor, k_scale: Tensor, v_scale: Tensor, page_table: Tensor,
                  seq_lens: Tensor, head_dim: int, out: tuple[Tensor, Tensor] | None = None
                  ) -> tuple[Tensor, Tensor]:
    """The module docstring's widening; out: (k16, v16) to write instead of new tensors. Arguments as
    paged_prefill checked them (same caches, scales, table)."""
    return _widen(k_cache, v_cache, k_scale, v_scale, page_table, seq_lens, head_dim, out)


def dequant_page_list(k_cache: Tensor, v_cache: Tensor, k_scale: Tensor, v_scale: Tensor, pages: Tensor,
                      head_dim: int, out: tuple[Tensor, Tensor] | None = None) -> tuple[Tensor, Tensor]:
    """The module docstring's list form: pages int32 [U] (in range: the caller's duty) -> fp16 [U, S, Hkv, D]."""
    return _widen(k_cache, v_cache, k_scale, v_scale, pages.view(-1, 1), None, head_dim, out)


def _widen(k_cache: Tensor, v_cache: Tensor, k_scale: Tensor, v_scale: Tensor, page_table: Tensor,
           seq_lens: Tensor | None, head_dim: int, out: tuple[Tensor, Tensor] | None) -> tuple[Tensor, Tensor]:
    """dequant_pages over page_table [B, W] (seq_lens None: every slot read whole)."""
    B, W = page_table.shape
    P, S, hkv, row = k_cache.shape
    int4 = k_cache.dtype == torch.uint8
    if int4:
        if row * 2 != head_dim or k_scale.shape[3:] != (2, 2):
            raise ValueError("dequant_pages: INT4 pages need head_dim / 2 bytes a row and two (scale, zero) groups")
        k_scale, v_scale = k_scale.flatten(3), v_scale.flatten(3)  # [P, S, Hkv, 4]: (s0, z0, s1, z1)
    elif row != head_dim:
        raise ValueError(f"dequant_pages: FP8 rows of {row} values, head_dim {head_dim}")
    if head_dim & (head_dim - 1):
        raise ValueError(f"dequant_pages: head_dim {head_dim} is not a power of two")
    shape = (B * W, S, hkv, head_dim)
    if out is None:
        out = (torch.empty(shape, dtype=torch.float16, device=k_cache.device),
               torch.empty(shape, dtype=torch.float16, device=k_cache.device))
    k16, v16 = out
    if k16.shape != shape or v16.shape != shape or not (k16.is_contiguous() and v16.is_contiguous()):
        raise ValueError(f"dequant_pages: out must be two contiguous fp16 {shape}")
    if v_cache.stride() != k_cache.stride() or v_scale.stride() != k_scale.stride():
        raise ValueError("dequant_pages: K and V (and their scales) must share strides")
    if B * W == 0:
        return k16, v16
    rows = min(triton.next_power_of_2(S * hkv), max(1, 4096 // head_dim))  # 4k values a program
    grid = (B * W, triton.cdiv(S * hkv, rows))
    _dequant_kernel[grid](k_cache, v_cache, k_scale, v_scale, page_table,
                          page_table if seq_lens is None else seq_lens, k16, v16,
                          *k_cache.stride()[:3], *k_scale.stride()[:3], page_table.stride(0), W,
                          PAGE_SIZE=S, HKV=hkv, HEAD_DIM=head_dim, ROWS=rows, IS_INT4=int4,
                          WHOLE=seq_lens is None, num_warps=4)
    return k16, v16
