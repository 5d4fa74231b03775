"""paged_prefill over INT4/INT2 pages (kernels/intq.py): `_int_kernel`, launched by prefill.paged_prefill
through launch_int.

Each K/V tile is read as whole packed rows and dequantised in registers one bit-plane at a time
(int_planes.int_codes' masks, then codes * scale + zero in float16, or float32 for fp32 q; bf16 q is
converted to float16); plane p's values are the head_dim columns p * W .. p * W + W - 1, so the scores are
the sum over the planes of q_p . K_p^T (one accumulating dot a plane) and the output keeps an accumulator a
plane. A plane of several groups (int4 groups of 16 at head_dim 64) gathers a (scale, zero) a column
(int_planes.plane_dequant). (Folding the scales into the scores, as paged_decode does, would cost
BLOCK_M x BLOCK_N multiplies a group instead of BLOCK_N x D. One [BLOCK_N, D] tile of the planes side by
side instead compiled, for sm_90, to 1.6x the instructions of this form and spilled at 128-row tiles.)
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from .int_planes import int_codes, plane_dequant, plane_unit, to_compute
from .intq import groups_per_plane, planes, planes_per_group
from .launch import LOG2E, KernelConfig, for_device, launch_options
from .prefill_lse import lse_strides, store_lse


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
    value; int_planes.int_codes' power of two folded into the scale); a (scale, zero) a column where the plane
    holds several groups (int_planes.plane_dequant)."""
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
    """paged_prefill over INT4 (PLANES 2) / INT2 (PLANES 4) pages: _prefill_kernel's loops, per bit-plane."""
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
        store_lse(lse_ptr, q_rows, h, m_mask, m_i, l_i, stride_lt, stride_lh)


def launch_int(q: Tensor, k_cache: Tensor, v_cache: Tensor, k_scale: Tensor, v_scale: Tensor, page_table: Tensor,
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
        *lse_strides(lse), GROUP=hq // hkv, PAGE_SIZE=k_cache.shape[1], BLOCK_M=config.block_m,
        BLOCK_N=config.block_n, WRITE_LSE=lse is not None, BITS=bits,
        PLANES=n_planes, PACKED=width, BLOCK_W=max(16, triton.next_power_of_2(width)),
        PLANES_PER_GROUP=planes_per_group(bits, k_scale.shape[3]),
        GROUPS_PER_PLANE=groups_per_plane(bits, k_scale.shape[3]), GROUP_SIZE=q.shape[2] // k_scale.shape[3],
        F32=q.dtype == torch.float32,
        DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32", **launch_options(config, q.device))
