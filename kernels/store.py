"""store_kv: scatter the new tokens' K/V rows into their page slots (quantising to FP8 or INT4/INT2 in-kernel).

One program per new token writes all its KV heads: K and V rows [Hkv, D] go to
`cache[slot // page_size, slot % page_size]`. For FP8 caches each (token, head) row gets its
own absmax scale (see kernels/fp8.py); values are clamped to the FP8 range before the cast.
For INT4/INT2 caches (uint8 pages) each row's groups get a float16 (scale, zero) and the codes are
packed into bit-planes (kernels/intq.py), in float32 and integer arithmetic only, so the interpreter
and the GPU store the same bytes as intq.quantize_int.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from .checks import CACHE_DTYPES, Q_DTYPES, cache_bits, check_scales, check_slots, check_tensor
from .fp8 import fp8_max, scale_range
from .intq import (
    FP16_MAX,
    SCALE_MIN,
    groups_per_plane,
    packed_dim,
    planes,
    planes_per_group,
    qmax,
)
from .launch import for_device


@triton.jit
def _store_one(src_ptr, t, stride_st, stride_sh, stride_sd,
               cache_ptr, page, off, stride_cp, stride_cs, stride_ch, stride_cd,
               scale_ptr, stride_xp, stride_xs, stride_xh,
               NUM_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
               IS_FP8: tl.constexpr, FP8_MAX: tl.constexpr, SCALE_MIN: tl.constexpr,
               SCALE_MAX: tl.constexpr):
    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_D)
    mask = (offs_h[:, None] < NUM_HEADS) & (offs_d[None, :] < HEAD_DIM)
    x = tl.load(src_ptr + t * stride_st + offs_h[:, None] * stride_sh + offs_d[None, :] * stride_sd,
                mask=mask, other=0.0)  # [BLOCK_H, BLOCK_D]
    dst = cache_ptr + page * stride_cp + off * stride_cs + offs_h[:, None] * stride_ch + offs_d[None, :] * stride_cd
    if IS_FP8:
        x = x.to(tl.float32)
        # div_rn: correctly rounded like torch's division, so GPU stores match the reference bit for bit
        amax = tl.max(tl.abs(x), axis=1)  # [BLOCK_H]
        scale = tl.math.div_rn(amax, tl.full(amax.shape, FP8_MAX, tl.float32))
        scale = tl.minimum(tl.maximum(scale, SCALE_MIN), SCALE_MAX)
        scale = scale.to(scale_ptr.dtype.element_ty).to(tl.float32)  # quantise by the scale as stored
        qx = tl.math.div_rn(x, tl.broadcast_to(scale[:, None], x.shape))
        qx = tl.minimum(tl.maximum(qx, -FP8_MAX), FP8_MAX)
        tl.store(dst, qx.to(cache_ptr.dtype.element_ty), mask=mask)
        tl.store(scale_ptr + page * stride_xp + off * stride_xs + offs_h * stride_xh, scale,
                 mask=offs_h < NUM_HEADS)
    else:
        tl.store(dst, x.to(cache_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _group_grid(lo, hi, QMAX: tl.constexpr, FP16_MAX: tl.constexpr, SCALE_MIN: tl.constexpr):
    """(scale, zero) float32 of groups with minimum lo and maximum hi, each rounded to float16 (as stored)."""
    zero = tl.minimum(tl.maximum(lo, -FP16_MAX), FP16_MAX).to(tl.float16).to(tl.float32)
    scale = tl.math.div_rn(hi - zero, tl.full(hi.shape, QMAX, tl.float32))
    scale = tl.minimum(tl.maximum(scale, SCALE_MIN), FP16_MAX).to(tl.float16).to(tl.float32)
    return scale, zero


@triton.jit
def _codes(x, scale, zero, QMAX: tl.constexpr):
    """int32 codes of x by its groups' (scale, zero), broadcast to x: round half up (truncation of >= 0)."""
    code = tl.math.div_rn(x - zero, tl.broadcast_to(scale, x.shape))
    return (tl.minimum(tl.maximum(code, 0.0), QMAX) + 0.5).to(tl.int32)


