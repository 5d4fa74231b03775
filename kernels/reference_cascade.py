"""Plain-PyTorch twins of cascade.py's kernels (to be folded into reference.py).

Same arguments and outputs as cascade_prefix_attention, paged_decode_partial, merge_attention_states and
cascade_decode; the partial states are one per (row, q head): o float32 [B, Hq, 1, D] normalised over its
keys, lse float32 [B, Hq, 1] = log2 of the softmax denominator of the scores q.k * sm_scale * log2(e)
(-inf and o 0 where there are no keys). Math in float32 (float64 for float64 q). Imports no Triton.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor

from .launch import LOG2E, check_page_values


def _rows(cache: Tensor, scale: Tensor | None, pages: Tensor, n: int, ctype: torch.dtype) -> Tensor:
    """The first n tokens stored on `pages`, dequantised: [n, Hkv, D] in ctype."""
    _, page_size, hkv, d = cache.shape
    pages = pages[: -(-n // page_size)].long()
    rows = cache[pages].to(ctype).reshape(-1, hkv, d)[:n]
    if scale is not None:
        rows = rows * scale[pages].to(ctype).reshape(-1, hkv)[:n].unsqueeze(-1)
    return rows


def _state(q: Tensor, k: Tensor, v: Tensor, sm_scale: float) -> tuple[Tensor, Tensor]:
    """q [M, Hq, D] against every key of k, v [N, Hkv, D] (no mask) -> o [M, Hq, D], lse [M, Hq] (log2)."""
    m, hq, d = q.shape
    if k.shape[0] == 0:
        return q.new_zeros(m, hq, d), q.new_full((m, hq), float("-inf"))
    group = hq // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)  # [N, Hq, D]
    s = torch.einsum("mhd,nhd->mhn", q, k) * sm_scale
    return torch.einsum("mhn,nhd->mhd", torch.softmax(s, dim=-1), v), torch.logsumexp(s, dim=-1) * LOG2E


def _ctype(q: Tensor) -> torch.dtype:
    return torch.float64 if q.dtype == torch.float64 else torch.float32


def cascade_prefix_attention_ref(q: Tensor, k_cache: Tensor, v_cache: Tensor, prefix_pages: Tensor,
                                 prefix_lens: Tensor, group_start: Tensor, group_rows: Tensor,
                                 sm_scale: float | None = None, k_scale: Tensor | None = None,
                                 v_scale: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Group g's rows (every q head) against its first prefix_lens[g] tokens on prefix_pages[g].
    q: [B, Hq, D] -> (o [B, Hq, 1, D], lse [B, Hq, 1]); rows in no group: o 0, lse -inf."""
    B, hq, d = q.shape
    sm_scale = 1.0 / math.sqrt(d) if sm_scale is None else sm_scale
    ct = _ctype(q)
    o = torch.zeros(B, hq, d, dtype=ct)
    lse = torch.full((B, hq), float("-inf"), dtype=ct)
    starts = group_start.tolist()
    for g, n in enumerate(prefix_lens.tolist()):
        rows = group_rows[starts[g]:starts[g + 1]].long()
        k = _rows(k_cache, k_scale, prefix_pages[g], n, ct)
        v = _rows(v_cache, v_scale, prefix_pages[g], n, ct)
        o[rows], lse[rows] = _state(q[rows].to(ct), k, v, sm_scale)
    return o.float().unsqueeze(2), lse.float().unsqueeze(2)


def paged_decode_partial_ref(q: Tensor, k_cache: Tensor, v_cache: Tensor, page_table: Tensor, seq_lens: Tensor,
                             sm_scale: float | None = None, k_scale: Tensor | None = None,
                             v_scale: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Row b's q against its seq_lens[b] tokens (0 allowed) -> (o [B, Hq, 1, D], lse [B, Hq, 1])."""
    check_page_values("paged_decode_partial_ref", page_table, seq_lens, k_cache, 0)
    B, hq, d = q.shape
    sm_scale = 1.0 / math.sqrt(d) if sm_scale is None else sm_scale
    ct = _ctype(q)
    o = torch.zeros(B, hq, d, dtype=ct)
    lse = torch.full((B, hq), float("-inf"), dtype=ct)
    for b, n in enumerate(seq_lens.tolist()):
        k = _rows(k_cache, k_scale, page_table[b], n, ct)
        v = _rows(v_cache, v_scale, page_table[b], n, ct)
        ob, lb = _state(q[b:b + 1].to(ct), k, v, sm_scale)
        o[b], lse[b] = ob[0], lb[0]
    return o.float().unsqueeze(2), lse.float().unsqueeze(2)


def merge_attention_states_ref(o_a: Tensor, lse_a: Tensor, o_b: Tensor, lse_b: Tensor, *,
                               out_dtype: torch.dtype | None = None, return_lse: bool = False):
    """Every state of a and b ([B, Hq, S, D] / [B, Hq, S], or [B, Hq, D] / [B, Hq]) folded into one:
    o [B, Hq, D] in out_dtype (default o_a's), and with return_lse its lse float32 [B, Hq]."""
    states = [(o if o.dim() == 4 else o.unsqueeze(2), s if s.dim() == 3 else s.unsqueeze(2))
              for o, s in ((o_a, lse_a), (o_b, lse_b))]
    o = torch.cat([x for x, _ in states], dim=2).double()  # [B, Hq, Sa + Sb, D]
    lse = torch.cat([s for _, s in states], dim=2).double()  # [B, Hq, Sa + Sb]
    top = lse.amax(dim=2, keepdim=True)
    top = torch.where(torch.isinf(top), torch.zeros_like(top), top)
    w = torch.exp2(lse - top)  # empty states weigh 0
    total = w.sum(dim=2)
    o = torch.where(w.unsqueeze(-1) > 0, o, 0.0)  # an empty state's o is never read
    merged = (o * w.unsqueeze(-1)).sum(dim=2) / torch.where(total > 0, total, 1.0).unsqueeze(-1)
    merged = merged.to(out_dtype or o_a.dtype)
    if not return_lse:
        return merged
    lse_out = torch.where(total > 0, top.squeeze(2) + torch.log2(torch.where(total > 0, total, 1.0)), float("-inf"))
    return merged, lse_out.float()


def cascade_decode_ref(q: Tensor, k_cache: Tensor, v_cache: Tensor, plan, sm_scale: float | None = None,
                       k_scale: Tensor | None = None, v_scale: Tensor | None = None) -> Tensor:
    """cascade_decode's twin over a cascade.CascadePlan: the prefix, suffix and merge twins composed."""
    g = plan.groups
    o_p, lse_p = cascade_prefix_attention_ref(q, k_cache, v_cache, g.prefix_pages, g.prefix_lens, g.group_start,
                                              g.group_rows, sm_scale, k_scale, v_scale)
    o_s, lse_s = paged_decode_partial_ref(q, k_cache, v_cache, plan.suffix_pages, plan.suffix_lens, sm_scale,
                                          k_scale, v_scale)
    return merge_attention_states_ref(o_p, lse_p, o_s, lse_s, out_dtype=q.dtype)
