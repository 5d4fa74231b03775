"""INT4/INT2 KV on the GPU in about a minute: kernel_checks.int_checks, then INT4 / INT2 against bf16 decode at
64 x 16k and extend at 8 x (4096 + 512), with bench_kernels.py's harness and pools (the full bench_kernels.py
run times every shape); then INT4 at head_dim 64 (KVStore's groups of 16 values, two a bit-plane; and the Triton
INT kernel's per-column path on the same pages) against bf16 decode at 64 x 16k.

Decode runs at the split count the engine would give it (dispatch.choose_num_splits for the kernel that runs:
paged_decode_int4's one-warp Gluon programs for INT4). With --sweep INT4 at head_dim 128 is also timed on the
Triton INT kernel and over a few split counts of the Gluon kernel. INT4 extends are checked against the fp64 twin
before the extend timings (the row's kernel_err is their worst).

Rows (--json; issue 34's benchmarks/results/int_kv.json): shape, kv, head_dim, us (decode) or tflops (extend),
vs_bf16, kernel_err (relative, against fp64 attention over the stored values; None where not measured).

    python benchmarks/kernels/check_int_kv.py [--sweep] [--extend-only] [--json OUT]
"""
from __future__ import annotations

import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kernel_checks import check_rows_int, int_checks, quantize_pool_int
from kernel_common import HQ, D, make_extend, make_pool, time_fn


