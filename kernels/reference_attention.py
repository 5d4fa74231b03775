"""Plain-PyTorch twins of the Triton attention kernels: the ground truth for every kernel test.

Same signatures and semantics as the Triton entry points (store.py's store_kv, decode.py's
paged_decode, prefill.py's paged_prefill). Math runs in float32 (float64 when q is float64),
output in q's dtype.

FP8 caches use per-token-per-head scales (k_scale, v_scale [num_pages, page_size, Hkv], a stored
row means `fp8 * scale`); rows are quantised with fp8.py's quantize_fp8, as store_kv does in-kernel.
INT4/INT2 caches (uint8 pages of packed codes, k_scale, v_scale float16 [P, S, Hkv, G, 2]) are
quantised with intq.py's quantize_int and read back through its dequantize_int (then attended).

Then the twins of cascade.py's shared-prefix kernels and of window.py's recent-token window.
The other twins: reference_layers.py (norm, activation, rope) and reference_sampling.py (the
sampler's noise and draws).
"""
from __future__ import annotations

import math

import torch
from torch import Tensor

from .checks import cache_bits, check_page_values, check_q_rows, check_scales, check_slots
from .fp8 import is_fp8, quantize_fp8
from .intq import dequantize_int, quantize_int
from .launch import LOG2E


def _check_scales(cache: Tensor, scale: Tensor | None, name: str) -> None:
    if cache.dtype == torch.uint8:
        return  # INT4/INT2: checks.check_scales checks both tensors (it needs head_dim)
    if is_fp8(cache.dtype):
        if scale is None:
            raise ValueError(f"{name}: an {cache.dtype} cache needs its scale tensor")
        if tuple(scale.shape) != tuple(cache.shape[:3]):
            raise ValueError(f"{name}: scale shape {tuple(scale.shape)} != {tuple(cache.shape[:3])}")
    elif scale is not None:
        raise ValueError(f"{name}: scale given for a non-FP8 cache of dtype {cache.dtype}")


def store_kv_ref(k: Tensor, v: Tensor, k_cache: Tensor, v_cache: Tensor, slots: Tensor,
                 k_scale: Tensor | None = None, v_scale: Tensor | None = None) -> None:
    """Write new rows into their slots. k, v: [T, Hkv, D]; slots: int64 [T] = page * page_size + offset.
    CPU slots out of [0, num_pages * page_size) raise IndexValueError before anything is written."""
    _check_scales(k_cache, k_scale, "k_cache")
    _check_scales(v_cache, v_scale, "v_cache")
    bits = cache_bits("store_kv_ref", k_cache, k.shape[-1])
    if bits:
        check_scales("store_kv_ref", k_cache, k_scale, v_scale, k.shape[-1])
    check_slots("store_kv_ref", slots, k_cache)
    page_size = k_cache.shape[1]
    flat = slots.long()
    page, offset = flat // page_size, flat % page_size  # caches and scales may be head-major (not viewable)
    for src, cache, scale in ((k, k_cache, k_scale), (v, v_cache, v_scale)):
        if bits:
            codes, s = quantize_int(src, bits, scale.shape[3])  # [T, Hkv, D * bits / 8], [T, Hkv, G, 2]
            cache[page, offset] = codes
            scale[page, offset] = s
        elif scale is None:
            cache[page, offset] = src.to(cache.dtype)
        else:
            qv, s = quantize_fp8(src, cache.dtype, scale.dtype)  # [T, Hkv, D], [T, Hkv]
            cache[page, offset] = qv
            scale[page, offset] = s.to(scale.dtype)  # exact: s is representable


def _gather_row(cache: Tensor, scale: Tensor | None, pages: Tensor, n: int, ctype: torch.dtype,
                bits: int = 0) -> Tensor:
    """First n tokens of one sequence, dequantised. Returns [n, Hkv, D] in ctype."""
    _, page_size, hkv, d = cache.shape
    if bits:  # packed rows [.., D * bits / 8] + (scale, zero) [.., G, 2]
        packed = cache[pages.long()].reshape(-1, hkv, d)[:n]
        groups = scale[pages.long()].reshape(-1, hkv, *scale.shape[3:])[:n]
        return dequantize_int(packed, groups, bits, ctype)  # [n, Hkv, D]
    rows = cache[pages.long()].to(ctype).reshape(-1, hkv, d)[:n]  # [n, Hkv, D]
    if scale is not None:
        rows = rows * scale[pages.long()].to(ctype).reshape(-1, hkv)[:n].unsqueeze(-1)
    return rows


