"""rms_norm: RMSNorm over the last dim with LlamaRMSNorm's numerics, optionally fused with the residual add.

    out = weight * (x32 * rsqrt(mean(x32 ** 2) + eps)).to(x.dtype)          x32 = x in float32
    residual given: h = (x + residual) rounded to x's dtype is written INTO residual, and out = rms_norm(h)

Rounding as transformers (and reference_layers.rms_norm_ref): normalise in fp32, round to the input dtype,
then multiply by the weight (a 16-bit product, so fp32 multiply and one rounding). The mean's fp32
sum is a tree here, not torch's order, so outputs can differ from the twin by a few fp32 ulps; in
16 bits almost all are bit-identical, the rare rest one ulp of the normalised value off (two of the
output after the weight). h (the new residual) is bit-identical.
On the GPU the mean is sum * (1 / H) and rsqrt is libdevice's rsqrtf, as in torch's CUDA kernels;
the interpreter (no libdevice) uses sum / H and 1 / sqrt, as torch's CPU kernels do.

Rows: x is [T, H], or [T, N, D] normalised per head (Qwen3's q/k norm) with weight [D] or [N, D]
(one weight row per head). Any row strides work (e.g. a head slice of the fused qkv output); the
last dim must be contiguous. Each program normalises ROWS rows of BLOCK = next_pow2(H) values.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor
from triton.language.extra import libdevice

from .checks import host_float
from .launch import KernelConfig, for_device, launch_options

DTYPES = (torch.float32, torch.float16, torch.bfloat16)


@triton.jit
def _rms_norm_kernel(x_ptr, res_ptr, w_ptr, out_ptr, n_rows, eps,
            stride_xt, stride_xn, stride_rt, stride_rn, stride_ot, stride_on, stride_wn,
            N: tl.constexpr, H: tl.constexpr, ROWS: tl.constexpr, BLOCK: tl.constexpr,
            HAS_RESIDUAL: tl.constexpr, WEIGHT_PER_HEAD: tl.constexpr, LIBDEVICE: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)  # flat rows t * N + n
    t = rows // N
    n = rows % N
    cols = tl.arange(0, BLOCK)
    mask = (rows < n_rows)[:, None] & (cols < H)[None, :]
    dtype = out_ptr.dtype.element_ty
    x = tl.load(x_ptr + (t * stride_xt + n * stride_xn)[:, None] + cols[None, :], mask=mask, other=0.0)
    x = x.to(tl.float32)  # [ROWS, BLOCK]
    if HAS_RESIDUAL:
        r_ptrs = res_ptr + (t * stride_rt + n * stride_rn)[:, None] + cols[None, :]
        h = (x + tl.load(r_ptrs, mask=mask, other=0.0).to(tl.float32)).to(dtype)  # rounded as `h + x` is
        tl.store(r_ptrs, h, mask=mask)
        x = h.to(tl.float32)
    # ---- rstd = rsqrt(mean(x^2) + eps), in fp32
    if LIBDEVICE:
        rstd = libdevice.rsqrt(tl.sum(x * x, axis=1) * (1.0 / H) + eps)
    else:
        rstd = tl.math.rsqrt(tl.sum(x * x, axis=1) / H + eps)
    xn = (x * rstd[:, None]).to(dtype).to(tl.float32)  # normalised, rounded to the input dtype
    # ---- weight multiply in the input dtype
    if WEIGHT_PER_HEAD:
        w = tl.load(w_ptr + n[:, None] * stride_wn + cols[None, :], mask=mask, other=0.0)
    else:
        w = tl.load(w_ptr + cols, mask=cols < H, other=0.0)[None, :]
    tl.store(out_ptr + (t * stride_ot + n * stride_on)[:, None] + cols[None, :],
             (w.to(tl.float32) * xn).to(dtype), mask=mask)


def _config(block: int) -> KernelConfig:
    """ROWS rows of BLOCK values a program, about 2k values (H = 4096: one row on 8 warps)."""
    rows = max(1, min(16, 2048 // block))
    return KernelConfig(block_m=rows, block_n=block, num_warps=max(1, min(8, rows * block // 512)), num_stages=1)


def _options(cfg: KernelConfig, device: torch.device) -> dict:
    opts = launch_options(cfg, device)
    if device.type != "cpu":
        opts["enable_fp_fusion"] = False  # x * x not contracted into the sum (torch squares, then sums)
    return opts


def _row_strides(t: Tensor) -> tuple[int, int]:
    return (t.stride(0), t.stride(1)) if t.dim() == 3 else (t.stride(0), 0)


def _check_like(name: str, t: Tensor, x: Tensor) -> None:
    if not isinstance(t, Tensor):
        raise ValueError(f"rms_norm: {name} must be a tensor, got {type(t).__name__}")
    if t.shape != x.shape or t.dtype != x.dtype or t.device != x.device:
        raise ValueError(f"rms_norm: {name} must be {x.dtype} {tuple(x.shape)} on {x.device}, "
                         f"got {t.dtype} {tuple(t.shape)} on {t.device}")
    if t.stride(-1) != 1:
        raise ValueError(f"rms_norm: {name}'s last dim must be contiguous (stride 1), got strides {t.stride()}")


def rms_norm(x: Tensor, weight: Tensor, eps: float, residual: Tensor | None = None, *,
             out: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
    """RMSNorm of x [T, H] (or [T, N, D] per head) by weight [H] (or [D] / [N, D]). Returns (out, new_residual).

    residual (x's shape and dtype): h = x + residual is written in place into `residual`, which is
    returned as new_residual, and h is normalised; without it new_residual is None. out: a fresh
    contiguous tensor of x's shape and dtype, or the given `out` (x itself is allowed, not residual).
    """
    if not isinstance(x, Tensor) or x.dim() not in (2, 3):
        raise ValueError(f"rms_norm: x must be [T, H] or [T, N, D], got {getattr(x, 'shape', type(x))}")
    if x.dtype not in DTYPES:
        raise ValueError(f"rms_norm: x dtype {x.dtype} not supported (fp32/fp16/bf16)")
    if x.stride(-1) != 1:
        raise ValueError(f"rms_norm: x's last dim must be contiguous (stride 1), got strides {x.stride()}")
    if not isinstance(weight, Tensor):
        raise ValueError(f"rms_norm: weight must be a tensor, got {type(weight).__name__}")
    eps = host_float("rms_norm", "eps", eps)
    if eps < 0:
        raise ValueError(f"rms_norm: eps must be >= 0, got {eps}")
    T, h = x.shape[0], x.shape[-1]
    n = x.shape[1] if x.dim() == 3 else 1
    heads_ok = x.dim() == 3 and tuple(weight.shape) == (n, h)
    if tuple(weight.shape) != (h,) and not heads_ok:
        want = f"[{h}]" + (f" or [{n}, {h}]" if x.dim() == 3 else "")
        raise ValueError(f"rms_norm: weight must be {want}, got {tuple(weight.shape)}")
    if weight.dtype != x.dtype or weight.device != x.device or weight.stride(-1) != 1:
        raise ValueError(f"rms_norm: weight must be {x.dtype} on {x.device} with a contiguous last dim, "
                         f"got {weight.dtype} on {weight.device}, strides {weight.stride()}")
    if residual is not None:
        _check_like("residual", residual, x)
    if out is None:
        out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    else:
        _check_like("out", out, x)
        if residual is not None and out.data_ptr() == residual.data_ptr():
            raise ValueError("rms_norm: out must not be residual (residual receives x + residual)")
    if T * n == 0:
        return out, residual
    cfg = _config(triton.next_power_of_2(h))
    res = residual if residual is not None else x  # placeholder: never read without a residual
    kernel = for_device(_rms_norm_kernel, x.device)
    kernel[(triton.cdiv(T * n, cfg.block_m),)](
        x, res, weight, out, T * n, float(eps),
        *_row_strides(x), *_row_strides(res), *_row_strides(out), weight.stride(0) if heads_ok else 0,
        N=n, H=h, ROWS=cfg.block_m, BLOCK=cfg.block_n, HAS_RESIDUAL=residual is not None,
        WEIGHT_PER_HEAD=heads_ok, LIBDEVICE=x.device.type == "cuda", **_options(cfg, x.device))
    return out, residual
