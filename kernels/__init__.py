"""radixkv.kernels: Triton paged-attention kernels (and their PyTorch twins in `reference`).

    store_kv(k, v, k_cache, v_cache, slots, k_scale=None, v_scale=None)
    paged_decode(q, k_cache, v_cache, page_table, seq_lens, sm_scale=None, k_scale=None, v_scale=None)
    paged_prefill(q, k_cache, v_cache, page_table, seq_lens, q_start, q_lens, sm_scale=None, ...)

One kernel a file: store.py, decode.py, decode_fp8_gluon.py, prefill.py, prefill_hopper_gluon.py.
Beside them: dispatch.py (which kernel runs, with how many splits; environment switches read once),
launch.py (tile configs, argument checks), fp8.py (quantisation helpers) and reference.py (the
plain-PyTorch twins, the ground truth).
The Triton modules load on first access to these names, so importing the package (or
`radixkv.kernels.reference`, `.dispatch`, `.fp8`, which the CPU engine and the attention front use)
never imports Triton. Tests that run the kernels on CPU must set TRITON_INTERPRET=1 before Triton
is first imported.

GPU-only checks (the interpreter gets them wrong): bf16 q/pages and the bit-exactness of
in-kernel FP8 quantisation are verified by benchmarks/kernels/bench_kernels.py's correctness phase.
"""
from __future__ import annotations

import importlib
from typing import Any

_LAUNCHERS = {"store_kv": ".store", "paged_decode": ".decode", "paged_prefill": ".prefill"}

__all__ = list(_LAUNCHERS)


def __getattr__(name: str) -> Any:
    if name not in _LAUNCHERS:
        raise AttributeError(f"module 'radixkv.kernels' has no attribute {name!r}")
    return getattr(importlib.import_module(_LAUNCHERS[name], __name__), name)
