"""bf16 extend (8 x (4096 cached + 512 new), causal) on the GPU: time chosen prefill tile configs.

    python benchmarks/profile_extend.py 128:128:8:3 128:64:8:3:128   # block_m:block_n:warps:stages[:maxnreg]

Each config is checked against fp64 attention on two rows, then timed (do_bench median over CUDA-graph
replays, L2 flushed). For Nsight Compute, add --once to launch each config once, untimed.
"""
from __future__ import annotations

import argparse
import math
import sys

import torch

from kernel_common import D, HQ, check_rows, make_pool, time_fn

EXTEND = (8, 4096, 512)  # sequences, cached tokens, new tokens (as bench_kernels.py)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("configs", nargs="+")
    ap.add_argument("--once", action="store_true")
    args = ap.parse_args(argv)
    from radixkv import kernels as ops
    from radixkv.kernels.launch import KernelConfig

    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(0)
    seqs, cached, new = EXTEND
    pool = make_pool(seqs, cached + new, dev, gen)
    q = torch.randn(seqs * new, HQ, D, device=dev, dtype=torch.bfloat16, generator=gen)
    qs = torch.arange(0, seqs * new, new, dtype=torch.int32, device=dev)
    ql = torch.full((seqs,), new, dtype=torch.int32, device=dev)
    flops = 4 * D * (new * cached + new * (new + 1) / 2) * HQ * seqs
    for spec in args.configs:
        m, n, w, s, *reg = spec.split(":")
        cfg = KernelConfig(int(m), int(n), int(w), int(s), max_registers=int(reg[0]) if reg else None)
        fn = lambda cfg=cfg: ops.paged_prefill(q, pool.k, pool.v, pool.page_table, pool.seq_lens, qs, ql,
                                               max_q_len=new, config=cfg)
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
