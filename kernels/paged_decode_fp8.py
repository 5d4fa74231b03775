"""paged_decode_fp8: FP8 decode in Gluon, with K/V bytes loaded straight into tensor-core operands.

The Triton kernel (paged_decode) stages FP8 tiles in shared memory and rebuilds the 16-bit
tensor-core operands with byte loads and register moves: ~3.5k warp instructions per 64-token
tile, twice bf16's, so it is issue-bound at bf16's speed. Here, with layouts chosen by hand:

- One warp per (KV head, sequence, split) program: every reduction stays inside the warp, and
  the GPU is filled with splits (choose_num_splits(..., fp8_kernel=True)).
- Each lane loads 16 contiguous bytes of a K or V row (LDG.128) and widens them to fp16 with the
  packed e4m3/e5m2 -> f16x2 instruction (exact). The registers are then *relabelled* (reshape +
  permute of the head-dim bits) so they already sit where mma.m16n8k16 wants its operands: no
  shared memory, no shuffles. q (K's contraction) and the output columns (V's) are relabelled
  the same way; the score columns are tokens in memory order, so P feeds P.V in registers.
- Scales: q is normalised by its max |q| (fp16 keeps full precision in [2^-14, 1]); K's per-token
  scale and qk_scale multiply the score columns; V's per-token scale, divided by the tile's
  largest, multiplies P (so P stays in [0, 1]) and the tile maximum joins the accumulator's
  rescale factor. Accumulation is fp32; the error is that of the FP8 storage alone.

Requires a GPU with FP8 converts (sm_89+), head_dim 64/128/256, a GQA group <= 16 and unit
strides along head_dim (`supported` says whether a launch qualifies). Same outputs as
paged_decode: the final output with one split, else mid_o/mid_lse for its merge kernel.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy, mma_v2

ROWS = 16  # mma rows: the GQA group padded
BLOCK_N = 32  # tokens per tile
STAGES = 4  # tiles in the shared-memory ring
_NUM_WARPS = 1


@gluon.constexpr_function
def _log2(n):
    return int(n).bit_length() - 1


@gluon.constexpr_function
def _bit_shape(n, dbits):
    return [n] + [2] * dbits


@gluon.constexpr_function
def _high_mask(log_vec, dbits):
    """Head-dim bits above the lane chunks, which keep their place in V's label."""
    return ((1 << dbits) - 1) & ~((8 << log_vec) - 1)


@gluon.constexpr_function
def _k_bits(dbits):
    """Head-dim bit i of K's operand label comes from physical bit _k_bits[i] (see _load_layouts)."""
    return [0, 4, 5, 1, 2, 3] + list(range(6, dbits))


@gluon.constexpr_function
def _v_log_vec(head_dim):
    return 4 if head_dim >= 128 else 3


@gluon.constexpr_function
def _v_bits(dbits, log_vec):
    """Output-column bit i of V's operand label comes from physical bit _v_bits[i]."""
    return [log_vec, log_vec + 1, log_vec + 2] + list(range(log_vec)) + list(range(log_vec + 3, dbits))


@gluon.constexpr_function
def _relabel_perm(src_bits):
    """permute() order for [N, 2, ..., 2] (physical head-dim bits, most significant first) that puts
    physical bit src_bits[i] at label bit i."""
    n = len(src_bits)
    return [0] + [1 + (n - 1 - src_bits[n - 1 - i]) for i in range(n)]


