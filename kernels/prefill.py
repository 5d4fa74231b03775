"""paged_prefill: ragged new tokens attending to their cached prefix plus themselves (causal).

Request b owns query rows q_start[b] : q_start[b] + q_lens[b], the LAST q_lens[b] of its
seq_lens[b] tokens; every key, the new ones included, is read from the pages (store_kv ran
first). Grid (Hq, B, M-blocks), heaviest query blocks first; query heads of one KV group are
neighbours in launch order so their K/V tiles are shared through L2. Each program runs a
mask-free loop over the keys every row of its block may see, then a masked loop over the
diagonal. FP8 pages are dequantised in-kernel as in paged_decode.
INT4/INT2 pages (kernels/intq.py) run prefill_int.py's kernel (dequantised a bit-plane at a time).
INT2 pages never take the Gluon kernel below, nor INT4 ones the Hopper check turns down.
Extends of more than 64 new tokens over 16-bit, FP8 or INT4 pages (head_dim 128) on sm_90 without an
explicit config go to paged_prefill_hopper's Gluon kernel instead
(dispatch.hopper_prefill_supported; faster, same output, figures in benchmarks/RESULTS.md;
RADIXKV_HOPPER_PREFILL=0 keeps them here). Over INT4 pages, and FP8 ones under more than 128 new tokens a
row, that kernel reads fp16 copies of the rows' pages, widened once a layer by dequant_pages.py
(dispatch.widen_first), when the launch's rows are extends (on average) and the copies fit the caller's
budget; else it widens each tile itself. A caller that lists the rows' distinct pages (`copies`: the
engine does, radixkv/engine/page_copies.py) has each shared page widened once, and FP8 rows sharing
pages take the copies at any length.
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl
from torch import Tensor

from .checks import check_paged_args, check_ragged_rows, host_float
from .dequant_pages import (WIDEN_MIN_NEW_PER_ROW, PageCopies, dequant_page_list, dequant_pages, page_list_bytes,
                            scratch_bytes, scratch_table, widen_budget)
from .dispatch import EXTEND_DEQUANT_MIN_REUSE, hopper_prefill_supported, widen_first
from .launch import LOG2E, KernelConfig, KernelKind, LayerLaunch, default_config, for_device, launch_options
from .prefill_int import launch_int
from .prefill_lse import check_lse, lse_strides, store_lse


@triton.jit
def _tile(q, acc, m_i, l_i, kc_ptr, vc_ptr, ks_ptr, vs_ptr, pt_row, k_lo, q_pos, seq_len, qk_scale,
          kv_head, scale_head, stride_cp, stride_cs, stride_cd, stride_xp, stride_xs, offs_d, d_mask,
          PAGE_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, MASKED: tl.constexpr, IS_FP8: tl.constexpr,
          DOT_PRECISION: tl.constexpr):
    """One BLOCK_N tile of keys starting at k_lo folded into the online softmax state."""
    offs_n = k_lo + tl.arange(0, BLOCK_N)
    n_mask = offs_n < seq_len
    page = tl.load(pt_row + offs_n // PAGE_SIZE, mask=n_mask, other=0).to(tl.int64)
    row = page * stride_cp + (offs_n % PAGE_SIZE) * stride_cs + kv_head  # [BLOCK_N]
    kv_mask = n_mask[:, None] & d_mask[None, :]
    k = tl.load(kc_ptr + row[:, None] + offs_d[None, :] * stride_cd, mask=kv_mask, other=0.0)
    qk = tl.dot(q, tl.trans(k.to(q.dtype)), input_precision=DOT_PRECISION)  # [BLOCK_M, BLOCK_N]
    if IS_FP8:  # K scales and qk_scale multiply the score columns
        xrow = page * stride_xp + (offs_n % PAGE_SIZE) * stride_xs + scale_head
        qk = qk * (tl.load(ks_ptr + xrow, mask=n_mask, other=0.0).to(tl.float32) * qk_scale)[None, :]
        exp_scale = 1.0
    else:  # qk_scale joins the exponent: one FFMA per score
        exp_scale = qk_scale
    if MASKED:
        qk = tl.where((offs_n[None, :] <= q_pos[:, None]) & n_mask[None, :], qk, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(qk, axis=1) * exp_scale)
    alpha = tl.exp2(m_i - m_new)
    acc = acc * alpha[:, None]
    p = tl.exp2(qk * exp_scale - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, axis=1)
    if IS_FP8:
        p = p * tl.load(vs_ptr + xrow, mask=n_mask, other=0.0).to(tl.float32)[None, :]
    v = tl.load(vc_ptr + row[:, None] + offs_d[None, :] * stride_cd, mask=kv_mask, other=0.0)
    acc += tl.dot(p.to(q.dtype), v.to(q.dtype), input_precision=DOT_PRECISION)
    return acc, m_new, l_i


@triton.jit
def _prefill_kernel(q_ptr, kc_ptr, vc_ptr, ks_ptr, vs_ptr, pt_ptr, lens_ptr, qstart_ptr, qlens_ptr, out_ptr, lse_ptr,
            qk_scale,
            stride_qt, stride_qh, stride_qd,
            stride_cp, stride_cs, stride_ch, stride_cd,
            stride_xp, stride_xs, stride_xh,
            stride_ptb, stride_ot, stride_oh, stride_od, stride_lt, stride_lh,
            GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, PAGE_SIZE: tl.constexpr,
            BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
            IS_FP8: tl.constexpr, WRITE_LSE: tl.constexpr, DOT_PRECISION: tl.constexpr):
    h = tl.program_id(0)
    b = tl.program_id(1)
    mblk = tl.num_programs(2) - 1 - tl.program_id(2)
    q_len = tl.load(qlens_ptr + b)
    seq_len = tl.load(lens_ptr + b)
    q_s = tl.load(qstart_ptr + b)
    active = mblk * BLOCK_M < q_len
    prefix = seq_len - q_len

    offs_m = mblk * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    m_mask = offs_m < q_len
    d_mask = offs_d < HEAD_DIM
    q_rows = (q_s + offs_m).to(tl.int64)
    q = tl.load(q_ptr + q_rows[:, None] * stride_qt + h.to(tl.int64) * stride_qh + offs_d[None, :] * stride_qd,
                mask=m_mask[:, None] & d_mask[None, :], other=0.0)  # q: [BLOCK_M, BLOCK_D]
    q_pos = prefix + offs_m

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    pt_row = pt_ptr + b * stride_ptb
    kvh = h // GROUP
    kv_head = kvh.to(tl.int64) * stride_ch
    scale_head = kvh * stride_xh
    # Keys below every row of this block: no causal mask needed.
    full_end = tl.where(active, ((prefix + mblk * BLOCK_M) // BLOCK_N) * BLOCK_N, 0)
    for k_lo in range(0, full_end, BLOCK_N):
        acc, m_i, l_i = _tile(q, acc, m_i, l_i, kc_ptr, vc_ptr, ks_ptr, vs_ptr, pt_row, k_lo, q_pos, seq_len,
                              qk_scale, kv_head, scale_head, stride_cp, stride_cs, stride_cd, stride_xp, stride_xs,
                              offs_d, d_mask, PAGE_SIZE, BLOCK_N, False, IS_FP8, DOT_PRECISION)
    # The diagonal: keys up to the block's last row, masked.
    diag_end = tl.where(active, tl.minimum(seq_len, prefix + (mblk + 1) * BLOCK_M), 0)
    for k_off in range(0, diag_end - full_end, BLOCK_N):
        acc, m_i, l_i = _tile(q, acc, m_i, l_i, kc_ptr, vc_ptr, ks_ptr, vs_ptr, pt_row, full_end + k_off, q_pos,
                              seq_len, qk_scale, kv_head, scale_head, stride_cp, stride_cs, stride_cd, stride_xp,
                              stride_xs, offs_d, d_mask, PAGE_SIZE, BLOCK_N, True, IS_FP8, DOT_PRECISION)

    l_safe = tl.where(l_i > 0, l_i, 1.0)
    o = acc / l_safe[:, None]
    tl.store(out_ptr + q_rows[:, None] * stride_ot + h.to(tl.int64) * stride_oh + offs_d[None, :] * stride_od,
             o.to(out_ptr.dtype.element_ty), mask=m_mask[:, None] & d_mask[None, :])  # inactive blocks: m_mask is all False
    if WRITE_LSE:
        store_lse(lse_ptr, q_rows, h, m_mask, m_i, l_i, stride_lt, stride_lh)


def paged_prefill(q: Tensor, k_cache: Tensor, v_cache: Tensor, page_table: Tensor, seq_lens: Tensor,
                  q_start: Tensor, q_lens: Tensor, sm_scale: float | None = None,
                  k_scale: Tensor | None = None, v_scale: Tensor | None = None,
                  max_q_len: int | None = None, config: KernelConfig | None = None,
                  out: Tensor | None = None, lse: Tensor | None = None,
                  widen_max_bytes: int | None = None, copies: PageCopies | None = None) -> Tensor:
    """q: [T, Hq, D] ragged rows (see module doc) -> [T, Hq, D] in q's dtype.

    q_start, q_lens: int32 [B]. max_q_len (host int) sizes the grid; without it the launcher reads
    q_lens.max() from the device (a host sync; PagedAttention passes it from its plan).
    `out` (optional, like q) is written in place. `lse` (optional, float32 [T, Hq] on q's device): each
    computed row's log-sum-exp of its scores in log2 units, log2(sum_j exp2(q.k_j * sm_scale * log2(e))),
    -inf where a row sees no key (the state convention of kernels/cascade.py); rows outside every row
    range are left as they are. The recent-token window (engine/attention.py) launches shifted rows
    that skip each query's latest keys and merges this state with the window's.

    Values (checks.check_page_values, check_q_rows): on CPU, seq_lens[b] in [0, max_pages * page_size],
    the page ids row b uses (its first ceil(seq_lens[b] / page_size) entries) in [0, num_pages),
    q_lens[b] in [0, seq_lens[b]], rows q_start[b] : q_start[b] + q_lens[b] inside q's T rows and
    disjoint, max_q_len >= max(q_lens) are checked before the launch (IndexValueError). On CUDA they
    are the caller's duty (no host sync here): out of range, the kernel reads or writes outside its
    tensors; a max_q_len below max(q_lens) leaves rows unwritten.
    """
    return prefill_launcher(q, k_cache, v_cache, page_table, seq_lens, q_start, q_lens, sm_scale, k_scale, v_scale,
                            max_q_len, config, out, lse, widen_max_bytes, copies)(q, k_cache, v_cache, k_scale,
                                                                                  v_scale)



def prefill_launcher(q: Tensor, k_cache: Tensor, v_cache: Tensor, page_table: Tensor, seq_lens: Tensor,
                     q_start: Tensor, q_lens: Tensor, sm_scale: float | None = None,
                     k_scale: Tensor | None = None, v_scale: Tensor | None = None,
                     max_q_len: int | None = None, config: KernelConfig | None = None,
                     out: Tensor | None = None, lse: Tensor | None = None,
                     widen_max_bytes: int | None = None, copies: PageCopies | None = None) -> LayerLaunch:
    """paged_prefill with its checks and choices made once: returns launch(q, k_cache, v_cache, k_scale, v_scale,
    out=None) -> out, to call with tensors like the ones checked here (the same shapes, dtypes, strides and
    device: each layer's caches of one KVStore, a step's q buffer), e.g. once a layer for a step
    (PagedAttention). The output: the call's `out` (like q), else the launcher's, else a new one each call.
    widen_max_bytes: the most memory dequant_pages' copies may take (default DEQUANT_MAX_BYTES). copies: the
    rows' distinct pages and page_table over them (its shape; used only where the rows' pages are widened)."""
    page_table, seq_lens, fp8, bits = check_paged_args("paged_prefill", q, k_cache, v_cache, page_table, seq_lens,
                                                        k_scale, v_scale)
    T, hq, d = q.shape
    B = page_table.shape[0]
    q_start, q_lens, max_q_len = check_ragged_rows("paged_prefill", q, q_start, q_lens, seq_lens, max_q_len)
    hkv = k_cache.shape[2]
    # positive: the kernels fold it into exp2 after the row max
    sm_scale = 1.0 / math.sqrt(d) if sm_scale is None else host_float("paged_prefill", "sm_scale", sm_scale, True)
    if out is not None and (not isinstance(out, torch.Tensor) or out.shape != q.shape or out.dtype != q.dtype
                            or out.device != q.device):
        raise ValueError(f"paged_prefill: out must match q: {tuple(q.shape)} {q.dtype} on {q.device}")
    if lse is not None:
        check_lse(lse, q)
    given = out

    def result(q: Tensor, out: Tensor | None) -> Tensor:
        return out if out is not None else torch.empty_like(q) if given is None else given
    if B == 0 or T == 0:
        return lambda q, k_cache, v_cache, k_scale, v_scale, out=None: result(q, out)
    if max_q_len is None:
        max_q_len = int(q_lens.max().item())
    hopper = config is None and hopper_prefill_supported(q, k_cache, v_cache, out if out is not None else q,
                                                         max_q_len, k_scale)
    if bits and not (bits == 4 and hopper):  # INT2, and INT4 off the Hopper kernel: the Triton INT kernel
        config = config or default_config(KernelKind.PREFILL, q, k_cache, max_q_len)

        def launch_bits(q: Tensor, k_cache: Tensor, v_cache: Tensor, k_scale: Tensor | None,
                        v_scale: Tensor | None, out: Tensor | None = None) -> Tensor:
            out = result(q, out)
            launch_int(q, k_cache, v_cache, k_scale, v_scale, page_table, seq_lens, q_start, q_lens, sm_scale,
                       max_q_len, out, lse, config, bits)
            return out
        return launch_bits
    if copies is not None and copies.table.shape != page_table.shape:
        raise ValueError(f"paged_prefill: copies.table is {tuple(copies.table.shape)}, page_table "
                         f"{tuple(page_table.shape)}")
    # the copies: the rows' distinct pages (each read `reuse` times) where listed, else each row's table
    reuse = copies.reads / max(1, copies.pages.numel()) if copies is not None else 1.0
    copy_bytes = (scratch_bytes(page_table, k_cache, d) if copies is None
                  else page_list_bytes(copies.pages.numel(), k_cache, d))
    widen = (widen_first(bool(bits), max_q_len, reuse) and copy_bytes <= widen_budget(widen_max_bytes)
             and (T >= WIDEN_MIN_NEW_PER_ROW * B or reuse >= EXTEND_DEQUANT_MIN_REUSE))
    if hopper and (fp8 or bits) and widen:
        from .prefill_hopper_gluon import launch as launch_hopper

        table = scratch_table(B, page_table.shape[1], q.device) if copies is None else copies.table

        def launch_widened(q: Tensor, k_cache: Tensor, v_cache: Tensor, k_scale: Tensor | None,
                           v_scale: Tensor | None, out: Tensor | None = None) -> Tensor:
            out = result(q, out)
            if copies is None:
                k16, v16 = dequant_pages(k_cache, v_cache, k_scale, v_scale, page_table, seq_lens, d)
            else:
                k16, v16 = dequant_page_list(k_cache, v_cache, k_scale, v_scale, copies.pages, d)
            launch_hopper(q, k16, v16, table, seq_lens, q_start, q_lens, sm_scale * LOG2E, max_q_len, out, lse=lse)
            return out
        return launch_widened
    if hopper:
        from .prefill_hopper_gluon import launch as launch_hopper

        def launch_gluon(q: Tensor, k_cache: Tensor, v_cache: Tensor, k_scale: Tensor | None,
                         v_scale: Tensor | None, out: Tensor | None = None) -> Tensor:
            out = result(q, out)
            launch_hopper(q, k_cache, v_cache, page_table, seq_lens, q_start, q_lens, sm_scale * LOG2E, max_q_len,
                          out, k_scale if fp8 or bits else None, v_scale if fp8 or bits else None, lse=lse)
            return out
        return launch_gluon
    config = config or default_config(KernelKind.PREFILL, q, k_cache, max_q_len)
    grid = (hq, B, triton.cdiv(max(1, max_q_len), config.block_m))
    kernel = for_device(_prefill_kernel, q.device)[grid]
    consts = dict(GROUP=hq // hkv, HEAD_DIM=d, PAGE_SIZE=k_cache.shape[1], BLOCK_M=config.block_m,
                  BLOCK_D=max(16, triton.next_power_of_2(d)), BLOCK_N=config.block_n, IS_FP8=fp8,
                  WRITE_LSE=lse is not None, DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
                  **launch_options(config, q.device))

    def launch_triton(q: Tensor, k_cache: Tensor, v_cache: Tensor, k_scale: Tensor | None,
                      v_scale: Tensor | None, out: Tensor | None = None) -> Tensor:
        out = result(q, out)
        xs = k_scale.stride() if fp8 else (0, 0, 0)
        kernel(q, k_cache, v_cache, k_scale if fp8 else k_cache, v_scale if fp8 else v_cache, page_table, seq_lens,
               q_start, q_lens, out, lse if lse is not None else out, sm_scale * LOG2E,
               *q.stride(), *k_cache.stride(), *xs, page_table.stride(0), *out.stride(), *lse_strides(lse), **consts)
        return out
    return launch_triton
