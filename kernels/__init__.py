"""radixkv.kernels: Triton paged-attention kernels (and their PyTorch twins in `reference`).

    store_kv(k, v, k_cache, v_cache, slots, k_scale=None, v_scale=None)
    paged_decode(q, k_cache, v_cache, page_table, seq_lens, sm_scale=None, k_scale=None, v_scale=None)
    paged_prefill(q, k_cache, v_cache, page_table, seq_lens, q_start, q_lens, sm_scale=None, ...)

The Triton modules load on first access to these names, so importing the package (or
`radixkv.kernels.reference`, which the CPU engine uses) never imports Triton. Tests that run
the kernels on CPU must set TRITON_INTERPRET=1 before Triton is first imported.

GPU-only checks (the interpreter gets them wrong): bf16 q/pages and the bit-exactness of
in-kernel FP8 quantisation are verified by benchmarks/bench_kernels.py's correctness phase.
"""
from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "store_kv": "radixkv.kernels.store_kv",
    "paged_decode": "radixkv.kernels.paged_decode",
    "paged_prefill": "radixkv.kernels.paged_prefill",
}

__all__ = list(_LAZY)


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'radixkv.kernels' has no attribute {name!r}")
    fn = getattr(importlib.import_module(_LAZY[name]), name)
    # Importing the submodule bound its module object to this name; the public name is the launcher.
    globals()[name] = fn
    return fn
