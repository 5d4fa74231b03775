"""Builders for kernel tests: random sequences scattered over shuffled pages, and a dense oracle."""
from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from radixkv.kernels.fp8 import quantize_fp8


class PagedKV(NamedTuple):
    k_cache: Tensor  # [P, S, Hkv, D]
    v_cache: Tensor
    k_scale: Tensor | None  # [P, S, Hkv] for FP8 caches
    v_scale: Tensor | None
    page_table: Tensor  # int32 [B, max_pages]
    seq_lens: Tensor  # int32 [B]
    k_seqs: list[Tensor]  # per row [n_b, Hkv, D] fp32: what the cache holds (dequantised)
    v_seqs: list[Tensor]


def make_paged(seq_lens: list[int], page_size: int, hkv: int, d: int, dtype: torch.dtype,
               gen: torch.Generator, spare_pages: int = 3) -> PagedKV:
    """Random K/V for each row stored in a random permutation of pages; unused pages hold garbage."""
    need = [-(-n // page_size) for n in seq_lens]
    num_pages = sum(need) + spare_pages
    perm = torch.randperm(num_pages, generator=gen).tolist()
    k_cache = (torch.randn(num_pages, page_size, hkv, d, generator=gen) * 100).to(dtype)  # garbage
    v_cache = (torch.randn(num_pages, page_size, hkv, d, generator=gen) * 100).to(dtype)
    fp8 = dtype in (torch.float8_e4m3fn, torch.float8_e5m2)
    k_scale = torch.full((num_pages, page_size, hkv), 7.0) if fp8 else None
    v_scale = torch.full((num_pages, page_size, hkv), 7.0) if fp8 else None
    table = torch.zeros(len(seq_lens), max(need), dtype=torch.int32)
    k_seqs, v_seqs = [], []
    pos = 0
    for b, n in enumerate(seq_lens):
        pages = perm[pos:pos + need[b]]
        pos += need[b]
        table[b, : need[b]] = torch.tensor(pages, dtype=torch.int32)
        k = torch.randn(n, hkv, d, generator=gen)
        v = torch.randn(n, hkv, d, generator=gen)
        slots = torch.tensor([pages[i // page_size] * page_size + i % page_size for i in range(n)])
        ks, vs = [], []
        for src, cache, scale, out in ((k, k_cache, k_scale, ks), (v, v_cache, v_scale, vs)):
            rows = cache.view(-1, hkv, d)
            if fp8:
                qv, s = quantize_fp8(src, dtype)
                rows[slots] = qv
                scale.view(-1, hkv)[slots] = s
                out.append(qv.float() * s.unsqueeze(-1))
            else:
                rows[slots] = src.to(dtype)
                out.append(src.to(dtype).float())
        k_seqs.append(ks[0])
        v_seqs.append(vs[0])
    return PagedKV(k_cache, v_cache, k_scale, v_scale, table,
                   torch.tensor(seq_lens, dtype=torch.int32), k_seqs, v_seqs)


def dense_attention(q: Tensor, k: Tensor, v: Tensor, sm_scale: float) -> Tensor:
    """Oracle independent of reference.py. q: [M, Hq, D] = the last M of k's N tokens; k, v: [N, Hkv, D]."""
    m, hq, _ = q.shape
    n, hkv, _ = k.shape
    g = hq // hkv
    qd = q.double().transpose(0, 1)  # [Hq, M, D]
    kd = k.double().repeat_interleave(g, dim=1).transpose(0, 1)  # [Hq, N, D]
    vd = v.double().repeat_interleave(g, dim=1).transpose(0, 1)
    mask = torch.ones(m, n, dtype=torch.bool).tril(diagonal=n - m)
    out = torch.nn.functional.scaled_dot_product_attention(qd, kd, vd, attn_mask=mask, scale=sm_scale)
    return out.transpose(0, 1)  # [M, Hq, D]
