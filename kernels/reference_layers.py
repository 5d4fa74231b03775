"""Plain-PyTorch twins of the fused layer kernels (rms_norm_ref, silu_and_mul_ref, apply_rope_ref for
norm.py, activation.py, rope.py): exactly radixkv/engine/model.py's eager math in the input dtype,
rounding included (no fp32 detour beyond what it does)."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def rms_norm_ref(x: Tensor, weight: Tensor, eps: float, residual: Tensor | None = None, *,
                 out: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
    """norm.rms_norm's twin: LlamaRMSNorm of the last dim. residual given: residual <- x + residual
    (in place), normalised. Returns (out, new_residual) with new_residual the residual tensor."""
    if residual is not None:
        residual.copy_(x + residual)
        x = residual
    dtype = x.dtype
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    y = weight * x32.to(dtype)  # weight [H] or per head [N, D]
    if out is not None:
        out.copy_(y)
        y = out
    return y, residual


def silu_and_mul_ref(gate_up: Tensor, *, out: Tensor | None = None) -> Tensor:
    """activation.silu_and_mul's twin: gate_up [T, 2 I] -> F.silu(gate) * up [T, I]."""
    gate, up = gate_up.chunk(2, dim=-1)
    y = F.silu(gate) * up
    if out is not None:
        out.copy_(y)
        y = out
    return y


def apply_rope_ref(qk: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """rope.apply_rope_'s twin: qk [T, H, D] <- qk * cos + rotate_half(qk) * sin, in place; returns qk."""
    if cos.dim() == 2:
        cos, sin = cos[:, None, :], sin[:, None, :]  # [T, 1, D]
    half = qk.shape[-1] // 2
    rotated = torch.cat((-qk[..., half:], qk[..., :half]), dim=-1)
    qk.copy_(qk * cos + rotated * sin)
    return qk
