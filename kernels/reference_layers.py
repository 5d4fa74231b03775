"""Plain-PyTorch twins of the fused layer kernels (rms_norm_ref, silu_and_mul_ref, apply_rope_ref,
rope_store_kv_ref for norm.py, activation.py, rope.py, rope_store.py): exactly radixkv/engine/model.py's
eager math in the input dtype, rounding included (no fp32 detour beyond what it does)."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from .reference_attention import store_kv_ref


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


def rope_store_kv_ref(qkv: Tensor, cos: Tensor, sin: Tensor, num_q_heads: int, k_cache: Tensor, v_cache: Tensor,
                      slots: Tensor) -> Tensor:
    """rope_store.rope_store_kv_'s twin: qkv [T, Hq + 2 Hkv, D]'s q heads rotated in place, its k heads rotated
    into k_cache [P, S, Hkv, D] at slots, its v heads into v_cache; qkv's k and v left as they were."""
    hkv = (qkv.shape[1] - num_q_heads) // 2
    qk = apply_rope_ref(qkv[:, :num_q_heads + hkv].clone(), cos, sin)  # [T, Hq + Hkv, D]
    store_kv_ref(qk[:, num_q_heads:], qkv[:, num_q_heads + hkv:], k_cache, v_cache, slots)
    qkv[:, :num_q_heads] = qk[:, :num_q_heads]
    return qkv


def decode_linear_ref(x: Tensor, w: Tensor, epilogue: str = "store", *, out: Tensor | None = None,
                      norm: tuple[Tensor, float] | None = None, ssq: Tensor | None = None,
                      ssq_out: Tensor | None = None, rope: tuple[Tensor, Tensor] | None = None,
                      heads: tuple[int, int, int] | None = None,
                      kv: tuple[Tensor, Tensor, Tensor] | None = None) -> Tensor:
    """decode_linear.decode_linear's twin: the unfused chain model.py runs (rms_norm, F.linear, then the
    residual add, silu_and_mul, or RoPE and store_kv), each step rounded to the dtype. Returns out.
    ssq (the norm's sums of squares in parts) is not needed here; ssq_out [M, P] receives the new out's
    sums of squares over P column blocks (a power of two wide, the last one short), as the kernel's tiles."""
    if norm is not None:
        x, _ = rms_norm_ref(x, norm[0], norm[1])
    y = F.linear(x, w)  # [M, N_w]
    if epilogue == "store":
        return y if out is None else out.copy_(y)
    if epilogue == "residual":
        out.copy_(y + out)
        if ssq_out is not None:
            width = 1 << (-(-out.shape[1] // ssq_out.shape[1]) - 1).bit_length()  # the kernel's power-of-two tile
            for j, part in enumerate(out.float().split(width, dim=1)):
                ssq_out[:, j] = part.pow(2).sum(1)
        return out
    if epilogue == "silu_mul":
        return silu_and_mul_ref(y, out=out)
    hq, hkv, d = heads
    qkv = y.view(len(y), hq + 2 * hkv, d)
    apply_rope_ref(qkv[:, :hq + hkv], *rope)  # q and k heads rotated in place
    out = y if out is None else out
    if kv is None:
        return out.copy_(y)
    from .reference_attention import store_kv_ref

    store_kv_ref(qkv[:, hq:hq + hkv], qkv[:, hq + hkv:], *kv)
    out[:, :hq * d] = y[:, :hq * d]
    return out