@triton.jit
def _store_int(src_ptr, t, stride_st, stride_sh, stride_sd,
               cache_ptr, page, off, stride_cp, stride_cs, stride_ch, stride_cd,
               scale_ptr, stride_xp, stride_xs, stride_xh, stride_xg, stride_xz,
               NUM_HEADS: tl.constexpr, BLOCK_H: tl.constexpr, BITS: tl.constexpr, PACKED: tl.constexpr,
               BLOCK_W: tl.constexpr, GROUPS: tl.constexpr, PLANES_PER_GROUP: tl.constexpr,
               QMAX: tl.constexpr, FP16_MAX: tl.constexpr, SCALE_MIN: tl.constexpr):
    """One token's rows [Hkv, D] as codes of BITS bits in bit-planes + float16 (scale, zero) per group."""
    h = tl.arange(0, BLOCK_H)[:, None, None, None]
    g = tl.arange(0, GROUPS)[None, :, None, None]
    pp = tl.arange(0, PLANES_PER_GROUP)[None, None, :, None]
    j = tl.arange(0, BLOCK_W)[None, None, None, :]
    plane = g * PLANES_PER_GROUP + pp  # [1, G, PPG, 1]
    mask = (h < NUM_HEADS) & (j < PACKED)
    # x: [BLOCK_H, G, PPG, BLOCK_W], value plane * PACKED + j of each head
    x = tl.load(src_ptr + t * stride_st + h * stride_sh + (plane * PACKED + j) * stride_sd,
                mask=mask, other=0.0).to(tl.float32)
    lo = tl.min(tl.min(tl.where(mask, x, float("inf")), axis=3), axis=2)  # [BLOCK_H, G]
    hi = tl.max(tl.max(tl.where(mask, x, float("-inf")), axis=3), axis=2)
    scale, zero = _group_grid(lo, hi, QMAX, FP16_MAX, SCALE_MIN)
    code = _codes(x, scale[:, :, None, None], zero[:, :, None, None], QMAX)
    packed = tl.sum(tl.sum(code << (plane * BITS), axis=2), axis=1)  # [BLOCK_H, BLOCK_W]: planes OR-ed
    h2 = tl.arange(0, BLOCK_H)[:, None]
    j2 = tl.arange(0, BLOCK_W)[None, :]
    tl.store(cache_ptr + page * stride_cp + off * stride_cs + h2 * stride_ch + j2 * stride_cd, packed.to(tl.uint8),
             mask=(h2 < NUM_HEADS) & (j2 < PACKED))
    g2 = tl.arange(0, GROUPS)[None, :]
    xs = scale_ptr + page * stride_xp + off * stride_xs + h2 * stride_xh + g2 * stride_xg  # [BLOCK_H, G]
    tl.store(xs, scale.to(tl.float16), mask=h2 < NUM_HEADS)
    tl.store(xs + stride_xz, zero.to(tl.float16), mask=h2 < NUM_HEADS)


