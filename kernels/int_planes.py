"""Triton helpers of the INT4/INT2 attention kernels (decode_int.py, prefill_int.py): a packed page row's
bit-planes as codes in a 16-bit (or 32-bit) float, and a plane dequantised with its groups' (scale, zero).

Codes become float16 (float32 for fp32 q) without shifts or int-to-float converts: a plane is masked in
place (code * 2^(bits * plane), the power of two folded into its scale), set as the low mantissa bits
of 1024.0, and 1024.0 subtracted; 16-bit q is used in float16 (bf16 q is converted). Format: intq.py.
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def int_codes(packed, plane, BITS: tl.constexpr, F32: tl.constexpr):
    """Bit-plane `plane` of uint8 bytes as exact float16 (float32 if F32) values code * 2^(BITS * plane):
    the plane is masked in place (no shift; callers scale by plane_unit) and its bits set as the low
    mantissa bits of 1024.0 (2^23), which is then subtracted, so only integer ops and one float
    subtraction run (no int-to-float converts, a quarter-rate instruction on the GPU)."""
    c = packed & (((1 << BITS) - 1) << (plane * BITS))  # < 256: exact below 1024's mantissa step
    if F32:
        return (c.to(tl.uint32) | 0x4B000000).to(tl.float32, bitcast=True) - 8388608.0
    return (c.to(tl.uint16) | 0x6400).to(tl.float16, bitcast=True) - 1024.0


@triton.jit
def plane_unit(plane, BITS: tl.constexpr):
    """2^-(BITS * plane): what int_codes' values of `plane` are multiplied by to give the codes."""
    return 1.0 / (1 << (plane * BITS))


@triton.jit
def to_compute(x, F32: tl.constexpr):
    """A q tile in the integer paths' compute dtype: float32 for fp32 q, else float16 (bf16 values
    clamped to float16's range first)."""
    if F32:
        return x.to(tl.float32)
    return tl.minimum(tl.maximum(x.to(tl.float32), -65504.0), 65504.0).to(tl.float16)


@triton.jit
def plane_dequant(packed, x_ptr, xrow, kv_mask, offs_j, plane, stride_xg, stride_xz,
                  BITS: tl.constexpr, GROUPS_PER_PLANE: tl.constexpr, GROUP_SIZE: tl.constexpr,
                  F32: tl.constexpr):
    """Bit-plane `plane` of packed rows [BLOCK_N, BLOCK_W] holding GROUPS_PER_PLANE groups of GROUP_SIZE
    values each, dequantised: codes * scale + zero with each column's own (scale, zero), gathered
    [BLOCK_N, BLOCK_W] (group plane * GROUPS_PER_PLANE + j // GROUP_SIZE), in float16 (float32 if F32)."""
    cdt = tl.float32 if F32 else tl.float16
    grp = plane * GROUPS_PER_PLANE + offs_j // GROUP_SIZE  # [BLOCK_W]
    xs = x_ptr + xrow[:, None] + grp[None, :] * stride_xg  # [BLOCK_N, BLOCK_W]
    s = (tl.load(xs, mask=kv_mask, other=0.0).to(tl.float32) * plane_unit(plane, BITS)).to(cdt)
    z = tl.load(xs + stride_xz, mask=kv_mask, other=0.0).to(cdt)
    return tl.fma(int_codes(packed, plane, BITS, F32), s, z)
