"""apply_rope_: rotary embedding (NeoX / Llama rotate-half), in place on the q and k heads of a token.

    out = x * cos + rotate_half(x) * sin,   rotate_half(x) = cat(-x[D/2:], x[:D/2])
    i.e. out[:D/2] = x1 * cos1 - x2 * sin1,  out[D/2:] = x2 * cos2 + x1 * sin2

Rounding as model.py's eager expression in the input dtype: each product rounded to the dtype,
then the sum rounded (16-bit values are multiplied and added in fp32, exact or correctly rounded,
then cast, as torch does). On the GPU fp fusion is switched off for this kernel, so no multiply-add
is contracted into an FMA (its sm_90 PTX has none: tests/kernels/test_layer_kernels.py) and results
should equal the twin bit for bit in fp32, fp16 and bf16; the interpreter shows it for fp32 and
fp16, benchmarks/kernels/bench_layer_kernels.py checks all three on the GPU.

qk: [T, Hq + Hkv, D], any token and head strides (e.g. the q and k heads of the fused qkv output,
row stride (Hq + 2 Hkv) * D), last dim contiguous. cos, sin: [T, D] or [T, 1, D] in qk's dtype
(model.py's layout). Grid: tokens x blocks of BLOCK_H heads; each program reads its cos/sin row once.
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl
from torch import Tensor

from .launch import KernelConfig, for_device, launch_options

DTYPES = (torch.float32, torch.float16, torch.bfloat16)


@triton.jit
def _cos_sin(cos_ptr, sin_ptr, t, stride_ct, stride_st, d, dmask, HALF: tl.constexpr):
    """This token's cos and sin, both halves, as fp32 [1, BLOCK_HALF] each: (c1, c2, s1, s2)."""
    c1 = tl.load(cos_ptr + t * stride_ct + d, mask=dmask, other=0.0).to(tl.float32)[None, :]
    c2 = tl.load(cos_ptr + t * stride_ct + HALF + d, mask=dmask, other=0.0).to(tl.float32)[None, :]
    s1 = tl.load(sin_ptr + t * stride_st + d, mask=dmask, other=0.0).to(tl.float32)[None, :]
    s2 = tl.load(sin_ptr + t * stride_st + HALF + d, mask=dmask, other=0.0).to(tl.float32)[None, :]
    return c1, c2, s1, s2


@triton.jit
def _rotate(x1, x2, c1, c2, s1, s2, dtype: tl.constexpr):
    """The rotated halves (fp32 holding dtype values): every product and the sum rounded to dtype, as the
    eager expression does."""
    o1 = (x1 * c1).to(dtype).to(tl.float32) - (x2 * s1).to(dtype).to(tl.float32)
    o2 = (x2 * c2).to(dtype).to(tl.float32) + (x1 * s2).to(dtype).to(tl.float32)
    return o1, o2


@triton.jit
def _rope_kernel(qk_ptr, cos_ptr, sin_ptr, stride_qt, stride_qh, stride_ct, stride_st,
            NUM_HEADS: tl.constexpr, HALF: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    heads = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    d = tl.arange(0, BLOCK_HALF)
    dmask = d < HALF
    mask = (heads < NUM_HEADS)[:, None] & dmask[None, :]
    c1, c2, s1, s2 = _cos_sin(cos_ptr, sin_ptr, t, stride_ct, stride_st, d, dmask, HALF)
    # ---- x halves of BLOCK_H heads: [BLOCK_H, BLOCK_HALF]
    ptrs = qk_ptr + t * stride_qt + heads[:, None] * stride_qh + d[None, :]
    x1 = tl.load(ptrs, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(ptrs + HALF, mask=mask, other=0.0).to(tl.float32)
    o1, o2 = _rotate(x1, x2, c1, c2, s1, s2, qk_ptr.dtype.element_ty)
    tl.store(ptrs, o1.to(qk_ptr.dtype.element_ty), mask=mask)
    tl.store(ptrs + HALF, o2.to(qk_ptr.dtype.element_ty), mask=mask)


def _config(num_heads: int, half: int) -> KernelConfig:
    """Up to 16 heads a program, a power of two dividing the head count where one of at least 4 does
    (40 heads: 5 blocks of 8), else masked blocks; up to 4 warps."""
    block_h = math.gcd(num_heads, 16)
    if block_h < 4:
        block_h = min(16, triton.next_power_of_2(num_heads))
    block_half = triton.next_power_of_2(half)
    return KernelConfig(block_m=block_h, block_n=block_half, num_warps=max(1, min(4, block_h * block_half // 256)),
                        num_stages=1)


def _options(cfg: KernelConfig, device: torch.device) -> dict:
    opts = launch_options(cfg, device)
    if device.type != "cpu":
        opts["enable_fp_fusion"] = False  # no FMA: products and sum rounded separately, as in eager torch
    return opts


def _cos_rows(name: str, c: Tensor, qk: Tensor, fn: str = "apply_rope_") -> int:
    """The token stride of cos or sin ([T, D] or [T, 1, D]) after checking it (errors name fn)."""
    T, _, d = qk.shape
    if not isinstance(c, Tensor):
        raise ValueError(f"{fn}: {name} must be a tensor, got {type(c).__name__}")
    if tuple(c.shape) not in ((T, d), (T, 1, d)):
        raise ValueError(f"{fn}: {name} must be [{T}, {d}] or [{T}, 1, {d}], got {tuple(c.shape)}")
    if c.dtype != qk.dtype or c.device != qk.device:
        raise ValueError(f"{fn}: {name} must be {qk.dtype} on {qk.device} (cast it as model.py does), "
                         f"got {c.dtype} on {c.device}")
    if c.stride(-1) != 1:
        raise ValueError(f"{fn}: {name}'s last dim must be contiguous, got strides {c.stride()}")
    return c.stride(0)


def apply_rope_(qk: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate qk [T, H, D] in place by cos, sin ([T, D] or [T, 1, D], qk's dtype); returns qk."""
    if not isinstance(qk, Tensor) or qk.dim() != 3:
        raise ValueError(f"apply_rope_: qk must be [T, Hq + Hkv, D], got {getattr(qk, 'shape', type(qk))}")
    if qk.dtype not in DTYPES:
        raise ValueError(f"apply_rope_: qk dtype {qk.dtype} not supported (fp32/fp16/bf16)")
    T, nh, d = qk.shape
    if d % 2:
        raise ValueError(f"apply_rope_: head_dim {d} must be even")
    if qk.stride(2) != 1:
        raise ValueError(f"apply_rope_: qk's last dim must be contiguous, got strides {qk.stride()}")
    stride_ct, stride_st = _cos_rows("cos", cos, qk), _cos_rows("sin", sin, qk)
    if T == 0 or nh == 0:
        return qk
    cfg = _config(nh, d // 2)
    kernel = for_device(_rope_kernel, qk.device)
    kernel[(T, triton.cdiv(nh, cfg.block_m))](
        qk, cos, sin, qk.stride(0), qk.stride(1), stride_ct, stride_st,
        NUM_HEADS=nh, HALF=d // 2, BLOCK_H=cfg.block_m, BLOCK_HALF=cfg.block_n, **_options(cfg, qk.device))
    return qk