def engine_splits(q, kc, vc, ks, ctx: int) -> int:
    """The split count PagedAttention.plan would pass for this decode (by the kernel that will run)."""
    from radixkv.kernels.dispatch import (
        choose_num_splits,
        decode_warps_per_sm,
        sm_count,
    )

    hkv = kc.shape[2]
    warps = decode_warps_per_sm(q.dtype, kc, vc, ks, q.shape[1] // hkv, q.shape[2])
    return choose_num_splits(q.shape[0], hkv, ctx, sm_count(q.device), warps_per_sm=warps)


def decode_us(ops, q, pool, caches: tuple[torch.Tensor, ...] | None = None, splits: int | None = None,
              config=None) -> float:
    kc, vc, ks, vs = caches if caches else (pool.k, pool.v, None, None)
    splits = splits or engine_splits(q, kc, vc, ks, int(pool.seq_lens.max()))
    return time_fn(lambda: ops.paged_decode(q, kc, vc, pool.page_table, pool.seq_lens, k_scale=ks, v_scale=vs,
                                            num_splits=splits, config=config), False).us


def extend_us(ops, ext, caches: tuple[torch.Tensor, ...] | None = None, config=None) -> float:
    pool = ext.pool
    kc, vc, ks, vs = caches if caches else (pool.k, pool.v, None, None)
    new = int(ext.q_lens[0])
    return time_fn(lambda: ops.paged_prefill(ext.q, kc, vc, pool.page_table, pool.seq_lens, ext.q_start, ext.q_lens,
                                             k_scale=ks, v_scale=vs, max_q_len=new, config=config), False).us


def int4_extend_checks(ops, ref, dev: torch.device, gen: torch.Generator) -> list[dict]:
    """INT4 extends long enough for paged_prefill_hopper (more than 64 new tokens a row, head_dim 128) against
    the twin, NaN-poisoned, over page sizes 1 / 3 / 16 / 32 and bf16 / fp16 q; and against the Triton INT
    kernel (an explicit config) on the same pages."""
    from kernel_checks import ragged_kv_int
    from kernel_common import rel_err
    from radixkv.kernels.launch import KernelKind, default_config

    rows = []
    lens, q_lens = [700, 300, 129, 65, 1000], [200, 129, 65, 65, 300]
    for page_size in (1, 3, 16, 32):
        kq, vq, ks, vs, table, seq = ragged_kv_int(lens, page_size, 4, 7, dev, gen, D)
        ql = torch.tensor(q_lens, dtype=torch.int32, device=dev)
        qs = (torch.cumsum(ql, 0) - ql).to(torch.int32)
        for qdt in (torch.bfloat16, torch.float16):
            q = torch.randn(sum(q_lens), HQ, D, device=dev, generator=gen).to(qdt)
            out = torch.full_like(q, float("nan"))
            ops.paged_prefill(q, kq, vq, table, seq, qs, ql, k_scale=ks, v_scale=vs, out=out)
            want = ref.paged_prefill_ref(q.double(), kq, vq, table, seq, qs, ql, k_scale=ks, v_scale=vs)
            tri = ops.paged_prefill(q, kq, vq, table, seq, qs, ql, k_scale=ks, v_scale=vs,
                                    config=default_config(KernelKind.PREFILL, q, kq, max(q_lens)))
            e, et = rel_err(out, want), rel_err(tri, want)
            rows.append({"check": f"int4 extend page{page_size} {str(qdt)[6:]}", "ok": e < 1e-2, "rel_err": e,
                         "triton_rel_err": et})
    return rows


def decode_rows(a, ops, ref, dev: torch.device, gen: torch.Generator, emit) -> None:
    """kernel_checks.int_checks, then the decode timings (and --sweep's)."""
    from radixkv.kernels.launch import KernelKind, default_config

    for row in int_checks(ops, ref, dev, gen, False):
        emit(row)
    pool = make_pool(64, 16384, dev, gen)
    q = torch.randn(64, HQ, D, device=dev, dtype=torch.bfloat16, generator=gen)
    t16 = decode_us(ops, q, pool)
    emit({"shape": "decode 64x16k", "kv": "bf16", "head_dim": D, "us": round(t16, 1), "vs_bf16": 1.0, "kernel_err": None,
          "splits": engine_splits(q, pool.k, pool.v, None, 16384)})
    for bits in (4, 2):
        intq = quantize_pool_int(pool, bits, ops)
        splits = engine_splits(q, intq[0], intq[1], intq[2], 16384)
        t = decode_us(ops, q, pool, intq)
        out = ops.paged_decode(q, *intq[:2], pool.page_table, pool.seq_lens, k_scale=intq[2], v_scale=intq[3],
                               num_splits=splits)
        err = check_rows_int(out, q, pool, intq, bits, [0, 31, 63], [1] * 64, D ** -0.5)
        emit({"shape": "decode 64x16k", "kv": f"int{bits}", "head_dim": D, "us": round(t, 1),
              "vs_bf16": round(t16 / t, 2), "kernel_err": err, "splits": splits})
        if bits == 4 and a.sweep:
            cfg = default_config(KernelKind.DECODE, q, intq[0])
            for s in (1, splits):
                emit({"sweep": "triton int4", "splits": s, "us": round(decode_us(ops, q, pool, intq, s, cfg), 1)})
            for s in (2, 4, 6, 8):
                emit({"sweep": "gluon int4", "splits": s, "us": round(decode_us(ops, q, pool, intq, s), 1)})
        del intq
    del pool
    pool = make_pool(64, 16384, dev, gen, head_dim=64)
    q = torch.randn(64, HQ, 64, device=dev, dtype=torch.bfloat16, generator=gen)
    t16 = decode_us(ops, q, pool)
    emit({"shape": "decode 64x16k", "kv": "bf16", "head_dim": 64, "us": round(t16, 1), "vs_bf16": 1.0, "kernel_err": None,
          "splits": engine_splits(q, pool.k, pool.v, None, 16384)})
    intq = quantize_pool_int(pool, 4, ops)
    splits = engine_splits(q, intq[0], intq[1], intq[2], 16384)
    t = decode_us(ops, q, pool, intq)
    out = ops.paged_decode(q, *intq[:2], pool.page_table, pool.seq_lens, k_scale=intq[2], v_scale=intq[3],
                           num_splits=splits)
    emit({"shape": "decode 64x16k", "kv": "int4 (groups of 16)", "head_dim": 64, "us": round(t, 1),
          "vs_bf16": round(t16 / t, 2), "splits": splits,
          "kernel_err": check_rows_int(out, q, pool, intq, 4, [0, 31, 63], [1] * 64, 64 ** -0.5)})
    cfg = default_config(KernelKind.DECODE, q, intq[0])  # the Triton INT kernel, at its own split rule
    t = decode_us(ops, q, pool, intq, engine_splits(q, pool.k, pool.v, None, 16384), cfg)
    emit({"shape": "decode 64x16k", "kv": "int4 (groups of 16), Triton kernel", "head_dim": 64, "us": round(t, 1),
          "vs_bf16": round(t16 / t, 2), "kernel_err": None})
    del pool, intq


def main() -> None:
    import argparse
    import json

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sweep", action="store_true", help="INT4 decode over split counts, code tricks and kernels")
    ap.add_argument("--extend-only", action="store_true",
                    help="INT4 extend checks (long extends: the Hopper kernel's path) and the extend timings only")
    ap.add_argument("--decode-only", action="store_true", help="the INT checks and the decode timings only")
    ap.add_argument("--json", default=None, help="write the rows here")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("check_int_kv: needs a CUDA GPU")
    import radixkv.kernels as ops
    from radixkv.kernels import reference_attention as ref

    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(0)
    rows: list[dict] = []

    def emit(row: dict) -> None:
        rows.append(row)
        print(row, flush=True)

    if not a.extend_only:
        decode_rows(a, ops, ref, dev, gen, emit)
    if not a.decode_only:
        extend_rows(ops, ref, dev, gen, emit)
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))
    print("\n| shape | kv | head_dim | us / TFLOP/s | vs bf16 | splits | kernel err |")
    for r in rows:
        if "check" in r:
            continue
        print(f"| {r.get('shape') or r.get('sweep')} | {r.get('kv', '')} | {r.get('head_dim', '')} | "
              f"{r.get('us', r.get('tflops'))} | {r.get('vs_bf16', '')} | {r.get('splits', '')} | "
              f"{'' if r.get('kernel_err') is None else r['kernel_err']} |")
    bad = [r["check"] for r in rows if "check" in r and not r["ok"]]
    print(f"checks: {sum('check' in r for r in rows) - len(bad)} passed, failed: {bad}")


