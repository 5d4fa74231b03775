"""Paged-attention kernels on the GPU: correctness first, then timings against peers and ceilings.

    python benchmarks/kernels/bench_kernels.py --json benchmarks/results/kernels.json     # H200, one call
    python benchmarks/kernels/bench_kernels.py --smoke      # CPU interpreter, tiny shapes: checks this script

Order: (1) correctness of store_kv / paged_decode / paged_prefill against fp64 on fresh random
inputs; (2) ceilings measured in the same run (device-to-device copy, streaming read);
(3) decode at the issue's (batch, context) shapes in bf16, fp8_e4m3 and int4 (int2 at three shapes,
64 x 16k among them), beside SDPA on contiguous K/V, gather-then-SDPA and FlashInfer; (4) extend
(8 x 4096 cached + 512 new, bf16 / fp8 / int4 / int2 pages; on sm_90 also the Triton kernel the Gluon
one replaced, as radixkv-triton); (5) small sweeps of split count and tiles (`--sweeps int`: INT4
decode and extend tiles). INT rows: pages written by the store_kv kernel (in-kernel quantisation),
bytes read counted with their scales and zeros (radixkv.plan.kv_row_bytes), rel_err_kernel against
fp64 over the dequantised values; summary lines give each INT row's speed-up over bf16. Each timing is the median of triton's do_bench
(which flushes L2 before every repetition) over CUDA-graph replays where capture works.
Phase (1) lives in kernel_checks.py, (2) and the peers in kernel_peers.py, the shared shapes,
timing, pools and fp64 oracles in kernel_common.py; this file runs the phases and writes the JSON.
"""
from __future__ import annotations

import argparse
import datetime
import enum
import json
import math
import os
import sys
import time

import torch

from kernel_checks import INT, check_rows_int, correctness, quantize_pool_int
from kernel_common import (D, EXTEND, FP8, HKV, HQ, Timing, check_rows, make_extend, make_pool, quantize_pool, time_fn,
                           time_rotated)
from kernel_peers import (Ceilings, ceilings, contiguous_kv, flashinfer_decode, flashinfer_prefill, gather_sdpa_decode,
                          load_flashinfer, sdpa_decode, sdpa_extend)

DECODE_SHAPES = [(1, 32768), (16, 4096), (64, 4096), (64, 16384), (256, 1024), (256, 4096)]
SMOKE_DECODE = [(2, 64), (3, 40)]
SMOKE_EXTEND = (2, 32, 16)
INT2_DECODE_SHAPES = ((16, 4096), (64, 4096), (64, 16384), SMOKE_DECODE[0])  # int2: these only


