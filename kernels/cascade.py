"""Cascade (shared-prefix) decode: a prefix shared by a group of rows is read once per group, not once a row.

One cascade level is a set of groups of decode rows sharing their first pages (a node of the radix tree
several running requests sit under); cascade_plan.py builds them on the host (CascadeGroups, CascadePlan:
the layout of the group tensors) and picks the split counts; cascade_checks.py checks the arguments.

Three launches (cascade_decode composes them):
1. cascade_prefix_attention: grid (M tiles, Hkv, G x splits). A program stacks BLOCK_M query rows of ONE
   group and ONE KV head, rows = (decode row, q head of the GQA group) pairs in group order, as the M
   dimension of tl.dot (a prefill-like tile: tensor cores, no causal mask: every row sees the whole
   prefix), and streams the group's prefix keys gathered from its pages (a split's share of them:
   flash-decoding splits keep the GPU busy when groups are few). Programs past a group's rows do nothing.
2. paged_decode_partial: decode.py's kernel over the suffix tables in its split mode (FP8 pages on the
   GPU: paged_decode_fp8's Gluon kernel, as paged_decode dispatches), so it returns states, not outputs.
3. merge_attention_states: every state of a (row, head) folded by the max-subtracted log-sum-exp rule.
Two levels (CascadePlan.outer; a system prompt shared by all rows over few-shot blocks shared by some):
the outer groups are a second CascadeGroups whose runs start at token 0, the inner groups' prefix tables
then start where their rows' outer run ends (plan_cascade), and launch 1 runs once per level, each writing
its slice of one state buffer, so launch 3 merges outer + inner + suffix states at once. A row in no group
of a level has -inf states there.

Partial attention states (decode.py's split partials, so one merge takes any mix):
    o    float32 [B, Hq, S, D]   S states per (row, q head), each normalised over its own keys
    lse  float32 [B, Hq, S]      log2 of the state's softmax denominator, in the kernels' units
                                 (scores q.k * sm_scale * log2(e)); -inf for an empty state (its o is
                                 then ignored: it may be zeros or unwritten)
Rows in no group get prefix states with lse -inf (and o 0). FP8 pages (per-token-per-head k_scale /
v_scale [P, S, Hkv], any strides, e.g. KVStore's head-major pages) are dequantised in-kernel as in
decode.py: K scales multiply the score columns, V scales the probabilities; or, where cascade_decode is given
memory for it (widen_max_bytes), a level's prefix pages are first widened once into fp16 copies
(dequant_pages.py) and launch 1 runs its 16-bit path over them, q rounded to fp16 (the in-kernel path widens
every tile in each of the group's M tiles: 48.6 us against bf16's 25.9 at 256 rows x 1k on the H200).
INT4/INT2 pages are not supported here yet. bf16 runs on the GPU only (the interpreter mis-computes bf16
dots; tests use fp16/fp32).
Values of the index tensors are checked on CPU only (checks.py's rule); on CUDA they are the caller's.
Triton specialisations (what a first launch compiles): every constexpr is fixed by the model and the KV
dtype (GQA group, head_dim, page_size, tiles, FP8 or not), never by a step's rows, groups or lengths. The
int arguments that vary with a step are the split counts and the strides and loop bounds derived from
them (and, on eager plans, the prefix table's width); the prefix and merge kernels take those unspecialised
(do_not_specialize: they only scale scattered one-float lse stores, a program_id division and loop
bounds), so each compiles once per engine (over FP8 pages, twice: the prefix kernel also over fp16 copies,
with dequant_pages' kernel, whose table width is unspecialised too). The suffix decode is decode.py's kernel
with SPLIT=True, specialised on its split count as Triton does for any int (== 1, divisible by 16, other): up to three.
Engine: LLM(cascade=True) runs cascade_decode on decode steps (radixkv/engine/attention.py), replayed from CUDA
graphs keyed by group-count buckets (radixkv/engine/cuda_graphs.py) or eagerly when a step does not fit them.
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl
from torch import Tensor

from .cascade_checks import as_states, check_attention_args, check_groups, check_out_states
from .cascade_plan import CascadeGroups, CascadePlan, default_prefix_config, default_prefix_splits, suffix_num_splits
from .checks import IndexValueError, check_paged_args, host_float, host_int
from .decode import _decode_kernel
from .dequant_pages import dequant_pages, scratch_bytes, scratch_table, widen_budget
from .decode_int import launch_int as launch_int_decode
from .dispatch import fp8_decode_gluon, int4_decode_gluon
from .launch import LOG2E, KernelConfig, KernelKind, default_config, for_device, launch_options


@triton.jit
def _prefix_tile(q, acc, m_i, l_i, kc_ptr, vc_ptr, ks_ptr, vs_ptr, pt_row, k_lo, hi, qk_scale, kv_head, scale_head,
                 stride_cp, stride_cs, stride_cd, stride_xp, stride_xs, offs_d, d_mask,
                 PAGE_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, MASKED: tl.constexpr, IS_FP8: tl.constexpr,
                 DOT_PRECISION: tl.constexpr):
    """Keys k_lo : k_lo + BLOCK_N (those below hi when MASKED) folded into the online softmax state."""
    offs_n = k_lo + tl.arange(0, BLOCK_N)
    n_mask = offs_n < hi
    if MASKED:
        page = tl.load(pt_row + offs_n // PAGE_SIZE, mask=n_mask, other=0).to(tl.int64)
        kv_mask = n_mask[:, None] & d_mask[None, :]
    else:
        page = tl.load(pt_row + offs_n // PAGE_SIZE).to(tl.int64)
        kv_mask = d_mask[None, :]
    row = page * stride_cp + (offs_n % PAGE_SIZE) * stride_cs + kv_head  # [BLOCK_N]
    k = tl.load(kc_ptr + row[:, None] + offs_d[None, :] * stride_cd, mask=kv_mask, other=0.0)  # [BLOCK_N, BLOCK_D]
    qk = tl.dot(q, tl.trans(k.to(q.dtype)), input_precision=DOT_PRECISION)  # [BLOCK_M, BLOCK_N]
    if IS_FP8:  # K scales and qk_scale multiply the score columns
        xrow = page * stride_xp + (offs_n % PAGE_SIZE) * stride_xs + scale_head
        qk = qk * (tl.load(ks_ptr + xrow, mask=n_mask, other=0.0).to(tl.float32) * qk_scale)[None, :]
        exp_scale = 1.0
    else:  # qk_scale joins the exponent: one FFMA per score
        exp_scale = qk_scale
    if MASKED:
        qk = tl.where(n_mask[None, :], qk, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(qk, axis=1) * exp_scale)
    alpha = tl.exp2(m_i - m_new)
    acc = acc * alpha[:, None]
    p = tl.exp2(qk * exp_scale - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, axis=1)
    if IS_FP8:
        p = p * tl.load(vs_ptr + xrow, mask=n_mask, other=0.0).to(tl.float32)[None, :]
    v = tl.load(vc_ptr + row[:, None] + offs_d[None, :] * stride_cd, mask=kv_mask, other=0.0)
    acc += tl.dot(p.to(q.dtype), v.to(q.dtype), input_precision=DOT_PRECISION)
    return acc, m_new, l_i


@triton.jit(do_not_specialize=["stride_ptg", "stride_lb", "stride_lh", "num_splits"])
def _prefix_kernel(q_ptr, kc_ptr, vc_ptr, ks_ptr, vs_ptr, pt_ptr, plen_ptr, gstart_ptr, grows_ptr, o_ptr, lse_ptr,
                   qk_scale,
                   stride_qb, stride_qh, stride_qd,
                   stride_cp, stride_cs, stride_ch, stride_cd,
                   stride_xp, stride_xs, stride_xh, stride_ptg,
                   stride_ob, stride_oh, stride_os, stride_od, stride_lb, stride_lh, stride_ls, num_splits,
                   GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, PAGE_SIZE: tl.constexpr, BLOCK_M: tl.constexpr,
                   BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, IS_FP8: tl.constexpr, OP_FP16: tl.constexpr,
                   DOT_PRECISION: tl.constexpr):
    tile = tl.program_id(0)  # M tiles of one (group, KV head, split) are launch neighbours: K/V shared in L2
    kvh = tl.program_id(1)
    g = tl.program_id(2) // num_splits
    split = tl.program_id(2) % num_splits
    r0 = tl.load(gstart_ptr + g)
    m_total = (tl.load(gstart_ptr + g + 1) - r0) * GROUP  # stacked (row, head) pairs of the group
    plen = tl.load(plen_ptr + g)
    per_split = tl.cdiv(tl.cdiv(plen, num_splits), BLOCK_N) * BLOCK_N  # tile-aligned key range of this split
    lo = split * per_split
    n_keys = tl.where(tile * BLOCK_M < m_total, tl.maximum(tl.minimum(lo + per_split, plen) - lo, 0), 0)
    n_full = (n_keys // BLOCK_N) * BLOCK_N

    offs_m = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    m_mask = offs_m < m_total
    d_mask = offs_d < HEAD_DIM
    rows = tl.load(grows_ptr + r0 + offs_m // GROUP, mask=m_mask, other=0).to(tl.int64)  # [BLOCK_M] batch rows
    heads = kvh * GROUP + offs_m % GROUP  # [BLOCK_M] q heads
    q = tl.load(q_ptr + rows[:, None] * stride_qb + heads[:, None] * stride_qh + offs_d[None, :] * stride_qd,
                mask=m_mask[:, None] & d_mask[None, :], other=0.0)  # q: [BLOCK_M, BLOCK_D]
    if OP_FP16:  # fp16 pages (widened FP8 copies) under bf16 q: products in fp16, q and P rounded to it
        q = q.to(tl.float16)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    pt_row = pt_ptr + g.to(tl.int64) * stride_ptg
    kv_head = kvh.to(tl.int64) * stride_ch
    scale_head = kvh * stride_xh
    hi = lo + n_keys
    # ---- whole tiles, no mask
    for start in range(0, n_full, BLOCK_N):
        acc, m_i, l_i = _prefix_tile(q, acc, m_i, l_i, kc_ptr, vc_ptr, ks_ptr, vs_ptr, pt_row, lo + start, hi,
                                     qk_scale, kv_head, scale_head, stride_cp, stride_cs, stride_cd, stride_xp,
                                     stride_xs, offs_d, d_mask, PAGE_SIZE, BLOCK_N, False, IS_FP8, DOT_PRECISION)
    # ---- the split's last, partial tile
    for start in range(0, n_keys - n_full, BLOCK_N):
        acc, m_i, l_i = _prefix_tile(q, acc, m_i, l_i, kc_ptr, vc_ptr, ks_ptr, vs_ptr, pt_row, lo + n_full + start,
                                     hi, qk_scale, kv_head, scale_head, stride_cp, stride_cs, stride_cd, stride_xp,
                                     stride_xs, offs_d, d_mask, PAGE_SIZE, BLOCK_N, True, IS_FP8, DOT_PRECISION)

    l_safe = tl.where(l_i > 0, l_i, 1.0)
    o = acc / l_safe[:, None]
    tl.store(o_ptr + rows[:, None] * stride_ob + heads[:, None] * stride_oh + split * stride_os
             + offs_d[None, :] * stride_od, o, mask=m_mask[:, None] & d_mask[None, :])
    lse = tl.where(l_i > 0, m_i + tl.log2(l_safe), float("-inf"))
    tl.store(lse_ptr + rows * stride_lb + heads * stride_lh + split * stride_ls, lse, mask=m_mask)


@triton.jit
def _fold_state(m, l, acc, o_ptrs, lse_ptrs, h_mask, d_mask):
    """One partial state (o [BLOCK_H, BLOCK_D], lse [BLOCK_H]) folded into the running merge."""
    lse = tl.load(lse_ptrs, mask=h_mask, other=float("-inf"))
    m_new = tl.maximum(m, lse)
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # all empty so far: no inf - inf
    alpha = tl.exp2(m - m_safe)
    w = tl.exp2(lse - m_safe)
    live = h_mask & (lse > float("-inf"))  # an empty state's o is never read (it may be unwritten)
    o = tl.load(o_ptrs, mask=live[:, None] & d_mask[None, :], other=0.0).to(tl.float32)
    return m_new, l * alpha + w, acc * alpha[:, None] + o * w[:, None]


@triton.jit(do_not_specialize=["num_a", "num_b", "stride_lab", "stride_lah", "stride_lbb", "stride_lbh"])
def _merge_kernel(oa_ptr, la_ptr, ob_ptr, lb_ptr, out_ptr, lse_out_ptr, num_heads, num_a, num_b,
                  stride_oab, stride_oah, stride_oas, stride_oad, stride_lab, stride_lah, stride_las,
                  stride_obb, stride_obh, stride_obs, stride_obd, stride_lbb, stride_lbh, stride_lbs,
                  stride_outb, stride_outh, stride_outd, stride_lob, stride_loh,
                  HEAD_DIM: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, WRITE_LSE: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    heads = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_D)
    h_mask = heads < num_heads
    d_mask = offs_d < HEAD_DIM
    m = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_D], tl.float32)
    oa = oa_ptr + b * stride_oab + heads[:, None] * stride_oah + offs_d[None, :] * stride_oad
    la = la_ptr + b * stride_lab + heads * stride_lah
    for s in range(num_a):
        m, l, acc = _fold_state(m, l, acc, oa + s * stride_oas, la + s * stride_las, h_mask, d_mask)
    ob = ob_ptr + b * stride_obb + heads[:, None] * stride_obh + offs_d[None, :] * stride_obd
    lb = lb_ptr + b * stride_lbb + heads * stride_lbh
    for s in range(num_b):
        m, l, acc = _fold_state(m, l, acc, ob + s * stride_obs, lb + s * stride_lbs, h_mask, d_mask)
    l_safe = tl.where(l > 0, l, 1.0)
    tl.store(out_ptr + b * stride_outb + heads[:, None] * stride_outh + offs_d[None, :] * stride_outd,
             (acc / l_safe[:, None]).to(out_ptr.dtype.element_ty), mask=h_mask[:, None] & d_mask[None, :])
    if WRITE_LSE:
        tl.store(lse_out_ptr + b * stride_lob + heads * stride_loh,
                 tl.where(l > 0, m + tl.log2(l_safe), float("-inf")), mask=h_mask)


# ----------------------------------------------------------------------------- launchers
def cascade_prefix_attention(q: Tensor, k_cache: Tensor, v_cache: Tensor, prefix_pages: Tensor, prefix_lens: Tensor,
                             group_start: Tensor, group_rows: Tensor, sm_scale: float | None = None,
                             k_scale: Tensor | None = None, v_scale: Tensor | None = None, *,
                             max_group_rows: int | None = None, num_splits: int | None = None,
                             config: KernelConfig | None = None, all_rows_grouped: bool | None = None,
                             out: tuple[Tensor, Tensor] | None = None) -> tuple[Tensor, Tensor]:
    """Each group's rows (all their q heads) against the group's shared prefix, no causal mask.

    q: [B, Hq, D]; caches [P, S, Hkv, D]; group tensors as the module docstring. Returns partial states
    (o float32 [B, Hq, num_splits, D], lse float32 [B, Hq, num_splits]); rows in no group: lse -inf, o 0.
    max_group_rows (host int) sizes the grid (default len(group_rows): exact for one group, no host sync);
    num_splits cuts each prefix into that many key ranges (default: prefix_num_splits). all_rows_grouped:
    whether every row of q is in a group, so no state needs the -inf init (default: len(group_rows) >= B,
    rows being unique; False for a static plan whose group_rows buffer is longer than its groups' rows).
    out: (o, lse), float32 [B, Hq, S, D] / [B, Hq, S] views (any strides: e.g. a slice along S of a buffer
    holding several levels' states, merged at once) to write into instead, S = num_splits (its default);
    rows in no group then get lse -inf and their o is left as it was (a merge never reads it).
    """
    fn = "cascade_prefix_attention"
    fp8 = check_attention_args(fn, q, k_cache, v_cache, k_scale, v_scale)
    pages, lens, start, rows = check_groups(fn, q, k_cache, prefix_pages, prefix_lens, group_start, group_rows)
    B, hq, d = q.shape
    hkv, page_size = k_cache.shape[2], k_cache.shape[1]
    group, G, R = hq // hkv, pages.shape[0], rows.shape[0]
    sm_scale = 1.0 / math.sqrt(d) if sm_scale is None else host_float(fn, "sm_scale", sm_scale, positive=True)
    max_group_rows = R if max_group_rows is None else host_int(fn, "max_group_rows", max_group_rows)
    if q.device.type == "cpu" and G and max_group_rows < int((start[1:] - start[:-1]).max()):
        raise IndexValueError(f"{fn}: max_group_rows = {max_group_rows} is below the largest group's rows")
    config = config or default_prefix_config(q.dtype, k_cache)
    if out is not None:
        o, lse = check_out_states(fn, out, (B, hq, d), q.device)
        num_splits = o.shape[2] if num_splits is None else num_splits
    elif num_splits is None:
        num_splits = default_prefix_splits(q.dtype, k_cache, hq, G, R, pages.shape[1] * page_size, config)
    num_splits = host_int(fn, "num_splits", num_splits, lo=1)
    f32 = {"dtype": torch.float32, "device": q.device}
    grouped = R >= B if all_rows_grouped is None else all_rows_grouped  # rows are unique (checked on CPU)
    if out is not None:
        if o.shape[2] != num_splits:
            raise ValueError(f"{fn}: out holds {o.shape[2]} states a (row, head), num_splits is {num_splits}")
        if not grouped:
            lse.fill_(float("-inf"))
    elif grouped:
        o, lse = torch.empty(B, hq, num_splits, d, **f32), torch.empty(B, hq, num_splits, **f32)
    else:
        o, lse = torch.zeros(B, hq, num_splits, d, **f32), torch.full((B, hq, num_splits), float("-inf"), **f32)
    tiles = triton.cdiv(max_group_rows * group, config.block_m)
    if G == 0 or tiles == 0 or B == 0:
        return o, lse
    xs = k_scale.stride() if fp8 else (0, 0, 0)
    for_device(_prefix_kernel, q.device)[(tiles, hkv, G * num_splits)](
        q, k_cache, v_cache, k_scale if fp8 else k_cache, v_scale if fp8 else v_cache, pages, lens, start, rows,
        o, lse, sm_scale * LOG2E, *q.stride(), *k_cache.stride(), *xs, pages.stride(0), *o.stride(), *lse.stride(),
        num_splits, GROUP=group, HEAD_DIM=d, PAGE_SIZE=page_size, BLOCK_M=config.block_m,
        BLOCK_D=max(16, triton.next_power_of_2(d)), BLOCK_N=config.block_n, IS_FP8=fp8,
        OP_FP16=q.dtype == torch.bfloat16 and k_cache.dtype == torch.float16,
        DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32", **launch_options(config, q.device))
    return o, lse


def paged_decode_partial(q: Tensor, k_cache: Tensor, v_cache: Tensor, page_table: Tensor, seq_lens: Tensor,
                         sm_scale: float | None = None, k_scale: Tensor | None = None, v_scale: Tensor | None = None,
                         num_splits: int = 1, config: KernelConfig | None = None) -> tuple[Tensor, Tensor]:
    """paged_decode's attention as partial states: (o float32 [B, Hq, num_splits, D], lse float32
    [B, Hq, num_splits]), the split partials of decode.py's kernels, unmerged. seq_lens may be 0 (lse -inf),
    except on the GPU's FP8 Gluon path (taken where paged_decode takes it, with num_splits raised to >= 2
    since that kernel writes states only when split), where every row needs a token. INT4/INT2 pages run
    paged_decode's INT kernels (the INT4 Gluon one where paged_decode takes it), num_splits raised to >= 2
    for the same reason."""
    fn = "paged_decode_partial"
    args = check_paged_args(fn, q, k_cache, v_cache, page_table, seq_lens, k_scale, v_scale, min_seq_len=0)
    B, hq, d = q.shape
    if B != args.page_table.shape[0]:
        raise ValueError(f"{fn}: q has {B} rows, page_table {args.page_table.shape[0]}")
    num_splits = host_int(fn, "num_splits", num_splits, lo=1)
    sm_scale = 1.0 / math.sqrt(d) if sm_scale is None else host_float(fn, "sm_scale", sm_scale)
    gluon_fp8 = args.fp8 and config is None and fp8_decode_gluon(q, k_cache, v_cache, q)
    gluon_int4 = args.bits == 4 and config is None and int4_decode_gluon(q, k_cache, v_cache, k_scale, v_scale, q)
    if gluon_fp8 or args.bits:
        num_splits = max(2, num_splits)
    block_d = d if gluon_fp8 or gluon_int4 else max(16, triton.next_power_of_2(d))
    mid_o = torch.empty(B, hq, num_splits, block_d, dtype=torch.float32, device=q.device)
    mid_lse = torch.empty(B, hq, num_splits, dtype=torch.float32, device=q.device)
    if B == 0:
        return mid_o[..., :d], mid_lse
    fp8, hkv = args.fp8, k_cache.shape[2]
    if gluon_fp8 or gluon_int4:
        from .decode_fp8_gluon import launch as launch_fp8
        from .decode_int4_gluon import launch as launch_int4

        (launch_int4 if gluon_int4 else launch_fp8)(q, k_cache, v_cache, k_scale, v_scale, args.page_table,
                                                    args.seq_lens, sm_scale * LOG2E, num_splits, q, mid_o, mid_lse)
        return mid_o, mid_lse
    config = config or default_config(KernelKind.DECODE, q, k_cache)
    if args.bits:
        launch_int_decode(q, k_cache, v_cache, k_scale, v_scale, args.page_table, args.seq_lens, sm_scale,
                          num_splits, q, mid_o, mid_lse, config, args.bits)
        return mid_o[..., :d], mid_lse
    xs = k_scale.stride() if fp8 else (0, 0, 0)
    for_device(_decode_kernel, q.device)[(hkv, B, num_splits)](
        q, k_cache, v_cache, k_scale if fp8 else k_cache, v_scale if fp8 else v_cache, args.page_table,
        args.seq_lens, q, mid_o, mid_lse, sm_scale * LOG2E, *q.stride(), *k_cache.stride(), *xs,
        args.page_table.stride(0), *q.stride(), num_splits, GROUP=hq // hkv, HEAD_DIM=d,
        PAGE_SIZE=k_cache.shape[1], BLOCK_H=max(16, triton.next_power_of_2(hq // hkv)), BLOCK_D=block_d,
        BLOCK_N=config.block_n, SPLIT=True, IS_FP8=fp8, K_FIRST=config.k_first,
        DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32", **launch_options(config, q.device))
    return mid_o[..., :d], mid_lse


def merge_attention_states(o_a: Tensor, lse_a: Tensor, o_b: Tensor, lse_b: Tensor, *, out: Tensor | None = None,
                           out_dtype: torch.dtype | None = None, return_lse: bool = False):
    """Attention over the union of two disjoint key sets from their partial states (module docstring:
    [B, Hq, S, D] / [B, Hq, S], or one state as [B, Hq, D] / [B, Hq]; every state of a and b is folded).
    Returns o [B, Hq, D] in out_dtype (default o_a's; or written into `out`), and with return_lse its
    lse float32 [B, Hq] (a state again, for merging another level). Rows with every state empty: o 0,
    lse -inf."""
    fn = "merge_attention_states"
    (oa, la), (ob, lb) = as_states(fn, "a", o_a, lse_a), as_states(fn, "b", o_b, lse_b)
    B, hq, _, d = oa.shape
    if (ob.shape[0], ob.shape[1], ob.shape[3]) != (B, hq, d):
        raise ValueError(f"{fn}: o_b {tuple(o_b.shape)} does not match o_a {tuple(o_a.shape)} in rows, heads, dim")
    if len({t.device for t in (oa, la, ob, lb)}) != 1:
        raise ValueError(f"{fn}: all states must be on one device")
    if out is None:
        out = torch.empty(B, hq, d, dtype=out_dtype or o_a.dtype, device=oa.device)
    elif not isinstance(out, Tensor) or tuple(out.shape) != (B, hq, d) or out.device != oa.device:
        raise ValueError(f"{fn}: out must be a [{B}, {hq}, {d}] tensor on {oa.device}")
    lse_out = torch.empty(B, hq, dtype=torch.float32, device=oa.device) if return_lse else out
    if B and hq:
        block_h = min(16, triton.next_power_of_2(hq))
        lso = lse_out.stride() if return_lse else (0, 0)
        for_device(_merge_kernel, oa.device)[(B, triton.cdiv(hq, block_h))](
            oa, la, ob, lb, out, lse_out, hq, oa.shape[2], ob.shape[2], *oa.stride(), *la.stride(), *ob.stride(),
            *lb.stride(), *out.stride(), *lso, HEAD_DIM=d, BLOCK_H=block_h,
            BLOCK_D=max(16, triton.next_power_of_2(d)), WRITE_LSE=return_lse,
            **({"num_warps": 4} if oa.device.type == "cuda" else {}))
    return (out, lse_out) if return_lse else out


def cascade_decode(q: Tensor, k_cache: Tensor, v_cache: Tensor, plan: CascadePlan, sm_scale: float | None = None,
                   k_scale: Tensor | None = None, v_scale: Tensor | None = None, *, prefix_splits: int | None = None,
                   suffix_splits: int | None = None, prefix_config: KernelConfig | None = None,
                   suffix_config: KernelConfig | None = None, out: Tensor | None = None,
                   outer_splits: int | None = None, widen_max_bytes: int | None = 0) -> Tensor:
    """paged_decode of q [B, Hq, D] over each row's whole sequence, computed as the plan's shared prefixes
    (once per group) + each row's suffix + the merge. Returns [B, Hq, D] in q's dtype (or `out`).
    A plan with no groups is plain paged_decode over the suffix tables (the whole sequences). Split counts:
    the arguments, else the plan's (CascadePlan.prefix_splits / suffix_splits), else chosen here.
    Two levels (plan.outer): the outer groups' prefixes once each too (outer_splits, default chosen as
    for prefix_splits), both levels' states written side by side into one buffer [B, Hq, So + Sp, D] and
    merged with the suffix's in the one merge: a launch more than one level, no merge more.
    FP8 pages: a level whose prefix tables' fp16 copies fit widen_max_bytes (scratch_bytes; 0: never; None:
    dequant_pages' default; the plan's own widen_max_bytes bounds it further) has its prefix pages widened
    once (dequant_pages; head_dim a power of two), and the prefix kernel runs its 16-bit path over the
    copies (fp16 products, q rounded to fp16: values past fp16's 65,504 overflow, as in the Hopper extend over
    copies) instead of dequantising every tile in each of the group's M tiles."""
    if not isinstance(plan, CascadePlan):
        raise ValueError(f"cascade_decode: plan must be a CascadePlan, got {type(plan).__name__}")  # noqa: TRY004
    g = plan.groups
    prefix_splits = plan.prefix_splits if prefix_splits is None else prefix_splits
    suffix_splits = plan.suffix_splits if suffix_splits is None else suffix_splits
    fp8 = check_paged_args("cascade_decode", q, k_cache, v_cache, plan.suffix_pages, plan.suffix_lens, k_scale,
                           v_scale).fp8
    if suffix_splits is None:
        suffix_splits = suffix_num_splits(q, k_cache, v_cache, k_scale, plan)
    if g.prefix_pages.shape[0] == 0 and plan.outer is None and not plan.empty_suffix:
        from .decode import paged_decode

        return paged_decode(q, k_cache, v_cache, plan.suffix_pages, plan.suffix_lens, sm_scale, k_scale, v_scale,
                            num_splits=suffix_splits, config=suffix_config, out=out)
    widen_max_bytes = widen_budget(widen_max_bytes)
    if plan.widen_max_bytes is not None:  # a CUDA graph's plan: what its pool may hold (cuda_graphs.py)
        widen_max_bytes = min(widen_max_bytes, plan.widen_max_bytes)
    d = q.shape[2]
    widen = (fp8 and prefix_config is None and widen_max_bytes > 0 and d & (d - 1) == 0
             and k_cache.stride(3) == 1)  # dequant_pages' rows: a power-of-two head_dim, contiguous

    def prefix(lv: CascadeGroups, **kw) -> tuple[Tensor, Tensor]:
        """cascade_prefix_attention of one level, over fp16 copies of its prefix pages where they fit."""
        if widen and scratch_bytes(lv.prefix_pages, k_cache, d) <= widen_max_bytes:
            k16, v16 = dequant_pages(k_cache, v_cache, k_scale, v_scale, lv.prefix_pages, lv.prefix_lens, d)
            pages, caches = scratch_table(*lv.prefix_pages.shape, q.device), (k16, v16, None, None)
        else:
            pages, caches = lv.prefix_pages, (k_cache, v_cache, k_scale, v_scale)
        return cascade_prefix_attention(q, *caches[:2], pages, lv.prefix_lens, lv.group_start, lv.group_rows,
                                        sm_scale, *caches[2:], max_group_rows=lv.max_group_rows,
                                        config=prefix_config, **kw)

    if plan.outer is None:
        o_p, lse_p = prefix(g, num_splits=prefix_splits, all_rows_grouped=plan.all_rows_grouped)
    else:
        B, hq, d = q.shape
        levels = ((plan.outer, outer_splits, None), (g, prefix_splits, plan.all_rows_grouped))
        splits = [n if n is not None else default_prefix_splits(
            q.dtype, k_cache, hq, lv.prefix_pages.shape[0], lv.group_rows.shape[0],
            lv.prefix_pages.shape[1] * k_cache.shape[1], prefix_config) for lv, n, _ in levels]
        o_p = torch.empty(B, hq, sum(splits), d, dtype=torch.float32, device=q.device)  # [B, Hq, So + Sp, D]
        lse_p = torch.empty(B, hq, sum(splits), dtype=torch.float32, device=q.device)  # [B, Hq, So + Sp]
        at = 0
        for (lv, _, grouped), n in zip(levels, splits):
            prefix(lv, num_splits=n, all_rows_grouped=grouped, out=(o_p[:, :, at:at + n], lse_p[:, :, at:at + n]))
            at += n
    # An empty suffix keeps the Triton kernel (explicit config): the Gluon one needs a token a row.
    if plan.empty_suffix and suffix_config is None:
        suffix_config = default_config(KernelKind.DECODE, q, k_cache)
    o_s, lse_s = paged_decode_partial(q, k_cache, v_cache, plan.suffix_pages, plan.suffix_lens, sm_scale, k_scale,
                                      v_scale, num_splits=suffix_splits, config=suffix_config)
    return merge_attention_states(o_p, lse_p, o_s, lse_s, out=out, out_dtype=q.dtype)