@gluon.constexpr_function
def _k_word_bases(block_n, head_dim):
    """K tile as loaded, in int32 words [BLOCK_N, D / 4]: 16 contiguous bytes per lane (registers
    1, 2), lanes 0-1 over head-dim chunks, lanes 2-4 over tokens; (reg, lane) bases."""
    regs = [[0, 1], [0, 2]] + [[0, 1 << i] for i in range(4, _log2(head_dim // 4))]
    regs += [[1 << i, 0] for i in range(3, _log2(block_n))]
    return regs, [[0, 4], [0, 8], [1, 0], [2, 0], [4, 0]]


@gluon.constexpr_function
def _v_word_bases(block_n, head_dim):
    """V tile as loaded, in int32 words [BLOCK_N, D / 4]: 2^log_vec contiguous bytes per lane
    (registers), lanes 0-1 over token pairs, lanes 2-4 over head-dim chunks; registers also cover
    token +1 and the rest; (reg, lane) bases."""
    log_words = _v_log_vec(head_dim) - 2
    chunk = 1 << log_words
    regs = [[0, 1 << i] for i in range(log_words)] + [[1, 0]]
    regs += [[1 << i, 0] for i in range(3, _log2(block_n))]
    regs += [[0, 1 << i] for i in range(log_words + 3, _log2(head_dim // 4))]
    return regs, [[2, 0], [4, 0], [0, chunk], [0, 2 * chunk], [0, 4 * chunk]]


@gluon.constexpr_function
def _k_copy_bases(block_n, head_dim):
    """K tile as copied to shared memory, in words [BLOCK_N, D / 4]: 8 lanes (at D >= 128) over one
    row's 16-byte chunks, so each copy instruction fetches whole 128-byte lines."""
    chunk_bits = _log2(head_dim // 16)
    lane_chunks = min(3, chunk_bits)
    lanes = [[0, 4 << i] for i in range(lane_chunks)] + [[1 << i, 0] for i in range(5 - lane_chunks)]
    regs = [[0, 1], [0, 2]] + [[0, 4 << i] for i in range(lane_chunks, chunk_bits)]
    regs += [[1 << i, 0] for i in range(5 - lane_chunks, _log2(block_n))]
    return regs, lanes


@gluon.constexpr_function
def _k_smem_layout(block_n, head_dim):
    """Row-major K tile in words, 16-byte chunk index XOR 4 on odd rows: both the copy layout and
    _k_word_bases' reads touch all 32 banks per 8-lane phase."""
    chunk_bits = _log2(head_dim // 16)
    offs = [[0, 1], [0, 2]] + [[0, 4 << i] for i in range(chunk_bits)]
    offs += [[1, 16] if chunk_bits >= 3 else [1, 0]] + [[1 << i, 0] for i in range(1, _log2(block_n))]
    return gl.SharedLinearLayout(offset_bases=offs)


@gluon.constexpr_function
def _distributed(bases, shape):
    return gl.DistributedLinearLayout(reg_bases=bases[0], lane_bases=bases[1], warp_bases=[], block_bases=[],
                                      shape=shape)


@gluon.constexpr_function
def _lane_private(bases, vector_regs):
    """Shared layout of a tile in which each lane's vector (its first vector_regs registers) and the
    lanes' vectors are consecutive: a warp's 16-byte accesses cover whole 128-byte rows."""
    regs, lanes = bases
    return gl.SharedLinearLayout(offset_bases=regs[:vector_regs] + lanes + regs[vector_regs:])


@gluon.jit
def _to_f16(w, E5M2: gl.constexpr):
    """int32 words [N, W] (4 FP8 bytes each) -> fp16 [N, 4W], exact: two packed converts per word.
    Loads and loop-carried tiles stay in words (a carried FP8 tensor takes a register per byte)."""
    b = gl.reshape(gl.join(gl.join(w.to(gl.int8), (w >> 16).to(gl.int8)),
                           gl.join((w >> 8).to(gl.int8), (w >> 24).to(gl.int8))), [w.shape[0], 4 * w.shape[1]])
    if E5M2:
        asm: gl.constexpr = ("{ .reg .b16 lo, hi; mov.b32 {lo, hi}, $2; cvt.rn.f16x2.e5m2x2 $0, lo; "
                             "cvt.rn.f16x2.e5m2x2 $1, hi; }")
    else:
        asm: gl.constexpr = ("{ .reg .b16 lo, hi; mov.b32 {lo, hi}, $2; cvt.rn.f16x2.e4m3x2 $0, lo; "
                             "cvt.rn.f16x2.e4m3x2 $1, hi; }")
    return gl.inline_asm_elementwise(asm, "=r,=r,r", [b], dtype=gl.float16, is_pure=True, pack=4)


@gluon.jit
def _relabel(x, perm: gl.constexpr, N: gl.constexpr, D: gl.constexpr):
    """x: [N, D] -> same registers, head-dim index bits permuted by perm (no data movement)."""
    x = gl.reshape(x, _bit_shape(N, _log2(D)))
    if D == 64:
        x = gl.permute(x, [perm[0], perm[1], perm[2], perm[3], perm[4], perm[5], perm[6]])
    elif D == 128:
        x = gl.permute(x, [perm[0], perm[1], perm[2], perm[3], perm[4], perm[5], perm[6], perm[7]])
    else:
        gl.static_assert(D == 256, "head_dim must be 64, 128 or 256")
        x = gl.permute(x, [perm[0], perm[1], perm[2], perm[3], perm[4], perm[5], perm[6], perm[7], perm[8]])
    return gl.reshape(x, [N, D])


@gluon.jit
def _issue_tile(sk, sv, sks, svs, kc_ptr, vc_ptr, ks_ptr, vs_ptr, kpage, vpage, xpage, start, hi, k_ar, v_ar, x_ar,
                kd, vd, stride_cp, stride_cs, stride_xp, stride_xs, kv_off, scale_off, PAGE_SIZE: gl.constexpr,
                OFF_TY: gl.constexpr):
    """Start copying the tile at `start` (K/V rows as int32 words [BLOCK_N, D / 4], zero past hi, and
    their scales [BLOCK_N]) into one pipeline stage (sk, sv, sks, svs) and commit the copy group.
    kpage/vpage/xpage: the tile's page ids in the K-copy, V and scale (one token per lane) layouts,
    whose token offsets are k_ar/v_ar/x_ar."""
    kn = start + k_ar
    async_copy.async_copy_global_to_shared(
        sk, kc_ptr + (kpage.to(OFF_TY) * stride_cp + (kn % PAGE_SIZE) * stride_cs + kv_off)[:, None] + kd[None, :],
        mask=(kn < hi)[:, None])
    vn = start + v_ar
    async_copy.async_copy_global_to_shared(
        sv, vc_ptr + (vpage.to(OFF_TY) * stride_cp + (vn % PAGE_SIZE) * stride_cs + kv_off)[:, None] + vd[None, :],
        mask=(vn < hi)[:, None])
    xn = start + x_ar
    xrow = xpage * stride_xp + (xn % PAGE_SIZE) * stride_xs + scale_off
    async_copy.async_copy_global_to_shared(sks, ks_ptr + xrow, mask=xn < hi)
    async_copy.async_copy_global_to_shared(svs, vs_ptr + xrow, mask=xn < hi)
    async_copy.commit_group()


@gluon.jit
def _page_ids(pt_row, start, hi, k_ar, v_ar, x_ar, PAGE_SIZE: gl.constexpr):
    """Page ids of the tile at `start` in the K-copy, V and scale layouts (0 past hi)."""
    kpage = gl.load(pt_row + (start + k_ar) // PAGE_SIZE, mask=start + k_ar < hi, other=0)
    vpage = gl.load(pt_row + (start + v_ar) // PAGE_SIZE, mask=start + v_ar < hi, other=0)
    xpage = gl.load(pt_row + (start + x_ar) // PAGE_SIZE, mask=start + x_ar < hi, other=0)
    return kpage, vpage, xpage


@gluon.jit
def _fp8_decode_kernel(q_ptr, kc_ptr, vc_ptr, ks_ptr, vs_ptr, pt_ptr, lens_ptr, out_ptr, mid_o_ptr, mid_lse_ptr,
                       qk_scale,
                       stride_qb, stride_qh, stride_cp, stride_cs, stride_ch, stride_xp, stride_xs, stride_xh,
                       stride_ptb, stride_ob, stride_oh, num_splits,
                       GROUP: gl.constexpr, HEADS: gl.constexpr, HEAD_DIM: gl.constexpr, PAGE_SIZE: gl.constexpr,
                       BLOCK_N: gl.constexpr, STAGES: gl.constexpr, SPLIT: gl.constexpr, OFF_64: gl.constexpr,
                       E5M2: gl.constexpr):
    """Scores transposed, S^T = K.q^T [BLOCK_N, HEADS], and O^T = V^T.P^T [D, HEADS]: tokens and
    head-dim fill the mma rows, the GQA group (padded to HEADS = 8 or 16) its columns."""
    DBITS: gl.constexpr = _log2(HEAD_DIM)
    LOG_VEC: gl.constexpr = _v_log_vec(HEAD_DIM)
    K_PERM: gl.constexpr = _relabel_perm(_k_bits(DBITS))
    V_PERM: gl.constexpr = _relabel_perm(_v_bits(DBITS, LOG_VEC))
    MMA: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[1, 1], instr_shape=[16, 8])
    OP_A: gl.constexpr = gl.DotOperandLayout(0, MMA, 2)
    OP_B: gl.constexpr = gl.DotOperandLayout(1, MMA, 2)
    ROWS_L: gl.constexpr = gl.SliceLayout(1, MMA)  # tokens of S^T, head-dim of O^T
    COLS_L: gl.constexpr = gl.SliceLayout(0, MMA)  # heads
    LK: gl.constexpr = gl.BlockedLayout([1, 16], [8, 4], [1, 1], [1, 0])  # K rows (and q) as bytes
    LKW: gl.constexpr = _distributed(_k_word_bases(BLOCK_N, HEAD_DIM), [BLOCK_N, HEAD_DIM // 4])  # LK in words
    LVW: gl.constexpr = _distributed(_v_word_bases(BLOCK_N, HEAD_DIM), [BLOCK_N, HEAD_DIM // 4])
    LKC: gl.constexpr = _distributed(_k_copy_bases(BLOCK_N, HEAD_DIM), [BLOCK_N, HEAD_DIM // 4])
    LANE: gl.constexpr = gl.BlockedLayout([1], [32], [1], [0])  # scales: one token per lane
    OFF_TY: gl.constexpr = gl.int64 if OFF_64 else gl.int32

    kvh = gl.program_id(0)
    b = gl.program_id(1)
    split = gl.program_id(2)
    seq_len = gl.load(lens_ptr + b)
    per_split = gl.cdiv(gl.cdiv(seq_len, num_splits), BLOCK_N) * BLOCK_N
    lo = split * per_split
    hi = gl.minimum(lo + per_split, seq_len)

    # q^T [D, HEADS]: q normalised by max |q| (folded into the score scale), relabelled like K.
    qh = gl.arange(0, HEADS, layout=gl.SliceLayout(1, LK))
    qd = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, LK))
    q = gl.load(q_ptr + b * stride_qb + (kvh * GROUP + qh % GROUP)[:, None] * stride_qh + qd[None, :]).to(gl.float32)
    # Heads past the group are padding (never stored). Zero them through a condition the compiler
    # cannot fold: columns it knows to be zero, or equal to another, cost register copies per tile.
    q = gl.where((qh < GROUP)[:, None] | (seq_len < 0), q, 0.0)
    q_max = gl.max(gl.max(gl.abs(q), axis=1), axis=0)
    q_norm = gl.where(q_max > 0, q_max, 1.0)
    q_t = gl.convert_layout(gl.permute(_relabel((q / q_norm).to(gl.float16), K_PERM, HEADS, HEAD_DIM), [1, 0]), OP_B)
    score_scale = qk_scale * q_norm

    m_i = gl.full([HEADS], float("-inf"), gl.float32, COLS_L)
    l_i = gl.zeros([HEADS], gl.float32, COLS_L)
    acc = gl.zeros([HEAD_DIM, HEADS], gl.float32, MMA)  # O^T
    acc_unit = q_norm * 0.0 + 1.0  # acc holds (true accumulator) / acc_unit
    pt_row = pt_ptr + b * stride_ptb
    kv_off = kvh * stride_ch
    scale_off = kvh * stride_xh
    kd = gl.arange(0, HEAD_DIM // 4, layout=gl.SliceLayout(0, LKC))
    vd = gl.arange(0, HEAD_DIM // 4, layout=gl.SliceLayout(0, LVW))
    k_ar = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, LKC))
    v_ar = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, LVW))
    x_ar = gl.arange(0, BLOCK_N, layout=LANE)

    # Pipeline: STAGES - 1 tiles are in flight (cp.async into shared memory) while one is computed;
    # page ids are read one tile ahead of their copies, so no load waits on another.
    sk = gl.allocate_shared_memory(gl.int32, [STAGES, BLOCK_N, HEAD_DIM // 4], _k_smem_layout(BLOCK_N, HEAD_DIM))
    sv = gl.allocate_shared_memory(gl.int32, [STAGES, BLOCK_N, HEAD_DIM // 4],
                                   _lane_private(_v_word_bases(BLOCK_N, HEAD_DIM), LOG_VEC - 2))
    ROW_MAJOR: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
    sks = gl.allocate_shared_memory(gl.float32, [STAGES, BLOCK_N], ROW_MAJOR)
    svs = gl.allocate_shared_memory(gl.float32, [STAGES, BLOCK_N], ROW_MAJOR)
    kpage, vpage, xpage = _page_ids(pt_row, lo, hi, k_ar, v_ar, x_ar, PAGE_SIZE)
    for i in gl.static_range(STAGES - 1):
        _issue_tile(sk.index(i), sv.index(i), sks.index(i), svs.index(i), kc_ptr, vc_ptr, ks_ptr, vs_ptr, kpage,
                    vpage, xpage, lo + i * BLOCK_N, hi, k_ar, v_ar, x_ar, kd, vd, stride_cp, stride_cs, stride_xp,
                    stride_xs, kv_off, scale_off, PAGE_SIZE, OFF_TY)
        kpage, vpage, xpage = _page_ids(pt_row, lo + (i + 1) * BLOCK_N, hi, k_ar, v_ar, x_ar, PAGE_SIZE)
    for t in range(0, gl.cdiv(hi - lo, BLOCK_N)):
        start = lo + t * BLOCK_N
        ahead = start + (STAGES - 1) * BLOCK_N
        st = (t + STAGES - 1) % STAGES
        _issue_tile(sk.index(st), sv.index(st), sks.index(st), svs.index(st), kc_ptr, vc_ptr, ks_ptr, vs_ptr,
                    kpage, vpage, xpage, ahead, hi, k_ar, v_ar, x_ar, kd, vd, stride_cp, stride_cs, stride_xp,
                    stride_xs, kv_off, scale_off, PAGE_SIZE, OFF_TY)
        kpage, vpage, xpage = _page_ids(pt_row, ahead + BLOCK_N, hi, k_ar, v_ar, x_ar, PAGE_SIZE)
        async_copy.wait_group(STAGES - 1)
        gl.thread_barrier()
        st = t % STAGES
        k_a = gl.convert_layout(_relabel(_to_f16(sk.index(st).load(LKW), E5M2), K_PERM, BLOCK_N, HEAD_DIM), OP_A,
                                assert_trivial=True)  # [BLOCK_N, D]
        s = mma_v2(k_a, q_t, gl.zeros([BLOCK_N, HEADS], gl.float32, MMA))  # S^T [BLOCK_N, HEADS]
        k_s = sks.index(st).load(ROWS_L)
        v_s = svs.index(st).load(ROWS_L)
        s = gl.where((start + gl.arange(0, BLOCK_N, layout=ROWS_L) < hi)[:, None], s * (k_s * score_scale)[:, None],
                     float("-inf"))
        m_new = gl.maximum(m_i, gl.max(s, axis=0))
        alpha = gl.exp2(m_i - m_new)
        p = gl.exp2(s - m_new[None, :])
        l_i = l_i * alpha + gl.sum(p, axis=0)
        v_max = gl.max(v_s, axis=0)
        v_unit = gl.where(v_max > 0, v_max, 1.0)
        p = p * (v_s * (1.0 / v_unit))[:, None]
        acc = acc * (alpha * (acc_unit / v_unit))[None, :]
        acc_unit = v_unit
        v_a = gl.convert_layout(gl.permute(_relabel(_to_f16(sv.index(st).load(LVW), E5M2), V_PERM, BLOCK_N, HEAD_DIM),
                                           [1, 0]), OP_A)  # V^T [D, BLOCK_N]
        acc = mma_v2(v_a, gl.convert_layout(p.to(gl.float16), OP_B), acc)
        m_i = m_new

    # Row n of O^T holds head-dim index _v_bits-relabelled: back to memory order.
    on = gl.arange(0, HEAD_DIM, layout=ROWS_L)
    VEC: gl.constexpr = 1 << LOG_VEC
    od = ((on >> 3) & (VEC - 1)) | ((on & 7) << LOG_VEC) | (on & _high_mask(LOG_VEC, DBITS))
    oh = gl.arange(0, HEADS, layout=COLS_L)
    h_mask = oh < GROUP
    l_safe = gl.where(l_i > 0, l_i, 1.0)
    o = acc * (acc_unit / l_safe)[None, :]
    heads = kvh * GROUP + oh
    if not SPLIT:
        gl.store(out_ptr + b * stride_ob + heads[None, :] * stride_oh + od[:, None],
                 o.to(out_ptr.dtype.element_ty), mask=h_mask[None, :])
    else:
        # mid_o: [B, Hq, num_splits, D] fp32, mid_lse: [B, Hq, num_splits] fp32 (log2 units), contiguous
        hq = gl.num_programs(0) * GROUP
        base = (b * hq + heads) * num_splits + split
        gl.store(mid_o_ptr + base[None, :].to(gl.int64) * HEAD_DIM + od[:, None], o, mask=h_mask[None, :])
        lse = gl.where(l_i > 0, m_i + gl.log2(l_safe), float("-inf"))
        gl.store(mid_lse_ptr + base, lse, mask=h_mask)


def launch(q: Tensor, k_cache: Tensor, v_cache: Tensor, k_scale: Tensor, v_scale: Tensor, page_table: Tensor,
           seq_lens: Tensor, qk_scale: float, num_splits: int, out: Tensor, mid_o: Tensor, mid_lse: Tensor) -> None:
    """Arguments as checked by paged_decode (which also runs the merge when num_splits > 1)."""
    B, hq, d = q.shape
    hkv = k_cache.shape[2]
    group = hq // hkv
    kw, vw = k_cache.view(torch.int32), v_cache.view(torch.int32)  # [P, S, Hkv, D / 4] words
    _fp8_decode_kernel[(hkv, B, num_splits)](
        q, kw, vw, k_scale, v_scale, page_table, seq_lens, out, mid_o, mid_lse, qk_scale,
        q.stride(0), q.stride(1), kw.stride(0), kw.stride(1), kw.stride(2),
        k_scale.stride(0), k_scale.stride(1), k_scale.stride(2), page_table.stride(0), out.stride(0), out.stride(1),
        num_splits, GROUP=group, HEADS=8 if group <= 8 else 16, HEAD_DIM=d, PAGE_SIZE=k_cache.shape[1],
        BLOCK_N=BLOCK_N, STAGES=STAGES, SPLIT=num_splits > 1, OFF_64=kw.numel() >= 2**31,
        E5M2=k_cache.dtype == torch.float8_e5m2, num_warps=1)
