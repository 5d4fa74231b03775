"""FP8 quantisation helpers shared by the kernels, their launchers and reference_attention.py.

FP8 caches use per-token-per-head scales: k_scale, v_scale are float32 or float16 tensors
[num_pages, page_size, Hkv] beside the pages, and a stored row means `fp8 * scale`.
Such scales need no calibration and are written once with their page, so a page shared
by many requests through the prefix tree stays valid for all of them.
"""
from __future__ import annotations

import torch
from torch import Tensor

FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)


def is_fp8(dtype: torch.dtype) -> bool:
    """Whether dtype is one of the FP8 cache dtypes (e4m3fn, e5m2)."""
    return dtype in FP8_DTYPES


def fp8_max(dtype: torch.dtype) -> float:
    """Largest finite value of an FP8 dtype (448 for e4m3fn, 57344 for e5m2)."""
    return float(torch.finfo(dtype).max)


def scale_range(scale_dtype: torch.dtype) -> tuple[float, float]:
    """Smallest and largest scale stored. float32: 1e-12 and its max. float16: its smallest normal,
    2^-14 (a subnormal scale, rounded to nearest, could fall far enough below amax / fp8_max to
    clip the row), and its max, 65504 (rows beyond 65504 * fp8_max saturate instead of becoming
    zeros times an infinite scale)."""
    if scale_dtype == torch.float16:
        return 2.0**-14, 65504.0
    return 1e-12, float(torch.finfo(torch.float32).max)


def quantize_fp8(x: Tensor, dtype: torch.dtype, scale_dtype: torch.dtype = torch.float32) -> tuple[Tensor, Tensor]:
    """Per-row (last dim) absmax quantisation. x: [..., D] -> (fp8 [..., D], scale fp32 [...]).

    The scale amax / fp8_max is rounded to scale_dtype (float32 or float16) and the row divided
    by the rounded value, so storing the scale in scale_dtype is exact. Values are clamped to the
    dtype's range before the cast (torch's e4m3fn cast does not saturate: 465 would become NaN).
    """
    x32 = x.float()
    amax = x32.abs().amax(dim=-1)
    lo, hi = scale_range(scale_dtype)
    # a tensor divisor: torch on CUDA divides by a Python scalar through its reciprocal, an ulp off
    scale = (amax / torch.full_like(amax, fp8_max(dtype))).clamp(lo, hi).to(scale_dtype).float()
    q = (x32 / scale.unsqueeze(-1)).clamp(-fp8_max(dtype), fp8_max(dtype)).to(dtype)
    return q, scale