def gather_pages(cache: Tensor, scale: Tensor | None, pages: Tensor, n: int, ctype: torch.dtype,
                 head_dim: int) -> Tensor:
    """The first n slots of `pages` (int [P']) of any page dtype, dequantised: [n, Hkv, head_dim] in ctype."""
    return _gather_row(cache, scale, pages, n, ctype, cache_bits("gather_pages", cache, head_dim))


def _widen16(cache: Tensor, scale: Tensor) -> Tensor:
    """Pages [n, S, Hkv, R] with their scales -> fp16 [n, S, Hkv, D] by dequant_pages' arithmetic."""
    if cache.dtype != torch.uint8:  # FP8: one product, rounded once to fp16
        return (cache.float() * scale.float().unsqueeze(-1)).half()
    s0, z0, s1, z1 = scale.flatten(3).float().unbind(-1)  # [n, S, Hkv] each
    codes = cache.to(torch.int32)
    half = [((c - 8).float() * s.unsqueeze(-1) + (z + 8 * s).half().float().unsqueeze(-1)).half()
            for c, s, z in ((codes & 15, s0, z0), (codes >> 4, s1, z1))]  # planes 0 and 1
    return torch.cat(half, dim=-1)


def dequant_pages_ref(k_cache: Tensor, v_cache: Tensor, k_scale: Tensor, v_scale: Tensor, page_table: Tensor,
                      seq_lens: Tensor, head_dim: int) -> tuple[Tensor, Tensor]:
    """dequant_pages' twin: FP8 or INT4 pages of each row's table widened to fp16 [B * W, S, Hkv, head_dim],
    row b's slot w at b * W + w for its first ceil(seq_lens[b] / S) slots, zeros elsewhere."""
    B, W = page_table.shape
    _, S, hkv, _ = k_cache.shape
    out = [torch.zeros(B * W, S, hkv, head_dim, dtype=torch.float16, device=k_cache.device) for _ in range(2)]
    for b in range(B):
        n = -(-int(seq_lens[b]) // S)
        pages = page_table[b, :n].long()
        for o, cache, scale in zip(out, (k_cache, v_cache), (k_scale, v_scale)):
            o[b * W:b * W + n] = _widen16(cache[pages], scale[pages])
    return out[0], out[1]


def _attend(q: Tensor, k: Tensor, v: Tensor, sm_scale: float, first_pos: int) -> tuple[Tensor, Tensor]:
    """q: [M, Hq, D] at positions first_pos.. ; k, v: [N, Hkv, D] -> ([M, Hq, D], lse [M, Hq] in log2 units)
    (causal; a query before every key: o 0, lse -inf)."""
    m, hq, _ = q.shape
    n, hkv, _ = k.shape
    group = hq // hkv
    k = k.repeat_interleave(group, dim=1)  # [N, Hq, D]
    v = v.repeat_interleave(group, dim=1)
    s = torch.einsum("mhd,nhd->hmn", q, k) * sm_scale  # [Hq, M, N]
    q_pos = torch.arange(m, device=q.device) + first_pos
    k_pos = torch.arange(n, device=q.device)
    s = s.masked_fill(k_pos[None, None, :] > q_pos[None, :, None], float("-inf"))
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)  # a row with no key: all -inf
    return torch.einsum("hmn,nhd->mhd", p, v), (torch.logsumexp(s, dim=-1) * LOG2E).transpose(0, 1)


def _compute_dtype(q: Tensor) -> torch.dtype:
    return torch.float64 if q.dtype == torch.float64 else torch.float32


