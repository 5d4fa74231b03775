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
import sys
import types
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
    globals()[name] = fn  # also after a mock.patch or a del, when the submodule is already imported
    return fn


class _Package(types.ModuleType):
    """Importing a submodule sets the package attribute of its name to the module object, whatever
    imported it first (`from radixkv.kernels.paged_decode import ...` included). The public name is
    the launcher of the same name, so that is what gets bound."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _LAZY and isinstance(value, types.ModuleType):
            value = getattr(value, name)
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
