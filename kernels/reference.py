"""Plain-PyTorch twins of the Triton kernels: the ground truth for every kernel test.

Same signatures and semantics as the Triton entry points (store.py's store_kv, decode.py's
paged_decode, prefill.py's paged_prefill). Math runs in float32 (float64 when q is float64),
output in q's dtype.

FP8 caches use per-token-per-head scales (k_scale, v_scale [num_pages, page_size, Hkv], a stored
row means `fp8 * scale`); rows are quantised with fp8.py's quantize_fp8, as store_kv does in-kernel.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor

from .fp8 import is_fp8, quantize_fp8


def _check_scales(cache: Tensor, scale: Tensor | None, name: str) -> None:
    if is_fp8(cache.dtype):
        if scale is None:
            raise ValueError(f"{name}: an {cache.dtype} cache needs its scale tensor")
        if tuple(scale.shape) != tuple(cache.shape[:3]):
            raise ValueError(f"{name}: scale shape {tuple(scale.shape)} != {tuple(cache.shape[:3])}")
    elif scale is not None:
        raise ValueError(f"{name}: scale given for a non-FP8 cache of dtype {cache.dtype}")


def store_kv_ref(k: Tensor, v: Tensor, k_cache: Tensor, v_cache: Tensor, slots: Tensor,
                 k_scale: Tensor | None = None, v_scale: Tensor | None = None) -> None:
    """Write new rows into their slots. k, v: [T, Hkv, D]; slots: int64 [T] = page * page_size + offset."""
    _check_scales(k_cache, k_scale, "k_cache")
    _check_scales(v_cache, v_scale, "v_cache")
    page_size = k_cache.shape[1]
    flat = slots.long()
    page, offset = flat // page_size, flat % page_size  # caches and scales may be head-major (not viewable)
    for src, cache, scale in ((k, k_cache, k_scale), (v, v_cache, v_scale)):
        if scale is None:
            cache[page, offset] = src.to(cache.dtype)
        else:
            qv, s = quantize_fp8(src, cache.dtype, scale.dtype)  # [T, Hkv, D], [T, Hkv]
            cache[page, offset] = qv
            scale[page, offset] = s.to(scale.dtype)  # exact: s is representable


def _gather_row(cache: Tensor, scale: Tensor | None, pages: Tensor, n: int, ctype: torch.dtype) -> Tensor:
    """First n tokens of one sequence, dequantised. Returns [n, Hkv, D] in ctype."""
    _, page_size, hkv, d = cache.shape
    rows = cache[pages.long()].to(ctype).reshape(-1, hkv, d)[:n]  # [n, Hkv, D]
    if scale is not None:
        rows = rows * scale[pages.long()].to(ctype).reshape(-1, hkv)[:n].unsqueeze(-1)
    return rows


def _attend(q: Tensor, k: Tensor, v: Tensor, sm_scale: float, first_pos: int) -> Tensor:
    """q: [M, Hq, D] at positions first_pos.. ; k, v: [N, Hkv, D] -> [M, Hq, D] (causal)."""
    m, hq, _ = q.shape
    n, hkv, _ = k.shape
    group = hq // hkv
    k = k.repeat_interleave(group, dim=1)  # [N, Hq, D]
    v = v.repeat_interleave(group, dim=1)
    s = torch.einsum("mhd,nhd->hmn", q, k) * sm_scale  # [Hq, M, N]
    q_pos = torch.arange(m, device=q.device) + first_pos
    k_pos = torch.arange(n, device=q.device)
    s = s.masked_fill(k_pos[None, None, :] > q_pos[None, :, None], float("-inf"))
    p = torch.softmax(s, dim=-1)
    return torch.einsum("hmn,nhd->mhd", p, v)


def _compute_dtype(q: Tensor) -> torch.dtype:
    return torch.float64 if q.dtype == torch.float64 else torch.float32


def paged_decode_ref(q: Tensor, k_cache: Tensor, v_cache: Tensor, page_table: Tensor, seq_lens: Tensor,
                     sm_scale: float | None = None, k_scale: Tensor | None = None,
                     v_scale: Tensor | None = None) -> Tensor:
    """One query token per sequence, the last of its seq_lens[b] tokens. q: [B, Hq, D] -> [B, Hq, D]."""
    q_start = torch.arange(q.shape[0], dtype=torch.int32)
    q_lens = torch.ones(q.shape[0], dtype=torch.int32)
    return paged_prefill_ref(q, k_cache, v_cache, page_table, seq_lens, q_start, q_lens,
                             sm_scale=sm_scale, k_scale=k_scale, v_scale=v_scale)


def paged_prefill_ref(q: Tensor, k_cache: Tensor, v_cache: Tensor, page_table: Tensor, seq_lens: Tensor,
                      q_start: Tensor, q_lens: Tensor, sm_scale: float | None = None,
                      k_scale: Tensor | None = None, v_scale: Tensor | None = None) -> Tensor:
    """Ragged causal attention over pages. q: [T, Hq, D]; row b owns q[q_start[b]:q_start[b]+q_lens[b]],
    the LAST q_lens[b] of its seq_lens[b] tokens. Returns [T, Hq, D] in q's dtype."""
    _check_scales(k_cache, k_scale, "k_cache")
    _check_scales(v_cache, v_scale, "v_cache")
    page_size = k_cache.shape[1]
    d = q.shape[-1]
    sm_scale = 1.0 / math.sqrt(d) if sm_scale is None else sm_scale
    ctype = _compute_dtype(q)
    out = torch.zeros_like(q)
    lens, starts, qls = seq_lens.tolist(), q_start.tolist(), q_lens.tolist()
    for b, (n, s0, m) in enumerate(zip(lens, starts, qls)):
        if m == 0:
            continue
        pages = page_table[b, : -(-n // page_size)]
        k = _gather_row(k_cache, k_scale, pages, n, ctype)
        v = _gather_row(v_cache, v_scale, pages, n, ctype)
        out[s0:s0 + m] = _attend(q[s0:s0 + m].to(ctype), k, v, sm_scale, n - m).to(q.dtype)
    return out
