"""paged_prefill on Hopper (sm_90): the extend kernel in Gluon, for 16-bit q over 16-bit, FP8 or INT4 pages.

Triton's code for paged_prefill's 256 x 64 tile (two warpgroups of one program, 255 registers, one
program an SM) meets at a barrier every key tile, so softmax never runs under the other warpgroup's
matrix products. Here a program of 128 query rows is two warpgroups of 64 rows each, capped at 128
registers:

- K/V tiles of 64 keys are gathered page by page with cp.async into NVMMA-swizzled shared memory
  (two buffers), q stays in shared memory, q.K^T and P.V run on async wgmma with P from registers;
  each warpgroup's accumulator is 64 x 128 (64 registers a thread).
- Two programs fit an SM (128 registers, 96 KB of shared memory each) and run independently (a
  program's barrier spans its own eight warps), so one's softmax overlaps the other's products.
  This shape beat the Triton kernel and the alternatives tried (one warpgroup of 128 rows at 255
  registers, 128 x 128 tiles at one program an SM, 256 rows in 16 warps, 32-key tiles); the figures
  are in benchmarks/RESULTS.md.
- Blocks go heaviest first; keys below every row of the block skip the causal mask.
- FP8 pages (KVStore's: per-token-per-head scales): tiles of FP8_BLOCK_N keys are copied as bytes
  (cp.async, 16-byte pieces, two buffers); then each thread loads its rows' scales and widens its
  rows to fp16 times the scale (a packed e4m3/e5m2 -> f16x2 convert, exact, and one fp16 product,
  rounded once), 32 rows at a time, into one fp16 K and V buffer that the products read. 64-key tiles
  beat 32 (which spill no registers; 64 spill ~80 bytes); widening V while q.K^T runs was slower (twice).
- INT4 pages (KVStore's at head_dim 128: 64 bytes a row, byte j holding values j and 64 + j, one
  (scale, zero) pair a plane a token): 64-key tiles of packed bytes are copied the same way, then
  dequantised in fp16 as (c - 8) s + (z + 8 s): a byte permute and a mask put two codes in the
  fp16 pair 1024 + c, a subtraction centres them (exact), one fp16 fma rounds once.
- Over FP8 and INT4 pages every product runs in fp16 (q is converted once, P rounded to fp16): fp16
  keeps 3 more mantissa bits than bf16, and widening into it skips fp32: a 64-key tile's loop runs
  274 (INT4) / 97 (FP8) sm_90 instructions a thread beyond the bf16 kernel's 604, against 428 / 229
  when it widened into bf16 through fp32 (benchmarks/RESULTS.md, "Extends over FP8 and INT4 pages in
  fp16": INT4 0.68 -> 0.77 of the bf16 kernel's TFLOP/s, FP8 0.71-0.77 -> 0.74-0.81). q, K or V values
  above fp16's 65,504 would overflow (not checked at run time; Llama-family q/K/V stay far below), and FP8
  scales must be float16 (dispatch.hopper_prefill_supported: a float32
  scale would be rounded once more; those pages take the Triton kernel).

Same contract and results as paged_prefill's Triton kernel (fp32 accumulation, qk_scale in the
exponent): over 16-bit pages, on the H200 the two gave bit-identical outputs on 40 random ragged
cases (page sizes 1-64, GQA groups 1-8, head-major pages, strided q/out, rows of 0-1000 new tokens) and on the 16 that
kernel_checks.py runs in every benchmark (also page sizes 3 and 24, 65-128 new tokens).
paged_prefill dispatches here when dispatch.hopper_prefill_supported holds, unless
RADIXKV_HOPPER_PREFILL=0.
"""
from __future__ import annotations

import torch
from torch import Tensor
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    warpgroup_mma,
    warpgroup_mma_wait,
)

_barrier = gl.barrier if hasattr(gl, "barrier") else gl.thread_barrier  # Triton 3.9 / 3.6 names
_async_load = getattr(async_copy, "async_load", None) or async_copy.async_copy_global_to_shared


