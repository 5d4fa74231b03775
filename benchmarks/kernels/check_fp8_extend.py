"""Extend over FP8 pages on the Hopper path (paged_prefill_hopper's Gluon kernel, FP8 tiles widened in
shared memory) against the Triton kernel and fp64 attention, then TFLOP/s beside bf16's Gluon kernel.

    python benchmarks/kernels/check_fp8_extend.py [--json OUT] [--variants] [--shared-only]

Checks: random ragged batches over KVStore's FP8 layout (head-major pages, float16 per-token scales;
page sizes 1-64, GQA groups 1-8, e4m3 and e5m2, bf16 and fp16 q): paged_prefill's own dispatch must
take the Gluon kernel (on sm_90), match the Triton kernel within bf16 rounding and the fp64 oracle on
the dequantised values as closely as the Triton kernel does. Timing: the extend benchmark's shapes
(kernel_common.EXTEND and shorter extends), bf16 and FP8 pages, each kernel in one run.
--variants also times the FP8 kernel with 32-key tiles. Shared prefixes (SHARED: few-shot's mixed steps,
rows of 80-600 new tokens over one cached prompt): bf16, FP8 widened in-kernel, and FP8 over copies of the
rows' distinct pages (the engine's path: radixkv/engine/page_copies.py), each with paged_prefill's dispatch.
Needs a CUDA GPU (sm_90 for the Gluon kernel)."""
from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kernel_common import (
    FP8,
    HKV,
    HQ,
    D,
    make_extend,
    quantize_pool,
    ragged_kv,
    rel_err,
    time_fn,
)


def ragged_cases(ops, ref, dev: torch.device, gen: torch.Generator, n_cases: int) -> list[dict]:
    from radixkv.kernels.dispatch import hopper_prefill_supported
    from radixkv.kernels.launch import KernelConfig

    rng = random.Random(5)
    triton_tile = KernelConfig(block_m=128, block_n=64, num_warps=8, num_stages=3)
    rows = []
    for case in range(n_cases):
        qdt = rng.choice([torch.bfloat16, torch.float16])
        kvdt = rng.choice(list(FP8.values()))
        page = rng.choice([1, 2, 8, 16, 32, 64])
        nb = rng.randint(1, 5)
        q_lens = [rng.choice([0, 65, 100, 129, 300, 777]) for _ in range(nb)]
        q_lens[0] = max(q_lens[0], 65)
        lens = [n + rng.choice([0, 1, 63, 500, 2100]) for n in q_lens]
        kv = ragged_kv(lens, page, kvdt, 3, dev, gen)
        group = rng.choice([1, 4])
        hq = HKV * group
        starts, t = [], 0
        for n in q_lens:
            t += rng.randint(0, 3)
            starts.append(t)
            t += n
        q = torch.randn(t + 2, hq, D, device=dev, generator=gen).to(qdt)
        seq, qs, ql = (torch.tensor(x, dtype=torch.int32, device=dev) for x in (lens, starts, q_lens))
        args = (q, kv.k, kv.v, kv.page_table, seq, qs, ql)
        mine = ops.paged_prefill(*args, k_scale=kv.k_scale, v_scale=kv.v_scale)
        triton_out = ops.paged_prefill(*args, k_scale=kv.k_scale, v_scale=kv.v_scale, config=triton_tile)
        want = ref.paged_prefill_ref(q.double(), kv.k, kv.v, kv.page_table, seq, qs, ql,
                                     k_scale=kv.k_scale, v_scale=kv.v_scale)
        sel = torch.zeros(t + 2, dtype=torch.bool, device=dev)
        for s, n in zip(starts, q_lens):
            sel[s:s + n] = True
        e, e_triton = rel_err(mine[sel], want[sel]), rel_err(triton_out[sel], want[sel])
        gluon = hopper_prefill_supported(q, kv.k, kv.v, mine, max(q_lens), kv.k_scale)
        ok = gluon and e <= max(2 * e_triton, 8e-3) and torch.isfinite(mine[sel]).all().item()
        rows.append({"check": f"fp8 extend {case} {str(kvdt)[6:]} q {str(qdt)[6:]} page{page} group{group} "
                              f"q_lens{q_lens}", "gluon": gluon, "rel_err": e, "rel_err_triton": e_triton,
                     "max_diff_vs_triton": float((mine[sel].float() - triton_out[sel].float()).abs().max()),
                     "ok": bool(ok)})
        print(f"  {rows[-1]['check']}: {'gluon' if gluon else 'TRITON'} err {e:.2e} (triton {e_triton:.2e}) "
              f"{'ok' if ok else 'FAIL'}")
    return rows