@triton.jit
def _store_int_sub(src_ptr, t, stride_st, stride_sh, stride_sd,
                   cache_ptr, page, off, stride_cp, stride_cs, stride_ch, stride_cd,
                   scale_ptr, stride_xp, stride_xs, stride_xh, stride_xg, stride_xz,
                   NUM_HEADS: tl.constexpr, BLOCK_H: tl.constexpr, BITS: tl.constexpr, PLANES: tl.constexpr,
                   PACKED: tl.constexpr, GROUPS_PER_PLANE: tl.constexpr, GROUP_SIZE: tl.constexpr,
                   BLOCK_G: tl.constexpr, QMAX: tl.constexpr, FP16_MAX: tl.constexpr, SCALE_MIN: tl.constexpr):
    """_store_int for groups smaller than a bit-plane: plane p holds groups p * GROUPS_PER_PLANE + gg of
    GROUP_SIZE values each (byte gg * GROUP_SIZE + i of the row); same arithmetic."""
    h = tl.arange(0, BLOCK_H)[:, None, None, None]
    p = tl.arange(0, PLANES)[None, :, None, None]
    gg = tl.arange(0, GROUPS_PER_PLANE)[None, None, :, None]
    i = tl.arange(0, BLOCK_G)[None, None, None, :]
    byte = gg * GROUP_SIZE + i  # [1, 1, GPP, BLOCK_G]
    mask = (h < NUM_HEADS) & (i < GROUP_SIZE)
    # x: [BLOCK_H, PLANES, GPP, BLOCK_G], value p * PACKED + byte of each head
    x = tl.load(src_ptr + t * stride_st + h * stride_sh + (p * PACKED + byte) * stride_sd,
                mask=mask, other=0.0).to(tl.float32)
    lo = tl.min(tl.where(mask, x, float("inf")), axis=3)  # [BLOCK_H, PLANES, GPP]
    hi = tl.max(tl.where(mask, x, float("-inf")), axis=3)
    scale, zero = _group_grid(lo, hi, QMAX, FP16_MAX, SCALE_MIN)
    code = _codes(x, scale[:, :, :, None], zero[:, :, :, None], QMAX)
    packed = tl.sum(code << (p * BITS), axis=1)  # [BLOCK_H, GPP, BLOCK_G]: planes OR-ed
    h3 = tl.arange(0, BLOCK_H)[:, None, None]
    gg3 = tl.arange(0, GROUPS_PER_PLANE)[None, :, None]
    i3 = tl.arange(0, BLOCK_G)[None, None, :]
    tl.store(cache_ptr + page * stride_cp + off * stride_cs + h3 * stride_ch + (gg3 * GROUP_SIZE + i3) * stride_cd,
             packed.to(tl.uint8), mask=(h3 < NUM_HEADS) & (i3 < GROUP_SIZE))
    p3 = tl.arange(0, PLANES)[None, :, None]
    g3 = p3 * GROUPS_PER_PLANE + tl.arange(0, GROUPS_PER_PLANE)[None, None, :]  # [1, PLANES, GPP]: group index
    xs = scale_ptr + page * stride_xp + off * stride_xs + h3 * stride_xh + g3 * stride_xg
    tl.store(xs, scale.to(tl.float16), mask=h3 < NUM_HEADS)  # [BLOCK_H, PLANES, GPP]
    tl.store(xs + stride_xz, zero.to(tl.float16), mask=h3 < NUM_HEADS)


@triton.jit
def _int_kernel(k_ptr, v_ptr, slots_ptr, kc_ptr, vc_ptr, ks_ptr, vs_ptr,
                stride_kt, stride_kh, stride_kd, stride_vt, stride_vh, stride_vd,
                stride_cp, stride_cs, stride_ch, stride_cd,
                stride_xp, stride_xs, stride_xh, stride_xg, stride_xz,
                PAGE_SIZE: tl.constexpr, NUM_HEADS: tl.constexpr, BLOCK_H: tl.constexpr, BITS: tl.constexpr,
                PACKED: tl.constexpr, BLOCK_W: tl.constexpr, GROUPS: tl.constexpr, PLANES_PER_GROUP: tl.constexpr,
                PLANES: tl.constexpr, GROUPS_PER_PLANE: tl.constexpr, GROUP_SIZE: tl.constexpr,
                BLOCK_G: tl.constexpr, QMAX: tl.constexpr, FP16_MAX: tl.constexpr, SCALE_MIN: tl.constexpr):
    t = tl.program_id(0)
    slot = tl.load(slots_ptr + t).to(tl.int64)
    page = slot // PAGE_SIZE
    off = slot % PAGE_SIZE
    if GROUPS_PER_PLANE == 1:
        _store_int(k_ptr, t, stride_kt, stride_kh, stride_kd, kc_ptr, page, off, stride_cp, stride_cs, stride_ch,
                   stride_cd, ks_ptr, stride_xp, stride_xs, stride_xh, stride_xg, stride_xz,
                   NUM_HEADS, BLOCK_H, BITS, PACKED, BLOCK_W, GROUPS, PLANES_PER_GROUP, QMAX, FP16_MAX, SCALE_MIN)
        _store_int(v_ptr, t, stride_vt, stride_vh, stride_vd, vc_ptr, page, off, stride_cp, stride_cs, stride_ch,
                   stride_cd, vs_ptr, stride_xp, stride_xs, stride_xh, stride_xg, stride_xz,
                   NUM_HEADS, BLOCK_H, BITS, PACKED, BLOCK_W, GROUPS, PLANES_PER_GROUP, QMAX, FP16_MAX, SCALE_MIN)
    else:
        _store_int_sub(k_ptr, t, stride_kt, stride_kh, stride_kd, kc_ptr, page, off, stride_cp, stride_cs,
                       stride_ch, stride_cd, ks_ptr, stride_xp, stride_xs, stride_xh, stride_xg, stride_xz,
                       NUM_HEADS, BLOCK_H, BITS, PLANES, PACKED, GROUPS_PER_PLANE, GROUP_SIZE, BLOCK_G, QMAX,
                       FP16_MAX, SCALE_MIN)
        _store_int_sub(v_ptr, t, stride_vt, stride_vh, stride_vd, vc_ptr, page, off, stride_cp, stride_cs,
                       stride_ch, stride_cd, vs_ptr, stride_xp, stride_xs, stride_xh, stride_xg, stride_xz,
                       NUM_HEADS, BLOCK_H, BITS, PLANES, PACKED, GROUPS_PER_PLANE, GROUP_SIZE, BLOCK_G, QMAX,
                       FP16_MAX, SCALE_MIN)