@gluon.jit
def _issue(k_smem, v_smem, buf, kc_ptr, vc_ptr, pt_row, k_lo, seq_len, kv_off, stride_cp, stride_cs,
           LOAD_L: gl.constexpr, BLOCK_N: gl.constexpr, ROW: gl.constexpr, PAGE_SIZE: gl.constexpr):
    """Gather the K and V rows [BLOCK_N, ROW] (ROW elements: D, or D / 2 packed INT4 bytes) of keys k_lo..
    into buffer buf (cp.async, one commit group); keys at or past seq_len (the caller's end of visible
    keys) are zero-filled."""
    offs_n = k_lo + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, LOAD_L))
    offs_d = gl.arange(0, ROW, layout=gl.SliceLayout(0, LOAD_L))
    n_ok = offs_n < seq_len
    page = gl.load(pt_row + offs_n // PAGE_SIZE, mask=n_ok, other=0).to(gl.int64)
    row = page * stride_cp + (offs_n % PAGE_SIZE) * stride_cs + kv_off
    mask = n_ok[:, None] & (offs_d < ROW)[None, :]
    _async_load(k_smem.index(buf), kc_ptr + row[:, None] + offs_d[None, :], mask=mask)
    _async_load(v_smem.index(buf), vc_ptr + row[:, None] + offs_d[None, :], mask=mask)
    async_copy.commit_group()


@gluon.jit
def _row_scales(ks_ptr, vs_ptr, pt_row, k_lo, seq_len, scale_off, stride_xp, stride_xs,
                LOAD_L: gl.constexpr, BLOCK_N: gl.constexpr, PAGE_SIZE: gl.constexpr):
    """FP8 scales (k, v) [BLOCK_N] of keys k_lo.., one per row of a tile in LOAD_L; 0 at or past seq_len."""
    offs_n = k_lo + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, LOAD_L))
    ok = offs_n < seq_len
    page = gl.load(pt_row + offs_n // PAGE_SIZE, mask=ok, other=0).to(gl.int64)
    row = page * stride_xp + (offs_n % PAGE_SIZE) * stride_xs + scale_off
    return gl.load(ks_ptr + row, mask=ok, other=0.0), gl.load(vs_ptr + row, mask=ok, other=0.0)


@gluon.jit
def _tile_scales(ks_ptr, vs_ptr, pt_row, k_lo, seq_len, scale_off, stride_xp, stride_xs,
                 LOAD_L: gl.constexpr, PIECE: gl.constexpr, TWO: gl.constexpr, PAGE_SIZE: gl.constexpr):
    """A tile's scales by pieces of PIECE keys: k and v of keys k_lo.. and, if TWO, of keys k_lo + PIECE..
    (else the first piece's again, unused)."""
    k0, v0 = _row_scales(ks_ptr, vs_ptr, pt_row, k_lo, seq_len, scale_off, stride_xp, stride_xs, LOAD_L, PIECE,
                         PAGE_SIZE)
    if TWO:
        k1, v1 = _row_scales(ks_ptr, vs_ptr, pt_row, k_lo + PIECE, seq_len, scale_off, stride_xp, stride_xs,
                             LOAD_L, PIECE, PAGE_SIZE)
    else:
        k1, v1 = k0, v0
    return k0, v0, k1, v1


@gluon.jit
def _widen(op_smem, smem, lo, scale, LOAD_L: gl.constexpr, PIECE: gl.constexpr):
    """op_smem = smem * scale[:, None] in fp16 for rows lo : lo + PIECE of an FP8 tile [BLOCK_N, D]: a packed
    convert (exact) and an fp16 product (rounded once) per two values."""
    x = smem.slice(lo, PIECE).load(LOAD_L).to(gl.float16)
    op_smem.slice(lo, PIECE).store(x * scale.to(gl.float16)[:, None])


@gluon.jit
def _int4_pairs(x_ptr, pt_row, k_lo, seq_len, scale_off, stride_xp, stride_xs, LOAD_L: gl.constexpr,
                BLOCK_N: gl.constexpr, PAGE_SIZE: gl.constexpr):
    """INT4 (scale, zero) of both planes, (s0, z0, s1, z1) fp32 [BLOCK_N] each, of keys k_lo.. (x_ptr: the
    pairs as fp16 [P, S, Hkv, 4]); 0 at or past seq_len."""
    offs_n = k_lo + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, LOAD_L))
    ok = offs_n < seq_len
    page = gl.load(pt_row + offs_n // PAGE_SIZE, mask=ok, other=0).to(gl.int64)
    at = x_ptr + page * stride_xp + (offs_n % PAGE_SIZE) * stride_xs + scale_off
    return (gl.load(at, mask=ok, other=0.0).to(gl.float32), gl.load(at + 1, mask=ok, other=0.0).to(gl.float32),
            gl.load(at + 2, mask=ok, other=0.0).to(gl.float32), gl.load(at + 3, mask=ok, other=0.0).to(gl.float32))


@gluon.jit
def _int4_codes(x):
    """uint8 [N, W] of packed INT4 bytes -> (low nibbles, high nibbles) as fp16 [N, W] each, centred:
    code c as c - 8, exactly (a byte permute, a mask into the fp16 1024 + c and a subtraction per two)."""
    return gl.inline_asm_elementwise(
        "{ .reg .b32 a, b, m, c; mov.b32 m, 0x64006400; mov.b32 c, 0x64086408; "
        "prmt.b32 a, $4, 0, 0x4140; prmt.b32 b, $4, 0, 0x4342; "
        "lop3.b32 $0, a, 0x000F000F, m, 0xea; sub.f16x2 $0, $0, c; lop3.b32 $1, b, 0x000F000F, m, 0xea; "
        "sub.f16x2 $1, $1, c; shr.b32 a, a, 4; shr.b32 b, b, 4; lop3.b32 $2, a, 0x000F000F, m, 0xea; "
        "sub.f16x2 $2, $2, c; lop3.b32 $3, b, 0x000F000F, m, 0xea; sub.f16x2 $3, $3, c; }",
        "=r,=r,=r,=r,r", [x], dtype=(gl.float16, gl.float16), is_pure=True, pack=4)


@gluon.jit
def _widen_int4(op_smem, smem, s0, z0, s1, z1, LOAD_L: gl.constexpr):
    """op_smem [BLOCK_N, D] = the INT4 tile smem [BLOCK_N, D / 2] dequantised in fp16: (c - 8) s + (z + 8 s),
    one fp16 fma (rounded once) per value; byte j of a row holds value j (low nibble, plane 0) and D / 2 + j
    (high, plane 1)."""
    lo, hi = _int4_codes(smem.load(LOAD_L))
    lo = lo * s0.to(gl.float16)[:, None] + (z0 + 8.0 * s0).to(gl.float16)[:, None]
    hi = hi * s1.to(gl.float16)[:, None] + (z1 + 8.0 * s1).to(gl.float16)[:, None]
    n: gl.constexpr = lo.shape[0]
    w: gl.constexpr = lo.shape[1]
    op_smem.store(gl.reshape(gl.permute(gl.join(lo, hi), [0, 2, 1]), [n, 2 * w]))


@gluon.jit
def _extend_kernel(q_ptr, kc_ptr, vc_ptr, ks_ptr, vs_ptr, pt_ptr, lens_ptr, qstart_ptr, qlens_ptr, out_ptr, lse_ptr,
                   qk_scale, stride_qt, stride_qh, stride_cp, stride_cs, stride_ch, stride_xp, stride_xs, stride_xh,
                   stride_ptb, stride_ot, stride_oh, stride_lt, stride_lh,
                   GROUP: gl.constexpr, HEAD_DIM: gl.constexpr, PAGE_SIZE: gl.constexpr, IS_FP8: gl.constexpr,
                   IS_INT4: gl.constexpr, WRITE_LSE: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, WARPS: gl.constexpr):
    S_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[WARPS, 1], instr_shape=[16, BLOCK_N, 16])
    O_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[WARPS, 1], instr_shape=[16, HEAD_DIM, 16])
    P_OP: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=O_L, k_width=2)
    Q_L: gl.constexpr = gl.BlockedLayout([1, 8], [2, 16], [WARPS, 1], [1, 0])  # 16-byte vectors of q
    DTYPE: gl.constexpr = q_ptr.dtype.element_ty
    KV_DT: gl.constexpr = kc_ptr.dtype.element_ty  # DTYPE, an FP8 type, or uint8 (INT4: two values a byte)
    KV_VEC: gl.constexpr = 16 // KV_DT.primitive_bitwidth * 8  # elements in 16 bytes
    ROW: gl.constexpr = HEAD_DIM // 2 if IS_INT4 else HEAD_DIM  # elements of a stored row
    WIDEN: gl.constexpr = IS_FP8 or IS_INT4  # tiles are widened into fp16 buffers for the products
    # the products' operands (q, K, V, P): fp16 for widened tiles, else the pages' (fp16 pages under bf16 q:
    # dequant_pages' copies, q converted once)
    OP_DT: gl.constexpr = gl.float16 if WIDEN else KV_DT
    LOAD_L: gl.constexpr = gl.BlockedLayout([1, KV_VEC], [32 * KV_VEC // ROW, ROW // KV_VEC], [WARPS, 1], [1, 0])
    Q_SMEM: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_M, HEAD_DIM], OP_DT)
    KV_SMEM: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, HEAD_DIM], OP_DT)
    STAGE_SMEM: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, ROW], KV_DT)

    h = gl.program_id(0)
    b = gl.program_id(1)
    mblk = gl.num_programs(2) - 1 - gl.program_id(2)  # heaviest blocks first
    q_len = gl.load(qlens_ptr + b)
    if mblk * BLOCK_M < q_len:
        seq_len = gl.load(lens_ptr + b)
        q_s = gl.load(qstart_ptr + b)
        prefix = seq_len - q_len
        kvh = h // GROUP
        kv_off = kvh.to(gl.int64) * stride_ch
        scale_off = kvh.to(gl.int64) * stride_xh
        pt_row = pt_ptr + b * stride_ptb

        qm = mblk * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, Q_L))
        qd = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, Q_L))
        q = gl.load(q_ptr + (q_s + qm).to(gl.int64)[:, None] * stride_qt + h.to(gl.int64) * stride_qh + qd[None, :],
                    mask=(qm < q_len)[:, None], other=0.0)
        q_smem = gl.allocate_shared_memory(OP_DT, [BLOCK_M, HEAD_DIM], Q_SMEM, q.to(OP_DT))  # q: [BLOCK_M, D]
        # K/V tiles as stored [STAGES, BLOCK_N, ROW]; FP8 and INT4 ones are widened into k_op/v_op
        k_smem = gl.allocate_shared_memory(KV_DT, [STAGES, BLOCK_N, ROW], STAGE_SMEM)
        v_smem = gl.allocate_shared_memory(KV_DT, [STAGES, BLOCK_N, ROW], STAGE_SMEM)
        if WIDEN:
            k_op = gl.allocate_shared_memory(OP_DT, [BLOCK_N, HEAD_DIM], KV_SMEM)
            v_op = gl.allocate_shared_memory(OP_DT, [BLOCK_N, HEAD_DIM], KV_SMEM)

        rows = mblk * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, S_L))
        q_pos = prefix + rows  # [BLOCK_M] absolute positions of the rows
        first_masked = prefix + mblk * BLOCK_M  # keys below it are visible to every row
        end = gl.minimum(seq_len, prefix + (mblk + 1) * BLOCK_M)
        n_tiles = gl.cdiv(end, BLOCK_N)

        m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, gl.SliceLayout(1, S_L))
        l_i = gl.zeros([BLOCK_M], gl.float32, gl.SliceLayout(1, S_L))
        acc = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, O_L)  # O, unnormalised
        for s in gl.static_range(STAGES - 1):
            _issue(k_smem, v_smem, s, kc_ptr, vc_ptr, pt_row, s * BLOCK_N, end, kv_off, stride_cp, stride_cs,
                   LOAD_L, BLOCK_N, ROW, PAGE_SIZE)
        if IS_FP8:
            gl.static_assert(STAGES == 2)
            PIECE: gl.constexpr = 32 * KV_VEC * WARPS // HEAD_DIM  # the rows LOAD_L covers once
            gl.static_assert(BLOCK_N == PIECE or BLOCK_N == 2 * PIECE)
            TWO: gl.constexpr = BLOCK_N == 2 * PIECE
        if IS_INT4:
            gl.static_assert(STAGES == 2)
            gl.static_assert(BLOCK_N == 32 * KV_VEC * WARPS // ROW)  # LOAD_L covers a whole tile once
        for j in range(n_tiles):
            async_copy.wait_group(STAGES - 2)
            if not WIDEN:
                fence_async_shared()  # this thread's copies of tile j (and q) visible to wgmma's async proxy
            _barrier()  # ... everyone's; and everyone is done with the buffer the next issue reuses
            nj = j + STAGES - 1
            _issue(k_smem, v_smem, nj % STAGES, kc_ptr, vc_ptr, pt_row, nj * BLOCK_N, end, kv_off, stride_cp,
                   stride_cs, LOAD_L, BLOCK_N, ROW, PAGE_SIZE)
            buf = j % STAGES
            if IS_FP8:  # tile j times its scales, in fp16, for the products
                ks0, vs0, ks1, vs1 = _tile_scales(ks_ptr, vs_ptr, pt_row, j * BLOCK_N, end, scale_off, stride_xp,
                                                  stride_xs, LOAD_L, PIECE, TWO, PAGE_SIZE)
                _widen(k_op, k_smem.index(buf), 0, ks0, LOAD_L, PIECE)
                if TWO:
                    _widen(k_op, k_smem.index(buf), PIECE, ks1, LOAD_L, PIECE)
                _widen(v_op, v_smem.index(buf), 0, vs0, LOAD_L, PIECE)
                if TWO:
                    _widen(v_op, v_smem.index(buf), PIECE, vs1, LOAD_L, PIECE)
                fence_async_shared()
                _barrier()
                k_t = k_op
                v_t = v_op
            elif IS_INT4:  # tile j dequantised, in fp16, for the products
                s0, z0, s1, z1 = _int4_pairs(ks_ptr, pt_row, j * BLOCK_N, end, scale_off, stride_xp, stride_xs,
                                             LOAD_L, BLOCK_N, PAGE_SIZE)
                _widen_int4(k_op, k_smem.index(buf), s0, z0, s1, z1, LOAD_L)
                s0, z0, s1, z1 = _int4_pairs(vs_ptr, pt_row, j * BLOCK_N, end, scale_off, stride_xp, stride_xs,
                                             LOAD_L, BLOCK_N, PAGE_SIZE)
                _widen_int4(v_op, v_smem.index(buf), s0, z0, s1, z1, LOAD_L)
                fence_async_shared()
                _barrier()
                k_t = k_op
                v_t = v_op
            else:
                k_t = k_smem.index(buf)
                v_t = v_smem.index(buf)
            s_tok = warpgroup_mma(q_smem, k_t.permute((1, 0)),
                                  gl.zeros([BLOCK_M, BLOCK_N], gl.float32, S_L), use_acc=False, is_async=True)
            sc = warpgroup_mma_wait(0, deps=[s_tok])  # q.K^T [BLOCK_M, BLOCK_N]
            k_lo = j * BLOCK_N
            if k_lo + BLOCK_N > first_masked:
                keys = k_lo + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, S_L))
                sc = gl.where((keys[None, :] <= q_pos[:, None]) & (keys < end)[None, :], sc, float("-inf"))
            m_new = gl.maximum(m_i, gl.max(sc, axis=1) * qk_scale)
            alpha = gl.exp2(m_i - m_new)
            p = gl.exp2(sc * qk_scale - m_new[:, None])
            l_i = l_i * alpha + gl.sum(p, axis=1)
            acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, O_L))[:, None]
            p_op = gl.convert_layout(p.to(OP_DT), P_OP)
            o_tok = warpgroup_mma(p_op, v_t, acc, is_async=True)
            acc = warpgroup_mma_wait(0, deps=[o_tok])
            m_i = m_new
        async_copy.wait_group(0)

        l_safe = gl.where(l_i > 0, l_i, 1.0)
        o = acc / gl.convert_layout(l_safe, gl.SliceLayout(1, O_L))[:, None]
        om = mblk * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, O_L))
        od = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, O_L))
        gl.store(out_ptr + (q_s + om).to(gl.int64)[:, None] * stride_ot + h.to(gl.int64) * stride_oh + od[None, :],
                 o.to(DTYPE), mask=(om < q_len)[:, None])
        if WRITE_LSE:  # log2 units, -inf for a row with no key (paged_prefill's lse)
            lse = gl.where(l_i > 0, m_i + gl.log2(l_safe), float("-inf"))
            gl.store(lse_ptr + (q_s + rows).to(gl.int64) * stride_lt + h.to(gl.int64) * stride_lh, lse,
                     mask=rows < q_len)