def time_shape(ops, dev: torch.device, gen: torch.Generator, shape: tuple[int, int, int], variants: bool) -> list[dict]:
    """bf16 Gluon, FP8 Gluon (and its variants) and FP8 Triton on one extend shape (seqs, cached, new)."""
    from radixkv.kernels import prefill_hopper_gluon as hop
    from radixkv.kernels.launch import KernelKind, default_config

    seqs, cached, new = shape
    pool, q, qs, ql, flops = make_extend(seqs, cached, new, dev, gen)
    rows = []

    def run(kc, vc, ks=None, vs=None, config=None):
        return lambda: ops.paged_prefill(q, kc, vc, pool.page_table, pool.seq_lens, qs, ql, k_scale=ks, v_scale=vs,
                                         max_q_len=new, config=config)

    def row(kernel, kv, t):
        rows.append({"seqs": seqs, "cached": cached, "new": new, "kernel": kernel, "kv_dtype": kv,
                     "us": round(t.us, 2), "tflops": round(flops / t.us / 1e6, 1)})
        print(f"  {seqs} x ({cached} + {new}) {kernel:16s} {kv:9s} {t.us:9.1f} us {flops / t.us / 1e6:6.1f} TFLOP/s")

    row("gluon", "bf16", time_fn(run(pool.k, pool.v), False))
    tile = default_config(KernelKind.PREFILL, q, pool.k, new)
    default = hop.FP8_BLOCK_N
    configs = [default] + ([bn for bn in (32, 64) if bn != default] if variants else [])
    for name, dt in FP8.items():
        kq, vq, ks, vs = quantize_pool(pool, dt, ops)
        for bn in configs:
            hop.FP8_BLOCK_N = bn
            row(f"gluon n{bn}", name, time_fn(run(kq, vq, ks, vs), False))
        hop.FP8_BLOCK_N = default
        row("triton", name, time_fn(run(kq, vq, ks, vs, config=tile), False))
    return rows


