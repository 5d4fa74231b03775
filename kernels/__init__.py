"""radixkv.kernels: Triton paged-attention and fused layer kernels (and their PyTorch twins in `reference_*`).

    store_kv(k, v, k_cache, v_cache, slots, k_scale=None, v_scale=None)
    paged_decode(q, k_cache, v_cache, page_table, seq_lens, sm_scale=None, k_scale=None, v_scale=None)
    paged_prefill(q, k_cache, v_cache, page_table, seq_lens, q_start, q_lens, sm_scale=None, ...)
    decode_launcher(...), prefill_launcher(...)  # their checks made once: launch(q, k_cache, v_cache, k_scale,
                                                 # v_scale) -> out, for each layer of a step
    rms_norm(x, weight, eps, residual=None, *, out=None) -> (out, new_residual)   # residual updated in place
    silu_and_mul(gate_up, *, out=None) -> out                                    # [T, 2 I] -> [T, I]
    apply_rope_(qk, cos, sin) -> qk                                              # in place
    rope_store_kv_(qkv, cos, sin, Hq, k_cache, v_cache, slots) -> qkv            # RoPE + 16-bit K/V store
    decode_linear.decode_linear(x, w, epilogue, *, out, norm, ssq, ssq_out, rope, heads, kv)  # (its module's
        # name: not a package attribute) a decode batch's projection, its norm, RoPE + K/V store,
        # SiLU-and-mul or residual add fused in
    gumbel_argmax(x, inv_temperature, seed, counter, *, splits=None) -> tokens   # [S, V] -> int64 [S]
    nucleus_draw(x, inv_temperature, top_p, min_p, seed, counter) -> tokens      # top-p / min-p, no sort
    IndexValueError   # an out-of-range slot, page id, length or row start (IndexError and ValueError)

Argument checks live in checks.py: shapes, dtypes and devices on every call; the values of the
index tensors (slots, page_table, seq_lens, q_start, q_lens) only on CPU tensors, before anything
is written. On CUDA tensors those values are the caller's duty (no host syncs in a launcher);
checks.py's docstring lists the ranges.

One kernel a file: store.py, decode.py, decode_fp8_gluon.py, decode_int4_gluon.py, prefill.py,
prefill_hopper_gluon.py, dequant_pages.py (FP8 / INT4 pages widened to fp16 copies for the Hopper extend and
the cascade prefix), window.py (the recent-token window's state), norm.py, activation.py, rope.py,
rope_store.py (RoPE with the K/V store), decode_linear.py, sample.py (the sampler's hash + Gumbel-max draw),
nucleus.py (top-p / min-p draws by rejection).
Beside them: dispatch.py (which kernel runs, with how many splits; environment switches read once),
launch.py (tile configs, launch options), checks.py (argument checks), fp8.py and intq.py (FP8 and INT4/INT2 formats and
quantisation helpers) and the plain-PyTorch twins, the ground truth: reference_attention.py (store,
decode, prefill, cascade, window, dequant_pages), reference_layers.py (norm, activation, rope, rope_store),
reference_sampling.py (the sampler's noise and draws); reference_layers.py also holds decode_linear's twin.
The Triton modules load on first access to these names, so importing the package (or
`radixkv.kernels.reference_*`, `.dispatch`, `.fp8`, `.intq`, which the CPU engine and the attention
front use) never imports Triton. Tests that run the kernels on CPU must set TRITON_INTERPRET=1 before Triton
is first imported.

GPU-only checks (the interpreter gets them wrong): bf16 q/pages and the bit-exactness of
in-kernel FP8 quantisation (and INT4/INT2 attention under bf16 q) are verified by
benchmarks/kernels/bench_kernels.py's correctness phase;
bf16 layer kernels (and libdevice's exp/rsqrt, which the interpreter lacks) by
benchmarks/kernels/bench_layer_kernels.py's.
"""
from __future__ import annotations

import importlib
from typing import Any

_LAUNCHERS = {"store_kv": ".store", "paged_decode": ".decode", "paged_prefill": ".prefill",
              "decode_launcher": ".decode", "prefill_launcher": ".prefill",
              "rms_norm": ".norm", "silu_and_mul": ".activation", "apply_rope_": ".rope",
              "rope_store_kv_": ".rope_store",
              "gumbel_argmax": ".sample", "nucleus_draw": ".nucleus", "IndexValueError": ".checks"}

__all__ = list(_LAUNCHERS)


def __getattr__(name: str) -> Any:
    if name not in _LAUNCHERS:
        raise AttributeError(f"module 'radixkv.kernels' has no attribute {name!r}")
    return getattr(importlib.import_module(_LAUNCHERS[name], __name__), name)