# ----------------------------------------------------------------------------- main phases
def bench_decode(ops, ref, fi, dev, gen, ceil: Ceilings, smoke, shapes, workspace) -> list[dict]:
    """Every decode kernel timed two ways: L2 flushed before each call (time_fn) and round-robin over
    two pools of the same shape without a flush (time_rotated; the issue's method). Rows carry both."""
    from radixkv.kernels.dispatch import choose_num_splits, decode_warps_per_sm, fp8_decode_warps_per_sm
    from radixkv.plan import kv_row_bytes

    rows = []
    sms = torch.cuda.get_device_properties(dev).multi_processor_count if dev.type == "cuda" else 132
    workspaces = [workspace, torch.empty_like(workspace)] if workspace is not None else None
    for batch, ctx in shapes:
        pools = [make_pool(batch, ctx, dev, gen) for _ in range(1 if smoke else 2)]  # pools[1]: timing only
        pool = pools[0]
        q = torch.randn(batch, HQ, D, device=dev, dtype=torch.bfloat16, generator=gen)
        splits = choose_num_splits(batch, HKV, ctx, sms)
        fp8_splits = choose_num_splits(batch, HKV, ctx, sms, warps_per_sm=fp8_decode_warps_per_sm(dev, D, HQ // HKV))
        check = [0, batch - 1] if batch > 1 else [0]
        sm = 1 / math.sqrt(D)
        bf16_bytes = 2 * batch * ctx * HKV * D * 2

        def row(kernel, kv_dtype, make, nbytes, fp8=None, num_splits=splits, kernel_err=None):
            """make(i) -> a call of the kernel on pools[i]; checked on pools[0], then timed. kernel_err(out):
            the kernel's own error (over the stored values), where not FP8's."""
            fn = make(0)
            out = fn()
            err = check_rows(out, q, pool, check, [1] * batch, sm)
            err_kernel = check_rows(out, q, pool, check, [1] * batch, sm, fp8=fp8) if fp8 is not None else None
            if kernel_err is not None:
                err_kernel = kernel_err(out)
            t = time_fn(fn, smoke)
            tr = time_rotated([fn] + [make(i) for i in range(1, len(pools))]) if not smoke else t
            tbps, tbps_r = nbytes / t.us / 1e6, nbytes / tr.us / 1e6
            r = {"kernel": kernel, "kv_dtype": kv_dtype, "batch": batch, "context": ctx, "us": round(t.us, 2),
                 "tbps": round(tbps, 3), "frac_read": round(tbps / ceil.read_tbps, 3), "rel_err": err,
                 "rel_err_kernel": err_kernel, "timing": t.method, "us_rotated": round(tr.us, 2),
                 "frac_read_rotated": round(tbps_r / ceil.read_rotated_tbps, 3),
                 "num_splits": num_splits if kernel == "radixkv" else None}
            print(f"  decode {kernel:12s} {kv_dtype:9s} {batch:4d} x {ctx:6d}: {t.us:9.1f} us "
                  f"({r['frac_read']:.2f} of read) | rotated {tr.us:9.1f} us ({r['frac_read_rotated']:.2f}) "
                  f"rel_err {err:.2e} kernel-only {err_kernel}")
            rows.append(r)

        row("radixkv", "bf16", lambda i: (lambda p=pools[i]: ops.paged_decode(
            q, p.k, p.v, p.page_table, p.seq_lens, num_splits=splits)), bf16_bytes)
        if not smoke:
            def dense(i):
                kc, vc = contiguous_kv(pools[i])
                return lambda: sdpa_decode(q, kc, vc)

            row("sdpa-dense", "bf16", dense, bf16_bytes)
            row("gather-sdpa", "bf16", lambda i: (lambda p=pools[i]: gather_sdpa_decode(q, p)), bf16_bytes)
        if fi is not None:
            try:
                row("flashinfer", "bf16", lambda i: flashinfer_decode(fi, pools[i], q, workspaces[i]), bf16_bytes)
            except Exception as exc:
                print(f"  flashinfer decode failed: {type(exc).__name__}: {str(exc)[:200]}")
        for name in ("fp8_e4m3", "fp8_e5m2"):
            if name == "fp8_e5m2" and (batch, ctx) not in ((16, 4096), (64, 4096), SMOKE_DECODE[0]):
                continue  # e5m2: accuracy (and a timing) at two shapes only
            fp8 = [quantize_pool(p, FP8[name], ops) for p in pools]

            def run_fp8(i):
                kq, vq, ks, vs = fp8[i]
                p = pools[i]
                return lambda: ops.paged_decode(q, kq, vq, p.page_table, p.seq_lens, k_scale=ks, v_scale=vs,
                                                num_splits=fp8_splits)

            row("radixkv", name, run_fp8, 2 * batch * ctx * HKV * (D + fp8[0][2].element_size()), fp8=fp8[0],
                num_splits=fp8_splits)
            del fp8
        for name, bits in INT.items():
            if name == "int2" and (batch, ctx) not in INT2_DECODE_SHAPES:
                continue
            intq = [quantize_pool_int(p, bits, ops) for p in pools]
            int_splits = choose_num_splits(batch, HKV, ctx, sms, warps_per_sm=decode_warps_per_sm(
                q.dtype, intq[0][0], intq[0][1], intq[0][2], HQ // HKV, D))  # the engine's, by the kernel that runs

            def run_int(i, intq=intq, pools=pools, q=q, splits=int_splits):
                kq, vq, ks, vs = intq[i]
                p = pools[i]
                return lambda: ops.paged_decode(q, kq, vq, p.page_table, p.seq_lens, k_scale=ks, v_scale=vs,
                                                num_splits=splits)

            def int_err(out, bits=bits, intq=intq[0], q=q, pool=pool, check=check, batch=batch, sm=sm):
                return check_rows_int(out, q, pool, intq, bits, check, [1] * batch, sm)

            row("radixkv", name, run_int, 2 * batch * ctx * HKV * kv_row_bytes(D, name), kernel_err=int_err,
                num_splits=int_splits)
            del intq
        del pools, pool
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    return rows


def bench_extend(ops, fi, dev, gen, smoke, shape, workspace) -> list[dict]:
    from radixkv.kernels.dispatch import hopper_prefill_supported
    from radixkv.kernels.launch import KernelKind, default_config

    seqs, cached, new = shape
    pool, q, qs, ql, flops = make_extend(seqs, cached, new, dev, gen)
    q_lens = [new] * seqs
    sm = 1 / math.sqrt(D)
    rows = []

    def row(kernel, kv_dtype, t: Timing, err, err_kernel=None):
        tf = flops / t.us / 1e6
        rows.append({"kernel": kernel, "kv_dtype": kv_dtype, "seqs": seqs, "cached": cached, "new": new,
                     "us": round(t.us, 2), "tflops": round(tf, 1), "rel_err": err, "rel_err_kernel": err_kernel,
                     "timing": t.method})
        print(f"  extend {kernel:12s} {kv_dtype:9s}: {t.us:9.1f} us {tf:6.1f} TFLOP/s rel_err {err:.2e} kernel-only {err_kernel}")

    def ours(kc, vc, ks=None, vs=None, config=None):
        return lambda: ops.paged_prefill(q, kc, vc, pool.page_table, pool.seq_lens, qs, ql, k_scale=ks, v_scale=vs,
                                         max_q_len=new, config=config)

    fn = ours(pool.k, pool.v)
    row("radixkv", "bf16", time_fn(fn, smoke), check_rows(fn(), q, pool, [0, seqs - 1], q_lens, sm))
    if hopper_prefill_supported(q, pool.k, pool.v, q, new):  # the row above ran it
        tile = default_config(KernelKind.PREFILL, q, pool.k, new)
        fn = ours(pool.k, pool.v, config=tile)
        row("radixkv-triton", "bf16", time_fn(fn, smoke), check_rows(fn(), q, pool, [0, seqs - 1], q_lens, sm))
    for name, dt in FP8.items():
        kq, vq, ks, vs = quantize_pool(pool, dt, ops)
        fn = ours(kq, vq, ks, vs)
        out = fn()
        row("radixkv", name, time_fn(fn, smoke), check_rows(out, q, pool, [0, seqs - 1], q_lens, sm),
            check_rows(out, q, pool, [0, seqs - 1], q_lens, sm, fp8=(kq, vq, ks, vs)))
        del kq, vq, ks, vs
    for name, bits in INT.items():
        intq = quantize_pool_int(pool, bits, ops)
        fn = ours(*intq)
        out = fn()
        row("radixkv", name, time_fn(fn, smoke), check_rows(out, q, pool, [0, seqs - 1], q_lens, sm),
            check_rows_int(out, q, pool, intq, bits, [0, seqs - 1], q_lens, sm))
        del intq
    if not smoke:
        kc, vc = contiguous_kv(pool)
        try:
            fn = lambda: sdpa_extend(q, kc, vc, new)  # noqa: E731
            row("sdpa-dense", "bf16", time_fn(fn, smoke), check_rows(fn(), q, pool, [0, seqs - 1], q_lens, sm))
        except Exception as exc:
            print(f"  sdpa extend failed: {type(exc).__name__}: {str(exc)[:200]}")
        del kc, vc

        def gather():
            k, v = contiguous_kv(pool)
            return sdpa_extend(q, k, v, new)

        try:
            row("gather-sdpa", "bf16", time_fn(gather, smoke), check_rows(gather(), q, pool, [0, seqs - 1], q_lens, sm))
        except Exception as exc:
            print(f"  gather-sdpa extend failed: {type(exc).__name__}: {str(exc)[:200]}")
    if fi is not None:
        try:
            fn = flashinfer_prefill(fi, pool, q, q_lens, workspace)
            row("flashinfer", "bf16", time_fn(fn, smoke), check_rows(fn(), q, pool, [0, seqs - 1], q_lens, sm))
        except Exception as exc:
            print(f"  flashinfer prefill failed: {type(exc).__name__}: {str(exc)[:200]}")
    return rows


class Sweeps(enum.Enum):
    NONE = "none"
    FP8 = "fp8"  # FP8 decode tiles only
    INT = "int"  # INT4 decode tiles at 64 x 16k and INT4 extend tiles (launch.DECODE_INT_GPU, PREFILL_INT_GPU_BY_LEN)
    ALL = "all"  # + split counts and extend tiles


def sweeps(ops, dev, gen, read_tbps, smoke, which: Sweeps) -> list[dict]:
    """Split counts for small batches and tile configs for the two kernels (informs launch.py defaults)."""
    from radixkv.kernels.launch import KernelConfig

    rows = []
    if which is Sweeps.NONE:
        return rows
    if which is Sweeps.INT:
        return int_sweeps(ops, dev, gen, read_tbps, smoke)
    shapes = [(1, 32768, [33, 66, 132]), (16, 4096, [3, 4, 5, 8]), (64, 4096, [1, 2, 3]), (256, 1024, [1, 2])]
    if smoke:
        shapes = [(1, 64, [1, 2])]
    if which is Sweeps.FP8:
        shapes = []
    for batch, ctx, split_list in shapes:
        pool = make_pool(batch, ctx, dev, gen)
        q = torch.randn(batch, HQ, D, device=dev, dtype=torch.bfloat16, generator=gen)
        for s in split_list:
            t = time_fn(lambda: ops.paged_decode(q, pool.k, pool.v, pool.page_table, pool.seq_lens, num_splits=s), smoke)
            rows.append({"sweep": "splits", "batch": batch, "context": ctx, "num_splits": s, "us": round(t.us, 2)})
            print(f"  sweep decode {batch} x {ctx} splits {s}: {t.us:.1f} us")
    if smoke:
        return rows
    pool = make_pool(64, 16384, dev, gen)
    q = torch.randn(64, HQ, D, device=dev, dtype=torch.bfloat16, generator=gen)
    nbytes = 2 * 64 * 16384 * HKV * D * 2
    kq, vq, ks, vs = quantize_pool(pool, torch.float8_e4m3fn, ops)
    fp8_only = ("fp8_e4m3",)
    for cfg, dtypes in ((KernelConfig(16, 64, 4, 3), ("bf16",)), (KernelConfig(16, 128, 4, 2), fp8_only),
                        (KernelConfig(16, 128, 4, 1), fp8_only), (KernelConfig(16, 128, 2, 2), fp8_only),
                        (KernelConfig(16, 64, 2, 2), fp8_only), (KernelConfig(16, 64, 4, 1), fp8_only),
                        (KernelConfig(16, 256, 4, 1), fp8_only), (KernelConfig(16, 32, 2, 2), fp8_only),
                        (KernelConfig(16, 128, 2, 1), fp8_only), (KernelConfig(16, 128, 2, 2, True), fp8_only)):
        for name, args, nb in (("bf16", (pool.k, pool.v, None, None), nbytes),
                               ("fp8_e4m3", (kq, vq, ks, vs), nbytes * (D + ks.element_size()) // (2 * D))):
            if name not in dtypes:
                continue
            def run():
                return ops.paged_decode(q, args[0], args[1], pool.page_table, pool.seq_lens,
                                        k_scale=args[2], v_scale=args[3], config=cfg)

            try:
                t = time_fn(run, smoke)
                err = check_rows(run(), q, pool, [0, 63], [1] * 64, 1 / math.sqrt(D),
                                 fp8=args if name != "bf16" else None)
            except Exception as exc:
                print(f"  sweep decode {cfg} {name} failed: {type(exc).__name__}: {str(exc)[:120]}")
                continue
            frac = nb / t.us / 1e6 / read_tbps
            print(f"    rel_err (kernel only) {err:.2e}")
            rows.append({"sweep": "decode_tiles", "kv_dtype": name, "config": list(cfg), "us": round(t.us, 2),
                         "rel_err_kernel": err,
                         "frac_read": round(frac, 3)})
            print(f"  sweep decode 64 x 16384 {name} {tuple(cfg)}: {t.us:.1f} us ({frac:.2f} of read)")
    del pool, kq, vq, ks, vs
    torch.cuda.empty_cache()
    if which is not Sweeps.ALL:
        return rows
    new = EXTEND[2]
    pool, q, qs, ql, flops = make_extend(*EXTEND, dev, gen)
    for cfg in (KernelConfig(128, 64, 8, 3, max_registers=128), KernelConfig(128, 64, 8, 2, max_registers=128),
                KernelConfig(128, 128, 8, 3), KernelConfig(128, 64, 8, 3), KernelConfig(64, 128, 4, 3)):
        try:
            t = time_fn(lambda: ops.paged_prefill(q, pool.k, pool.v, pool.page_table, pool.seq_lens, qs, ql,
                                                  max_q_len=new, config=cfg), smoke)
        except Exception as exc:
            print(f"  sweep extend {cfg} failed: {type(exc).__name__}")
            continue
        rows.append({"sweep": "extend_tiles", "config": list(cfg), "us": round(t.us, 2),
                     "tflops": round(flops / t.us / 1e6, 1)})
        print(f"  sweep extend {tuple(cfg)}: {t.us:.1f} us {flops / t.us / 1e6:.1f} TFLOP/s")
    return rows


# INT4 tiles: 64-row extend tiles only but for one 128-row check (128-row ones spilled when compiled for
# sm_90 on the CPU machine; launch.py).
def int_sweeps(ops, dev, gen, read_tbps, smoke) -> list[dict]:
    """INT4 decode tiles at 64 x 16k (bytes read: plan.kv_row_bytes) and INT4 extend tiles at EXTEND."""
    from radixkv.kernels.launch import KernelConfig
    from radixkv.plan import kv_row_bytes

    rows = []
    batch, ctx = (2, 64) if smoke else (64, 16384)
    pool = make_pool(batch, ctx, dev, gen)
    q = torch.randn(batch, HQ, D, device=dev, dtype=torch.bfloat16, generator=gen)
    intq = quantize_pool_int(pool, 4, ops)
    nbytes = 2 * batch * ctx * HKV * kv_row_bytes(D, "int4")
    decode_tiles = [KernelConfig(16, 64, 4, 3), KernelConfig(16, 64, 4, 2), KernelConfig(16, 128, 4, 2),
                    KernelConfig(16, 64, 2, 2), KernelConfig(16, 128, 8, 2), KernelConfig(16, 32, 4, 3),
                    KernelConfig(16, 256, 8, 2)]
    for cfg in decode_tiles[:1] if smoke else decode_tiles:
        def run(cfg=cfg):
            return ops.paged_decode(q, *intq[:2], pool.page_table, pool.seq_lens, k_scale=intq[2], v_scale=intq[3],
                                    config=cfg)
        try:
            t = time_fn(run, smoke)
            err = check_rows_int(run(), q, pool, intq, 4, [0, batch - 1], [1] * batch, 1 / math.sqrt(D))
        except Exception as exc:
            print(f"  sweep int4 decode {tuple(cfg)} failed: {type(exc).__name__}: {str(exc)[:120]}")
            continue
        frac = nbytes / t.us / 1e6 / read_tbps
        rows.append({"sweep": "int4_decode_tiles", "config": list(cfg), "us": round(t.us, 2), "rel_err_kernel": err,
                     "frac_read": round(frac, 3)})
        print(f"  sweep int4 decode {batch} x {ctx} {tuple(cfg)}: {t.us:.1f} us ({frac:.2f} of read) rel_err {err:.1e}")
    del pool, intq
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    shape = SMOKE_EXTEND if smoke else EXTEND
    pool, q, qs, ql, flops = make_extend(*shape, dev, gen)
    intq = quantize_pool_int(pool, 4, ops)
    extend_tiles = [KernelConfig(64, 64, 4, 3), KernelConfig(64, 64, 4, 2), KernelConfig(64, 32, 4, 3),
                    KernelConfig(64, 64, 8, 3), KernelConfig(128, 64, 8, 2)]
    for cfg in extend_tiles[:1] if smoke else extend_tiles:
        try:
            t = time_fn(lambda cfg=cfg: ops.paged_prefill(q, *intq[:2], pool.page_table, pool.seq_lens, qs, ql,
                                                          k_scale=intq[2], v_scale=intq[3], max_q_len=shape[2],
                                                          config=cfg), smoke)
        except Exception as exc:
            print(f"  sweep int4 extend {tuple(cfg)} failed: {type(exc).__name__}: {str(exc)[:120]}")
            continue
        rows.append({"sweep": "int4_extend_tiles", "config": list(cfg), "us": round(t.us, 2),
                     "tflops": round(flops / t.us / 1e6, 1)})
        print(f"  sweep int4 extend {tuple(cfg)}: {t.us:.1f} us {flops / t.us / 1e6:.1f} TFLOP/s")
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", default=None, help="write results here (kernels.json schema of issue 3)")
    ap.add_argument("--smoke", action="store_true", help="CPU interpreter, tiny shapes (checks the script)")
    ap.add_argument("--no-flashinfer", action="store_true")
    ap.add_argument("--only-sweeps", action="store_true", help="skip correctness, decode and extend tables")
    ap.add_argument("--sweeps", choices=[w.value for w in Sweeps], default=Sweeps.FP8.value)
    args = ap.parse_args(argv)
    if args.smoke:
        os.environ.setdefault("TRITON_INTERPRET", "1")
    fi = load_flashinfer(not args.no_flashinfer and not args.smoke)
    from radixkv import kernels as ops
    from radixkv.kernels import reference_attention as ref

    dev = torch.device("cpu" if args.smoke else "cuda")
    gen = torch.Generator(device=dev).manual_seed(0)
    t0 = time.time()
    name = "cpu (interpreter smoke run)" if args.smoke else torch.cuda.get_device_name(dev)
    print(f"device {name}; torch {torch.__version__}; flashinfer {getattr(fi, '__version__', None)}")
    checks = correctness(ops, ref, dev, gen, args.smoke) if not args.only_sweeps else []
    bad = [c for c in checks if not c["ok"]]
    print(f"correctness: {len(checks) - len(bad)}/{len(checks)} checks pass" + "".join(f"\n  FAIL {c}" for c in bad))
    ceil = ceilings(dev, args.smoke)
    copy_tbps, read_tbps = ceil.copy_tbps, ceil.read_tbps
    print(f"ceilings: copy {copy_tbps:.3f} TB/s (read+write), streaming read {read_tbps:.3f} TB/s "
          f"(L2 flushed), {ceil.read_rotated_tbps:.3f} TB/s (rotated)")
    workspace = torch.zeros(256 << 20, dtype=torch.uint8, device=dev) if fi is not None else None
    result = {"device": name, "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "torch": torch.__version__, "triton": __import__("triton").__version__,
              "flashinfer": getattr(fi, "__version__", None), "copy_tbps": round(copy_tbps, 3),
              "read_tbps": round(read_tbps, 3), "read_rotated_tbps": round(ceil.read_rotated_tbps, 3),
              "correctness": checks, "decode": [], "prefill": [], "sweeps": []}

    def save() -> None:  # after every phase, so a run cut short still leaves its numbers
        result["wall_s"] = round(time.time() - t0, 1)
        if args.json:
            os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
            with open(args.json, "w") as f:
                json.dump(result, f, indent=1)

    save()
    if args.only_sweeps:
        result["sweeps"] = sweeps(ops, dev, gen, read_tbps, args.smoke, Sweeps(args.sweeps))
        save()
        return 0
    result["decode"] = bench_decode(ops, ref, fi, dev, gen, ceil, args.smoke,
                                    SMOKE_DECODE if args.smoke else DECODE_SHAPES, workspace)
    save()
    result["prefill"] = bench_extend(ops, fi, dev, gen, args.smoke, SMOKE_EXTEND if args.smoke else EXTEND, workspace)
    save()
    result["int_summary"] = int_summary(result)
    save()
    result["sweeps"] = sweeps(ops, dev, gen, read_tbps, args.smoke, Sweeps(args.sweeps))
    save()
    print_table(result)
    if args.smoke:  # checks that the script runs; its numbers are verdicts only on the GPU
        if bad:
            print("smoke run: the interpreter mis-computes bf16 dots and in-kernel fp8 casts (bf16 stored as uint16), "
                  "so the failing checks above say nothing about the kernels")
        return 0
    return 1 if bad else 0


def print_table(r: dict) -> None:
    print(f"\n{r['device']}  copy {r['copy_tbps']} TB/s  read {r['read_tbps']} TB/s (L2 flushed), "
          f"{r['read_rotated_tbps']} TB/s (rotated)")
    print("decode: us with L2 flushed / rotated over two pools; frac = of the read ceiling, same method")
    names = ("radixkv", "flashinfer", "sdpa-dense", "gather-sdpa")
    print(f"{'decode':>14s} {'kv':>9s} {'frac':>11s} " + " ".join(f"{k:>17s}" for k in names))
    keys = sorted({(d["batch"], d["context"], d["kv_dtype"]) for d in r["decode"]})
    for b, c, kv in keys:
        by = {d["kernel"]: d for d in r["decode"] if (d["batch"], d["context"], d["kv_dtype"]) == (b, c, kv)}
        ours = by.get("radixkv")
        frac = f"{ours['frac_read']:.2f}/{ours['frac_read_rotated']:.2f}" if ours else "-"
        cells = [f"{by[k]['us']:8.1f}/{by[k]['us_rotated']:<8.1f}" if k in by else f"{'-':>17s}" for k in names]
        print(f"{b:5d} x {c:6d} {kv:>9s} {frac:>11s} " + " ".join(cells))
    for p in r["prefill"]:
        print(f"extend {p['kernel']:12s} {p['kv_dtype']:9s} {p['us']:9.1f} us {p['tflops']:6.1f} TFLOP/s "
              f"rel_err {p['rel_err']:.1e}")
    for line in r.get("int_summary", {}).get("lines", []):
        print(line)


def int_summary(r: dict) -> dict:
    """INT rows against bf16 (radixkv kernels, same run): decode speed-ups (flushed / rotated) at every
    shape, extend TFLOP/s ratios, and the issue's targets: int4 decode >= 3.2x bf16 at 64 x 16k (kernel
    error <= 2e-3), int2 faster still, extend over int4 >= 0.8x bf16's TFLOP/s."""
    ours = [d for d in r["decode"] if d["kernel"] == "radixkv"]
    bf16 = {(d["batch"], d["context"]): d for d in ours if d["kv_dtype"] == "bf16"}
    lines, decode = ["INT KV against bf16 (radixkv, same run):"], {}
    for d in ours:
        base = bf16.get((d["batch"], d["context"]))
        if d["kv_dtype"] not in INT or base is None:
            continue
        x, xr = base["us"] / d["us"], base["us_rotated"] / d["us_rotated"]
        decode[f"{d['kv_dtype']} {d['batch']}x{d['context']}"] = {"speedup": round(x, 2), "speedup_rotated": round(xr, 2),
                                                                  "rel_err_kernel": d["rel_err_kernel"]}
        lines.append(f"  decode {d['kv_dtype']} {d['batch']:4d} x {d['context']:6d}: {x:.2f}x / {xr:.2f}x rotated "
                     f"({d['frac_read']:.2f} of read), kernel rel_err {d['rel_err_kernel']:.1e}")
    ext = {p["kv_dtype"]: p["tflops"] for p in r["prefill"] if p["kernel"] == "radixkv"}
    extend = {k: round(ext[k] / ext["bf16"], 2) for k in INT if k in ext and ext.get("bf16")}
    lines += [f"  extend {k}: {v:.2f}x bf16's TFLOP/s" for k, v in extend.items()]
    int4, int2 = decode.get("int4 64x16384"), decode.get("int2 64x16384")
    targets = {}
    if int4:
        targets["int4_decode_64x16k_3.2x"] = int4["speedup"] >= 3.2 and (int4["rel_err_kernel"] or 1) <= 2e-3
    if int4 and int2:
        targets["int2_decode_faster_than_int4"] = int2["speedup"] > int4["speedup"]
    if "int4" in extend:
        targets["int4_extend_0.8x"] = extend["int4"] >= 0.8
    lines += [f"  target {k}: {'met' if v else 'NOT met'}" for k, v in targets.items()]
    return {"decode": decode, "extend": extend, "targets": targets, "lines": lines}


if __name__ == "__main__":
    sys.exit(main())
