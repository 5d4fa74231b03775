"""paged_decode_fp8: FP8 decode in Gluon, K/V bytes loaded straight into tensor-core operands.

The Triton kernel (paged_decode) stages FP8 tiles in shared memory and rebuilds the 16-bit
tensor-core operands from byte loads and register moves: many more warp instructions per tile than
bf16 needs, so FP8 decode ran no faster than bf16 (profiles in benchmarks/RESULTS.md). Here the
layouts are chosen by hand:

- One warp per (KV head, sequence, split) program: every reduction stays in the warp, and the GPU
  is filled with splits in whole waves of resident programs (dispatch.choose_num_splits with
  dispatch.decode_warps_per_sm: 12 per SM at 168 registers).
- Transposed products, S^T = K.q^T [BLOCK_N, HEADS] and O^T = V^T.P^T [D, HEADS]: tokens and
  head-dim fill the 16 mma rows and the GQA group (padded to HEADS = 8 or 16) the columns, so no
  register holds a padding row of the accumulator.
- Each lane loads 16 contiguous bytes of a K or V row as int32 words (a loop-carried FP8 tensor
  would take a register per byte) and widens them with the packed e4m3/e5m2 -> f16x2 convert
  (exact). The registers are then *relabelled* (reshape + permute of the head-dim index bits) so
  they already sit where mma.m16n8k16 wants them: no shared memory, no shuffles. q is relabelled
  like K (the contraction index), and the rows of O^T are put back in memory order at the store.
- Tokens are relabelled too: row r of a 32-token tile (of S^T, and column r of V^T) is token
  4 (r % 8) + r // 8, so the four rows a lane holds in the mma layouts are four consecutive
  tokens: one page id and one 8-byte scale load per lane instead of four each (21 loads a tile,
  not 36, at head_dim 128 and 16-token pages; faster at every benchmark shape).
- Software pipeline in registers: tile t+1's K words and scales are loaded while tile t is
  computed, its V once tile t's K is consumed, and page ids a tile earlier still, so no load
  waits on another. K/V rows past the split read its last token (finite data, P = 0) instead of
  being masked; their scores are set to -inf and their V scales to 0.
- Scales: q is normalised by its max |q| (fp16 keeps full precision in [2^-14, 1]); K's
  per-token scale and qk_scale multiply the score rows; V's per-token scale, over the tile's
  largest, multiplies P (which stays in [0, 1]) and the tile maximum joins the accumulator's
  rescale. Accumulation is fp32: the error is the FP8 storage's alone. Limits of the 16-bit
  operands: a token whose V scale is below ~2^-24 of its tile's largest (with P near 1) or a head
  whose |q| is below ~2^-14 of its group's largest loses precision to fp16 subnormals; real K/V
  scales within 32 tokens and q norms within a group are far closer than that.

Runs where dispatch.fp8_decode_gluon holds (sm_89+, head_dim 64/128, GQA group <= 16, caches that
view as int32 words); paged_decode checks and dispatches. Register caps: dispatch.max_registers.
Outputs as paged_decode's kernel: the result with one split, else mid_o/mid_lse for its merge kernel.
"""
from __future__ import annotations

import torch
from torch import Tensor
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import mma_v2

from .dispatch import fp8_offsets_64, fp8_wide_launch, max_registers, sm_count

BLOCK_N = 32  # tokens per tile


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
def _k_lane_bits(head_dim):
    """log2 of the bytes a lane loads of a K row: 16, or 8 for rows of 32 bytes (INT4 rows of 64 values)."""
    return 4 if head_dim >= 64 else 3


@gluon.constexpr_function
def _k_bits(dbits):
    """Bit i of K's label (the mma contraction index k) is physical head-dim bit _k_bits[i]. Loaded
    (_k_word_layout), physical bits 0-3 are a lane's 16 bytes (0-2: 8 bytes in rows of 32), the next
    two its lane bits 0-1, the rest registers; the mma operand wants k bit 0 in a register (the f16x2
    pair), bits 1-2 from lane bits 0-1, 3+ in registers."""
    n = _k_lane_bits(1 << dbits)
    return [0, n, n + 1] + list(range(1, n)) + list(range(n + 2, dbits))