@triton.jit
def _store_kernel(k_ptr, v_ptr, slots_ptr, kc_ptr, vc_ptr, ks_ptr, vs_ptr,
            stride_kt, stride_kh, stride_kd, stride_vt, stride_vh, stride_vd,
            stride_cp, stride_cs, stride_ch, stride_cd,
            stride_xp, stride_xs, stride_xh,
            PAGE_SIZE: tl.constexpr, NUM_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
            BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, IS_FP8: tl.constexpr, FP8_MAX: tl.constexpr,
            SCALE_MIN: tl.constexpr, SCALE_MAX: tl.constexpr):
    t = tl.program_id(0)
    slot = tl.load(slots_ptr + t).to(tl.int64)
    page = slot // PAGE_SIZE
    off = slot % PAGE_SIZE
    _store_one(k_ptr, t, stride_kt, stride_kh, stride_kd, kc_ptr, page, off,
               stride_cp, stride_cs, stride_ch, stride_cd, ks_ptr, stride_xp, stride_xs, stride_xh,
               NUM_HEADS, HEAD_DIM, BLOCK_H, BLOCK_D, IS_FP8, FP8_MAX, SCALE_MIN, SCALE_MAX)
    _store_one(v_ptr, t, stride_vt, stride_vh, stride_vd, vc_ptr, page, off,
               stride_cp, stride_cs, stride_ch, stride_cd, vs_ptr, stride_xp, stride_xs, stride_xh,
               NUM_HEADS, HEAD_DIM, BLOCK_H, BLOCK_D, IS_FP8, FP8_MAX, SCALE_MIN, SCALE_MAX)


