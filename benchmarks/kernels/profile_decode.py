"""Paged decode (default 64 x 16k): time chosen configs, or launch each once for Nsight Compute.

    # each config is kv:block_n:warps:stages:splits[:maxnreg]
    python benchmarks/kernels/profile_decode.py --time bf16 fp8:64:2:2:1 bf16:64:4:3:1:96
    ncu --clock-control none --kernel-name _kernel --section SpeedOfLight --section Occupancy \
        --section WarpStateStats --section LaunchStats python benchmarks/kernels/profile_decode.py fp8:64:2:2:1

kv is bf16 or fp8 (e4m3, quantised in-kernel from the bf16 pool); a bare "bf16" or "fp8" is the
launcher's default (for fp8, the Gluon kernel where supported) with its own split choice, and
"fp8@S" the default with S splits. rel_err is vs fp64 over the cache's own values (rows 0 and B-1).
"""
from __future__ import annotations

import argparse
import sys

import torch

from kernel_common import HKV, D, check_rows, make_pool, quantize_pool, time_fn, time_rotated


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("configs", nargs="+")
    ap.add_argument("--time", action="store_true", help="time each config (do_bench over graph replays)")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--context", type=int, default=16384)
    ap.add_argument("--ceiling", action="store_true", help="first measure the streaming-read ceiling")
    ap.add_argument("--rotate", action="store_true", help="also time over two pools in turn, no L2 flush")
    args = ap.parse_args(argv)
    from radixkv import kernels as ops
    from radixkv.kernels.dispatch import choose_num_splits, fp8_decode_warps_per_sm
    from radixkv.kernels.launch import KernelConfig

    dev = torch.device("cuda")
    if args.ceiling:
        from kernel_peers import ceilings

        ceil = ceilings(dev, False)
        print(f"read ceiling {ceil.read_tbps:.3f} TB/s (L2 flushed), {ceil.read_rotated_tbps:.3f} TB/s (rotated)")
    gen = torch.Generator(device=dev).manual_seed(0)
    pool = make_pool(args.batch, args.context, dev, gen)
    q = torch.randn(args.batch, 4 * HKV, D, device=dev, dtype=torch.bfloat16, generator=gen)
    kq, vq, ks, vs = quantize_pool(pool, torch.float8_e4m3fn, ops)
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    caches = {"bf16": (pool.k, pool.v, None, None), "fp8": (kq, vq, ks, vs)}
    pool2 = make_pool(args.batch, args.context, dev, gen) if args.rotate else None
    for spec in args.configs:
        kv, _, forced_splits = spec.partition("@")
        kv, *tiles = kv.split(":")
        kc, vc, k_s, v_s = caches[kv]
        if forced_splits:
            cfg, splits = None, int(forced_splits)
        elif tiles:
            n, w, s, splits, *reg = map(int, tiles)
            cfg = KernelConfig(16, n, w, s, max_registers=reg[0] if reg else None)
        else:
            cfg, splits = None, choose_num_splits(args.batch, HKV, args.context, sms,
                                                  warps_per_sm=fp8_decode_warps_per_sm(dev, D, 4) if kv == "fp8" else 0)
        fn = (lambda kc=kc, vc=vc, k_s=k_s, v_s=v_s, cfg=cfg, splits=splits: ops.paged_decode(
            q, kc, vc, pool.page_table, pool.seq_lens, k_scale=k_s, v_scale=v_s, num_splits=splits, config=cfg))
        if args.time:
            t = time_fn(fn, False).us
            # bytes of one token's K (or V) row of one head, with its scale
            row_bytes = kc.element_size() * D + (k_s.element_size() if k_s is not None else 0)
            tbps = row_bytes * 2 * args.batch * args.context * HKV / t / 1e6
            err = check_rows(fn(), q, pool, [0, args.batch - 1], [1] * args.batch, D ** -0.5,
                             fp8=caches[kv] if kv == "fp8" else None)
            line = f"{spec:20s} {t:8.1f} us {tbps:6.3f} TB/s rel_err {err:.1e}"
            if pool2 is not None and kv == "bf16":
                other = (lambda cfg=cfg, splits=splits: ops.paged_decode(
                    q, pool2.k, pool2.v, pool2.page_table, pool2.seq_lens, num_splits=splits, config=cfg))
                tr = time_rotated([fn, other]).us
                line += f" | rotated {tr:8.1f} us {tbps * t / tr:6.3f} TB/s"
            print(line, flush=True)
        else:
            fn()
    torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
