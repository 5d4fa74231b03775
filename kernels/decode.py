"""paged_decode: one query token per sequence attending to its whole paged KV (flash-decoding).

Grid (Hkv, B, num_splits). A program owns one KV head of one sequence and all the query
heads that share it (the GQA group, padded to BLOCK_H >= 16 rows so q.K^T and P.V are tensor-
core dots and each K/V byte is read once). The sequence is cut into num_splits token ranges;
tiles of BLOCK_N tokens are independent of the page size (each token looks its page up).
With one split the program writes the output; otherwise each split writes its normalised
partial output and log-sum-exp, and `_merge_kernel` combines them.

FP8 caches are dequantised in-kernel: K/V tiles are converted to q's dtype, the per-token
scales multiply the score columns (K) and the probabilities (V); accumulation stays fp32.
INT4/INT2 caches (uint8 bit-planes + float16 (scale, zero) per group, kernels/intq.py) run decode_int.py's
kernel (the group scales folded into the scores).
Where dispatch.fp8_decode_gluon holds (FP8 pages on sm_89+ GPUs, shapes it takes), FP8 launches
without an explicit config go to paged_decode_fp8's Gluon kernel instead (same outputs, faster than
bf16 decode; figures in benchmarks/RESULTS.md). Likewise INT4 pages of head_dim 64 or 128 (KVStore's)
go to paged_decode_int4's (decode_int4_gluon.py) where dispatch.int4_decode_gluon holds.
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl
from torch import Tensor

from .checks import check_paged_args, host_float, host_int
from .decode_int import launch_int
from .dispatch import fp8_decode_gluon, int4_decode_gluon
from .launch import (LOG2E, KernelConfig, KernelKind, LayerLaunch, default_config, for_device, launch_options,
                     merge_warps)


@triton.jit
def _decode_kernel(q_ptr, kc_ptr, vc_ptr, ks_ptr, vs_ptr, pt_ptr, lens_ptr, out_ptr, mid_o_ptr, mid_lse_ptr,
            qk_scale,
            stride_qb, stride_qh, stride_qd,
            stride_cp, stride_cs, stride_ch, stride_cd,
            stride_xp, stride_xs, stride_xh,
            stride_ptb, stride_ob, stride_oh, stride_od, num_splits,
            GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, PAGE_SIZE: tl.constexpr,
            BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
            SPLIT: tl.constexpr, IS_FP8: tl.constexpr, K_FIRST: tl.constexpr, DOT_PRECISION: tl.constexpr):
    kvh = tl.program_id(0)  # heads of one row are launch neighbours: they share FP8 scale sectors in L2
    b = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(lens_ptr + b)
    # Tile-aligned token range of this split.
    per_split = tl.cdiv(tl.cdiv(seq_len, num_splits), BLOCK_N) * BLOCK_N
    lo = split * per_split
    hi = tl.minimum(lo + per_split, seq_len)

    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_D)
    heads = kvh * GROUP + offs_h
    h_mask = offs_h < GROUP
    d_mask = offs_d < HEAD_DIM
    q = tl.load(q_ptr + b * stride_qb + heads[:, None] * stride_qh + offs_d[None, :] * stride_qd,
                mask=h_mask[:, None] & d_mask[None, :], other=0.0)  # q: [BLOCK_H, BLOCK_D]

    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_D], tl.float32)
    pt_row = pt_ptr + b * stride_ptb
    kv_head = kvh * stride_ch
    for start in range(0, hi - lo, BLOCK_N):
        offs_n = lo + start + tl.arange(0, BLOCK_N)
        n_mask = offs_n < hi
        page = tl.load(pt_row + offs_n // PAGE_SIZE, mask=n_mask, other=0).to(tl.int64)
        row = page * stride_cp + (offs_n % PAGE_SIZE) * stride_cs + kv_head  # [BLOCK_N]
        kv_mask = n_mask[:, None] & d_mask[None, :]
        k = tl.load(kc_ptr + row[:, None] + offs_d[None, :] * stride_cd, mask=kv_mask, other=0.0)  # [BLOCK_N, BLOCK_D]
        v = tl.load(vc_ptr + row[:, None] + offs_d[None, :] * stride_cd, mask=kv_mask, other=0.0)
        if K_FIRST:  # K as the dot's first operand, in its memory order (no transposed 8-bit loads)
            qk = tl.trans(tl.dot(k.to(q.dtype), tl.trans(q), input_precision=DOT_PRECISION))
        else:
            qk = tl.dot(q, tl.trans(k.to(q.dtype)), input_precision=DOT_PRECISION)  # [BLOCK_H, BLOCK_N]
        if IS_FP8:
            xrow = page * stride_xp + (offs_n % PAGE_SIZE) * stride_xs + kvh * stride_xh
            k_s = tl.load(ks_ptr + xrow, mask=n_mask, other=0.0).to(tl.float32)
            v_s = tl.load(vs_ptr + xrow, mask=n_mask, other=0.0).to(tl.float32)
            qk = qk * (k_s * qk_scale)[None, :]
        else:
            qk = qk * qk_scale
        qk = tl.where(n_mask[None, :], qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, axis=1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(qk - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        if IS_FP8:
            p = p * v_s[None, :]
        acc = acc * alpha[:, None]
        acc += tl.dot(p.to(q.dtype), v.to(q.dtype), input_precision=DOT_PRECISION)
        m_i = m_new

    out_mask = h_mask[:, None] & d_mask[None, :]
    l_safe = tl.where(l_i > 0, l_i, 1.0)
    o = acc / l_safe[:, None]
    if not SPLIT:
        tl.store(out_ptr + b * stride_ob + heads[:, None] * stride_oh + offs_d[None, :] * stride_od,
                 o.to(out_ptr.dtype.element_ty), mask=out_mask)
    else:
        # mid_o: [B, Hq, num_splits, BLOCK_D] fp32, mid_lse: [B, Hq, num_splits] fp32 (log2 units), contiguous
        hq = tl.num_programs(0) * GROUP
        base = (b * hq + heads) * num_splits + split  # [BLOCK_H]
        tl.store(mid_o_ptr + base[:, None].to(tl.int64) * BLOCK_D + offs_d[None, :], o, mask=out_mask)
        lse = tl.where(l_i > 0, m_i + tl.log2(l_safe), float("-inf"))
        tl.store(mid_lse_ptr + base, lse, mask=h_mask)


@triton.jit
def _merge_kernel(mid_o_ptr, mid_lse_ptr, out_ptr, stride_ob, stride_oh, stride_od,
                  num_splits, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_S: tl.constexpr):
    b = tl.program_id(0)
    h = tl.program_id(1)
    row = b * tl.num_programs(1) + h
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    s_mask = offs_s < num_splits
    lse = tl.load(mid_lse_ptr + row * num_splits + offs_s, mask=s_mask, other=float("-inf"))  # [BLOCK_S]
    w = tl.exp2(lse - tl.max(lse, axis=0))
    o = tl.load(mid_o_ptr + (row.to(tl.int64) * num_splits + offs_s[:, None]) * BLOCK_D + offs_d[None, :],
                mask=s_mask[:, None], other=0.0)  # [BLOCK_S, BLOCK_D]
    merged = tl.sum(o * w[:, None], axis=0) / tl.sum(w, axis=0)
    tl.store(out_ptr + b * stride_ob + h * stride_oh + offs_d * stride_od,
             merged.to(out_ptr.dtype.element_ty), mask=offs_d < HEAD_DIM)


def paged_decode(q: Tensor, k_cache: Tensor, v_cache: Tensor, page_table: Tensor, seq_lens: Tensor,
                 sm_scale: float | None = None, k_scale: Tensor | None = None, v_scale: Tensor | None = None,
                 num_splits: int = 1, config: KernelConfig | None = None, out: Tensor | None = None) -> Tensor:
    """q: [B, Hq, D] (the last token of each sequence) over pages -> [B, Hq, D] in q's dtype.

    page_table int32 [B, max_pages], seq_lens int32 [B] (>= 1). num_splits > 1 cuts each sequence
    into that many ranges (flash-decoding) merged by a second kernel; it is a launch parameter so
    the caller (PagedAttention.plan) picks it without a host sync here. `out` (optional, like q) is
    written in place, for CUDA-graph capture and for tests that poison it first.

    Values (checks.check_page_values): on CPU, seq_lens[b] in [1, max_pages * page_size] and the page
    ids of row b's first ceil(seq_lens[b] / page_size) entries in [0, num_pages) are checked before
    the launch (IndexValueError). On CUDA they are the caller's duty (no host sync here): out of
    range, the kernel reads outside the caches; seq_lens 0 gives zeros, or NaN when split.
    """
    return decode_launcher(q, k_cache, v_cache, page_table, seq_lens, sm_scale, k_scale, v_scale, num_splits,
                           config, out)(q, k_cache, v_cache, k_scale, v_scale)



def decode_launcher(q: Tensor, k_cache: Tensor, v_cache: Tensor, page_table: Tensor, seq_lens: Tensor,
                    sm_scale: float | None = None, k_scale: Tensor | None = None, v_scale: Tensor | None = None,
                    num_splits: int = 1, config: KernelConfig | None = None,
                    out: Tensor | None = None) -> LayerLaunch:
    """paged_decode with its checks and choices made once: returns launch(q, k_cache, v_cache, k_scale, v_scale,
    out=None) -> out, to call with tensors like the ones checked here (the same shapes, dtypes, strides and
    device: each layer's caches of one KVStore, a step's q buffer), e.g. once a layer for a step
    (PagedAttention). The split buffers are allocated once and reused, in stream order. The output: the call's
    `out` (like q), else the launcher's, else a new one each call."""
    page_table, seq_lens, fp8, bits = check_paged_args("paged_decode", q, k_cache, v_cache, page_table, seq_lens,
                                                        k_scale, v_scale, min_seq_len=1)
    B, hq, d = q.shape
    if B != page_table.shape[0]:
        raise ValueError(f"paged_decode: q has {B} rows, page_table {page_table.shape[0]}")
    num_splits = host_int("paged_decode", "num_splits", num_splits, lo=1)
    sm_scale = 1.0 / math.sqrt(d) if sm_scale is None else host_float("paged_decode", "sm_scale", sm_scale)
    if out is not None and (not isinstance(out, torch.Tensor) or out.shape != q.shape or out.dtype != q.dtype
                            or out.device != q.device):
        raise ValueError(f"paged_decode: out must match q: {tuple(q.shape)} {q.dtype} on {q.device}")
    given = out
    if B == 0:
        return lambda q, k_cache, v_cache, k_scale, v_scale, out=None: (
            out if out is not None else torch.empty_like(q) if given is None else given)
    gluon_fp8 = fp8 and config is None and fp8_decode_gluon(q, k_cache, v_cache, out if out is not None else q)
    gluon_int4 = bits == 4 and config is None and int4_decode_gluon(q, k_cache, v_cache, k_scale, v_scale,
                                                                   out if out is not None else q)
    config = config or default_config(KernelKind.DECODE, q, k_cache)
    block_d = max(16, triton.next_power_of_2(d))
    mid_o = mid_lse = None
    if num_splits > 1:
        mid_o = torch.empty(B, hq, num_splits, block_d, dtype=torch.float32, device=q.device)
        mid_lse = torch.empty(B, hq, num_splits, dtype=torch.float32, device=q.device)
    merge = None
    if num_splits > 1:
        block_s = max(2, triton.next_power_of_2(num_splits))
        merge = (for_device(_merge_kernel, q.device)[(B, hq)],
                 dict(HEAD_DIM=d, BLOCK_D=block_d, BLOCK_S=block_s,
                      **({"num_warps": merge_warps(block_s, block_d)} if q.device.type == "cuda" else {})))
    qk_scale = sm_scale * LOG2E

    def launch(q: Tensor, k_cache: Tensor, v_cache: Tensor, k_scale: Tensor | None, v_scale: Tensor | None,
               out: Tensor | None = None) -> Tensor:
        if out is None:
            out = torch.empty_like(q) if given is None else given
        mo, ml = (mid_o, mid_lse) if mid_o is not None else (out, out)  # placeholders, never touched with one split
        if gluon_int4:
            from .decode_int4_gluon import launch as launch_int4

            launch_int4(q, k_cache, v_cache, k_scale, v_scale, page_table, seq_lens, qk_scale, num_splits, out,
                        mo, ml)
        elif bits:
            launch_int(q, k_cache, v_cache, k_scale, v_scale, page_table, seq_lens, sm_scale, num_splits, out,
                       mo, ml, config, bits)
        elif gluon_fp8:
            from .decode_fp8_gluon import launch as launch_fp8

            launch_fp8(q, k_cache, v_cache, k_scale, v_scale, page_table, seq_lens, qk_scale, num_splits, out,
                       mo, ml)
        else:
            _launch_triton(q, k_cache, v_cache, k_scale, v_scale, page_table, seq_lens, sm_scale, num_splits, out,
                           mo, ml, config, fp8)
        if merge is not None:
            merge[0](mo, ml, out, *out.stride(), num_splits, **merge[1])
        return out
    return launch


