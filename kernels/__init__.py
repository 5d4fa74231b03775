"""radixkv.kernels: Triton paged-attention kernels (and their PyTorch twins in `reference`).

    store_kv(k, v, k_cache, v_cache, slots, k_scale=None, v_scale=None)
    paged_decode(q, k_cache, v_cache, page_table, seq_lens, sm_scale=None, k_scale=None, v_scale=None)
    paged_prefill(q, k_cache, v_cache, page_table, seq_lens, q_start, q_lens, sm_scale=None, ...)

Launchers run the compiled kernel on CUDA tensors and Triton's interpreter on CPU tensors
(whether or not TRITON_INTERPRET=1 was set before import), see `for_device`.
"""
from __future__ import annotations

from typing import Any

import torch


def for_device(kernel: Any, device: torch.device) -> Any:
    """The launchable form of a @triton.jit kernel for tensors on `device`.

    CPU tensors need Triton's interpreter; a kernel decorated without TRITON_INTERPRET=1 is
    wrapped in an InterpretedFunction (cached on the kernel object).
    """
    if device.type != "cpu":
        return kernel
    from triton.runtime.interpreter import InterpretedFunction

    if isinstance(kernel, InterpretedFunction):
        return kernel
    cached = getattr(kernel, "_radixkv_interpreted", None)
    if cached is None:
        cached = InterpretedFunction(kernel.fn)
        kernel._radixkv_interpreted = cached
    return cached


from .paged_decode import paged_decode  # noqa: E402
from .paged_prefill import paged_prefill  # noqa: E402
from .store_kv import store_kv  # noqa: E402

__all__ = ["for_device", "paged_decode", "paged_prefill", "store_kv"]
