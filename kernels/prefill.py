"""paged_prefill: ragged new tokens attending to their cached prefix plus themselves (causal).

Request b owns query rows q_start[b] : q_start[b] + q_lens[b], the LAST q_lens[b] of its
seq_lens[b] tokens; every key, the new ones included, is read from the pages (store_kv ran
first). Grid (Hq, B, M-blocks), heaviest query blocks first; query heads of one KV group are
neighbours in launch order so their K/V tiles are shared through L2. Each program runs a
mask-free loop over the keys every row of its block may see, then a masked loop over the
diagonal. FP8 pages are dequantised in-kernel as in paged_decode.
INT4/INT2 pages (kernels/intq.py) run `_int_kernel`: each K/V tile is read as whole packed rows and
dequantised in registers one bit-plane at a time (decode.int_codes' masks, then codes * scale + zero in
float16, or float32 for fp32 q; bf16 q is converted to float16); plane p's values are the head_dim
columns p * W .. p * W + W - 1, so the scores are the sum over the planes of q_p . K_p^T (one
accumulating dot a plane) and the output keeps an accumulator a plane. A plane of several groups (int4 groups
of 16 at head_dim 64) gathers a (scale, zero) a column (decode.plane_dequant). (Folding the scales into the
scores, as paged_decode does, would cost BLOCK_M x BLOCK_N multiplies a group instead of BLOCK_N x D.
One [BLOCK_N, D] tile of the planes side by side instead compiled, for sm_90, to 1.6x the instructions
of this form and spilled at 128-row tiles.)
INT2 pages never take the Gluon kernel below, nor INT4 ones the Hopper check turns down.
Extends of more than 64 new tokens over 16-bit, FP8 or INT4 pages (head_dim 128) on sm_90 without an
explicit config go to paged_prefill_hopper's Gluon kernel instead
(dispatch.hopper_prefill_supported; faster, same output, figures in benchmarks/RESULTS.md;
RADIXKV_HOPPER_PREFILL=0 keeps them here).
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl
from torch import Tensor

from .checks import check_paged_args, check_ragged_rows, host_float
from .decode import (  # the INT paths' shared helpers
    int_codes,
    plane_dequant,
    plane_unit,
    to_compute,
)
from .dispatch import hopper_prefill_supported
from .intq import groups_per_plane, planes, planes_per_group
from .launch import LOG2E, KernelConfig, KernelKind, default_config, for_device, launch_options


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
def _plane_q(q_ptr, q_rows, h, m_mask, offs_j, j_mask, plane, stride_qt, stride_qh, stride_qd,
             PACKED: tl.constexpr, F32: tl.constexpr):
    """Bit-plane `plane`'s columns of the block's query rows: [BLOCK_M, BLOCK_W] in the compute dtype."""
    q = tl.load(q_ptr + q_rows[:, None] * stride_qt + h.to(tl.int64) * stride_qh
                + (plane * PACKED + offs_j[None, :]) * stride_qd, mask=m_mask[:, None] & j_mask[None, :], other=0.0)
    return to_compute(q, F32)


@triton.jit
def _plane_rows(packed, x_ptr, xrow, n_mask, kv_mask, offs_j, plane, stride_xg, stride_xz,
                BITS: tl.constexpr, PLANES_PER_GROUP: tl.constexpr, GROUPS_PER_PLANE: tl.constexpr,
                GROUP_SIZE: tl.constexpr, F32: tl.constexpr):
    """One bit-plane of BLOCK_N packed rows [BLOCK_N, BLOCK_W] dequantised: codes * scale + zero (one FMA a
    value; decode.int_codes' power of two folded into the scale); a (scale, zero) a column where the plane
    holds several groups (decode.plane_dequant)."""
    if GROUPS_PER_PLANE > 1:
        return plane_dequant(packed, x_ptr, xrow, kv_mask, offs_j, plane, stride_xg, stride_xz, BITS,
                             GROUPS_PER_PLANE, GROUP_SIZE, F32)
    cdt = tl.float32 if F32 else tl.float16
    xs = x_ptr + xrow + (plane // PLANES_PER_GROUP) * stride_xg
    # the unit in float32, then rounded: Triton 3.6 types plane_unit's quotient float32 (3.9: a constant)
    s = (tl.load(xs, mask=n_mask, other=0.0).to(tl.float32) * plane_unit(plane, BITS)).to(cdt)
    z = tl.load(xs + stride_xz, mask=n_mask, other=0.0).to(cdt)
    x = int_codes(packed, plane, BITS, F32)
    return tl.fma(x, s[:, None], z[:, None])


@triton.jit
def _int_tile(q0, q1, q2, q3, acc0, acc1, acc2, acc3, m_i, l_i, kc_ptr, vc_ptr, ks_ptr, vs_ptr, pt_row, k_lo,
              q_pos, seq_len, qk_scale, kv_head, scale_head, stride_cp, stride_cs, stride_cd, stride_xp, stride_xs,
              stride_xg, stride_xz, offs_j, j_mask,
              PAGE_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, MASKED: tl.constexpr, PLANES: tl.constexpr,
              BITS: tl.constexpr, PLANES_PER_GROUP: tl.constexpr, GROUPS_PER_PLANE: tl.constexpr,
              GROUP_SIZE: tl.constexpr, F32: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """_tile over INT4/INT2 pages: planes 0..PLANES-1 of one BLOCK_N tile of keys (q2, q3, acc2, acc3 only
    for INT2): scores = sum over planes of q_p . K_p^T, acc_p += P . V_p."""
    offs_n = k_lo + tl.arange(0, BLOCK_N)
    n_mask = offs_n < seq_len
    page = tl.load(pt_row + offs_n // PAGE_SIZE, mask=n_mask, other=0).to(tl.int64)
    slot = offs_n % PAGE_SIZE
    row = page * stride_cp + slot * stride_cs + kv_head
    xrow = page * stride_xp + slot * stride_xs + scale_head
    kv_mask = n_mask[:, None] & j_mask[None, :]
    # ---- scores: whole packed K rows [BLOCK_N, BLOCK_W] uint8, one accumulating dot a plane
    kb = tl.load(kc_ptr + row[:, None] + offs_j[None, :] * stride_cd, mask=kv_mask, other=0)
    k = _plane_rows(kb, ks_ptr, xrow, n_mask, kv_mask, offs_j, 0, stride_xg, stride_xz, BITS,
                           PLANES_PER_GROUP, GROUPS_PER_PLANE, GROUP_SIZE, F32)
    qk = tl.dot(q0, tl.trans(k), input_precision=DOT_PRECISION)  # [BLOCK_M, BLOCK_N]
    k = _plane_rows(kb, ks_ptr, xrow, n_mask, kv_mask, offs_j, 1, stride_xg, stride_xz, BITS,
                           PLANES_PER_GROUP, GROUPS_PER_PLANE, GROUP_SIZE, F32)
    qk = tl.dot(q1, tl.trans(k), qk, input_precision=DOT_PRECISION)
    if PLANES == 4:
        k = _plane_rows(kb, ks_ptr, xrow, n_mask, kv_mask, offs_j, 2, stride_xg, stride_xz, BITS,
                           PLANES_PER_GROUP, GROUPS_PER_PLANE, GROUP_SIZE, F32)
        qk = tl.dot(q2, tl.trans(k), qk, input_precision=DOT_PRECISION)
        k = _plane_rows(kb, ks_ptr, xrow, n_mask, kv_mask, offs_j, 3, stride_xg, stride_xz, BITS,
                           PLANES_PER_GROUP, GROUPS_PER_PLANE, GROUP_SIZE, F32)
        qk = tl.dot(q3, tl.trans(k), qk, input_precision=DOT_PRECISION)
    if MASKED:
        qk = tl.where((offs_n[None, :] <= q_pos[:, None]) & n_mask[None, :], qk, float("-inf"))
    # ---- online softmax (qk_scale joins the exponent)
    m_new = tl.maximum(m_i, tl.max(qk, axis=1) * qk_scale)
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(qk * qk_scale - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, axis=1)
    p = p.to(q0.dtype)
    # ---- P.V: an accumulator a plane, [BLOCK_M, BLOCK_W]
    vb = tl.load(vc_ptr + row[:, None] + offs_j[None, :] * stride_cd, mask=kv_mask, other=0)
    v = _plane_rows(vb, vs_ptr, xrow, n_mask, kv_mask, offs_j, 0, stride_xg, stride_xz, BITS,
                           PLANES_PER_GROUP, GROUPS_PER_PLANE, GROUP_SIZE, F32)
    acc0 = tl.dot(p, v, acc0 * alpha[:, None], input_precision=DOT_PRECISION)
    v = _plane_rows(vb, vs_ptr, xrow, n_mask, kv_mask, offs_j, 1, stride_xg, stride_xz, BITS,
                           PLANES_PER_GROUP, GROUPS_PER_PLANE, GROUP_SIZE, F32)
    acc1 = tl.dot(p, v, acc1 * alpha[:, None], input_precision=DOT_PRECISION)
    if PLANES == 4:
        v = _plane_rows(vb, vs_ptr, xrow, n_mask, kv_mask, offs_j, 2, stride_xg, stride_xz, BITS,
                           PLANES_PER_GROUP, GROUPS_PER_PLANE, GROUP_SIZE, F32)
        acc2 = tl.dot(p, v, acc2 * alpha[:, None], input_precision=DOT_PRECISION)
        v = _plane_rows(vb, vs_ptr, xrow, n_mask, kv_mask, offs_j, 3, stride_xg, stride_xz, BITS,
                           PLANES_PER_GROUP, GROUPS_PER_PLANE, GROUP_SIZE, F32)
        acc3 = tl.dot(p, v, acc3 * alpha[:, None], input_precision=DOT_PRECISION)
    return acc0, acc1, acc2, acc3, m_new, l_i


@triton.jit
def _plane_store(acc, l_safe, out_ptr, q_rows, h, m_mask, offs_j, j_mask, plane, stride_ot, stride_oh, stride_od,
                 PACKED: tl.constexpr):
    """Write one bit-plane's output columns."""
    tl.store(out_ptr + q_rows[:, None] * stride_ot + h.to(tl.int64) * stride_oh
             + (plane * PACKED + offs_j[None, :]) * stride_od, (acc / l_safe[:, None]).to(out_ptr.dtype.element_ty),
             mask=m_mask[:, None] & j_mask[None, :])


@triton.jit
def _store_lse(lse_ptr, q_rows, h, m_mask, m_i, l_i, stride_lt, stride_lh):
    """Each row's log2-sum-exp of its scaled scores (m_i: their running max, log2 units); -inf with no key."""
    lse = tl.where(l_i > 0, m_i + tl.log2(tl.where(l_i > 0, l_i, 1.0)), float("-inf"))
    tl.store(lse_ptr + q_rows * stride_lt + h.to(tl.int64) * stride_lh, lse, mask=m_mask)


@triton.jit
def _int_kernel(q_ptr, kc_ptr, vc_ptr, ks_ptr, vs_ptr, pt_ptr, lens_ptr, qstart_ptr, qlens_ptr, out_ptr, lse_ptr,
                qk_scale,
                stride_qt, stride_qh, stride_qd,
                stride_cp, stride_cs, stride_ch, stride_cd,
                stride_xp, stride_xs, stride_xh, stride_xg, stride_xz,
                stride_ptb, stride_ot, stride_oh, stride_od, stride_lt, stride_lh,
                GROUP: tl.constexpr, PAGE_SIZE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                WRITE_LSE: tl.constexpr, BITS: tl.constexpr, PLANES: tl.constexpr, PACKED: tl.constexpr, BLOCK_W: tl.constexpr,
                PLANES_PER_GROUP: tl.constexpr, GROUPS_PER_PLANE: tl.constexpr, GROUP_SIZE: tl.constexpr,
                F32: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """paged_prefill over INT4 (PLANES 2) / INT2 (PLANES 4) pages: _kernel's loops, per bit-plane."""
    h = tl.program_id(0)
    b = tl.program_id(1)
    mblk = tl.num_programs(2) - 1 - tl.program_id(2)
    q_len = tl.load(qlens_ptr + b)
    seq_len = tl.load(lens_ptr + b)
    q_s = tl.load(qstart_ptr + b)
    active = mblk * BLOCK_M < q_len
    prefix = seq_len - q_len
    offs_m = mblk * BLOCK_M + tl.arange(0, BLOCK_M)
    m_mask = offs_m < q_len
    offs_j = tl.arange(0, BLOCK_W)
    j_mask = offs_j < PACKED
    q_rows = (q_s + offs_m).to(tl.int64)
    q0 = _plane_q(q_ptr, q_rows, h, m_mask, offs_j, j_mask, 0, stride_qt, stride_qh, stride_qd, PACKED, F32)
    q1 = _plane_q(q_ptr, q_rows, h, m_mask, offs_j, j_mask, 1, stride_qt, stride_qh, stride_qd, PACKED, F32)
    acc0 = tl.zeros([BLOCK_M, BLOCK_W], tl.float32)
    acc1 = tl.zeros([BLOCK_M, BLOCK_W], tl.float32)
    if PLANES == 4:
        q2 = _plane_q(q_ptr, q_rows, h, m_mask, offs_j, j_mask, 2, stride_qt, stride_qh, stride_qd, PACKED, F32)
        q3 = _plane_q(q_ptr, q_rows, h, m_mask, offs_j, j_mask, 3, stride_qt, stride_qh, stride_qd, PACKED, F32)
        acc2 = tl.zeros([BLOCK_M, BLOCK_W], tl.float32)
        acc3 = tl.zeros([BLOCK_M, BLOCK_W], tl.float32)
    else:  # placeholders: never read
        q2 = q0
        q3 = q0
        acc2 = tl.zeros([1, 1], tl.float32)
        acc3 = tl.zeros([1, 1], tl.float32)
    q_pos = prefix + offs_m
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    pt_row = pt_ptr + b * stride_ptb
    kvh = h // GROUP
    kv_head = kvh.to(tl.int64) * stride_ch
    scale_head = kvh.to(tl.int64) * stride_xh
    full_end = tl.where(active, ((prefix + mblk * BLOCK_M) // BLOCK_N) * BLOCK_N, 0)
    for k_lo in range(0, full_end, BLOCK_N):
        acc0, acc1, acc2, acc3, m_i, l_i = _int_tile(
            q0, q1, q2, q3, acc0, acc1, acc2, acc3, m_i, l_i, kc_ptr, vc_ptr, ks_ptr, vs_ptr, pt_row, k_lo, q_pos,
            seq_len, qk_scale, kv_head, scale_head, stride_cp, stride_cs, stride_cd, stride_xp, stride_xs, stride_xg,
            stride_xz, offs_j, j_mask, PAGE_SIZE, BLOCK_N, False, PLANES, BITS, PLANES_PER_GROUP, GROUPS_PER_PLANE, GROUP_SIZE,
            F32, DOT_PRECISION)
    diag_end = tl.where(active, tl.minimum(seq_len, prefix + (mblk + 1) * BLOCK_M), 0)
    for k_off in range(0, diag_end - full_end, BLOCK_N):
        acc0, acc1, acc2, acc3, m_i, l_i = _int_tile(
            q0, q1, q2, q3, acc0, acc1, acc2, acc3, m_i, l_i, kc_ptr, vc_ptr, ks_ptr, vs_ptr, pt_row, full_end + k_off,
            q_pos, seq_len, qk_scale, kv_head, scale_head, stride_cp, stride_cs, stride_cd, stride_xp, stride_xs,
            stride_xg, stride_xz, offs_j, j_mask, PAGE_SIZE, BLOCK_N, True, PLANES, BITS, PLANES_PER_GROUP,
            GROUPS_PER_PLANE, GROUP_SIZE, F32, DOT_PRECISION)
    l_safe = tl.where(l_i > 0, l_i, 1.0)
    _plane_store(acc0, l_safe, out_ptr, q_rows, h, m_mask, offs_j, j_mask, 0, stride_ot, stride_oh, stride_od, PACKED)
    _plane_store(acc1, l_safe, out_ptr, q_rows, h, m_mask, offs_j, j_mask, 1, stride_ot, stride_oh, stride_od, PACKED)
    if PLANES == 4:
        _plane_store(acc2, l_safe, out_ptr, q_rows, h, m_mask, offs_j, j_mask, 2, stride_ot, stride_oh, stride_od,
                     PACKED)
        _plane_store(acc3, l_safe, out_ptr, q_rows, h, m_mask, offs_j, j_mask, 3, stride_ot, stride_oh, stride_od,
                     PACKED)
    if WRITE_LSE:
        _store_lse(lse_ptr, q_rows, h, m_mask, m_i, l_i, stride_lt, stride_lh)


@triton.jit
def _kernel(q_ptr, kc_ptr, vc_ptr, ks_ptr, vs_ptr, pt_ptr, lens_ptr, qstart_ptr, qlens_ptr, out_ptr, lse_ptr,
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
        _store_lse(lse_ptr, q_rows, h, m_mask, m_i, l_i, stride_lt, stride_lh)


def paged_prefill(q: Tensor, k_cache: Tensor, v_cache: Tensor, page_table: Tensor, seq_lens: Tensor,
                  q_start: Tensor, q_lens: Tensor, sm_scale: float | None = None,
                  k_scale: Tensor | None = None, v_scale: Tensor | None = None,
                  max_q_len: int | None = None, config: KernelConfig | None = None,
                  out: Tensor | None = None, lse: Tensor | None = None) -> Tensor:
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
    page_table, seq_lens, fp8, bits = check_paged_args("paged_prefill", q, k_cache, v_cache, page_table, seq_lens,
                                                        k_scale, v_scale)
    T, hq, d = q.shape
    B = page_table.shape[0]
    q_start, q_lens, max_q_len = check_ragged_rows("paged_prefill", q, q_start, q_lens, seq_lens, max_q_len)
    hkv = k_cache.shape[2]
    # positive: the kernels fold it into exp2 after the row max
    sm_scale = 1.0 / math.sqrt(d) if sm_scale is None else host_float("paged_prefill", "sm_scale", sm_scale, True)
    if out is None:
        out = torch.empty_like(q)
    elif not isinstance(out, torch.Tensor) or out.shape != q.shape or out.dtype != q.dtype or out.device != q.device:
        raise ValueError(f"paged_prefill: out must match q: {tuple(q.shape)} {q.dtype} on {q.device}")
    if lse is not None:
        _check_lse(lse, q)
    if B == 0 or T == 0:
        return out
    if max_q_len is None:
        max_q_len = int(q_lens.max().item())
    hopper = config is None and hopper_prefill_supported(q, k_cache, v_cache, out, max_q_len, k_scale)
    if bits and not (bits == 4 and hopper):  # INT2, and INT4 off the Hopper kernel: the Triton INT kernel
        config = config or default_config(KernelKind.PREFILL, q, k_cache, max_q_len)
        _launch_int(q, k_cache, v_cache, k_scale, v_scale, page_table, seq_lens, q_start, q_lens, sm_scale,
                    max_q_len, out, lse, config, bits)
        return out
    if hopper:
        from .prefill_hopper_gluon import launch

        launch(q, k_cache, v_cache, page_table, seq_lens, q_start, q_lens, sm_scale * LOG2E, max_q_len, out,
               k_scale if fp8 or bits else None, v_scale if fp8 or bits else None, lse=lse)
        return out
    config = config or default_config(KernelKind.PREFILL, q, k_cache, max_q_len)
    xs = k_scale.stride() if fp8 else (0, 0, 0)
    grid = (hq, B, triton.cdiv(max(1, max_q_len), config.block_m))
    for_device(_kernel, q.device)[grid](
        q, k_cache, v_cache, k_scale if fp8 else k_cache, v_scale if fp8 else v_cache, page_table, seq_lens,
        q_start, q_lens, out, lse if lse is not None else out, sm_scale * LOG2E,
        *q.stride(), *k_cache.stride(), *xs, page_table.stride(0), *out.stride(), *_lse_strides(lse),
        GROUP=hq // hkv, HEAD_DIM=d, PAGE_SIZE=k_cache.shape[1],
        BLOCK_M=config.block_m, BLOCK_D=max(16, triton.next_power_of_2(d)), BLOCK_N=config.block_n, IS_FP8=fp8,
        WRITE_LSE=lse is not None,
        DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32", **launch_options(config, q.device))
    return out


def _check_lse(lse: object, q: Tensor) -> None:
    """paged_prefill's lse output: a float32 [T, Hq] tensor on q's device, else ValueError naming the problem."""
    if not isinstance(lse, torch.Tensor):
        raise ValueError(f"paged_prefill: lse must be a float32 tensor [T, Hq], got {type(lse).__name__}")  # noqa: TRY004
    if tuple(lse.shape) != tuple(q.shape[:2]):
        raise ValueError(f"paged_prefill: lse shape {tuple(lse.shape)} != [T, Hq] = {tuple(q.shape[:2])}")
    if lse.dtype != torch.float32:
        raise ValueError(f"paged_prefill: lse must be float32, got {lse.dtype}")
    if lse.device != q.device:
        raise ValueError(f"paged_prefill: lse must be on q's device {q.device}, got {lse.device}")


def _lse_strides(lse: Tensor | None) -> tuple[int, int]:
    """The lse tensor's (row, head) strides, zeros when there is none (the kernels' WRITE_LSE off)."""
    return lse.stride() if lse is not None else (0, 0)


def _launch_int(q: Tensor, k_cache: Tensor, v_cache: Tensor, k_scale: Tensor, v_scale: Tensor, page_table: Tensor,
                seq_lens: Tensor, q_start: Tensor, q_lens: Tensor, sm_scale: float, max_q_len: int, out: Tensor,
                lse: Tensor | None, config: KernelConfig, bits: int) -> None:
    hq = q.shape[1]
    B = page_table.shape[0]
    hkv, width = k_cache.shape[2], k_cache.shape[3]
    n_planes = planes(bits)
    grid = (hq, B, triton.cdiv(max(1, max_q_len), config.block_m))
    for_device(_int_kernel, q.device)[grid](
        q, k_cache, v_cache, k_scale, v_scale, page_table, seq_lens, q_start, q_lens, out, lse if lse is not None else out,
        sm_scale * LOG2E, *q.stride(), *k_cache.stride(), *k_scale.stride(), page_table.stride(0), *out.stride(),
        *_lse_strides(lse), GROUP=hq // hkv, PAGE_SIZE=k_cache.shape[1], BLOCK_M=config.block_m,
        BLOCK_N=config.block_n, WRITE_LSE=lse is not None, BITS=bits,
        PLANES=n_planes, PACKED=width, BLOCK_W=max(16, triton.next_power_of_2(width)),
        PLANES_PER_GROUP=planes_per_group(bits, k_scale.shape[3]),
        GROUPS_PER_PLANE=groups_per_plane(bits, k_scale.shape[3]), GROUP_SIZE=q.shape[2] // k_scale.shape[3],
        F32=q.dtype == torch.float32,
        DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32", **launch_options(config, q.device))
