"""silu_and_mul: the gated MLP's activation, out = silu(gate) * up with gate_up = [gate | up] on the last dim.

Rounding as `F.silu(gate) * up` in the input dtype: silu in fp32 (x / (1 + exp(-x)), correctly
rounded division) rounded once to the input dtype, then the product (exact in fp32 for 16-bit
inputs) rounded again. On the GPU exp is libdevice's expf, the function torch's CUDA silu calls,
compiled with FMA contraction as nvcc does, so results should equal torch's bit for bit in every
dtype (benchmarks/kernels/bench_layer_kernels.py checks it; unverified until run on a GPU). The
interpreter's exp is NumPy's, which differs from torch's CPU exp (SLEEF) in the last fp32 bits: on
CPU the kernel is within a few fp32 ulps (one fp16 ulp) of the twin, and bit-identical in fp32 and
fp16 to the same rounding steps taken with NumPy's exp (tests).

One program computes BLOCK outputs of one token row; gate_up may have any row stride (last dim
contiguous).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor
from triton.language.extra import libdevice

from .launch import KernelConfig, for_device, launch_options

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# GPU: FMA contraction on, as nvcc compiles torch's silu by default (--fmad=true): libdevice's expf is
# contracted inside, and its last multiply with the `1 +` after it. bench_layer_kernels.py's check
# also runs the kernel with contraction off, in case torch's build rounds differently.
FP_FUSION = True


@triton.jit
def _silu_mul_kernel(gu_ptr, out_ptr, stride_gt, stride_ot,
            I: tl.constexpr, BLOCK: tl.constexpr, LIBDEVICE: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < I
    dtype = out_ptr.dtype.element_ty
    gate = tl.load(gu_ptr + t * stride_gt + cols, mask=mask, other=0.0).to(tl.float32)  # [BLOCK]
    up = tl.load(gu_ptr + t * stride_gt + I + cols, mask=mask, other=0.0).to(tl.float32)
    if LIBDEVICE:
        e = libdevice.exp(-gate)
    else:
        e = tl.exp(-gate)
    silu = tl.math.div_rn(gate, 1.0 + e).to(dtype).to(tl.float32)  # F.silu's result in the input dtype
    tl.store(out_ptr + t * stride_ot + cols, (silu * up).to(dtype), mask=mask)


def _config(i: int) -> KernelConfig:
    """Up to 1024 outputs a program on 4 warps (8 a thread)."""
    block = min(1024, triton.next_power_of_2(i))
    return KernelConfig(block_m=1, block_n=block, num_warps=max(1, min(4, block // 256)), num_stages=1)


def _options(cfg: KernelConfig, device: torch.device) -> dict:
    opts = launch_options(cfg, device)
    if device.type != "cpu":
        opts["enable_fp_fusion"] = FP_FUSION
    return opts


def silu_and_mul(gate_up: Tensor, *, out: Tensor | None = None) -> Tensor:
    """gate_up [T, 2 I] (gate first, up second) -> silu(gate) * up [T, I], in gate_up's dtype.

    Not in place: out is a fresh contiguous [T, I] tensor, or the given `out` ([T, I], same dtype
    and device, last dim contiguous; it must not overlap gate_up).
    """
    if not isinstance(gate_up, Tensor) or gate_up.dim() != 2 or gate_up.shape[1] % 2:
        raise ValueError(f"silu_and_mul: gate_up must be [T, 2 I], got {getattr(gate_up, 'shape', type(gate_up))}")
    if gate_up.dtype not in DTYPES:
        raise ValueError(f"silu_and_mul: gate_up dtype {gate_up.dtype} not supported (fp32/fp16/bf16)")
    if gate_up.stride(1) != 1:
        raise ValueError(f"silu_and_mul: gate_up's last dim must be contiguous, got strides {gate_up.stride()}")
    T, i = gate_up.shape[0], gate_up.shape[1] // 2
    if out is None:
        out = torch.empty((T, i), dtype=gate_up.dtype, device=gate_up.device)
    elif not isinstance(out, Tensor):
        raise ValueError(f"silu_and_mul: out must be a tensor, got {type(out).__name__}")
    elif (tuple(out.shape) != (T, i) or out.dtype != gate_up.dtype or out.device != gate_up.device
          or out.stride(-1) != 1):
        raise ValueError(f"silu_and_mul: out must be {gate_up.dtype} [{T}, {i}] on {gate_up.device} with a "
                         f"contiguous last dim, got {out.dtype} {tuple(out.shape)} on {out.device}")
    if T == 0 or i == 0:
        return out
    cfg = _config(i)
    kernel = for_device(_silu_mul_kernel, gate_up.device)
    kernel[(T, triton.cdiv(i, cfg.block_n))](
        gate_up, out, gate_up.stride(0), out.stride(0),
        I=i, BLOCK=cfg.block_n, LIBDEVICE=gate_up.device.type == "cuda", **_options(cfg, gate_up.device))
    return out