def time_shared(ops, dev: torch.device, gen: torch.Generator, shape: tuple[int, int, int]) -> list[dict]:
    """(rows, shared, new): every row's first `shared` tokens are row 0's pages; bf16 against FP8 e4m3 without
    and with the distinct-page copies (kernel time includes the copies' pass), and the FP8 outputs' difference."""
    from radixkv.engine.page_copies import distinct_pages
    from radixkv.kernels.dequant_pages import PageCopies
    from kernel_common import PAGE

    seqs, shared, new = shape
    pool, q, qs, ql, flops = make_extend(seqs, shared, new, dev, gen)
    pool.page_table[:, :shared // PAGE] = pool.page_table[0, :shared // PAGE]
    d = distinct_pages(pool.page_table.cpu().numpy(), pool.seq_lens.tolist(), PAGE, pool.k.shape[0])
    copies = PageCopies(torch.from_numpy(d.pages).to(dev), torch.from_numpy(d.table).to(dev), d.reads)
    kq, vq, ks, vs = quantize_pool(pool, FP8["fp8_e4m3"], ops)
    runs = {"bf16": (pool.k, pool.v, None, None, None), "fp8 in-kernel": (kq, vq, ks, vs, None),
            "fp8 copies": (kq, vq, ks, vs, copies)}
    rows, outs = [], {}
    for name, (kc, vc, xk, xv, cp) in runs.items():
        def fn(kc=kc, vc=vc, xk=xk, xv=xv, cp=cp):
            return ops.paged_prefill(q, kc, vc, pool.page_table, pool.seq_lens, qs, ql, k_scale=xk, v_scale=xv,
                                     max_q_len=new, copies=cp)
        outs[name] = fn()
        t = time_fn(fn, False)
        rows.append({"seqs": seqs, "shared": shared, "new": new, "path": name, "us": round(t.us, 2),
                     "tflops": round(flops / t.us / 1e6, 1), "distinct_pages": len(d.pages), "page_reads": d.reads})
        print(f"  {seqs} x ({shared} shared + {new}) {name:14s} {t.us:9.1f} us {flops / t.us / 1e6:6.1f} TFLOP/s")
    diff = rel_err(outs["fp8 copies"], outs["fp8 in-kernel"].double())
    for r in rows:
        r["vs_bf16"] = round(rows[0]["us"] / r["us"], 3)
        r["fp8_copies_vs_in_kernel_rel_err"] = diff
    return rows


EXTENDS = ((8, 4096, 512), (8, 4096, 128), (4, 0, 2048), (32, 1024, 96))
SHARED = ((64, 4096, 256), (128, 4096, 96), (256, 1024, 80), (4, 512, 96))  # the last: each copy read ~2.7 times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path)
    ap.add_argument("--cases", type=int, default=24)
    ap.add_argument("--variants", action="store_true")
    ap.add_argument("--shared-only", action="store_true", help="only the shared-prefix timings")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("check_fp8_extend: needs a CUDA GPU")
    import radixkv.kernels as ops
    from radixkv.kernels import reference_attention as ref

    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(0)
    print(f"{torch.cuda.get_device_name()}, HQ {HQ}, HKV {HKV}, D {D}")
    checks = [] if args.shared_only else ragged_cases(ops, ref, dev, gen, args.cases)
    times, shared = [], []
    for shape in () if args.shared_only else EXTENDS:
        times += time_shape(ops, dev, gen, shape, args.variants)
        torch.cuda.empty_cache()
    for shape in SHARED:
        shared += time_shared(ops, dev, gen, shape)
        torch.cuda.empty_cache()
    if args.json:
        args.json.write_text(json.dumps({"checks": checks, "timings": times, "shared": shared}, indent=1))
    print(f"\n{'shared prefix':>28s} {'path':14s} {'us':>9s} {'TFLOP/s':>8s} {'x bf16':>7s} "
          f"{'copies vs in-kernel':>20s}")
    for r in shared:
        print(f"{r['seqs']:>6d} x ({r['shared']} + {r['new']}) pages {r['distinct_pages']:>5d} {r['path']:14s} "
              f"{r['us']:9.1f} {r['tflops']:8.1f} {r['vs_bf16']:7.2f} {r['fp8_copies_vs_in_kernel_rel_err']:20.1e}")
    if args.shared_only:
        return
    print(f"\nchecks: {sum(c['ok'] for c in checks)}/{len(checks)} ok")
    print(f"{'shape':>22s} {'kernel':16s} {'kv':9s} {'TFLOP/s':>8s} {'of bf16':>8s}")
    bf16 = {(r["seqs"], r["cached"], r["new"]): r["tflops"] for r in times if r["kv_dtype"] == "bf16"}
    for r in times:
        shape = f"{r['seqs']} x ({r['cached']} + {r['new']})"
        print(f"{shape:>22s} {r['kernel']:16s} {r['kv_dtype']:9s} {r['tflops']:8.1f} "
              f"{r['tflops'] / bf16[(r['seqs'], r['cached'], r['new'])]:8.2f}")


if __name__ == "__main__":
    main()
