"""window_attention: each query against its `window` most recent keys held in full precision.

KIVI's recent-token window for quantised pages (radixkv/engine/kv_window.py keeps it): the K/V of
the pages that hold a running request's latest tokens are copied, in the compute dtype, into a small
pool of "shadow" pages beside the quantised store. A query at position t attends over keys
t - window + 1 .. t from that full-precision copy, and over keys 0 .. t - window from the quantised
pages (paged_decode_partial / paged_prefill with lse, shifted); the two states are merged
(cascade.merge_attention_states). This kernel computes the window state, and writes this step's new
K/V into the shadow pages (so a later step's window finds them):

    q [T, Hq, D], k, v [T, Hkv, D]: this step's tokens (Batch row order, ragged rows as paged_prefill)
    shadow_k, shadow_v [S + 1, page_size, Hkv, D] (q's dtype; page S is scratch for unmapped pages)
    shadow_of int32 [num_pages]: the shadow page of each KV page (S where there is none)
    page_table int32 [B, max_pages], seq_lens, q_start, q_lens int32 [B], token_rows int32 [T] (row of
    each token) -> o float32 [T, Hq, D], lse float32 [T, Hq] (log2 units, as the cascade states).

Key t - w of query t (w < window, t - w >= 0) comes from this step's k/v when it is one of the row's
new tokens, else from shadow page shadow_of[page_table[b, (t - w) // page_size]]: the caller maps
every such page first (KVWindow.prepare). Every query has at least its own key, so lse is finite.

With `sink` S > 0 (attention sinks: a sequence's first tokens, which draw much of every query's
attention), keys 0 .. min(S, t - window + 1) - 1 are the window's too, read the same way, and the page
attention covers S .. t - window only (radixkv.engine.attention.window_plan).
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl
from torch import Tensor

from .checks import check_tensor, host_float, host_int
from .launch import LOG2E, for_device


@triton.jit
def _keys(k_ptr, v_ptr, sk_ptr, sv_ptr, shadow_of_ptr, pt_row, pos, live, i, t, start, kvh, offs_d, d_mask,
          stride_kt, stride_kh, stride_sp, stride_ss, stride_sh, PAGE_SIZE: tl.constexpr):
    """K and V float32 [N, BLOCK_D] at key positions pos [N] of token i (position t; zero where not live):
    this step's rows for the row's new positions (>= start), the shadow pages for earlier ones."""
    fresh = live & (pos >= start)
    held = live & (pos < start)
    page = tl.load(pt_row + tl.where(held, pos, 0) // PAGE_SIZE, mask=held, other=0)
    shadow = tl.load(shadow_of_ptr + page, mask=held, other=0).to(tl.int64)
    s_off = shadow * stride_sp + (tl.where(held, pos, 0) % PAGE_SIZE) * stride_ss + kvh * stride_sh
    f_off = (i - tl.where(fresh, t - pos, 0)).to(tl.int64) * stride_kt + kvh * stride_kh
    m2 = d_mask[None, :]
    kw = tl.load(k_ptr + f_off[:, None] + offs_d[None, :], mask=fresh[:, None] & m2, other=0.0).to(tl.float32) \
        + tl.load(sk_ptr + s_off[:, None] + offs_d[None, :], mask=held[:, None] & m2, other=0.0).to(tl.float32)
    vw = tl.load(v_ptr + f_off[:, None] + offs_d[None, :], mask=fresh[:, None] & m2, other=0.0).to(tl.float32) \
        + tl.load(sv_ptr + s_off[:, None] + offs_d[None, :], mask=held[:, None] & m2, other=0.0).to(tl.float32)
    return kw, vw


@triton.jit
def _window_kernel(q_ptr, k_ptr, v_ptr, sk_ptr, sv_ptr, shadow_of_ptr, pt_ptr, lens_ptr, qstart_ptr, qlens_ptr,
                   rows_ptr, o_ptr, lse_ptr, qk_scale, window, sink,
                   stride_qt, stride_qh, stride_kt, stride_kh, stride_sp, stride_ss, stride_sh, stride_ptb,
                   stride_ot, stride_oh, stride_lt,
                   GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, PAGE_SIZE: tl.constexpr, BLOCK_G: tl.constexpr,
                   BLOCK_W: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr):
    i = tl.program_id(0)  # token
    kvh = tl.program_id(1)
    b = tl.load(rows_ptr + i)
    seq_len = tl.load(lens_ptr + b)
    q_len = tl.load(qlens_ptr + b)
    q_s = tl.load(qstart_ptr + b)
    start = seq_len - q_len  # the row's first new position
    t = start + (i - q_s)  # this token's position
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < HEAD_DIM
    pt_row = pt_ptr + b.to(tl.int64) * stride_ptb
    # this token's K/V into its page's shadow (the scratch page when unmapped)
    own = tl.load(shadow_of_ptr + tl.load(pt_row + t // PAGE_SIZE)).to(tl.int64) * stride_sp \
        + (t % PAGE_SIZE) * stride_ss + kvh * stride_sh + offs_d
    src = i.to(tl.int64) * stride_kt + kvh * stride_kh + offs_d
    tl.store(sk_ptr + own, tl.load(k_ptr + src, mask=d_mask), mask=d_mask)
    tl.store(sv_ptr + own, tl.load(v_ptr + src, mask=d_mask), mask=d_mask)
    offs_g = tl.arange(0, BLOCK_G)
    g_mask = offs_g < GROUP
    heads = kvh * GROUP + offs_g
    q = tl.load(q_ptr + i.to(tl.int64) * stride_qt + heads[:, None] * stride_qh + offs_d[None, :],
                mask=g_mask[:, None] & d_mask[None, :], other=0.0).to(tl.float32)  # [BLOCK_G, BLOCK_D]
    # the window's keys: positions t - w
    offs_w = tl.arange(0, BLOCK_W)
    pos = t - offs_w
    live = (offs_w < window) & (pos >= 0)
    kw, vw = _keys(k_ptr, v_ptr, sk_ptr, sv_ptr, shadow_of_ptr, pt_row, pos, live, i, t, start, kvh, offs_d, d_mask,
                   stride_kt, stride_kh, stride_sp, stride_ss, stride_sh, PAGE_SIZE)  # [BLOCK_W, BLOCK_D] each
    s = tl.sum(q[:, None, :] * kw[None, :, :], axis=2) * qk_scale  # [BLOCK_G, BLOCK_W]
    s = tl.where(live[None, :], s, float("-inf"))
    m = tl.max(s, axis=1)
    if BLOCK_S > 0:  # the sink's keys: positions 0 .. sink - 1 older than the window
        offs_s = tl.arange(0, BLOCK_S)
        s_live = (offs_s < sink) & (offs_s <= t - window)
        ks, vs = _keys(k_ptr, v_ptr, sk_ptr, sv_ptr, shadow_of_ptr, pt_row, offs_s, s_live, i, t, start, kvh, offs_d,
                       d_mask, stride_kt, stride_kh, stride_sp, stride_ss, stride_sh, PAGE_SIZE)
        s_s = tl.sum(q[:, None, :] * ks[None, :, :], axis=2) * qk_scale  # [BLOCK_G, BLOCK_S]
        s_s = tl.where(s_live[None, :], s_s, float("-inf"))
        m = tl.maximum(m, tl.max(s_s, axis=1))
        p_s = tl.exp2(s_s - m[:, None])
    p = tl.exp2(s - m[:, None])
    l = tl.sum(p, axis=1)
    o = tl.sum(p[:, :, None] * vw[None, :, :], axis=1)  # [BLOCK_G, BLOCK_D]
    if BLOCK_S > 0:
        l += tl.sum(p_s, axis=1)
        o += tl.sum(p_s[:, :, None] * vs[None, :, :], axis=1)
    o = o / l[:, None]
    tl.store(o_ptr + i.to(tl.int64) * stride_ot + heads[:, None] * stride_oh + offs_d[None, :], o,
             mask=g_mask[:, None] & d_mask[None, :])
    tl.store(lse_ptr + i.to(tl.int64) * stride_lt + heads, m + tl.log2(l), mask=g_mask)


def window_attention(q: Tensor, k: Tensor, v: Tensor, shadow_k: Tensor, shadow_v: Tensor, shadow_of: Tensor,
                     page_table: Tensor, seq_lens: Tensor, q_start: Tensor, q_lens: Tensor, token_rows: Tensor,
                     window: int, sm_scale: float | None = None, sink: int = 0) -> tuple[Tensor, Tensor]:
    """The window state of every token (module docstring): (o float32 [T, Hq, D], lse float32 [T, Hq]);
    with `sink`, positions 0 .. sink - 1 older than the window are its keys too.
    Writes k, v into shadow_k, shadow_v at each token's slot of its page's shadow (in place).
    Index values are the caller's duty (no host sync): rows as paged_prefill's, every page the window
    reads mapped in shadow_of."""
    fn = "window_attention"
    check_window_args(fn, q, k, v, shadow_k, shadow_v)
    T, hq, d = q.shape
    hkv = k.shape[1]
    for name, t, dim in (("shadow_of", shadow_of, 1), ("page_table", page_table, 2), ("seq_lens", seq_lens, 1),
                         ("q_start", q_start, 1), ("q_lens", q_lens, 1), ("token_rows", token_rows, 1)):
        check_tensor(fn, name, t, dim, (torch.int32,))
        if t.device != q.device:
            raise ValueError(f"{fn}: {name} is on {t.device}, q on {q.device}")
    if token_rows.shape[0] != T:
        raise ValueError(f"{fn}: token_rows has {token_rows.shape[0]} entries for {T} tokens")
    window = host_int(fn, "window", window, lo=1)
    sink = host_int(fn, "sink", sink, lo=0)
    sm_scale = 1.0 / math.sqrt(d) if sm_scale is None else host_float(fn, "sm_scale", sm_scale, True)
    o = torch.empty(T, hq, d, dtype=torch.float32, device=q.device)
    lse = torch.empty(T, hq, dtype=torch.float32, device=q.device)
    if T == 0:
        return o, lse
    for_device(_window_kernel, q.device)[(T, hkv)](
        q, k, v, shadow_k, shadow_v, shadow_of, page_table, seq_lens, q_start, q_lens, token_rows, o, lse,
        sm_scale * LOG2E, window, sink, q.stride(0), q.stride(1), k.stride(0), k.stride(1), *shadow_k.stride()[:3],
        page_table.stride(0), o.stride(0), o.stride(1), lse.stride(0),
        GROUP=hq // hkv, HEAD_DIM=d, PAGE_SIZE=shadow_k.shape[1], BLOCK_G=max(2, triton.next_power_of_2(hq // hkv)),
        BLOCK_W=max(2, triton.next_power_of_2(window)),
        BLOCK_S=max(2, triton.next_power_of_2(sink)) if sink else 0, BLOCK_D=max(16, triton.next_power_of_2(d)),
        **({"num_warps": 4} if q.device.type == "cuda" else {}))
    return o, lse


def check_window_args(fn: str, q: Tensor, k: Tensor, v: Tensor, shadow_k: Tensor, shadow_v: Tensor) -> None:
    """Shapes, dtypes and devices of window_attention's tensors (ValueError naming the first problem)."""
    check_tensor(fn, "q", q, 3, (torch.float32, torch.float16, torch.bfloat16, torch.float64))
    T, hq, d = q.shape
    for name, t in (("k", k), ("v", v)):
        check_tensor(fn, name, t, 3)
        if t.shape[0] != T or t.shape[2] != d or t.dtype != q.dtype or t.device != q.device:
            raise ValueError(f"{fn}: {name} must be [{T}, Hkv, {d}] {q.dtype} on {q.device}, got "
                             f"{list(t.shape)} {t.dtype} on {t.device}")
        if t.stride(2) != 1:
            raise ValueError(f"{fn}: {name} must have unit stride in its last dim")
    hkv = k.shape[1]
    if v.shape != k.shape or hq % hkv != 0:
        raise ValueError(f"{fn}: k {list(k.shape)} / v {list(v.shape)} do not fit q's {hq} heads")
    for name, t in (("shadow_k", shadow_k), ("shadow_v", shadow_v)):
        check_tensor(fn, name, t, 4)
        if (t.shape[2], t.shape[3]) != (hkv, d) or t.dtype != q.dtype or t.device != q.device \
                or not t.is_contiguous():
            raise ValueError(f"{fn}: {name} must be contiguous [S + 1, page_size, {hkv}, {d}] {q.dtype} on "
                             f"{q.device}, got {list(t.shape)} {t.dtype} on {t.device}")
    if shadow_v.shape != shadow_k.shape:
        raise ValueError(f"{fn}: shadow_v {list(shadow_v.shape)} != shadow_k {list(shadow_k.shape)}")
    if q.stride(2) != 1:
        raise ValueError(f"{fn}: q must have unit stride in its last dim")
