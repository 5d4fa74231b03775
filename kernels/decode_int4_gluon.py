"""paged_decode_int4: INT4 decode in Gluon, packed codes loaded straight into tensor-core operands.

The Triton INT kernel (decode_int.py `_int_kernel`) rebuilds 16-bit operands from nibbles through
shared memory and float converts: about 2.5x the instructions of a bf16 tile, so it ran at half
bf16's speed on a quarter of the bytes; this one runs at 2.2x bf16's at 64 x 16k on the H200, still
instruction-bound (benchmarks/RESULTS.md, "INT4 decode in Gluon"). It is
decode_fp8_gluon's one-warp kernel (its layouts, relabelling, token order and register pipeline,
imported from there) with INT4 pages in place of FP8 bytes:

- The format (intq.py) at head_dim 128: a packed row is 64 bytes; byte j holds value j in its low
  nibble (plane 0) and value 64 + j in its high one (plane 1), and each plane is one (scale, zero)
  group. So a tile's packed rows load exactly as FP8 rows of head_dim 64 do, and each plane is an
  FP8-like head_dim-64 operand: K.q^T and V^T.P^T are two mma products a tile, one per plane,
  the same count as one product over 128 values.
- Nibbles become fp16 operands with one byte permute per two values (`_codes`). K's code c in
  [0, 15], placed in the low bits of an fp16, is the subnormal c * 2^-24 (tensor cores take fp16
  subnormals at full precision; the 2^24 joins K's scale). V's enter centred, as 1024 + c less 1032
  = c - 8 (one f16x2 subtraction, exact): P is rounded to fp16 before its product, and against
  codes in [0, 15] that rounding error would scale with (c - 8 + 8) s rather than with the value
  (c - 8) s + (z + 8 s) that survives the zero's cancellation (2.6e-3 against 1.7e-3 on the H200).
  No float convert, no shared memory.
- Scales and zeros never touch the operands: per token t and plane g, with codes c and
  (scale s, zero z),
      score[t] = s_0 (q_0 . c_0) + z_0 sum(q_0) + s_1 (q_1 . c_1) + z_1 sum(q_1)
      out      = sum_t p_t s_g,t c_t + sum_t p_t z_g,t     (for the values of plane g)
  K's (s, z) scale the two score products row by row (q's fp16 rounding is the same in both
  terms, so the zero's cancellation costs nothing there); V's s scales P per plane (over the tile's
  largest s, as FP8's V scale: two accumulators, each with its own unit), and the zero terms are
  one [HEADS] running sum a plane. A token's four fp16 (s_0, z_0, s_1, z_1) are one 8-byte load.
- Accumulation is fp32 and the codes are exact, so the error is q's and P's fp16 rounding (as in
  the FP8 kernel) plus the INT4 storage's.

Runs where dispatch.int4_decode_gluon holds (sm_80+, head_dim 128 in two groups, GQA group <= 16);
paged_decode checks and dispatches. Outputs as paged_decode's kernel: the result with one split,
else mid_o/mid_lse for its merge kernel.
"""
from __future__ import annotations

import torch
from torch import Tensor
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import mma_v2

from .decode_fp8_gluon import (
    BLOCK_N,
    _block_layout,
    _high_mask,
    _k_bits,
    _k_word_layout,
    _log2,
    _per_token,
    _relabel,
    _relabel_perm,
    _rows_order,
    _tile_pages,
    _v_bits,
    _v_log_vec,
    _v_word_layout,
    _words,
)
from .dispatch import fp8_offsets_64, fp8_wide_launch, int4_max_registers, sm_count


@gluon.jit
def _codes(w, HIGH: gl.constexpr, CENTRED: gl.constexpr):
    """int32 words [N, W] of packed INT4 rows -> fp16 [N, 4W]: the low (HIGH: high) nibble c of every byte,
    in memory order, as the fp16 subnormal c * 2^-24, or (CENTRED) as c - 8, exactly."""
    b = gl.reshape(gl.join(gl.join(w.to(gl.int8), (w >> 16).to(gl.int8)),
                           gl.join((w >> 8).to(gl.int8), (w >> 24).to(gl.int8))), [w.shape[0], 4 * w.shape[1]])
    # $2 holds 4 bytes (elements 0-3); prmt puts bytes 0, 1 (2, 3) in the low bits of two fp16 halves.
    if HIGH:
        pick: gl.constexpr = "shr.b32 t, $2, 4; and.b32 t, t, 0x0F0F0F0F; "
    else:
        pick: gl.constexpr = "and.b32 t, $2, 0x0F0F0F0F; "
    if CENTRED:  # 0x64 high bytes: 1024 + c; less 1032
        asm: gl.constexpr = ("{ .reg .b32 t, z, a, c; mov.b32 z, 0x64646464; mov.b32 c, 0x64086408; " + pick +
                             "prmt.b32 a, t, z, 0x4140; sub.f16x2 $0, a, c; "
                             "prmt.b32 a, t, z, 0x4342; sub.f16x2 $1, a, c; }")
    else:
        asm: gl.constexpr = ("{ .reg .b32 t, z; mov.b32 z, 0; " + pick +
                             "prmt.b32 $0, t, z, 0x4140; prmt.b32 $1, t, z, 0x4342; }")
    return gl.inline_asm_elementwise(asm, "=r,=r,r", [b], dtype=gl.float16, is_pure=True, pack=4)