def extend_rows(ops, ref, dev: torch.device, gen: torch.Generator, emit) -> None:
    """int4_extend_checks, then INT4 / INT2 extend against bf16 at 8 x (4096 + 512)."""
    ext_checks = int4_extend_checks(ops, ref, dev, gen)
    for row in ext_checks:
        emit(row)
    ext = make_extend(8, 4096, 512, dev, gen)
    te = extend_us(ops, ext)
    shape = "extend 8x(4096+512)"
    emit({"shape": shape, "kv": "bf16", "head_dim": D, "tflops": round(ext.flops / te / 1e6, 1), "vs_bf16": 1.0,
          "kernel_err": None})
    for bits in (4, 2):
        intq = quantize_pool_int(ext.pool, bits, ops)
        t = extend_us(ops, ext, intq)
        # the checks' worst, against fp64 (a NaN, from a non-finite output, counts as the worst)
        err = max(math.inf if math.isnan(r["rel_err"]) else r["rel_err"] for r in ext_checks) if bits == 4 else None
        emit({"shape": shape, "kv": f"int{bits}", "head_dim": D, "tflops": round(ext.flops / t / 1e6, 1),
              "vs_bf16": round(te / t, 2), "kernel_err": err})
        if bits == 4:  # the Triton INT kernel on the same pages (an explicit config keeps it)
            from radixkv.kernels.launch import KernelKind, default_config

            t = extend_us(ops, ext, intq, default_config(KernelKind.PREFILL, ext.q, intq[0], int(ext.q_lens[0])))
            emit({"shape": shape, "kv": "int4, Triton kernel", "head_dim": D, "tflops": round(ext.flops / t / 1e6, 1),
                  "vs_bf16": round(te / t, 2), "kernel_err": None})


if __name__ == "__main__":
    main()