def paged_decode_ref(q: Tensor, k_cache: Tensor, v_cache: Tensor, page_table: Tensor, seq_lens: Tensor,
                     sm_scale: float | None = None, k_scale: Tensor | None = None,
                     v_scale: Tensor | None = None) -> Tensor:
    """One query token per sequence, the last of its seq_lens[b] tokens. q: [B, Hq, D] -> [B, Hq, D].
    CPU values are checked as paged_decode checks them (checks.check_page_values)."""
    check_page_values("paged_decode_ref", page_table, seq_lens, k_cache, 1)
    q_start = torch.arange(q.shape[0], dtype=torch.int32)
    q_lens = torch.ones(q.shape[0], dtype=torch.int32)
    return _prefill(q, k_cache, v_cache, page_table, seq_lens, q_start, q_lens, sm_scale, k_scale, v_scale)[0]


def paged_prefill_ref(q: Tensor, k_cache: Tensor, v_cache: Tensor, page_table: Tensor, seq_lens: Tensor,
                      q_start: Tensor, q_lens: Tensor, sm_scale: float | None = None,
                      k_scale: Tensor | None = None, v_scale: Tensor | None = None, return_lse: bool = False):
    """Ragged causal attention over pages. q: [T, Hq, D]; row b owns q[q_start[b]:q_start[b]+q_lens[b]],
    the LAST q_lens[b] of its seq_lens[b] tokens. Returns [T, Hq, D] in q's dtype; with return_lse also
    lse float32 [T, Hq] (log2 units, as paged_prefill's lse; -inf in rows no row range covers).
    CPU values are checked as paged_prefill checks them (checks.check_page_values, check_q_rows)."""
    check_page_values("paged_prefill_ref", page_table, seq_lens, k_cache, 0)
    check_q_rows("paged_prefill_ref", q.shape[0], q_start, q_lens, seq_lens, None)
    out, lse = _prefill(q, k_cache, v_cache, page_table, seq_lens, q_start, q_lens, sm_scale, k_scale, v_scale)
    return (out, lse) if return_lse else out


