"""Extend (8 x (4096 cached + 512 new), causal) on the GPU: time chosen prefill tile configs.

    python benchmarks/kernels/profile_extend.py 128:128:8:3 128:64:8:3:128 default   # block_m:block_n:warps:stages[:maxnreg]
    python benchmarks/kernels/profile_extend.py --kv fp8 --new 64 default 256:64:8:3

"default" is the launcher's own choice, "hopper" paged_prefill_hopper's Gluon kernel (sm_90, bf16).
--kv fp8 runs over e4m3 pages (quantised in-kernel).

Each config is checked against fp64 attention over the true (bf16) values on two rows, then timed
(do_bench median over CUDA-graph replays, L2 flushed). For Nsight Compute, add --once to launch each
config once, untimed.
"""
from __future__ import annotations

import argparse
import math
import sys

import torch

from kernel_common import D, EXTEND, FP8, check_rows, make_extend, quantize_pool, time_fn


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("configs", nargs="+")
    ap.add_argument("--once", action="store_true")
    ap.add_argument("--kv", choices=("bf16", "fp8"), default="bf16")
    ap.add_argument("--new", type=int, default=EXTEND[2], help="new tokens per sequence")
    args = ap.parse_args(argv)
    from radixkv import kernels as ops
    from radixkv.kernels.launch import KernelConfig

    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(0)
    seqs, cached, new = EXTEND[0], EXTEND[1], args.new
    pool, q, qs, ql, flops = make_extend(seqs, cached, new, dev, gen)
    kc, vc, ks, vs = (pool.k, pool.v, None, None) if args.kv == "bf16" else quantize_pool(pool, FP8["fp8_e4m3"], ops)
    for spec in args.configs:
        if spec == "hopper":
            from radixkv.kernels import prefill_hopper_gluon
            from radixkv.kernels.launch import LOG2E

            hopper_out = torch.empty_like(q)

            def fn():
                prefill_hopper_gluon.launch(q, kc, vc, pool.page_table, pool.seq_lens, qs, ql, LOG2E / math.sqrt(D),
                                            new, hopper_out)
                return hopper_out
        else:
            if spec == "default":
                cfg = None
            else:
                m, n, w, s, *reg = spec.split(":")
                cfg = KernelConfig(int(m), int(n), int(w), int(s), max_registers=int(reg[0]) if reg else None)
            fn = lambda cfg=cfg: ops.paged_prefill(q, kc, vc, pool.page_table, pool.seq_lens, qs, ql, k_scale=ks,
                                                   v_scale=vs, max_q_len=new, config=cfg)
        if args.once:
            fn()
            continue
        err = check_rows(fn(), q, pool, [0, seqs - 1], [new] * seqs, 1 / math.sqrt(D))
        t = time_fn(fn, False)
        print(f"{spec:24s} {t.us:8.1f} us {flops / t.us / 1e6:6.1f} TFLOP/s  rel_err {err:.1e}", flush=True)
    torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
