"""paged_decode_int4: INT4 decode in Gluon, every value dequantised as it becomes a tensor-core operand.

The Triton INT kernel (decode_int.py `_int_kernel`) rebuilds 16-bit operands from nibbles through
shared memory and float converts, and where a (scale, zero) group is smaller than a bit-plane
(KVStore's head_dim 64, groups of 16) it gathers each column's pair: 0.57x and 0.21x bf16's speed on
the H200. This kernel is decode_fp8_gluon's one-warp kernel with another widening
(benchmarks/RESULTS.md, "INT4 decode, every value dequantised in its operands"):

- Layouts, token order, relabelling and register pipeline are decode_fp8_gluon's. A packed row of
  head_dim values is head_dim / 2 bytes: bit-plane 0 (low nibbles) holds values 0 .. head_dim/2 - 1
  in byte order and plane 1 (high nibbles) the rest (intq.py), so each plane is an FP8-like row of
  head_dim / 2 values. At head_dim 64 that row is 32 bytes, which decode_fp8_gluon's layouts load
  8 bytes a lane.
- A word of 4 packed bytes gives 4 values of each plane, all in one group. Its group's (scale,
  zero), one int32 (fp16 s low, z high), is loaded beside it: once a token where a group spans the
  plane (head_dim 128, two groups), one 8-byte load for a plane's two groups (head_dim 64, four of
  16). `_dequant` turns a byte pair's low nibbles into fp16 (1024 + c) pairs with one
  masked OR, less 1024 exactly, and the high nibbles into 1024 + 16 c, times 1/16 less 64
  exactly (one fma); then one f16x2 fma c * s + z each (a single rounding to fp16).
- S^T = K0.q0^T + K1.q1^T (one score tile) and O^T's two planes are two accumulators over the same
  P: no scale or zero term outside the products. The error is q's, K's, V's and P's fp16 rounding
  plus the INT4 storage's; accumulation is fp32. (The first INT4 Gluon kernel folded one (scale,
  zero) a plane into the scores and P instead: head_dim 128 in two groups only, and 9% slower.)
- Limits of the fp16 values: a stored value within one group step of +-65504 may round to inf
  (intq.py saturates the scale and zero there, not the values between).

Runs where dispatch.int4_decode_gluon holds (sm_80+, KVStore's groups at head_dim 64 or 128, GQA
group <= 16); paged_decode checks and dispatches. Outputs as paged_decode's kernel: the
result with one split, else mid_o/mid_lse for its merge kernel.
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
    _relabel,
    _relabel_perm,
    _row_offsets,
    _tile_pages,
    _v_bits,
    _v_log_vec,
    _v_word_layout,
)
from .dispatch import fp8_offsets_64, fp8_wide_launch, max_registers, sm_count


@gluon.constexpr_function
def _swap01(bits):
    """Head-dim bit list with physical bits 0 and 1 exchanged (_dequant's value order in a word)."""
    return [1 if b == 0 else 0 if b == 1 else b for b in bits]


@gluon.jit
def _dequant(w, sz0, sz1):
    """int32 words [N, W] of packed INT4 rows and each word's (scale, zero) int32 [N, W] (fp16 s low,
    z high) in plane 0 and plane 1 -> the two planes' values c * s + z, fp16 [N, 4W] each. A word's
    four values come out in the order 0, 2, 1, 3 (bit-planes are built a byte pair at a time)."""
    shape: gl.constexpr = [w.shape[0], 4 * w.shape[1]]
    # Each word and pair repeated for its four values (the same registers: no instructions).
    wq = gl.reshape(gl.join(gl.join(w, w), gl.join(w, w)), shape)
    x0 = gl.reshape(gl.join(gl.join(sz0, sz0), gl.join(sz0, sz0)), shape)
    x1 = gl.reshape(gl.join(gl.join(sz1, sz1), gl.join(sz1, sz1)), shape)
    # $4 (= $5..$7): the word; $8 (= $9..$11): plane 0's (s, z), $12 (..$15) plane 1's. Bytes 0 and 2
    # (then 1 and 3, shifted down): a low nibble c under 0x6400 is the fp16 1024 + c, less 1024
    # exactly; a high nibble c is 1024 + 16 c, times 1/16 less 64 exactly. Then one fma c * s + z
    # (the pair moves of s and z become the fma's operand selects).
    asm: gl.constexpr = (
        "{ .reg .b32 t, a, k, r, m, s0, z0, s1, z1; .reg .b16 sl, zh; "
        "mov.b32 k, 0x64006400; mov.b32 r, 0x2C002C00; mov.b32 m, 0xD400D400; "
        "mov.b32 {sl, zh}, $8; mov.b32 s0, {sl, sl}; mov.b32 z0, {zh, zh}; "
        "mov.b32 {sl, zh}, $12; mov.b32 s1, {sl, sl}; mov.b32 z1, {zh, zh}; "
        "lop3.b32 a, $4, 0x000F000F, k, 0xEA; sub.f16x2 a, a, k; fma.rn.f16x2 $0, a, s0, z0; "
        "lop3.b32 a, $4, 0x00F000F0, k, 0xEA; fma.rn.f16x2 a, a, r, m; fma.rn.f16x2 $2, a, s1, z1; "
        "shr.b32 t, $4, 8; "
        "lop3.b32 a, t, 0x000F000F, k, 0xEA; sub.f16x2 a, a, k; fma.rn.f16x2 $1, a, s0, z0; "
        "lop3.b32 a, t, 0x00F000F0, k, 0xEA; fma.rn.f16x2 a, a, r, m; fma.rn.f16x2 $3, a, s1, z1; }")
    return gl.inline_asm_elementwise(asm, "=r,=r,=r,=r" + ",r" * 12, [wq, x0, x1],
                                     dtype=(gl.float16, gl.float16), is_pure=True, pack=4)


@gluon.jit
def _group_pairs(x_ptr, row, words, w, PLANE: gl.constexpr, HALF: gl.constexpr, GS: gl.constexpr):
    """The (scale, zero) int32 of each word's group in bit-plane PLANE, [N, W] like `words`; row: the
    tile's token offsets in the pair words [N] (words' row layout), w: word indices [W] (its columns).
    A group spanning the plane (head_dim 128) is one load a token; a plane's two groups (head_dim 64) one
    8-byte load a token, each word selecting its half."""
    gl.static_assert(GS == HALF or 2 * GS == HALF, "one or two (scale, zero) groups a bit-plane")
    first: gl.constexpr = (PLANE * HALF) // GS
    if GS == HALF:
        return gl.broadcast(gl.load(x_ptr + row + first)[:, None], words)[0]
    else:
        both = gl.load((x_ptr + row + first).to(gl.pointer_type(gl.int64), bitcast=True))
        high = gl.broadcast((both >> 32).to(gl.int32)[:, None], words)[0]
        return gl.where((((4 * w) // GS) == 1)[None, :], high, both.to(gl.int32)[:, None])


@gluon.jit
def _tile(c_ptr, x_ptr, pages, start, last, d, stride_cp, stride_cs, kv_off, stride_xp, stride_xs, x_off,
          BL: gl.constexpr, ROW_L: gl.constexpr, PAGE_SIZE: gl.constexpr, OFF_TY: gl.constexpr,
          HALF: gl.constexpr, GS: gl.constexpr):
    """A tile's packed K or V words [BLOCK_N, HALF / 4] and their plane-0 and plane-1 (scale, zero)
    words, tokens clamped to last (finite data where P will be 0)."""
    row = _row_offsets(pages, start, last, stride_cp, stride_cs, kv_off, BL, ROW_L, PAGE_SIZE, OFF_TY)
    words = gl.load(c_ptr + row[:, None] + d[None, :])
    xrow = _row_offsets(pages, start, last, stride_xp, stride_xs, x_off, BL, ROW_L, PAGE_SIZE, OFF_TY)
    return (words, _group_pairs(x_ptr, xrow, words, d, 0, HALF, GS),
            _group_pairs(x_ptr, xrow, words, d, 1, HALF, GS))


@gluon.jit
def _int4_decode_kernel(q_ptr, kc_ptr, vc_ptr, ks_ptr, vs_ptr, pt_ptr, lens_ptr, out_ptr, mid_o_ptr, mid_lse_ptr,
                        qk_scale,
                        stride_qb, stride_qh, stride_cp, stride_cs, stride_ch, stride_xp, stride_xs, stride_xh,
                        stride_ptb, stride_ob, stride_oh, num_splits,
                        GROUP: gl.constexpr, HEADS: gl.constexpr, HEAD_DIM: gl.constexpr, GROUPS: gl.constexpr,
                        PAGE_SIZE: gl.constexpr, BLOCK_N: gl.constexpr, SPLIT: gl.constexpr, OFF_64: gl.constexpr):
    HALF: gl.constexpr = HEAD_DIM // 2  # a bit-plane's values = a packed row's bytes
    GS: gl.constexpr = HEAD_DIM // GROUPS  # values a (scale, zero) group
    DBITS: gl.constexpr = _log2(HALF)
    LOG_VEC: gl.constexpr = _v_log_vec(HALF)
    K_PERM: gl.constexpr = _relabel_perm(_k_bits(DBITS))
    Q_PERM: gl.constexpr = _relabel_perm(_swap01(_k_bits(DBITS)))  # q in memory order, K in _dequant's
    V_PERM: gl.constexpr = _relabel_perm(_v_bits(DBITS, LOG_VEC))
    MMA: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[1, 1], instr_shape=[16, 8])
    OP_A: gl.constexpr = gl.DotOperandLayout(0, MMA, 2)
    OP_B: gl.constexpr = gl.DotOperandLayout(1, MMA, 2)
    ROWS_L: gl.constexpr = gl.SliceLayout(1, MMA)  # tokens of S^T, head-dim of O^T
    COLS_L: gl.constexpr = gl.SliceLayout(0, MMA)  # heads
    LK: gl.constexpr = gl.BlockedLayout([1, 16], [8, 4], [1, 1], [1, 0])  # q rows
    LKW: gl.constexpr = _k_word_layout(BLOCK_N, HALF)
    LVW: gl.constexpr = _v_word_layout(BLOCK_N, HALF)
    OFF_TY: gl.constexpr = gl.int64 if OFF_64 else gl.int32
    gl.static_assert(BLOCK_N == 32, "tiles are 8 blocks of 4 tokens")
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
    q0_t = gl.convert_layout(gl.permute(_relabel((q0 / q_norm).to(gl.float16), Q_PERM, HEADS, HALF), [1, 0]), OP_B)
    q1_t = gl.convert_layout(gl.permute(_relabel((q1 / q_norm).to(gl.float16), Q_PERM, HEADS, HALF), [1, 0]), OP_B)
    score_scale = qk_scale * q_norm

    m_i = gl.full([HEADS], float("-inf"), gl.float32, COLS_L)
    l_i = gl.zeros([HEADS], gl.float32, COLS_L)
    acc0 = gl.zeros([HALF, HEADS], gl.float32, MMA)  # O^T of plane 0
    acc1 = gl.zeros([HALF, HEADS], gl.float32, MMA)
    pt_row = pt_ptr + b * stride_ptb
    kv_off = kvh * stride_ch
    x_off = kvh * stride_xh
    kd = gl.arange(0, HALF // 4, layout=gl.SliceLayout(0, LKW))
    vd = gl.arange(0, HALF // 4, layout=gl.SliceLayout(0, LVW))
    rows = gl.arange(0, BLOCK_N, layout=ROWS_L)
    row_tok = 4 * (rows % 8) + rows // 8
    last = hi - 1

    kpage = _tile_pages(pt_row, lo, last, KB, PAGE_SIZE)
    vpage = _tile_pages(pt_row, lo, last, VB, PAGE_SIZE)
    kw, kx0, kx1 = _tile(kc_ptr, ks_ptr, kpage, lo, last, kd, stride_cp, stride_cs, kv_off, stride_xp, stride_xs,
                         x_off, KB, K_ROWS, PAGE_SIZE, OFF_TY, HALF, GS)
    vw, vx0, vx1 = _tile(vc_ptr, vs_ptr, vpage, lo, last, vd, stride_cp, stride_cs, kv_off, stride_xp, stride_xs,
                         x_off, VB, V_ROWS, PAGE_SIZE, OFF_TY, HALF, GS)
    kpage = _tile_pages(pt_row, lo + BLOCK_N, last, KB, PAGE_SIZE)
    vpage = _tile_pages(pt_row, lo + BLOCK_N, last, VB, PAGE_SIZE)
    for t in range(gl.cdiv(hi - lo, BLOCK_N)):
        start = lo + t * BLOCK_N
        nxt = start + BLOCK_N
        nkw, nkx0, nkx1 = _tile(kc_ptr, ks_ptr, kpage, nxt, last, kd, stride_cp, stride_cs, kv_off, stride_xp,
                                stride_xs, x_off, KB, K_ROWS, PAGE_SIZE, OFF_TY, HALF, GS)
        k0, k1 = _dequant(kw, kx0, kx1)  # [BLOCK_N, HALF] each
        k0 = gl.convert_layout(_relabel(k0, K_PERM, BLOCK_N, HALF), OP_A, assert_trivial=True)
        k1 = gl.convert_layout(_relabel(k1, K_PERM, BLOCK_N, HALF), OP_A, assert_trivial=True)
        s = mma_v2(k1, q1_t, mma_v2(k0, q0_t, gl.zeros([BLOCK_N, HEADS], gl.float32, MMA)))  # S^T
        nvw, nvx0, nvx1 = _tile(vc_ptr, vs_ptr, vpage, nxt, last, vd, stride_cp, stride_cs, kv_off, stride_xp,
                                stride_xs, x_off, VB, V_ROWS, PAGE_SIZE, OFF_TY, HALF, GS)
        kpage = _tile_pages(pt_row, nxt + BLOCK_N, last, KB, PAGE_SIZE)
        vpage = _tile_pages(pt_row, nxt + BLOCK_N, last, VB, PAGE_SIZE)
        valid = start + row_tok < hi
        s = gl.where(valid[:, None], s * score_scale, float("-inf"))
        m_new = gl.maximum(m_i, gl.max(s, axis=0))
        alpha = gl.exp2(m_i - m_new)
        p = gl.exp2(s - m_new[None, :])
        l_i = l_i * alpha + gl.sum(p, axis=0)
        p16 = gl.convert_layout(p.to(gl.float16), OP_B)
        v0, v1 = _dequant(vw, vx0, vx1)
        v0 = gl.convert_layout(gl.permute(_relabel(v0, V_PERM, BLOCK_N, HALF), [1, 0]), OP_A)  # V^T [HALF, BLOCK_N]
        acc0 = mma_v2(v0, p16, acc0 * alpha[None, :])
        v1 = gl.convert_layout(gl.permute(_relabel(v1, V_PERM, BLOCK_N, HALF), [1, 0]), OP_A)
        acc1 = mma_v2(v1, p16, acc1 * alpha[None, :])
        m_i = m_new
        kw, kx0, kx1, vw, vx0, vx1 = nkw, nkx0, nkx1, nvw, nvx0, nvx1

    # Row n of each O^T holds its plane's value _v_bits-relabelled, in _dequant's order: back to memory order.
    on = gl.arange(0, HALF, layout=ROWS_L)
    VEC: gl.constexpr = 1 << LOG_VEC
    od = ((on >> 3) & (VEC - 1)) | ((on & 7) << LOG_VEC) | (on & _high_mask(LOG_VEC, DBITS))
    od = (od & ~3) | ((od & 1) << 1) | ((od >> 1) & 1)
    oh = gl.arange(0, HEADS, layout=COLS_L)
    h_mask = oh < GROUP
    inv_l = (1.0 / gl.where(l_i > 0, l_i, 1.0))[None, :]
    o0 = acc0 * inv_l
    o1 = acc1 * inv_l
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
        lse = gl.where(l_i > 0, m_i + gl.log2(gl.where(l_i > 0, l_i, 1.0)), float("-inf"))
        gl.store(mid_lse_ptr + base, lse, mask=h_mask)


def group_words(scale: Tensor) -> Tensor:
    """INT4 (scale, zero) pairs [P, S, Hkv, G, 2] float16 -> int32 words [P, S, Hkv, G]: a group's
    (s, z) as one word (dispatch.int4_decode_gluon checks that the view exists)."""
    return scale.view(torch.int32).squeeze(-1)


def launch(q: Tensor, k_cache: Tensor, v_cache: Tensor, k_scale: Tensor, v_scale: Tensor, page_table: Tensor,
           seq_lens: Tensor, qk_scale: float, num_splits: int, out: Tensor, mid_o: Tensor, mid_lse: Tensor) -> None:
    """Arguments as checked by paged_decode (which also runs the merge when num_splits > 1);
    qk_scale includes log2(e)."""
    B, hq, d = q.shape
    hkv = k_cache.shape[2]
    group = hq // hkv
    kw, vw = k_cache.view(torch.int32), v_cache.view(torch.int32)  # [P, S, Hkv, D / 8] words
    kx, vx = group_words(k_scale), group_words(v_scale)  # [P, S, Hkv, G]
    off64 = fp8_offsets_64(k_cache, kx)
    wide = num_splits == 1 and fp8_wide_launch(B * hkv, sm_count(q.device))
    _int4_decode_kernel[(hkv, B, num_splits)](
        q, kw, vw, kx, vx, page_table, seq_lens, out, mid_o, mid_lse, qk_scale,
        q.stride(0), q.stride(1), kw.stride(0), kw.stride(1), kw.stride(2),
        kx.stride(0), kx.stride(1), kx.stride(2), page_table.stride(0), out.stride(0), out.stride(1),
        num_splits, GROUP=group, HEADS=8 if group <= 8 else 16, HEAD_DIM=d, GROUPS=kx.shape[3],
        PAGE_SIZE=k_cache.shape[1], BLOCK_N=BLOCK_N, SPLIT=num_splits > 1, OFF_64=off64,
        num_warps=1, maxnreg=max_registers(d, group, off64, wide, k_cache.shape[1]))