BLOCK_M, BLOCK_N, STAGES, WARPS, MAX_REGISTERS = 128, 64, 2, 8, 128
FP8_BLOCK_N = 64  # keys a tile over FP8 pages


def launch(q: Tensor, k_cache: Tensor, v_cache: Tensor, page_table: Tensor, seq_lens: Tensor, q_start: Tensor,
           q_lens: Tensor, qk_scale: float, max_q_len: int, out: Tensor, k_scale: Tensor | None = None,
           v_scale: Tensor | None = None, lse: Tensor | None = None) -> None:
    """Arguments as checked by paged_prefill; qk_scale includes log2(e); k_scale, v_scale: FP8 pages' scales,
    or INT4 pages' (scale, zero) pairs [P, S, Hkv, 2, 2] (uint8 pages of head_dim / 2 bytes a row); lse:
    paged_prefill's optional float32 [T, Hq] log-sum-exp output."""
    if v_cache.stride() != k_cache.stride():  # the kernel reads both with k_cache's strides
        raise ValueError("paged_prefill_hopper: k_cache and v_cache must share strides")
    quant = k_scale is not None
    if quant and (v_scale is None or v_scale.stride() != k_scale.stride()):
        raise ValueError("paged_prefill_hopper: k_scale and v_scale must both be given and share strides")
    int4 = k_cache.dtype == torch.uint8
    if int4:  # a token-head's (s0, z0, s1, z1) as four fp16
        k_scale, v_scale = k_scale.flatten(3), v_scale.flatten(3)
    hq = q.shape[1]
    grid = (hq, page_table.shape[0], -(-max_q_len // BLOCK_M))
    xs = k_scale.stride()[:3] if quant else (0, 0, 0)
    _extend_kernel[grid](q, k_cache, v_cache, k_scale if quant else k_cache, v_scale if quant else v_cache,
                         page_table, seq_lens, q_start, q_lens, out, lse if lse is not None else out, qk_scale,
                         q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), *xs,
                         page_table.stride(0), out.stride(0), out.stride(1),
                         *(lse.stride() if lse is not None else (0, 0)),
                         GROUP=hq // k_cache.shape[2], HEAD_DIM=q.shape[2], PAGE_SIZE=k_cache.shape[1],
                         IS_FP8=quant and not int4, IS_INT4=int4, WRITE_LSE=lse is not None,
                         BLOCK_M=BLOCK_M, BLOCK_N=FP8_BLOCK_N if quant else BLOCK_N, STAGES=STAGES,
                         WARPS=WARPS, num_warps=WARPS,
                         maxnreg=MAX_REGISTERS)