@gluon.constexpr_function
def _v_log_vec(head_dim):
    return 4 if head_dim >= 128 else 3 if head_dim >= 64 else 2


@gluon.constexpr_function
def _v_bits(dbits, log_vec):
    """Bit i of V's head-dim label (the row of V^T and O^T) is physical bit _v_bits[i]: the mma wants
    row bits 0-2 from lane bits 2-4, which hold physical bits log_vec.. (_v_word_layout)."""
    return [log_vec, log_vec + 1, log_vec + 2] + list(range(log_vec)) + list(range(log_vec + 3, dbits))


@gluon.constexpr_function
def _relabel_perm(src_bits):
    """permute() order for [N, 2, ..., 2] (physical head-dim bits, most significant first) that puts
    physical bit src_bits[i] at label bit i."""
    n = len(src_bits)
    return [0] + [1 + (n - 1 - src_bits[n - 1 - i]) for i in range(n)]


@gluon.constexpr_function
def _word_layout(regs, lanes, block_n, head_dim):
    return gl.DistributedLinearLayout(reg_bases=regs, lane_bases=lanes, warp_bases=[], block_bases=[],
                                      shape=[block_n, head_dim // 4])


@gluon.constexpr_function
def _k_word_layout(block_n, head_dim):
    """K tile as loaded, in int32 words [BLOCK_N, D / 4]: 16 contiguous bytes per lane (registers
    1, 2; 8 bytes in rows of 32), lanes 0-1 over head-dim chunks, lanes 2-4 over tokens (the mma A
    operand's rows)."""
    n = _k_lane_bits(head_dim) - 2  # word bits in a lane's chunk
    regs = [[0, 1 << i] for i in range(n)] + [[0, 1 << i] for i in range(n + 2, _log2(head_dim // 4))]
    regs += [[1 << i, 0] for i in range(3, _log2(block_n))]
    return _word_layout(regs, [[0, 1 << n], [0, 2 << n], [1, 0], [2, 0], [4, 0]], block_n, head_dim)


@gluon.constexpr_function
def _v_word_layout(block_n, head_dim):
    """V tile as loaded, in int32 words [BLOCK_N, D / 4]: 2^log_vec contiguous bytes per lane
    (registers), lanes 0-1 over token pairs (the mma A operand's k), lanes 2-4 over head-dim chunks;
    registers also cover token +1 and the rest."""
    log_words = _v_log_vec(head_dim) - 2
    chunk = 1 << log_words
    regs = [[0, 1 << i] for i in range(log_words)] + [[1, 0]]
    regs += [[1 << i, 0] for i in range(3, _log2(block_n))]
    regs += [[0, 1 << i] for i in range(log_words + 3, _log2(head_dim // 4))]
    return _word_layout(regs, [[2, 0], [4, 0], [0, chunk], [0, 2 * chunk], [0, 4 * chunk]], block_n, head_dim)


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
    if D == 32:
        x = gl.permute(x, [perm[0], perm[1], perm[2], perm[3], perm[4], perm[5]])
    elif D == 64:
        x = gl.permute(x, [perm[0], perm[1], perm[2], perm[3], perm[4], perm[5], perm[6]])
    else:
        gl.static_assert(D == 128, "head_dim must be 32, 64 or 128")
        x = gl.permute(x, [perm[0], perm[1], perm[2], perm[3], perm[4], perm[5], perm[6], perm[7]])
    return gl.reshape(x, [N, D])


@gluon.constexpr_function
def _block_layout(row_regs, row_lanes):
    """A tile's tokens as [8 blocks, 4] (token 4 * block + j), laid out so that _rows_order gives the
    row layout whose register / lane bits hold the row-index bits listed (-1: broadcast lanes).
    Row r of a tile holds token 4 * (r % 8) + r // 8: the four rows of a lane (r, r + 8, r + 16,
    r + 24 in the mma layouts) are four consecutive tokens, so their scales are one 8-byte load and
    their page one id."""
    return gl.DistributedLinearLayout(
        reg_bases=[[0, 0] if b < 0 else ([1 << b, 0] if b < 3 else [0, 1 << (b - 3)]) for b in row_regs],
        lane_bases=[[0, 0] if b < 0 else ([1 << b, 0] if b < 3 else [0, 1 << (b - 3)]) for b in row_lanes],
        warp_bases=[], block_bases=[], shape=[8, 4])


@gluon.jit
def _rows_order(x, ROW_L: gl.constexpr):
    """[8, 4] (token 4 * block + j) -> [32] in row order (row block + 8 j): the same registers."""
    return gl.convert_layout(gl.reshape(gl.permute(x, [1, 0]), [32]), ROW_L, assert_trivial=True)


@gluon.jit
def _clamped(start, ar, last):
    """Token indices start + ar, clamped to [0, last]."""
    return gl.maximum(gl.minimum(start + ar, last), 0)


@gluon.jit
def _tile_pages(pt_row, start, last, BL: gl.constexpr, PAGE_SIZE: gl.constexpr):
    """Page ids of the tile at start (tokens clamped to last): one per 4-token block [8] when no
    block straddles two pages, else one per token [8, 4]."""
    blk = gl.arange(0, 8, layout=gl.SliceLayout(1, BL))
    if PAGE_SIZE % 4 == 0:
        tok = _clamped(start, 4 * blk, last)
    else:
        tok = _clamped(start, 4 * blk[:, None] + gl.arange(0, 4, layout=gl.SliceLayout(0, BL))[None, :], last)
    return gl.load(pt_row + tok // PAGE_SIZE, mask=tok <= last, other=0)  # an empty sequence: page 0


@gluon.jit
def _per_token(pages, PAGE_SIZE: gl.constexpr):
    """_tile_pages' ids, broadcastable against the tile's [8, 4] tokens."""
    if PAGE_SIZE % 4 == 0:
        return pages[:, None]
    else:
        return pages


@gluon.jit
def _row_offsets(pages, start, last, stride_cp, stride_cs, kv_off, BL: gl.constexpr, ROW_L: gl.constexpr,
                 PAGE_SIZE: gl.constexpr, OFF_TY: gl.constexpr):
    """Offsets [BLOCK_N] (ROW_L) of a tile's token rows in a cache of strides (stride_cp, stride_cs),
    tokens clamped to last (finite data where P will be 0)."""
    blk = gl.arange(0, 8, layout=gl.SliceLayout(1, BL))
    tok = _clamped(start, 4 * blk[:, None] + gl.arange(0, 4, layout=gl.SliceLayout(0, BL))[None, :], last)
    # Relabelled before the strides multiply them, so the compiler still sees 16-byte aligned rows.
    page = _rows_order(gl.broadcast(_per_token(pages, PAGE_SIZE), tok)[0], ROW_L)
    return page.to(OFF_TY) * stride_cp + (_rows_order(tok, ROW_L) % PAGE_SIZE) * stride_cs + kv_off


@gluon.jit
def _words(c_ptr, pages, start, last, d, stride_cp, stride_cs, kv_off, BL: gl.constexpr, ROW_L: gl.constexpr,
           PAGE_SIZE: gl.constexpr, OFF_TY: gl.constexpr):
    """A tile's K or V rows as int32 words [BLOCK_N, D / 4] (d and ROW_L: that cache's load layout),
    tokens clamped to last (finite data where P will be 0)."""
    row = _row_offsets(pages, start, last, stride_cp, stride_cs, kv_off, BL, ROW_L, PAGE_SIZE, OFF_TY)
    return gl.load(c_ptr + row[:, None] + d[None, :])


@gluon.jit
def _scales(s_ptr, pages, start, stride_xp, stride_xs, scale_off, BL: gl.constexpr, ROWS_L: gl.constexpr,
            PAGE_SIZE: gl.constexpr, OFF_TY: gl.constexpr):
    """A tile's K or V scales [BLOCK_N] (score-row layout; pages: K's). Tokens are not clamped, so a
    lane's four are one vector load; past the split they are other slots of a real page, junk the
    caller masks."""
    blk = gl.arange(0, 8, layout=gl.SliceLayout(1, BL))
    j = gl.arange(0, 4, layout=gl.SliceLayout(0, BL))
    xrow = (_per_token(pages, PAGE_SIZE).to(OFF_TY) * stride_xp
            + ((start + 4 * blk[:, None] + j[None, :]) % PAGE_SIZE) * stride_xs + scale_off)
    return _rows_order(gl.load(s_ptr + xrow), ROWS_L).to(gl.float32)


@gluon.jit
def _fp8_decode_kernel(q_ptr, kc_ptr, vc_ptr, ks_ptr, vs_ptr, pt_ptr, lens_ptr, out_ptr, mid_o_ptr, mid_lse_ptr,
                       qk_scale,
                       stride_qb, stride_qh, stride_cp, stride_cs, stride_ch, stride_xp, stride_xs, stride_xh,
                       stride_ptb, stride_ob, stride_oh, num_splits,
                       GROUP: gl.constexpr, HEADS: gl.constexpr, HEAD_DIM: gl.constexpr, PAGE_SIZE: gl.constexpr,
                       BLOCK_N: gl.constexpr, SPLIT: gl.constexpr, OFF_64: gl.constexpr, E5M2: gl.constexpr):
    DBITS: gl.constexpr = _log2(HEAD_DIM)
    LOG_VEC: gl.constexpr = _v_log_vec(HEAD_DIM)
    K_PERM: gl.constexpr = _relabel_perm(_k_bits(DBITS))
    V_PERM: gl.constexpr = _relabel_perm(_v_bits(DBITS, LOG_VEC))
    MMA: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[1, 1], instr_shape=[16, 8])
    OP_A: gl.constexpr = gl.DotOperandLayout(0, MMA, 2)
    OP_B: gl.constexpr = gl.DotOperandLayout(1, MMA, 2)
    ROWS_L: gl.constexpr = gl.SliceLayout(1, MMA)  # tokens of S^T, head-dim of O^T
    COLS_L: gl.constexpr = gl.SliceLayout(0, MMA)  # heads
    LK: gl.constexpr = gl.BlockedLayout([1, 16], [8, 4], [1, 1], [1, 0])  # q (and K) rows as bytes
    LKW: gl.constexpr = _k_word_layout(BLOCK_N, HEAD_DIM)  # LK in words
    LVW: gl.constexpr = _v_word_layout(BLOCK_N, HEAD_DIM)
    OFF_TY: gl.constexpr = gl.int64 if OFF_64 else gl.int32
    gl.static_assert(BLOCK_N == 32, "tiles are 8 blocks of 4 tokens")
    K_ROWS: gl.constexpr = gl.SliceLayout(1, LKW)
    V_ROWS: gl.constexpr = gl.SliceLayout(1, LVW)
    KB: gl.constexpr = _block_layout([3, 4], [-1, -1, 0, 1, 2])  # K rows = score rows (lanes 2-4: row bits 0-2)
    VB: gl.constexpr = _block_layout([0, 3, 4], [1, 2, -1, -1, -1])  # V^T columns (_v_word_layout's tokens)

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
    kd = gl.arange(0, HEAD_DIM // 4, layout=gl.SliceLayout(0, LKW))
    vd = gl.arange(0, HEAD_DIM // 4, layout=gl.SliceLayout(0, LVW))
    rows = gl.arange(0, BLOCK_N, layout=ROWS_L)
    row_tok = 4 * (rows % 8) + rows // 8  # token (within the tile) of score row r and of V^T column r
    last = hi - 1

    kpage = _tile_pages(pt_row, lo, last, KB, PAGE_SIZE)
    vpage = _tile_pages(pt_row, lo, last, VB, PAGE_SIZE)
    kw = _words(kc_ptr, kpage, lo, last, kd, stride_cp, stride_cs, kv_off, KB, K_ROWS, PAGE_SIZE, OFF_TY)
    k_s = _scales(ks_ptr, kpage, lo, stride_xp, stride_xs, scale_off, KB, ROWS_L, PAGE_SIZE, OFF_TY)
    vw = _words(vc_ptr, vpage, lo, last, vd, stride_cp, stride_cs, kv_off, VB, V_ROWS, PAGE_SIZE, OFF_TY)
    v_s = _scales(vs_ptr, kpage, lo, stride_xp, stride_xs, scale_off, KB, ROWS_L, PAGE_SIZE, OFF_TY)
    kpage = _tile_pages(pt_row, lo + BLOCK_N, last, KB, PAGE_SIZE)
    vpage = _tile_pages(pt_row, lo + BLOCK_N, last, VB, PAGE_SIZE)
    for t in range(gl.cdiv(hi - lo, BLOCK_N)):
        start = lo + t * BLOCK_N
        nxt = start + BLOCK_N
        # K of tile t+1 is loaded now, its V once K of tile t is consumed: fewer live registers
        # (168, three warps per SM sub-partition, against 200 when both load here).
        nkw = _words(kc_ptr, kpage, nxt, last, kd, stride_cp, stride_cs, kv_off, KB, K_ROWS, PAGE_SIZE, OFF_TY)
        nk_s = _scales(ks_ptr, kpage, nxt, stride_xp, stride_xs, scale_off, KB, ROWS_L, PAGE_SIZE, OFF_TY)
        k_a = gl.convert_layout(_relabel(_to_f16(kw, E5M2), K_PERM, BLOCK_N, HEAD_DIM), OP_A,
                                assert_trivial=True)  # [BLOCK_N, D]
        s = mma_v2(k_a, q_t, gl.zeros([BLOCK_N, HEADS], gl.float32, MMA))  # S^T [BLOCK_N, HEADS]
        nvw = _words(vc_ptr, vpage, nxt, last, vd, stride_cp, stride_cs, kv_off, VB, V_ROWS, PAGE_SIZE, OFF_TY)
        nv_s = _scales(vs_ptr, kpage, nxt, stride_xp, stride_xs, scale_off, KB, ROWS_L, PAGE_SIZE, OFF_TY)
        kpage = _tile_pages(pt_row, nxt + BLOCK_N, last, KB, PAGE_SIZE)
        vpage = _tile_pages(pt_row, nxt + BLOCK_N, last, VB, PAGE_SIZE)
        valid = start + row_tok < hi
        s = gl.where(valid[:, None], s * (k_s * score_scale)[:, None], float("-inf"))
        m_new = gl.maximum(m_i, gl.max(s, axis=0))
        alpha = gl.exp2(m_i - m_new)
        p = gl.exp2(s - m_new[None, :])
        l_i = l_i * alpha + gl.sum(p, axis=0)
        v_s = gl.where(valid, v_s, 0.0)  # junk past the split (see _scales)
        v_max = gl.max(v_s, axis=0)
        v_unit = gl.where(v_max > 1e-30, v_max, 1.0)  # a subnormal unit would make acc_unit / v_unit inf
        p = p * (v_s * (1.0 / v_unit))[:, None]
        acc = acc * (alpha * (acc_unit / v_unit))[None, :]
        acc_unit = v_unit
        v_a = gl.convert_layout(gl.permute(_relabel(_to_f16(vw, E5M2), V_PERM, BLOCK_N, HEAD_DIM), [1, 0]),
                                OP_A)  # V^T [D, BLOCK_N]
        acc = mma_v2(v_a, gl.convert_layout(p.to(gl.float16), OP_B), acc)
        m_i = m_new
        kw, vw, k_s, v_s = nkw, nvw, nk_s, nv_s

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
    """Arguments as checked by paged_decode (which also runs the merge when num_splits > 1);
    qk_scale includes log2(e)."""
    B, hq, d = q.shape
    hkv = k_cache.shape[2]
    group = hq // hkv
    kw, vw = k_cache.view(torch.int32), v_cache.view(torch.int32)  # [P, S, Hkv, D / 4] words
    off64 = fp8_offsets_64(k_cache, k_scale)
    wide = num_splits == 1 and fp8_wide_launch(B * hkv, sm_count(q.device))
    _fp8_decode_kernel[(hkv, B, num_splits)](
        q, kw, vw, k_scale, v_scale, page_table, seq_lens, out, mid_o, mid_lse, qk_scale,
        q.stride(0), q.stride(1), kw.stride(0), kw.stride(1), kw.stride(2),
        k_scale.stride(0), k_scale.stride(1), k_scale.stride(2), page_table.stride(0), out.stride(0), out.stride(1),
        num_splits, GROUP=group, HEADS=8 if group <= 8 else 16, HEAD_DIM=d, PAGE_SIZE=k_cache.shape[1],
        BLOCK_N=BLOCK_N, SPLIT=num_splits > 1, OFF_64=off64, E5M2=k_cache.dtype == torch.float8_e5m2,
        num_warps=1, maxnreg=max_registers(d, group, off64, wide, k_cache.shape[1]))