@gluon.jit
def _pairs(x_ptr, pages, start, stride_xp, stride_xs, off, BL: gl.constexpr, ROWS_L: gl.constexpr,
           PAGE_SIZE: gl.constexpr, OFF_TY: gl.constexpr):
    """A tile's (s_0, z_0, s_1, z_1) as int64 words [BLOCK_N] (score-row layout), as
    decode_fp8_gluon._scales loads FP8 scales: tokens not clamped (junk past the split, masked by
    the caller), a lane's four consecutive tokens one contiguous run."""
    blk = gl.arange(0, 8, layout=gl.SliceLayout(1, BL))
    j = gl.arange(0, 4, layout=gl.SliceLayout(0, BL))
    xrow = (_per_token(pages, PAGE_SIZE).to(OFF_TY) * stride_xp
            + ((start + 4 * blk[:, None] + j[None, :]) % PAGE_SIZE) * stride_xs + off)
    return _rows_order(gl.load(x_ptr + xrow), ROWS_L)


@gluon.jit
def _half(x, i: gl.constexpr):
    """fp16 number i (0-3) of int64 words, as float32."""
    return ((x >> (16 * i)) & 0xFFFF).to(gl.int16).to(gl.float16, bitcast=True).to(gl.float32)


@gluon.jit
def _int4_decode_kernel(q_ptr, kc_ptr, vc_ptr, ks_ptr, vs_ptr, pt_ptr, lens_ptr, out_ptr, mid_o_ptr, mid_lse_ptr,
                        qk_scale,
                        stride_qb, stride_qh, stride_cp, stride_cs, stride_ch, stride_xp, stride_xs, stride_xh,
                        stride_ptb, stride_ob, stride_oh, num_splits,
                        GROUP: gl.constexpr, HEADS: gl.constexpr, HEAD_DIM: gl.constexpr, PAGE_SIZE: gl.constexpr,
                        BLOCK_N: gl.constexpr, SPLIT: gl.constexpr, OFF_64: gl.constexpr):
    HALF: gl.constexpr = HEAD_DIM // 2  # a plane: 64 values, one (scale, zero) group
    DBITS: gl.constexpr = _log2(HALF)
    LOG_VEC: gl.constexpr = _v_log_vec(HALF)
    K_PERM: gl.constexpr = _relabel_perm(_k_bits(DBITS))
    V_PERM: gl.constexpr = _relabel_perm(_v_bits(DBITS, LOG_VEC))
    MMA: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[1, 1], instr_shape=[16, 8])
    OP_A: gl.constexpr = gl.DotOperandLayout(0, MMA, 2)
    OP_B: gl.constexpr = gl.DotOperandLayout(1, MMA, 2)
    ROWS_L: gl.constexpr = gl.SliceLayout(1, MMA)  # tokens of S^T, head-dim of O^T
    COLS_L: gl.constexpr = gl.SliceLayout(0, MMA)  # heads
    LK: gl.constexpr = gl.BlockedLayout([1, 16], [8, 4], [1, 1], [1, 0])  # q rows
    LKW: gl.constexpr = _k_word_layout(BLOCK_N, HALF)  # a packed row is as long as an FP8 row of HALF values
    LVW: gl.constexpr = _v_word_layout(BLOCK_N, HALF)
    OFF_TY: gl.constexpr = gl.int64 if OFF_64 else gl.int32
    gl.static_assert(BLOCK_N == 32, "tiles are 8 blocks of 4 tokens")
    gl.static_assert(HEAD_DIM == 128, "head_dim 128: two planes of 64 values, one group each")
    K_ROWS: gl.constexpr = gl.SliceLayout(1, LKW)
    V_ROWS: gl.constexpr = gl.SliceLayout(1, LVW)
    KB: gl.constexpr = _block_layout([3, 4], [-1, -1, 0, 1, 2])
    VB: gl.constexpr = _block_layout([0, 3, 4], [1, 2, -1, -1, -1])

    kvh = gl.program_id(0)
    b = gl.program_id(1)
    split = gl.program_id(2)
    seq_len = gl.load(lens_ptr + b)
    per_split = gl.cdiv(gl.cdiv(seq_len, num_splits), BLOCK_N) * BLOCK_N
    lo = split * per_split
    hi = gl.minimum(lo + per_split, seq_len)

    # q^T per plane [HALF, HEADS], normalised by max |q| (folded into the score scale), relabelled like K.
    qh = gl.arange(0, HEADS, layout=gl.SliceLayout(1, LK))
    qd = gl.arange(0, HALF, layout=gl.SliceLayout(0, LK))
    q_row = q_ptr + b * stride_qb + (kvh * GROUP + qh % GROUP)[:, None] * stride_qh + qd[None, :]
    keep = (qh < GROUP)[:, None] | (seq_len < 0)  # padding heads: zero (see decode_fp8_gluon)
    q0 = gl.where(keep, gl.load(q_row).to(gl.float32), 0.0)
    q1 = gl.where(keep, gl.load(q_row + HALF).to(gl.float32), 0.0)
    q_max = gl.maximum(gl.max(gl.max(gl.abs(q0), axis=1), axis=0), gl.max(gl.max(gl.abs(q1), axis=1), axis=0))
    q_norm = gl.where(q_max > 0, q_max, 1.0)
    q0 = (q0 / q_norm).to(gl.float16)
    q1 = (q1 / q_norm).to(gl.float16)
    q0_sum = gl.convert_layout(gl.sum(q0.to(gl.float32), axis=1), COLS_L)  # [HEADS]: the zero's weight
    q1_sum = gl.convert_layout(gl.sum(q1.to(gl.float32), axis=1), COLS_L)
    q0_t = gl.convert_layout(gl.permute(_relabel(q0, K_PERM, HEADS, HALF), [1, 0]), OP_B)
    q1_t = gl.convert_layout(gl.permute(_relabel(q1, K_PERM, HEADS, HALF), [1, 0]), OP_B)
    score_scale = qk_scale * q_norm
    K_UNIT: gl.constexpr = 16777216.0  # 2^24: K's codes c are read as the fp16 subnormals c * 2^-24

    m_i = gl.full([HEADS], float("-inf"), gl.float32, COLS_L)
    l_i = gl.zeros([HEADS], gl.float32, COLS_L)
    acc0 = gl.zeros([HALF, HEADS], gl.float32, MMA)  # O^T of plane 0, in units of acc0_unit
    acc1 = gl.zeros([HALF, HEADS], gl.float32, MMA)
    zero0 = gl.zeros([HEADS], gl.float32, COLS_L)  # sum_t p_t z_t of each plane
    zero1 = gl.zeros([HEADS], gl.float32, COLS_L)
    acc0_unit = q_norm * 0.0 + 1.0
    acc1_unit = acc0_unit
    pt_row = pt_ptr + b * stride_ptb
    kv_off = kvh * stride_ch
    pair_off = kvh * stride_xh
    kd = gl.arange(0, HALF // 4, layout=gl.SliceLayout(0, LKW))
    vd = gl.arange(0, HALF // 4, layout=gl.SliceLayout(0, LVW))
    rows = gl.arange(0, BLOCK_N, layout=ROWS_L)
    row_tok = 4 * (rows % 8) + rows // 8
    last = hi - 1

    kpage = _tile_pages(pt_row, lo, last, KB, PAGE_SIZE)
    vpage = _tile_pages(pt_row, lo, last, VB, PAGE_SIZE)
    kw = _words(kc_ptr, kpage, lo, last, kd, stride_cp, stride_cs, kv_off, KB, K_ROWS, PAGE_SIZE, OFF_TY)
    k_x = _pairs(ks_ptr, kpage, lo, stride_xp, stride_xs, pair_off, KB, ROWS_L, PAGE_SIZE, OFF_TY)
    vw = _words(vc_ptr, vpage, lo, last, vd, stride_cp, stride_cs, kv_off, VB, V_ROWS, PAGE_SIZE, OFF_TY)
    v_x = _pairs(vs_ptr, kpage, lo, stride_xp, stride_xs, pair_off, KB, ROWS_L, PAGE_SIZE, OFF_TY)
    kpage = _tile_pages(pt_row, lo + BLOCK_N, last, KB, PAGE_SIZE)
    vpage = _tile_pages(pt_row, lo + BLOCK_N, last, VB, PAGE_SIZE)
    for t in range(gl.cdiv(hi - lo, BLOCK_N)):
        start = lo + t * BLOCK_N
        nxt = start + BLOCK_N
        nkw = _words(kc_ptr, kpage, nxt, last, kd, stride_cp, stride_cs, kv_off, KB, K_ROWS, PAGE_SIZE, OFF_TY)
        nk_x = _pairs(ks_ptr, kpage, nxt, stride_xp, stride_xs, pair_off, KB, ROWS_L, PAGE_SIZE, OFF_TY)
        k0 = gl.convert_layout(_relabel(_codes(kw, False, False), K_PERM, BLOCK_N, HALF), OP_A,
                               assert_trivial=True)  # [BLOCK_N, HALF]
        k1 = gl.convert_layout(_relabel(_codes(kw, True, False), K_PERM, BLOCK_N, HALF), OP_A,
                               assert_trivial=True)
        s0 = mma_v2(k0, q0_t, gl.zeros([BLOCK_N, HEADS], gl.float32, MMA))  # S^T of plane 0 [BLOCK_N, HEADS]
        s1 = mma_v2(k1, q1_t, gl.zeros([BLOCK_N, HEADS], gl.float32, MMA))
        nvw = _words(vc_ptr, vpage, nxt, last, vd, stride_cp, stride_cs, kv_off, VB, V_ROWS, PAGE_SIZE, OFF_TY)
        nv_x = _pairs(vs_ptr, kpage, nxt, stride_xp, stride_xs, pair_off, KB, ROWS_L, PAGE_SIZE, OFF_TY)
        kpage = _tile_pages(pt_row, nxt + BLOCK_N, last, KB, PAGE_SIZE)
        vpage = _tile_pages(pt_row, nxt + BLOCK_N, last, VB, PAGE_SIZE)
        valid = start + row_tok < hi
        # Junk (s, z) past the split may be anything, NaN included: only selected, never multiplied in.
        ks0 = gl.where(valid, _half(k_x, 0) * (K_UNIT * score_scale), 0.0)
        kz0 = gl.where(valid, _half(k_x, 1) * score_scale, 0.0)
        ks1 = gl.where(valid, _half(k_x, 2) * (K_UNIT * score_scale), 0.0)
        kz1 = gl.where(valid, _half(k_x, 3) * score_scale, 0.0)
        s = (s0 * ks0[:, None] + s1 * ks1[:, None] + kz0[:, None] * q0_sum[None, :]
             + kz1[:, None] * q1_sum[None, :])
        s = gl.where(valid[:, None], s, float("-inf"))
        m_new = gl.maximum(m_i, gl.max(s, axis=0))
        alpha = gl.exp2(m_i - m_new)
        p = gl.exp2(s - m_new[None, :])
        l_i = l_i * alpha + gl.sum(p, axis=0)
        vs0 = gl.where(valid, _half(v_x, 0), 0.0)
        vs1 = gl.where(valid, _half(v_x, 2), 0.0)
        # V's codes enter as c - 8: value = (c - 8) s + (z + 8 s)
        zero0 = zero0 * alpha + gl.sum(p * gl.where(valid, _half(v_x, 1) + 8.0 * vs0, 0.0)[:, None], axis=0)
        zero1 = zero1 * alpha + gl.sum(p * gl.where(valid, _half(v_x, 3) + 8.0 * vs1, 0.0)[:, None], axis=0)
        v0_max = gl.max(vs0, axis=0)
        v1_max = gl.max(vs1, axis=0)
        v0_unit = gl.where(v0_max > 1e-30, v0_max, 1.0)
        v1_unit = gl.where(v1_max > 1e-30, v1_max, 1.0)
        acc0 = acc0 * (alpha * (acc0_unit / v0_unit))[None, :]
        acc1 = acc1 * (alpha * (acc1_unit / v1_unit))[None, :]
        acc0_unit = v0_unit
        acc1_unit = v1_unit
        p0 = gl.convert_layout((p * (vs0 * (1.0 / v0_unit))[:, None]).to(gl.float16), OP_B)
        p1 = gl.convert_layout((p * (vs1 * (1.0 / v1_unit))[:, None]).to(gl.float16), OP_B)
        v0 = gl.convert_layout(gl.permute(_relabel(_codes(vw, False, True), V_PERM, BLOCK_N, HALF), [1, 0]),
                               OP_A)  # V^T of plane 0 [HALF, BLOCK_N]
        acc0 = mma_v2(v0, p0, acc0)
        v1 = gl.convert_layout(gl.permute(_relabel(_codes(vw, True, True), V_PERM, BLOCK_N, HALF), [1, 0]),
                               OP_A)
        acc1 = mma_v2(v1, p1, acc1)
        m_i = m_new
        kw, vw, k_x, v_x = nkw, nvw, nk_x, nv_x

    # Row n of each O^T holds its plane's value _v_bits-relabelled: back to memory order.
    on = gl.arange(0, HALF, layout=ROWS_L)
    VEC: gl.constexpr = 1 << LOG_VEC
    od = ((on >> 3) & (VEC - 1)) | ((on & 7) << LOG_VEC) | (on & _high_mask(LOG_VEC, DBITS))
    oh = gl.arange(0, HEADS, layout=COLS_L)
    h_mask = oh < GROUP
    l_safe = gl.where(l_i > 0, l_i, 1.0)
    o0 = (acc0 * acc0_unit + zero0[None, :]) * (1.0 / l_safe)[None, :]
    o1 = (acc1 * acc1_unit + zero1[None, :]) * (1.0 / l_safe)[None, :]
    heads = kvh * GROUP + oh
    if not SPLIT:
        o_row = out_ptr + b * stride_ob + heads[None, :] * stride_oh + od[:, None]
        gl.store(o_row, o0.to(out_ptr.dtype.element_ty), mask=h_mask[None, :])
        gl.store(o_row + HALF, o1.to(out_ptr.dtype.element_ty), mask=h_mask[None, :])
    else:
        # mid_o: [B, Hq, num_splits, D] fp32, mid_lse: [B, Hq, num_splits] fp32 (log2 units), contiguous
        hq = gl.num_programs(0) * GROUP
        base = (b * hq + heads) * num_splits + split
        m_row = mid_o_ptr + base[None, :].to(gl.int64) * HEAD_DIM + od[:, None]
        gl.store(m_row, o0, mask=h_mask[None, :])
        gl.store(m_row + HALF, o1, mask=h_mask[None, :])
        lse = gl.where(l_i > 0, m_i + gl.log2(l_safe), float("-inf"))
        gl.store(mid_lse_ptr + base, lse, mask=h_mask)


def pair_words(scale: Tensor) -> Tensor:
    """INT4 (scale, zero) pairs [P, S, Hkv, 2, 2] float16 -> int64 words [P, S, Hkv, 1]: a token-head's four
    fp16 (s_0, z_0, s_1, z_1) as one word (dispatch.int4_decode_gluon checks that the view exists)."""
    return scale.flatten(3).view(torch.int64)


def launch(q: Tensor, k_cache: Tensor, v_cache: Tensor, k_scale: Tensor, v_scale: Tensor, page_table: Tensor,
           seq_lens: Tensor, qk_scale: float, num_splits: int, out: Tensor, mid_o: Tensor, mid_lse: Tensor) -> None:
    """Arguments as checked by paged_decode (which also runs the merge when num_splits > 1);
    qk_scale includes log2(e)."""
    B, hq, d = q.shape
    hkv = k_cache.shape[2]
    group = hq // hkv
    kw, vw = k_cache.view(torch.int32), v_cache.view(torch.int32)  # [P, S, Hkv, D / 8] words
    kx, vx = pair_words(k_scale), pair_words(v_scale)
    off64 = fp8_offsets_64(k_cache, kx)
    wide = num_splits == 1 and fp8_wide_launch(B * hkv, sm_count(q.device))
    _int4_decode_kernel[(hkv, B, num_splits)](
        q, kw, vw, kx, vx, page_table, seq_lens, out, mid_o, mid_lse, qk_scale,
        q.stride(0), q.stride(1), kw.stride(0), kw.stride(1), kw.stride(2),
        kx.stride(0), kx.stride(1), kx.stride(2), page_table.stride(0), out.stride(0), out.stride(1),
        num_splits, GROUP=group, HEADS=8 if group <= 8 else 16, HEAD_DIM=d, PAGE_SIZE=k_cache.shape[1],
        BLOCK_N=BLOCK_N, SPLIT=num_splits > 1, OFF_64=off64,
        num_warps=1, maxnreg=int4_max_registers(group, off64, k_cache.shape[1], wide))
