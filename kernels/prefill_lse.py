"""paged_prefill's optional log-sum-exp output (prefill.py and prefill_int.py): its check, its strides as
kernel arguments, and the kernels' store of it (log2 units: the scores scaled by sm_scale * log2(e))."""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor


@triton.jit
def store_lse(lse_ptr, q_rows, h, m_mask, m_i, l_i, stride_lt, stride_lh):
    """Each row's log2-sum-exp of its scaled scores (m_i: their running max, log2 units); -inf with no key."""
    lse = tl.where(l_i > 0, m_i + tl.log2(tl.where(l_i > 0, l_i, 1.0)), float("-inf"))
    tl.store(lse_ptr + q_rows * stride_lt + h.to(tl.int64) * stride_lh, lse, mask=m_mask)


def check_lse(lse: object, q: Tensor) -> None:
    """paged_prefill's lse output: a float32 [T, Hq] tensor on q's device, else ValueError naming the problem."""
    if not isinstance(lse, torch.Tensor):
        raise ValueError(f"paged_prefill: lse must be a float32 tensor [T, Hq], got {type(lse).__name__}")  # noqa: TRY004
    if tuple(lse.shape) != tuple(q.shape[:2]):
        raise ValueError(f"paged_prefill: lse shape {tuple(lse.shape)} != [T, Hq] = {tuple(q.shape[:2])}")
    if lse.dtype != torch.float32:
        raise ValueError(f"paged_prefill: lse must be float32, got {lse.dtype}")
    if lse.device != q.device:
        raise ValueError(f"paged_prefill: lse must be on q's device {q.device}, got {lse.device}")


def lse_strides(lse: Tensor | None) -> tuple[int, int]:
    """The lse tensor's (row, head) strides, zeros when there is none (the kernels' WRITE_LSE off)."""
    return lse.stride() if lse is not None else (0, 0)
