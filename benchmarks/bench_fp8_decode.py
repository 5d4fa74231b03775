"""FP8 (e4m3) paged decode on the GPU: the dot-dtype variants (DecodeMath) and tiles against bf16.

    python benchmarks/bench_fp8_decode.py --json $OUT/fp8_decode.json     # H200, one call (~4 min)
    python benchmarks/bench_fp8_decode.py --smoke                         # CPU interpreter, checks the script

Order: (1) correctness of every decode math variant on the GPU (ragged rows, page sizes 1/16/32,
bf16/e4m3/e5m2, 1 and 5 splits, NaN-poisoned outputs) against reference.py; (2) the streaming-read
ceiling; (3) at 64 x 16k a sweep of FP8 decode configs beside bf16 and the current FP8 default;
(4) the best configs at 64 x 4k and 1 x 32k. Timings as in bench_kernels.py (CUDA-graph replays,
do_bench median, L2 flushed). rel_err_kernel: against fp64 attention over the dequantised FP8 values.
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import sys
import time

import torch

from bench_kernels import D, HKV, HQ, ceilings, check_rows, make_pool, quantize_pool, time_fn
from kernel_common import FP8, ragged_kv, rel_err


def variants():
    """(label, KernelConfig) candidates for FP8 decode, the current default first."""
    from radixkv.kernels.launch import DECODE_FP8_GPU, DecodeMath, KernelConfig

    grid = {
        DecodeMath.Q_DTYPE: ((64, 2, 2),),
        DecodeMath.F16_SCALE_P: ((64, 2, 2), (32, 1, 2), (32, 2, 2), (64, 2, 3), (64, 4, 3), (128, 4, 3),
                                 (128, 8, 3), (64, 1, 2), (32, 1, 3)),
        DecodeMath.F16_SCALE_V: ((64, 4, 3), (64, 4, 2), (128, 8, 3), (128, 8, 2), (64, 4, 4), (64, 2, 2),
                                 (32, 2, 2)),
    }
    out = [("default", DECODE_FP8_GPU)]
    for math_, tiles in grid.items():
        out += [(f"{math_.name.lower()} n{n} w{w} s{s}", KernelConfig(16, n, w, s, math=math_)) for n, w, s in tiles]
    return out


def gpu_correctness(ops, ref, dev, gen, smoke: bool) -> list[dict]:
    from radixkv.kernels.launch import CPU_TILES, DecodeMath

    hgen = torch.Generator().manual_seed(1)
    rows_n, max_len = (2, 40) if smoke else (5, 700)
    maths = list(DecodeMath)
    res = []
    for page_size, kv_name in (((16, "fp8_e4m3"),) if smoke else ((1, "fp8_e4m3"), (32, "fp8_e5m2"), (16, "bf16"))):
        cdt = FP8.get(kv_name, torch.bfloat16)
        lens = torch.randint(1, max_len, (rows_n,), generator=hgen).tolist()
        kq, vq, ks, vs, table, seq = ragged_kv(ref, lens, page_size, cdt, 5, dev, gen)
        q = torch.randn(rows_n, HQ, D, device=dev, generator=gen).to(torch.bfloat16)
        want = ref.paged_decode_ref(q.float(), kq, vq, table, seq, k_scale=ks, v_scale=vs).double()
        for m in maths:
            for n, w in (((16, 1),) if smoke else ((64, 4), (64, 2))):
                cfg = CPU_TILES._replace(block_n=n, num_warps=w, math=m)
                for splits in (1, 5):
                    out = torch.full_like(q, float("nan"))
                    ops.paged_decode(q, kq, vq, table, seq, k_scale=ks, v_scale=vs, num_splits=splits,
                                     out=out, config=cfg)
                    e = rel_err(out, want)
                    res.append({"check": f"decode {m.name} n{n} w{w} page{page_size} {kv_name} splits{splits}",
                                "ok": e < 1e-2, "rel_err": e})
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", default=None)
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--budget-s", type=float, default=230.0, help="stop sweeping after this many seconds")
    args = ap.parse_args(argv)
    if args.smoke:
        os.environ.setdefault("TRITON_INTERPRET", "1")
    from radixkv import kernels as ops
    from radixkv.attention import choose_num_splits
    from radixkv.kernels import reference as ref
    from radixkv.kernels.launch import DECODE_GPU, KernelConfig

    t0 = time.time()
    dev = torch.device("cpu" if args.smoke else "cuda")
    gen = torch.Generator(device=dev).manual_seed(0)
    name = "cpu (smoke)" if args.smoke else torch.cuda.get_device_name(dev)
    print(f"device {name}; torch {torch.__version__}; triton {__import__('triton').__version__}")
    checks = gpu_correctness(ops, ref, dev, gen, args.smoke)
    bad = [c for c in checks if not c["ok"]]
    worst = max((c["rel_err"] for c in checks), default=0.0)
    print(f"correctness: {len(checks) - len(bad)}/{len(checks)} pass (worst rel_err {worst:.2e}) "
          f"[{time.time() - t0:.0f} s]" + "".join(f"\n  FAIL {c}" for c in bad))
    _, read_tbps = ceilings(dev, args.smoke)
    print(f"read ceiling {read_tbps:.3f} TB/s [{time.time() - t0:.0f} s]")
    result = {"device": name, "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "torch": torch.__version__, "triton": __import__("triton").__version__, "read_tbps": read_tbps,
              "correctness_failures": bad, "checks": len(checks), "rows": []}
    sms = torch.cuda.get_device_properties(dev).multi_processor_count if dev.type == "cuda" else 132

    def save():
        if args.json:
            result["wall_s"] = round(time.time() - t0, 1)
            with open(args.json, "w") as f:
                json.dump(result, f, indent=1, default=str)

    shapes = [(64, 16384), (64, 4096), (1, 32768)] if not args.smoke else [(2, 64)]
    ranked: list[tuple[float, str, KernelConfig, int]] = []
    for si, (batch, ctx) in enumerate(shapes):
        pool = make_pool(batch, ctx, dev, gen)
        q = torch.randn(batch, HQ, D, device=dev, dtype=torch.bfloat16, generator=gen)
        fp8 = quantize_pool(pool, torch.float8_e4m3fn, ops)
        kq, vq, ks, vs = fp8
        base_splits = choose_num_splits(batch, HKV, ctx, sms)
        check = [0, batch - 1] if batch > 1 else [0]
        sm = 1 / math.sqrt(D)
        bf16_bytes = 2 * batch * ctx * HKV * D * 2
        fp8_bytes = 2 * batch * ctx * HKV * (D + 4)

        def record(label, kv, cfg, splits, fn, nbytes, fp8_args):
            try:
                t = time_fn(fn, args.smoke)
                out = fn()
                err = check_rows(out, q, pool, check, [1] * batch, sm, fp8=fp8_args)
                err_e2e = check_rows(out, q, pool, check, [1] * batch, sm) if fp8_args is not None else err
            except Exception as exc:
                print(f"  {batch:3d} x {ctx:6d} {label:30s} FAILED {type(exc).__name__}: {str(exc)[:160]}")
                return None
            frac = nbytes / t.us / 1e6 / read_tbps
            r = {"batch": batch, "context": ctx, "label": label, "kv_dtype": kv, "config": list(cfg) if cfg else None,
                 "num_splits": splits, "us": round(t.us, 2), "frac_read": round(frac, 3), "rel_err_kernel": err,
                 "rel_err_e2e": err_e2e, "timing": t.method}
            result["rows"].append(r)
            print(f"  {batch:3d} x {ctx:6d} {label:30s} {kv:9s} splits {splits:3d}: {t.us:8.1f} us "
                  f"{frac:5.2f} of read  rel_err kernel {err:.1e} e2e {err_e2e:.1e}  [{time.time() - t0:.0f} s]")
            save()
            return t.us

        record("bf16-default", "bf16", DECODE_GPU, base_splits,
               lambda: ops.paged_decode(q, pool.k, pool.v, pool.page_table, pool.seq_lens, num_splits=base_splits),
               bf16_bytes, None)
        cands = variants() if si == 0 else [("default", variants()[0][1])] + [(lb, c) for _, lb, c, _ in ranked[:3]]
        for label, cfg in cands:
            if time.time() - t0 > args.budget_s:
                print("  (time budget reached, stopping)")
                break
            fn = (lambda cfg=cfg: ops.paged_decode(q, kq, vq, pool.page_table, pool.seq_lens, k_scale=ks, v_scale=vs,
                                                   num_splits=base_splits, config=cfg))
            us = record(label, "fp8_e4m3", cfg, base_splits, fn, fp8_bytes, fp8)
            if si == 0 and us is not None and label != "default":
                ranked.append((us, label, cfg, base_splits))
        if si == 0:
            ranked.sort(key=lambda x: x[0])
            for us, label, cfg, _ in list(ranked[:2]):
                for splits in (2, 4):
                    if time.time() - t0 > args.budget_s:
                        break
                    fn = (lambda cfg=cfg, s=splits: ops.paged_decode(q, kq, vq, pool.page_table, pool.seq_lens,
                                                                     k_scale=ks, v_scale=vs, num_splits=s, config=cfg))
                    record(label, "fp8_e4m3", cfg, splits, fn, fp8_bytes, fp8)
        del pool, q, fp8, kq, vq, ks, vs
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    save()
    print("\nbest FP8 configs at the first shape:", [(round(u, 1), lb) for u, lb, _, _ in ranked[:5]])
    print(f"total {time.time() - t0:.0f} s")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