def _launch_triton(q: Tensor, k_cache: Tensor, v_cache: Tensor, k_scale: Tensor | None, v_scale: Tensor | None,
                   page_table: Tensor, seq_lens: Tensor, sm_scale: float, num_splits: int, out: Tensor,
                   mid_o: Tensor, mid_lse: Tensor, config: KernelConfig, fp8: bool) -> None:
    B, hq, d = q.shape
    hkv = k_cache.shape[2]
    group = hq // hkv
    block_d = max(16, triton.next_power_of_2(d))
    xs = k_scale.stride() if fp8 else (0, 0, 0)
    args = (q, k_cache, v_cache, k_scale if fp8 else k_cache, v_scale if fp8 else v_cache, page_table, seq_lens,
            out, mid_o, mid_lse, sm_scale * LOG2E,
            *q.stride(), *k_cache.stride(), *xs, page_table.stride(0), *out.stride(), num_splits)
    common = dict(GROUP=group, HEAD_DIM=d, PAGE_SIZE=k_cache.shape[1], BLOCK_D=block_d, BLOCK_N=config.block_n,
                  SPLIT=num_splits > 1, IS_FP8=fp8, **launch_options(config, q.device))
    for_device(_decode_kernel, q.device)[(hkv, B, num_splits)](
        *args, BLOCK_H=max(16, triton.next_power_of_2(group)), K_FIRST=config.k_first,
        DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32", **common)
