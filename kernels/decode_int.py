"""paged_decode over INT4/INT2 pages (uint8 bit-planes + float16 (scale, zero) per group, kernels/intq.py):
`_int_kernel`, launched by decode.paged_decode (and cascade.paged_decode_partial) through launch_int: every INT2
launch, INT4 on the CPU, with fp32 q or an explicit config, and INT4 layouts other than KVStore's (on a GPU,
KVStore's INT4 pages take decode_int4_gluon.py's kernel, dispatch.int4_decode_gluon).

Each program loads whole packed rows [BLOCK_N, D * bits / 8] of K and V once, unpacks every bit-plane
with one shift and mask (planes are the batch dimension of 3-D dots, so no shuffles), and folds the
group scales into the scores instead of dequantising K: for a plane of group g,
q . (s * x + z) = s * (q . x) + z * sum(q), so the dots run on the exact integer codes and the scale
and zero multiply [GQA rows, BLOCK_N] scores, not [BLOCK_N, D] values. Likewise for V, the probabilities
are scaled per group (P * s) before the dot and sum(P * z) is added to the group's output columns.
Where a plane holds several groups (int4 groups of 16 values at head_dim 64, kernels/intq.py), a plane's
(scale, zero) differ along its columns: that plane is dequantised in registers instead (each column's pair
gathered, codes * s + z, `plane_dequant`) and dotted as it is, as paged_prefill does. The codes' float
trick: int_planes.py. Grid, splits and merge: decode.py.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from .int_planes import int_codes, plane_dequant, plane_unit, to_compute
from .intq import groups_per_plane, planes, planes_per_group
from .launch import LOG2E, KernelConfig, for_device, launch_options


@triton.jit
def _plane_q(q_ptr, q_row, heads, hj_mask, offs_j, plane, stride_qh, stride_qd,
             PACKED: tl.constexpr, F32: tl.constexpr):
    """Bit-plane `plane`'s columns of the GQA group's query rows: [BLOCK_H, BLOCK_W]."""
    q = tl.load(q_ptr + q_row + heads[:, None] * stride_qh + (plane * PACKED + offs_j[None, :]) * stride_qd,
                mask=hj_mask, other=0.0)
    return to_compute(q, F32)


@triton.jit
def _plane_scores(q, q_sum, kb, ks_ptr, xrow, n_mask, kv_mask, offs_j, plane, stride_xg, stride_xz,
                  BITS: tl.constexpr, PLANES_PER_GROUP: tl.constexpr, GROUPS_PER_PLANE: tl.constexpr,
                  GROUP_SIZE: tl.constexpr, F32: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """One bit-plane's share of the scores, s * (q . codes) + z * sum(q): [BLOCK_H, BLOCK_N]; where a plane
    holds several groups, q . (codes * s + z) over the plane dequantised in registers."""
    if GROUPS_PER_PLANE > 1:
        k = plane_dequant(kb, ks_ptr, xrow, kv_mask, offs_j, plane, stride_xg, stride_xz, BITS,
                          GROUPS_PER_PLANE, GROUP_SIZE, F32)
        return tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)
    x = int_codes(kb, plane, BITS, F32)  # [BLOCK_N, BLOCK_W]: codes * 2^(BITS * plane)
    xs = ks_ptr + xrow + (plane // PLANES_PER_GROUP) * stride_xg  # [BLOCK_N]
    s = tl.load(xs, mask=n_mask, other=0.0).to(tl.float32) * plane_unit(plane, BITS)
    z = tl.load(xs + stride_xz, mask=n_mask, other=0.0).to(tl.float32)
    d = tl.dot(q, tl.trans(x), input_precision=DOT_PRECISION)
    return d * s[None, :] + q_sum[:, None] * z[None, :]


@triton.jit
def _plane_values(acc, p, alpha, vb, vs_ptr, xrow, n_mask, kv_mask, offs_j, plane, stride_xg, stride_xz,
                  BITS: tl.constexpr, PLANES_PER_GROUP: tl.constexpr, GROUPS_PER_PLANE: tl.constexpr,
                  GROUP_SIZE: tl.constexpr, F32: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """One bit-plane's accumulator [BLOCK_H, BLOCK_W] rescaled by alpha plus (P * s) . codes + sum(P * z)
    (P . (codes * s + z) where a plane holds several groups)."""
    if GROUPS_PER_PLANE > 1:
        v = plane_dequant(vb, vs_ptr, xrow, kv_mask, offs_j, plane, stride_xg, stride_xz, BITS,
                          GROUPS_PER_PLANE, GROUP_SIZE, F32)
        return acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
    x = int_codes(vb, plane, BITS, F32)  # [BLOCK_N, BLOCK_W]: codes * 2^(BITS * plane)
    xs = vs_ptr + xrow + (plane // PLANES_PER_GROUP) * stride_xg
    s = tl.load(xs, mask=n_mask, other=0.0).to(tl.float32) * plane_unit(plane, BITS)
    z = tl.load(xs + stride_xz, mask=n_mask, other=0.0).to(tl.float32)
    acc = acc * alpha[:, None] + tl.sum(p * z[None, :], axis=1)[:, None]
    return acc + tl.dot((p * s[None, :]).to(x.dtype), x, input_precision=DOT_PRECISION)


@triton.jit
def _plane_out(acc, l_safe, out_ptr, mid_o_ptr, b, heads, hj_mask, offs_j, plane, base, stride_ob, stride_oh,
               stride_od, PACKED: tl.constexpr, BLOCK_D: tl.constexpr, SPLIT: tl.constexpr):
    """Write one bit-plane's columns of the output (or of mid_o, as _decode_kernel's layout)."""
    o = acc / l_safe[:, None]
    cols = plane * PACKED + offs_j[None, :]
    if not SPLIT:
        tl.store(out_ptr + b * stride_ob + heads[:, None] * stride_oh + cols * stride_od,
                 o.to(out_ptr.dtype.element_ty), mask=hj_mask)
    else:
        tl.store(mid_o_ptr + base[:, None].to(tl.int64) * BLOCK_D + cols, o, mask=hj_mask)


@triton.jit
def _int_kernel(q_ptr, kc_ptr, vc_ptr, ks_ptr, vs_ptr, pt_ptr, lens_ptr, out_ptr, mid_o_ptr, mid_lse_ptr,
                qk_scale,
                stride_qb, stride_qh, stride_qd,
                stride_cp, stride_cs, stride_ch, stride_cd,
                stride_xp, stride_xs, stride_xh, stride_xg, stride_xz,
                stride_ptb, stride_ob, stride_oh, stride_od, num_splits,
                GROUP: tl.constexpr, PAGE_SIZE: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
                BLOCK_N: tl.constexpr, SPLIT: tl.constexpr, BITS: tl.constexpr, PLANES: tl.constexpr,
                PACKED: tl.constexpr, BLOCK_W: tl.constexpr, PLANES_PER_GROUP: tl.constexpr,
                GROUPS_PER_PLANE: tl.constexpr, GROUP_SIZE: tl.constexpr, F32: tl.constexpr,
                DOT_PRECISION: tl.constexpr):
    """paged_decode over INT4 (PLANES 2) / INT2 (PLANES 4) pages; planes 2 and 3 exist only for INT2."""
    kvh = tl.program_id(0)
    b = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(lens_ptr + b)
    per_split = tl.cdiv(tl.cdiv(seq_len, num_splits), BLOCK_N) * BLOCK_N
    lo = split * per_split
    hi = tl.minimum(lo + per_split, seq_len)

    offs_h = tl.arange(0, BLOCK_H)
    heads = kvh * GROUP + offs_h
    h_mask = offs_h < GROUP
    offs_j = tl.arange(0, BLOCK_W)
    j_mask = offs_j < PACKED
    hj_mask = h_mask[:, None] & j_mask[None, :]
    q_row = b * stride_qb
    # q0..q3: [BLOCK_H, BLOCK_W], the columns of planes 0..3; their row sums multiply the zeros
    q0 = _plane_q(q_ptr, q_row, heads, hj_mask, offs_j, 0, stride_qh, stride_qd, PACKED, F32)
    q1 = _plane_q(q_ptr, q_row, heads, hj_mask, offs_j, 1, stride_qh, stride_qd, PACKED, F32)
    q0_sum = tl.sum(q0.to(tl.float32), axis=1)
    q1_sum = tl.sum(q1.to(tl.float32), axis=1)
    acc0 = tl.zeros([BLOCK_H, BLOCK_W], tl.float32)
    acc1 = tl.zeros([BLOCK_H, BLOCK_W], tl.float32)
    if PLANES == 4:
        q2 = _plane_q(q_ptr, q_row, heads, hj_mask, offs_j, 2, stride_qh, stride_qd, PACKED, F32)
        q3 = _plane_q(q_ptr, q_row, heads, hj_mask, offs_j, 3, stride_qh, stride_qd, PACKED, F32)
        q2_sum = tl.sum(q2.to(tl.float32), axis=1)
        q3_sum = tl.sum(q3.to(tl.float32), axis=1)
        acc2 = tl.zeros([BLOCK_H, BLOCK_W], tl.float32)
        acc3 = tl.zeros([BLOCK_H, BLOCK_W], tl.float32)

    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    pt_row = pt_ptr + b * stride_ptb
    kv_head = kvh * stride_ch
    for start in range(0, hi - lo, BLOCK_N):
        offs_n = lo + start + tl.arange(0, BLOCK_N)
        n_mask = offs_n < hi
        page = tl.load(pt_row + offs_n // PAGE_SIZE, mask=n_mask, other=0).to(tl.int64)
        slot = offs_n % PAGE_SIZE
        # ---- whole packed rows of K and V: [BLOCK_N, BLOCK_W] uint8
        row = page * stride_cp + slot * stride_cs + kv_head  # [BLOCK_N]
        kv_mask = n_mask[:, None] & j_mask[None, :]
        kb = tl.load(kc_ptr + row[:, None] + offs_j[None, :] * stride_cd, mask=kv_mask, other=0)
        vb = tl.load(vc_ptr + row[:, None] + offs_j[None, :] * stride_cd, mask=kv_mask, other=0)
        xrow = page * stride_xp + slot * stride_xs + kvh * stride_xh  # [BLOCK_N]: the row's (scale, zero)s
        # ---- scores: sum over the planes of s * (q . codes) + z * sum(q)
        qk = _plane_scores(q0, q0_sum, kb, ks_ptr, xrow, n_mask, kv_mask, offs_j, 0, stride_xg, stride_xz, BITS,
                           PLANES_PER_GROUP, GROUPS_PER_PLANE, GROUP_SIZE, F32, DOT_PRECISION)
        qk += _plane_scores(q1, q1_sum, kb, ks_ptr, xrow, n_mask, kv_mask, offs_j, 1, stride_xg, stride_xz, BITS,
                            PLANES_PER_GROUP, GROUPS_PER_PLANE, GROUP_SIZE, F32, DOT_PRECISION)
        if PLANES == 4:
            qk += _plane_scores(q2, q2_sum, kb, ks_ptr, xrow, n_mask, kv_mask, offs_j, 2, stride_xg, stride_xz, BITS,
                                PLANES_PER_GROUP, GROUPS_PER_PLANE, GROUP_SIZE, F32, DOT_PRECISION)
            qk += _plane_scores(q3, q3_sum, kb, ks_ptr, xrow, n_mask, kv_mask, offs_j, 3, stride_xg, stride_xz, BITS,
                                PLANES_PER_GROUP, GROUPS_PER_PLANE, GROUP_SIZE, F32, DOT_PRECISION)
        qk = tl.where(n_mask[None, :], qk * qk_scale, float("-inf"))  # [BLOCK_H, BLOCK_N]
        # ---- online softmax
        m_new = tl.maximum(m_i, tl.max(qk, axis=1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(qk - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        # ---- P.V per plane: (P * s) . codes + sum(P * z)
        acc0 = _plane_values(acc0, p, alpha, vb, vs_ptr, xrow, n_mask, kv_mask, offs_j, 0, stride_xg, stride_xz, BITS,
                             PLANES_PER_GROUP, GROUPS_PER_PLANE, GROUP_SIZE, F32, DOT_PRECISION)
        acc1 = _plane_values(acc1, p, alpha, vb, vs_ptr, xrow, n_mask, kv_mask, offs_j, 1, stride_xg, stride_xz, BITS,
                             PLANES_PER_GROUP, GROUPS_PER_PLANE, GROUP_SIZE, F32, DOT_PRECISION)
        if PLANES == 4:
            acc2 = _plane_values(acc2, p, alpha, vb, vs_ptr, xrow, n_mask, kv_mask, offs_j, 2, stride_xg, stride_xz, BITS,
                                 PLANES_PER_GROUP, GROUPS_PER_PLANE, GROUP_SIZE, F32, DOT_PRECISION)
            acc3 = _plane_values(acc3, p, alpha, vb, vs_ptr, xrow, n_mask, kv_mask, offs_j, 3, stride_xg, stride_xz, BITS,
                                 PLANES_PER_GROUP, GROUPS_PER_PLANE, GROUP_SIZE, F32, DOT_PRECISION)
        m_i = m_new

    l_safe = tl.where(l_i > 0, l_i, 1.0)
    base = (b * tl.num_programs(0) * GROUP + heads) * num_splits + split  # [BLOCK_H]: mid_o / mid_lse rows
    _plane_out(acc0, l_safe, out_ptr, mid_o_ptr, b, heads, hj_mask, offs_j, 0, base, stride_ob, stride_oh,
               stride_od, PACKED, BLOCK_D, SPLIT)
    _plane_out(acc1, l_safe, out_ptr, mid_o_ptr, b, heads, hj_mask, offs_j, 1, base, stride_ob, stride_oh,
               stride_od, PACKED, BLOCK_D, SPLIT)
    if PLANES == 4:
        _plane_out(acc2, l_safe, out_ptr, mid_o_ptr, b, heads, hj_mask, offs_j, 2, base, stride_ob, stride_oh,
                   stride_od, PACKED, BLOCK_D, SPLIT)
        _plane_out(acc3, l_safe, out_ptr, mid_o_ptr, b, heads, hj_mask, offs_j, 3, base, stride_ob, stride_oh,
                   stride_od, PACKED, BLOCK_D, SPLIT)
    if SPLIT:
        lse = tl.where(l_i > 0, m_i + tl.log2(l_safe), float("-inf"))
        tl.store(mid_lse_ptr + base, lse, mask=h_mask)


def launch_int(q: Tensor, k_cache: Tensor, v_cache: Tensor, k_scale: Tensor, v_scale: Tensor, page_table: Tensor,
                seq_lens: Tensor, sm_scale: float, num_splits: int, out: Tensor, mid_o: Tensor, mid_lse: Tensor,
                config: KernelConfig, bits: int) -> None:
    B, hq, d = q.shape
    hkv, width = k_cache.shape[2], k_cache.shape[3]
    group = hq // hkv
    n_planes = planes(bits)
    for_device(_int_kernel, q.device)[(hkv, B, num_splits)](
        q, k_cache, v_cache, k_scale, v_scale, page_table, seq_lens, out, mid_o, mid_lse, sm_scale * LOG2E,
        *q.stride(), *k_cache.stride(), *k_scale.stride(), page_table.stride(0), *out.stride(), num_splits,
        GROUP=group, PAGE_SIZE=k_cache.shape[1], BLOCK_H=max(16, triton.next_power_of_2(group)),
        BLOCK_D=max(16, triton.next_power_of_2(d)), BLOCK_N=config.block_n, SPLIT=num_splits > 1, BITS=bits,
        PLANES=n_planes, PACKED=width, BLOCK_W=max(16, triton.next_power_of_2(width)),
        PLANES_PER_GROUP=planes_per_group(bits, k_scale.shape[3]),
        GROUPS_PER_PLANE=groups_per_plane(bits, k_scale.shape[3]), GROUP_SIZE=d // k_scale.shape[3],
        F32=q.dtype == torch.float32,
        DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32", **launch_options(config, q.device))
