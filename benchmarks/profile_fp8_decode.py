"""FP8 paged decode at 64 x 16k: time chosen configs, or launch each once for Nsight Compute.

    python benchmarks/profile_fp8_decode.py --time bf16 64:2:2:1 64:4:2:3:128   # block_n:warps:stages:splits[:maxnreg]
    ncu --clock-control none --kernel-name _kernel --section SpeedOfLight --section Occupancy \
        --section WarpStateStats --section LaunchStats python benchmarks/profile_fp8_decode.py 64:2:2:1

"bf16" times the bf16 default on the same pool.
"""
from __future__ import annotations

import argparse
import sys

import torch

from kernel_common import HKV, D, make_pool, quantize_pool, time_fn


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("configs", nargs="+")
    ap.add_argument("--time", action="store_true", help="time each config (do_bench over graph replays)")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--context", type=int, default=16384)
    args = ap.parse_args(argv)
    from radixkv import kernels as ops
    from radixkv.kernels.launch import KernelConfig

    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(0)
    pool = make_pool(args.batch, args.context, dev, gen)
    q = torch.randn(args.batch, 4 * HKV, D, device=dev, dtype=torch.bfloat16, generator=gen)
    kq, vq, ks, vs = quantize_pool(pool, torch.float8_e4m3fn, ops)
    for spec in args.configs:
        if spec == "bf16":
            fn = lambda: ops.paged_decode(q, pool.k, pool.v, pool.page_table, pool.seq_lens)
        else:
            n, w, s, splits, *reg = spec.split(":")
            cfg = KernelConfig(16, int(n), int(w), int(s), max_registers=int(reg[0]) if reg else None)
            fn = (lambda cfg=cfg, splits=int(splits): ops.paged_decode(
                q, kq, vq, pool.page_table, pool.seq_lens, k_scale=ks, v_scale=vs, num_splits=splits, config=cfg))
        if args.time:
            print(f"{spec:16s} {time_fn(fn, False).us:8.1f} us", flush=True)
        else:
            fn()
    torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