def store_kv(k: Tensor, v: Tensor, k_cache: Tensor, v_cache: Tensor, slots: Tensor,
             k_scale: Tensor | None = None, v_scale: Tensor | None = None) -> None:
    """Write k, v [T, Hkv, D] into k_cache, v_cache [P, S, Hkv, D] at slots int64 [T] (= page * S + offset).

    FP8 caches need k_scale, v_scale float32 or float16 [P, S, Hkv]; each written row's scale is
    stored there, rounded to that dtype, and the row is quantised by the stored value.
    INT4/INT2 caches are uint8 [P, S, Hkv, D * bits / 8] with k_scale, v_scale float16 [P, S, Hkv, G, 2]
    (kernels/intq.py: G groups of D / G values, each with its (scale, zero)).
    Several tokens may share a slot (the CUDA-graph runner pads with one scratch slot; which write
    wins is unspecified). Values: on CPU every slot must be in [0, P * S), checked before anything
    is written (checks.check_slots raises IndexValueError naming the first bad one); on CUDA that
    is the caller's duty (no host sync here): out of range, the kernel writes outside the caches.
    """
    fn = "store_kv"
    check_tensor(fn, "k", k, 3, Q_DTYPES)
    check_tensor(fn, "v", v, 3, Q_DTYPES)
    T, hkv, d = k.shape
    if v.shape != k.shape:
        raise ValueError(f"store_kv: k {tuple(k.shape)} and v {tuple(v.shape)} differ")
    check_tensor(fn, "k_cache", k_cache, 4, CACHE_DTYPES)
    check_tensor(fn, "v_cache", v_cache, 4)
    width = packed_dim(d, cache_bits(fn, k_cache, d)) if k_cache.dtype == torch.uint8 else d
    if k_cache.shape[2:] != (hkv, width) or v_cache.shape != k_cache.shape:
        raise ValueError(f"store_kv: caches {tuple(k_cache.shape)}/{tuple(v_cache.shape)} do not hold [*, *, {hkv}, {d}] rows")
    if k_cache.stride() != v_cache.stride() or v_cache.dtype != k_cache.dtype:
        raise ValueError("store_kv: k_cache and v_cache must share dtype and strides")
    if k_cache.shape[1] == 0:
        raise ValueError(f"store_kv: caches {tuple(k_cache.shape)} have pages of 0 slots")
    if not isinstance(slots, Tensor) or slots.shape != (T,) or slots.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"store_kv: slots must be int64 [{T}], got {getattr(slots, 'dtype', type(slots))} "
                         f"{tuple(getattr(slots, 'shape', ()))}")
    quant = check_scales(fn, k_cache, k_scale, v_scale, d)
    fp8 = quant.fp8
    devices = {t.device for t in (k, v, k_cache, v_cache, slots)}
    if len(devices) != 1:
        raise ValueError(f"store_kv: tensors on several devices {devices}")
    check_slots(fn, slots, k_cache)
    if T == 0:
        return
    slots = slots.contiguous()  # the kernel reads slots[t] at offset t
    if quant.bits:
        _launch_int(k, v, k_cache, v_cache, slots, k_scale, v_scale, quant.bits)
        return
    ks = k_scale if fp8 else k_cache  # placeholders: never read when not FP8
    vs = v_scale if fp8 else v_cache
    xstride = k_scale.stride() if fp8 else (0, 0, 0)
    scale_lo, scale_hi = scale_range(k_scale.dtype) if fp8 else (1.0, 1.0)
    kernel = for_device(_store_kernel, k.device)
    kernel[(T,)](
        k, v, slots, k_cache, v_cache, ks, vs,
        *k.stride(), *v.stride(), *k_cache.stride(), *xstride,
        PAGE_SIZE=k_cache.shape[1], NUM_HEADS=hkv, HEAD_DIM=d,
        BLOCK_H=triton.next_power_of_2(hkv), BLOCK_D=triton.next_power_of_2(d),
        IS_FP8=fp8, FP8_MAX=fp8_max(k_cache.dtype) if fp8 else 1.0,
        SCALE_MIN=scale_lo, SCALE_MAX=scale_hi,
    )


def _launch_int(k: Tensor, v: Tensor, k_cache: Tensor, v_cache: Tensor, slots: Tensor, k_scale: Tensor,
                v_scale: Tensor, bits: int) -> None:
    T, hkv, _ = k.shape
    groups = k_scale.shape[3]
    width = k_cache.shape[3]
    gsize = width * planes(bits) // groups  # values a group holds
    for_device(_int_kernel, k.device)[(T,)](
        k, v, slots, k_cache, v_cache, k_scale, v_scale,
        *k.stride(), *v.stride(), *k_cache.stride(), *k_scale.stride(),
        PAGE_SIZE=k_cache.shape[1], NUM_HEADS=hkv, BLOCK_H=triton.next_power_of_2(hkv), BITS=bits,
        PACKED=width, BLOCK_W=triton.next_power_of_2(width), GROUPS=groups,
        PLANES_PER_GROUP=planes_per_group(bits, groups), PLANES=planes(bits),
        GROUPS_PER_PLANE=groups_per_plane(bits, groups), GROUP_SIZE=gsize,
        BLOCK_G=triton.next_power_of_2(gsize), QMAX=float(qmax(bits)), FP16_MAX=FP16_MAX, SCALE_MIN=SCALE_MIN)
