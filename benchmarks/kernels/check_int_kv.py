"""INT4/INT2 KV on the GPU in about a minute: kernel_checks.int_checks, then INT4 / INT2 against bf16 decode at
64 x 16k and extend at 8 x (4096 + 512), with bench_kernels.py's harness and pools (the full bench_kernels.py
run times every shape); then INT4 at head_dim 64 (KVStore's groups of 16 values, smaller than a bit-plane: the
kernels' per-column (scale, zero) path, radixkv.plan.kv_int_groups) against bf16 decode at 64 x 16k.

    python benchmarks/kernels/check_int_kv.py
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kernel_checks import int_checks, quantize_pool_int
from kernel_common import HQ, D, make_extend, make_pool, time_fn


def decode_us(ops, q, pool, caches: tuple[torch.Tensor, ...] | None = None) -> float:
    kc, vc, ks, vs = caches if caches else (pool.k, pool.v, None, None)
    return time_fn(lambda: ops.paged_decode(q, kc, vc, pool.page_table, pool.seq_lens, k_scale=ks, v_scale=vs),
                   False).us


def extend_us(ops, ext, caches: tuple[torch.Tensor, ...] | None = None) -> float:
    pool = ext.pool
    kc, vc, ks, vs = caches if caches else (pool.k, pool.v, None, None)
    new = int(ext.q_lens[0])
    return time_fn(lambda: ops.paged_prefill(ext.q, kc, vc, pool.page_table, pool.seq_lens, ext.q_start, ext.q_lens,
                                             k_scale=ks, v_scale=vs, max_q_len=new), False).us


def main() -> None:
    if not torch.cuda.is_available():
        sys.exit("check_int_kv: needs a CUDA GPU")
    import radixkv.kernels as ops
    from radixkv.kernels import reference as ref

    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(0)
    for row in int_checks(ops, ref, dev, gen, False):
        print(row, flush=True)
    pool = make_pool(64, 16384, dev, gen)
    q = torch.randn(64, HQ, D, device=dev, dtype=torch.bfloat16, generator=gen)
    t16 = decode_us(ops, q, pool)
    print(f"decode 64x16k bf16 {t16:.1f} us", flush=True)
    for bits in (4, 2):
        t = decode_us(ops, q, pool, quantize_pool_int(pool, bits, ops))
        print(f"decode 64x16k int{bits} {t:.1f} us  speed-up {t16 / t:.2f}x", flush=True)
    del pool
    pool = make_pool(64, 16384, dev, gen, head_dim=64)
    q = torch.randn(64, HQ, 64, device=dev, dtype=torch.bfloat16, generator=gen)
    t16 = decode_us(ops, q, pool)
    t = decode_us(ops, q, pool, quantize_pool_int(pool, 4, ops))
    print(f"decode 64x16k head_dim 64 bf16 {t16:.1f} us, int4 (groups of 16) {t:.1f} us  speed-up {t16 / t:.2f}x",
          flush=True)
    del pool
    ext = make_extend(8, 4096, 512, dev, gen)
    te = extend_us(ops, ext)
    print(f"extend bf16 {ext.flops / te / 1e6:.1f} TFLOP/s", flush=True)
    for bits in (4, 2):
        t = extend_us(ops, ext, quantize_pool_int(ext.pool, bits, ops))
        print(f"extend int{bits} {ext.flops / t / 1e6:.1f} TFLOP/s  of bf16 {te / t:.2f}", flush=True)


if __name__ == "__main__":
    main()
