"""rope_store_kv_: a decode step's RoPE and K/V store in one kernel (the unfused path's two).

After the qkv projection, `apply_rope_` rotates q and k in place and `store_kv` copies k and v into their
page slots: two launches a layer. This kernel does both for 16-bit pages of the activations' dtype: q heads
rotated in place, k heads rotated into their slots, v heads copied into theirs. The rotation is rope.py's
(same rounding, fp fusion off), the store a plain copy, so pages and q equal apply_rope_ + store_kv's bit
for bit. qkv's k and v heads are left as they were (k not rotated): attention reads them from the pages.

qkv: [T, Hq + 2 Hkv, D] (q | k | v heads), any token and head strides, last dim contiguous. cos, sin: [T, D]
or [T, 1, D] in qkv's dtype. k_cache, v_cache: [P, S, Hkv, D] in qkv's dtype, one layout (token-major or
KVStore's head-major). slots: int64 [T] = page * S + offset. Grid: tokens x blocks of BLOCK_H heads.
"""
from __future__ import annotations

import triton
import triton.language as tl
from torch import Tensor

from .checks import check_slots
from .launch import for_device
from .rope import _config, _cos_rows, _cos_sin, _options, _rotate, DTYPES


@triton.jit
def _rope_store_kernel(qkv_ptr, cos_ptr, sin_ptr, slots_ptr, kc_ptr, vc_ptr,
                       stride_qt, stride_qh, stride_ct, stride_st, stride_cp, stride_cs, stride_ch, stride_cd,
                       HQ: tl.constexpr, HKV: tl.constexpr, PAGE_SIZE: tl.constexpr, HALF: tl.constexpr,
                       BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    heads = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)  # [BLOCK_H]: q | k | v head numbers
    d = tl.arange(0, BLOCK_HALF)
    dmask = d < HALF
    c1, c2, s1, s2 = _cos_sin(cos_ptr, sin_ptr, t, stride_ct, stride_st, d, dmask, HALF)
    # ---- x halves of BLOCK_H heads: [BLOCK_H, BLOCK_HALF]
    ptrs = qkv_ptr + t * stride_qt + heads[:, None] * stride_qh + d[None, :]
    mask = (heads < HQ + 2 * HKV)[:, None] & dmask[None, :]
    x1 = tl.load(ptrs, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(ptrs + HALF, mask=mask, other=0.0).to(tl.float32)
    dtype = qkv_ptr.dtype.element_ty
    o1, o2 = _rotate(x1, x2, c1, c2, s1, s2, dtype)
    rotated = (heads < HQ + HKV)[:, None]
    o1 = tl.where(rotated, o1, x1).to(dtype)  # v heads as loaded (exact)
    o2 = tl.where(rotated, o2, x2).to(dtype)
    # ---- q heads back in place
    is_q = (heads < HQ)[:, None] & dmask[None, :]
    tl.store(ptrs, o1, mask=is_q)
    tl.store(ptrs + HALF, o2, mask=is_q)
    # ---- k and v heads into this token's slot
    slot = tl.load(slots_ptr + t).to(tl.int64)
    at = (slot // PAGE_SIZE) * stride_cp + (slot % PAGE_SIZE) * stride_cs + d[None, :] * stride_cd
    is_k = ((heads >= HQ) & (heads < HQ + HKV))[:, None] & dmask[None, :]
    k_dst = kc_ptr + at + (heads - HQ)[:, None] * stride_ch
    tl.store(k_dst, o1, mask=is_k)
    tl.store(k_dst + HALF * stride_cd, o2, mask=is_k)
    is_v = ((heads >= HQ + HKV) & (heads < HQ + 2 * HKV))[:, None] & dmask[None, :]
    v_dst = vc_ptr + at + (heads - HQ - HKV)[:, None] * stride_ch
    tl.store(v_dst, o1, mask=is_v)
    tl.store(v_dst + HALF * stride_cd, o2, mask=is_v)


def rope_store_kv_(qkv: Tensor, cos: Tensor, sin: Tensor, num_q_heads: int, k_cache: Tensor, v_cache: Tensor,
                   slots: Tensor) -> Tensor:
    """Rotate qkv's q heads in place and write its rotated k heads and its v heads into k_cache, v_cache at
    slots (shapes in the module docstring); returns qkv. CPU slots out of range raise before any write."""
    fn = "rope_store_kv_"
    if not isinstance(qkv, Tensor) or qkv.dim() != 3:
        raise ValueError(f"{fn}: qkv must be [T, Hq + 2 Hkv, D], got {getattr(qkv, 'shape', type(qkv))}")
    if qkv.dtype not in DTYPES:
        raise ValueError(f"{fn}: qkv dtype {qkv.dtype} not supported (fp32/fp16/bf16)")
    T, nh, d = qkv.shape
    if d % 2 or qkv.stride(2) != 1:
        raise ValueError(f"{fn}: head_dim {d} must be even and qkv's last dim contiguous (strides {qkv.stride()})")
    hkv = (nh - num_q_heads) // 2
    if num_q_heads < 1 or hkv < 1 or num_q_heads + 2 * hkv != nh:
        raise ValueError(f"{fn}: {nh} heads are not {num_q_heads} q heads + 2 x Hkv")
    for name, c in (("k_cache", k_cache), ("v_cache", v_cache)):
        if not isinstance(c, Tensor) or c.dim() != 4 or tuple(c.shape[2:]) != (hkv, d):
            raise ValueError(f"{fn}: {name} must be [P, S, {hkv}, {d}], got {getattr(c, 'shape', type(c))}")
        if c.dtype != qkv.dtype or c.device != qkv.device:
            raise ValueError(f"{fn}: {name} must be {qkv.dtype} on {qkv.device} (other page dtypes: apply_rope_ "
                             f"and store_kv), got {c.dtype} on {c.device}")
    if v_cache.shape != k_cache.shape or v_cache.stride() != k_cache.stride():
        raise ValueError(f"{fn}: k_cache and v_cache must share one shape and layout")
    if (not isinstance(slots, Tensor) or slots.shape != (T,) or slots.dtype.is_floating_point
            or slots.device != qkv.device):
        raise ValueError(f"{fn}: slots must be an integer tensor [{T}] on {qkv.device}")
    stride_ct, stride_st = _cos_rows("cos", cos, qkv, fn), _cos_rows("sin", sin, qkv, fn)
    check_slots(fn, slots, k_cache)
    if T == 0:
        return qkv
    cfg = _config(nh, d // 2)
    kernel = for_device(_rope_store_kernel, qkv.device)
    kernel[(T, triton.cdiv(nh, cfg.block_m))](
        qkv, cos, sin, slots, k_cache, v_cache, qkv.stride(0), qkv.stride(1), stride_ct, stride_st,
        *k_cache.stride(), HQ=num_q_heads, HKV=hkv, PAGE_SIZE=k_cache.shape[1], HALF=d // 2,
        BLOCK_H=cfg.block_m, BLOCK_HALF=cfg.block_n, **_options(cfg, qkv.device))
    return qkv