def _prefill(q: Tensor, k_cache: Tensor, v_cache: Tensor, page_table: Tensor, seq_lens: Tensor, q_start: Tensor,
             q_lens: Tensor, sm_scale: float | None, k_scale: Tensor | None,
             v_scale: Tensor | None) -> tuple[Tensor, Tensor]:
    _check_scales(k_cache, k_scale, "k_cache")
    _check_scales(v_cache, v_scale, "v_cache")
    bits = cache_bits("paged_attention_ref", k_cache, q.shape[-1])
    if bits:
        check_scales("paged_attention_ref", k_cache, k_scale, v_scale, q.shape[-1])
    page_size = k_cache.shape[1]
    d = q.shape[-1]
    sm_scale = 1.0 / math.sqrt(d) if sm_scale is None else sm_scale
    ctype = _compute_dtype(q)
    out = torch.zeros_like(q)
    lse = torch.full(q.shape[:2], float("-inf"), dtype=torch.float32, device=q.device)
    lens, starts, qls = seq_lens.tolist(), q_start.tolist(), q_lens.tolist()
    for b, (n, s0, m) in enumerate(zip(lens, starts, qls)):
        if m == 0:
            continue
        pages = page_table[b, : -(-n // page_size)]
        k = _gather_row(k_cache, k_scale, pages, n, ctype, bits)
        v = _gather_row(v_cache, v_scale, pages, n, ctype, bits)
        o, row_lse = _attend(q[s0:s0 + m].to(ctype), k, v, sm_scale, n - m)
        out[s0:s0 + m], lse[s0:s0 + m] = o.to(q.dtype), row_lse.float()
    return out, lse


# ----------------------------------------------------------------------------- cascade (cascade.py's twins)
# Same arguments and outputs as cascade_prefix_attention, paged_decode_partial, merge_attention_states
# and cascade_decode; the partial states are one per (row, q head): o float32 [B, Hq, 1, D] normalised
# over its keys, lse float32 [B, Hq, 1] = log2 of the softmax denominator of the scores
# q.k * sm_scale * log2(e) (-inf and o 0 where there are no keys). Math in float32 (float64 for float64 q).


def _cascade_rows(cache: Tensor, scale: Tensor | None, pages: Tensor, n: int, ctype: torch.dtype) -> Tensor:
    """The first n tokens stored on `pages`, dequantised: [n, Hkv, D] in ctype."""
    _, page_size, hkv, d = cache.shape
    pages = pages[: -(-n // page_size)].long()
    rows = cache[pages].to(ctype).reshape(-1, hkv, d)[:n]
    if scale is not None:
        rows = rows * scale[pages].to(ctype).reshape(-1, hkv)[:n].unsqueeze(-1)
    return rows


def _cascade_state(q: Tensor, k: Tensor, v: Tensor, sm_scale: float) -> tuple[Tensor, Tensor]:
    """q [M, Hq, D] against every key of k, v [N, Hkv, D] (no mask) -> o [M, Hq, D], lse [M, Hq] (log2)."""
    m, hq, d = q.shape
    if k.shape[0] == 0:
        return q.new_zeros(m, hq, d), q.new_full((m, hq), float("-inf"))
    group = hq // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)  # [N, Hq, D]
    s = torch.einsum("mhd,nhd->mhn", q, k) * sm_scale
    return torch.einsum("mhn,nhd->mhd", torch.softmax(s, dim=-1), v), torch.logsumexp(s, dim=-1) * LOG2E


def _cascade_ctype(q: Tensor) -> torch.dtype:
    return torch.float64 if q.dtype == torch.float64 else torch.float32


def cascade_prefix_attention_ref(q: Tensor, k_cache: Tensor, v_cache: Tensor, prefix_pages: Tensor,
                                 prefix_lens: Tensor, group_start: Tensor, group_rows: Tensor,
                                 sm_scale: float | None = None, k_scale: Tensor | None = None,
                                 v_scale: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Group g's rows (every q head) against its first prefix_lens[g] tokens on prefix_pages[g].
    q: [B, Hq, D] -> (o [B, Hq, 1, D], lse [B, Hq, 1]); rows in no group: o 0, lse -inf."""
    B, hq, d = q.shape
    sm_scale = 1.0 / math.sqrt(d) if sm_scale is None else sm_scale
    ct = _cascade_ctype(q)
    o = torch.zeros(B, hq, d, dtype=ct)
    lse = torch.full((B, hq), float("-inf"), dtype=ct)
    starts = group_start.tolist()
    for g, n in enumerate(prefix_lens.tolist()):
        rows = group_rows[starts[g]:starts[g + 1]].long()
        k = _cascade_rows(k_cache, k_scale, prefix_pages[g], n, ct)
        v = _cascade_rows(v_cache, v_scale, prefix_pages[g], n, ct)
        o[rows], lse[rows] = _cascade_state(q[rows].to(ct), k, v, sm_scale)
    return o.float().unsqueeze(2), lse.float().unsqueeze(2)


def paged_decode_partial_ref(q: Tensor, k_cache: Tensor, v_cache: Tensor, page_table: Tensor, seq_lens: Tensor,
                             sm_scale: float | None = None, k_scale: Tensor | None = None,
                             v_scale: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Row b's q against its seq_lens[b] tokens (0 allowed; any page dtype) -> (o [B, Hq, 1, D], lse [B, Hq, 1])."""
    check_page_values("paged_decode_partial_ref", page_table, seq_lens, k_cache, 0)
    B, hq, d = q.shape
    bits = cache_bits("paged_decode_partial_ref", k_cache, d)
    sm_scale = 1.0 / math.sqrt(d) if sm_scale is None else sm_scale
    ct = _cascade_ctype(q)
    o = torch.zeros(B, hq, d, dtype=ct, device=q.device)
    lse = torch.full((B, hq), float("-inf"), dtype=ct, device=q.device)
    for b, n in enumerate(seq_lens.tolist()):
        pages = page_table[b, : -(-n // k_cache.shape[1])]
        k = _gather_row(k_cache, k_scale, pages, n, ct, bits)
        v = _gather_row(v_cache, v_scale, pages, n, ct, bits)
        ob, lb = _cascade_state(q[b:b + 1].to(ct), k, v, sm_scale)
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
    """cascade_decode's twin over a cascade_plan.CascadePlan: the prefix (per level: plan.outer, if any, then
    plan.groups), suffix and merge twins composed."""
    levels = [plan.groups] if plan.outer is None else [plan.outer, plan.groups]
    states = [cascade_prefix_attention_ref(q, k_cache, v_cache, g.prefix_pages, g.prefix_lens, g.group_start,
                                           g.group_rows, sm_scale, k_scale, v_scale) for g in levels]
    o_p = torch.cat([o for o, _ in states], dim=2)  # [B, Hq, levels, D]
    lse_p = torch.cat([lse for _, lse in states], dim=2)  # [B, Hq, levels]
    o_s, lse_s = paged_decode_partial_ref(q, k_cache, v_cache, plan.suffix_pages, plan.suffix_lens, sm_scale,
                                          k_scale, v_scale)
    return merge_attention_states_ref(o_p, lse_p, o_s, lse_s, out_dtype=q.dtype)

# ----------------------------------------------------------------------------- recent-token window (window.py's twin)


def window_attention_ref(q: Tensor, k: Tensor, v: Tensor, shadow_k: Tensor, shadow_v: Tensor, shadow_of: Tensor,
                         page_table: Tensor, seq_lens: Tensor, q_start: Tensor, q_lens: Tensor, token_rows: Tensor,
                         window: int, sm_scale: float | None = None, sink: int = 0) -> tuple[Tensor, Tensor]:
    """window_attention's twin: each token against its `window` most recent keys and the positions below
    `sink` older than those (this step's own k/v for the row's new tokens, the shadow pages for earlier
    ones) -> (o float32 [T, Hq, D], lse float32 [T, Hq], log2 units); writes k, v into their pages'
    shadows first. Math in float32 (float64 for float64 q)."""
    T, hq, d = q.shape
    hkv = k.shape[1]
    sm_scale = 1.0 / math.sqrt(d) if sm_scale is None else sm_scale
    ps = shadow_k.shape[1]
    rows = token_rows.long()  # [T]
    start = (seq_lens.long() - q_lens.long())[rows]  # [T] the row's first new position
    t = start + torch.arange(T, device=q.device) - q_start.long()[rows]  # [T] positions
    table = page_table.long()
    own = shadow_of.long()[table[rows, t // ps]] * ps + t % ps  # [T] shadow slot of each token
    shadow_k.view(-1, hkv, d)[own] = k.to(shadow_k.dtype)
    shadow_v.view(-1, hkv, d)[own] = v.to(shadow_v.dtype)
    w = torch.arange(window, device=q.device)
    sinks = torch.arange(sink, device=q.device)
    pos = torch.cat([t[:, None] - w[None, :], sinks.expand(T, sink)], dim=1)  # [T, W + S]
    live = torch.cat([pos[:, :window] >= 0, pos[:, window:] <= t[:, None] - window], dim=1)  # sinks not in the window
    fresh = live & (pos >= start[:, None])
    p = pos.clamp(min=0)
    held_slot = shadow_of.long()[table[rows[:, None], p // ps]] * ps + p % ps  # [T, W + S]
    fresh_row = (torch.arange(T, device=q.device)[:, None] - (t[:, None] - p)).clamp(0, T - 1)
    ct = _cascade_ctype(q)
    out = []
    for x, shadow in ((k, shadow_k), (v, shadow_v)):
        held = shadow.view(-1, hkv, d)[held_slot].to(ct)  # [T, W + S, Hkv, D]
        out.append(torch.where(fresh[..., None, None], x[fresh_row].to(ct), held))
    kw, vw = (x.repeat_interleave(hq // hkv, dim=2) for x in out)  # [T, W + S, Hq, D]
    s = torch.einsum("thd,twhd->thw", q.to(ct), kw) * sm_scale
    s = s.masked_fill(~live[:, None, :], float("-inf"))
    o = torch.einsum("thw,twhd->thd", torch.softmax(s, dim=-1), vw)
    return o.float(), (torch.logsumexp(s, dim=-1) * LOG2E).float()
