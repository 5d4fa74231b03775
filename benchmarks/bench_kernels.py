"""Paged-attention kernels on the GPU: correctness first, then timings against peers and ceilings.

    python benchmarks/bench_kernels.py --json benchmarks/results/kernels.json     # H200, one call
    python benchmarks/bench_kernels.py --smoke      # CPU interpreter, tiny shapes: checks this script

Order: (1) correctness of store_kv / paged_decode / paged_prefill against fp64 on fresh random
inputs; (2) ceilings measured in the same run (device-to-device copy, streaming read);
(3) decode at the issue's (batch, context) shapes in bf16 and fp8_e4m3, beside SDPA on
contiguous K/V, gather-then-SDPA and FlashInfer; (4) extend (8 x 4096 cached + 512 new);
(5) small sweeps of split count and tiles. Each timing is the median of triton's do_bench
(which flushes L2 before every repetition) over CUDA-graph replays where capture works.
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
from typing import Callable, NamedTuple

import torch

HQ, HKV, D, PAGE = 32, 8, 128, 16
DECODE_SHAPES = [(1, 32768), (16, 4096), (64, 4096), (64, 16384), (256, 1024), (256, 4096)]
EXTEND = (8, 4096, 512)  # sequences, cached tokens, new tokens
SMOKE_DECODE = [(2, 64), (3, 40)]
SMOKE_EXTEND = (2, 32, 16)
FP8 = {"fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}


class Timing(NamedTuple):
    us: float
    method: str  # "graph" (CUDA-graph replays), "eager", or "wall" (smoke runs)


def time_fn(fn: Callable[[], object], smoke: bool) -> Timing:
    """Median microseconds of fn, L2 flushed before each repetition (triton do_bench)."""
    if smoke:
        t = time.perf_counter()
        fn()
        return Timing((time.perf_counter() - t) * 1e6, "wall")
    from triton.testing import do_bench

    fn()
    torch.cuda.synchronize()
    try:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            fn()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        return Timing(do_bench(graph.replay, warmup=25, rep=150, return_mode="median") * 1e3, "graph")
    except Exception as exc:  # some peers cannot be captured; time them eagerly
        print(f"  (graph capture failed: {type(exc).__name__}: {str(exc)[:80]}; timing eagerly)")
        torch.cuda.synchronize()
        return Timing(do_bench(fn, warmup=25, rep=150, return_mode="median") * 1e3, "eager")


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    out = out.double()
    if not torch.isfinite(out).all():
        return float("nan")
    return float((out - ref).norm() / ref.norm())


# ----------------------------------------------------------------------------- pools and oracles
class Pool(NamedTuple):
    k: torch.Tensor  # [P, PAGE, HKV, D] bf16 (the "true" values)
    v: torch.Tensor
    page_table: torch.Tensor  # int32 [B, ctx // PAGE], pages shuffled
    seq_lens: torch.Tensor  # int32 [B]


def make_pool(batch: int, ctx: int, dev: torch.device, gen: torch.Generator) -> Pool:
    pages = batch * (-(-ctx // PAGE))
    k = torch.randn(pages, PAGE, HKV, D, device=dev, dtype=torch.bfloat16, generator=gen)
    v = torch.randn(pages, PAGE, HKV, D, device=dev, dtype=torch.bfloat16, generator=gen)
    table = torch.randperm(pages, device=dev, generator=gen).to(torch.int32).view(batch, -1)
    return Pool(k, v, table, torch.full((batch,), ctx, dtype=torch.int32, device=dev))


def quantize_pool(pool: Pool, dtype: torch.dtype, ops) -> tuple[torch.Tensor, ...]:
    """FP8 copy of a pool written by the store_kv kernel (in-kernel quantisation), chunked."""
    kq, vq = torch.empty_like(pool.k, dtype=dtype), torch.empty_like(pool.v, dtype=dtype)
    ks = torch.empty(pool.k.shape[:3], dtype=torch.float32, device=pool.k.device)
    vs = torch.empty_like(ks)
    rows = pool.k.shape[0] * PAGE
    step = 1 << 18
    for lo in range(0, rows, step):
        hi = min(rows, lo + step)
        slots = torch.arange(lo, hi, device=pool.k.device, dtype=torch.int64)
        ops.store_kv(pool.k.view(-1, HKV, D)[lo:hi], pool.v.view(-1, HKV, D)[lo:hi], kq, vq, slots,
                     k_scale=ks, v_scale=vs)
    return kq, vq, ks, vs


def dense_ref(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sm_scale: float) -> torch.Tensor:
    """fp64 causal GQA attention. q: [M, HQ, D] = last M of k's N tokens; k, v: [N, HKV, D] -> [M, HQ, D]."""
    m, n = q.shape[0], k.shape[0]
    g = q.shape[1] // k.shape[1]
    kd = k.double().repeat_interleave(g, dim=1)
    vd = v.double().repeat_interleave(g, dim=1)
    s = torch.einsum("mhd,nhd->hmn", q.double(), kd) * sm_scale
    mask = torch.ones(m, n, dtype=torch.bool, device=q.device).tril(diagonal=n - m)
    p = torch.softmax(s.masked_fill(~mask, float("-inf")), dim=-1)
    return torch.einsum("hmn,nhd->mhd", p, vd)


def row_kv(pool: Pool, b: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    pages = pool.page_table[b, : -(-n // PAGE)].long()
    return pool.k[pages].reshape(-1, HKV, D)[:n], pool.v[pages].reshape(-1, HKV, D)[:n]


def row_kv_fp8(pool: Pool, fp8: tuple[torch.Tensor, ...], b: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    kq, vq, ks, vs = fp8
    pages = pool.page_table[b, : -(-n // PAGE)].long()
    k = (kq[pages].double() * ks[pages].double().unsqueeze(-1)).reshape(-1, HKV, D)[:n]
    v = (vq[pages].double() * vs[pages].double().unsqueeze(-1)).reshape(-1, HKV, D)[:n]
    return k, v


def check_rows(out: torch.Tensor, q: torch.Tensor, pool: Pool, rows: list[int], q_lens: list[int], sm_scale: float,
               fp8: tuple[torch.Tensor, ...] | None = None) -> float:
    """Relative error of `out` on the given rows vs fp64 attention over the pool's true (bf16) values, or,
    with fp8 = (k, v, k_scale, v_scale), over the dequantised FP8 values (the kernel's own error)."""
    outs, refs = [], []
    start = 0
    starts = [sum(q_lens[:b]) for b in range(len(q_lens))]
    for b in rows:
        n = int(pool.seq_lens[b])
        k, v = row_kv(pool, b, n) if fp8 is None else row_kv_fp8(pool, fp8, b, n)
        s0, m = starts[b], q_lens[b]
        refs.append(dense_ref(q[s0:s0 + m], k, v, sm_scale))
        outs.append(out[s0:s0 + m])
        start += m
    return rel_err(torch.cat(outs), torch.cat(refs))


# ----------------------------------------------------------------------------- ceilings
def ceilings(dev: torch.device, smoke: bool) -> tuple[float, float]:
    """(copy_tbps counting read + write, read_tbps of a streaming-read Triton kernel)."""
    if smoke:
        return 1.0, 1.0
    import triton
    import triton.language as tl

    @triton.jit
    def _read_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr, ITERS: tl.constexpr):
        base = tl.program_id(0).to(tl.int64) * BLOCK * ITERS
        acc = tl.zeros([BLOCK], tl.float32)
        for i in range(ITERS):
            offs = base + i * BLOCK + tl.arange(0, BLOCK)
            acc += tl.load(x_ptr + offs, mask=offs < n, other=0.0).to(tl.float32)
        tl.store(out_ptr + tl.program_id(0), tl.sum(acc, axis=0))

    n = 1 << 31  # 4 GiB of bf16
    x = torch.randn(n // 4, device=dev, dtype=torch.float32).to(torch.bfloat16).repeat(4)
    y = torch.empty_like(x)
    from triton.testing import do_bench

    # eager copy_ (a CUDA graph turns it into a copy-engine memcpy node, which is slower)
    copy_us = do_bench(lambda: y.copy_(x), warmup=25, rep=150, return_mode="median") * 1e3
    copy_tbps = 2 * x.numel() * 2 / copy_us / 1e6
    print(f"  torch copy_: {copy_tbps:.3f} TB/s (read + write)")
    best = 0.0
    for block, iters, warps in ((4096, 16, 8), (8192, 8, 8), (2048, 32, 4), (16384, 4, 16)):
        partial = torch.empty(triton.cdiv(n, block * iters), device=dev, dtype=torch.float32)
        grid = (partial.numel(),)
        us = time_fn(lambda: _read_kernel[grid](x, partial, n, BLOCK=block, ITERS=iters, num_warps=warps), False).us
        tbps = x.numel() * 2 / us / 1e6
        print(f"  read kernel BLOCK={block} ITERS={iters} warps={warps}: {tbps:.3f} TB/s")
        best = max(best, tbps)
    del x, y
    torch.cuda.empty_cache()
    return copy_tbps, best


# ----------------------------------------------------------------------------- correctness (small, random)
def correctness(ops, ref, dev: torch.device, gen: torch.Generator, smoke: bool) -> list[dict]:
    """Kernels vs reference.py on fresh random inputs with NaN-poisoned outputs."""
    results = []
    hgen = torch.Generator().manual_seed(1)  # host-side sizes
    max_len, max_new, n_rows = (40, 12, 2) if smoke else (700, 200, 5)
    # store_kv: bf16 exact, fp8 bit-exact vs torch quantisation
    for name, dt in (("bf16", torch.bfloat16), *FP8.items()):
        T, P = (20, 4) if smoke else (300, 64)
        k = torch.randn(T, HKV, D, device=dev, generator=gen) * 4
        v = torch.randn(T, HKV, D, device=dev, generator=gen)
        slots = torch.randperm(P * PAGE, device=dev, generator=gen)[:T]
        caches = [torch.zeros(P, PAGE, HKV, D, device=dev).to(dt) for _ in range(4)]
        fp8 = dt in FP8.values()
        sc = [torch.zeros(P, PAGE, HKV, device=dev) for _ in range(4)] if fp8 else [None] * 4
        src_k, src_v = (k, v) if fp8 else (k.to(dt), v.to(dt))
        ops.store_kv(src_k, src_v, caches[0], caches[1], slots, k_scale=sc[0], v_scale=sc[1])
        ref.store_kv_ref(src_k, src_v, caches[2], caches[3], slots, k_scale=sc[2], v_scale=sc[3])
        diff = max(float((caches[i].view(torch.uint8) != caches[i + 2].view(torch.uint8)).float().mean()) for i in (0, 1))
        # torch divides by a scalar through its reciprocal on CUDA, the kernel rounds the division
        # exactly: scales may differ by an ulp, and a value on a rounding edge may then differ too.
        scale_rel = max(float(((sc[i] - sc[i + 2]).abs() / sc[i + 2].abs().clamp(min=1e-30)).max()) for i in (0, 1)) if fp8 else 0.0
        ok = diff <= (1e-3 if fp8 else 0.0) and scale_rel <= 1e-6
        results.append({"check": f"store_kv {name}", "ok": ok, "mismatch_frac": diff, "scale_rel_diff": scale_rel})
    # attention on ragged random shapes, several page sizes and splits
    for page_size in ((16,) if smoke else (1, 16, 32)):
        for kv_name in ("bf16", "fp16", "fp8_e4m3", "fp8_e5m2"):
            cdt = {"bf16": torch.bfloat16, "fp16": torch.float16, **FP8}[kv_name]
            qdt = torch.float16 if kv_name == "fp16" else torch.bfloat16
            lens = torch.randint(1, max_len, (n_rows,), generator=hgen).tolist()
            q_lens = [min(n, int(x)) for n, x in zip(lens, torch.randint(1, max_new, (n_rows,), generator=hgen))]
            need = [-(-n // page_size) for n in lens]
            P = sum(need) + 7
            kt = torch.randn(P, page_size, HKV, D, device=dev, generator=gen)
            vt = torch.randn(P, page_size, HKV, D, device=dev, generator=gen)
            if cdt in FP8.values():
                kq, ks = ref.quantize_fp8(kt, cdt)
                vq, vs = ref.quantize_fp8(vt, cdt)
            else:
                kq, vq, ks, vs = kt.to(cdt), vt.to(cdt), None, None
            perm = torch.randperm(P, device=dev, generator=gen).to(torch.int32)
            table = torch.zeros(n_rows, max(need), dtype=torch.int32, device=dev)
            pos = 0
            for b, n in enumerate(need):
                table[b, :n] = perm[pos:pos + n]
                pos += n
            seq = torch.tensor(lens, dtype=torch.int32, device=dev)
            ql = torch.tensor(q_lens, dtype=torch.int32, device=dev)
            qs = (torch.cumsum(ql, 0) - ql).to(torch.int32)
            q = torch.randn(sum(q_lens), HQ, D, device=dev, generator=gen).to(qdt)
            out = torch.full_like(q, float("nan"))
            ops.paged_prefill(q, kq, vq, table, seq, qs, ql, k_scale=ks, v_scale=vs, out=out)
            want = ref.paged_prefill_ref(q.float(), kq, vq, table, seq, qs, ql, k_scale=ks, v_scale=vs)
            e = rel_err(out, want.double())
            results.append({"check": f"prefill page{page_size} {kv_name}", "ok": e < 1e-2, "rel_err": e})
            qd = torch.randn(n_rows, HQ, D, device=dev, generator=gen).to(qdt)
            want = ref.paged_decode_ref(qd.float(), kq, vq, table, seq, k_scale=ks, v_scale=vs).double()
            for splits in (1, 5, 32):
                out = torch.full_like(qd, float("nan"))
                ops.paged_decode(qd, kq, vq, table, seq, k_scale=ks, v_scale=vs, num_splits=splits, out=out)
                e = rel_err(out, want)
                results.append({"check": f"decode page{page_size} {kv_name} splits{splits}", "ok": e < 1e-2, "rel_err": e})
    return results


# ----------------------------------------------------------------------------- peers
def load_flashinfer(enabled: bool):
    if not enabled:
        return None
    try:
        import flashinfer  # imported once in the main thread, before any JIT build

        return flashinfer
    except Exception as exc:
        print(f"FlashInfer unavailable: {type(exc).__name__}: {exc}")
        return None


def flashinfer_decode(fi, pool: Pool, q: torch.Tensor, workspace: torch.Tensor):
    B, n_pages = pool.page_table.shape
    dev = q.device
    w = fi.BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD", use_tensor_cores=True)
    indptr = torch.arange(0, B + 1, device=dev, dtype=torch.int32) * n_pages
    last = ((pool.seq_lens - 1) % PAGE + 1).to(torch.int32)
    w.plan(indptr, pool.page_table.flatten(), last, HQ, HKV, D, PAGE, q_data_type=q.dtype, kv_data_type=pool.k.dtype)
    return lambda: w.run(q, (pool.k, pool.v))


def flashinfer_prefill(fi, pool: Pool, q: torch.Tensor, q_lens: list[int], workspace: torch.Tensor):
    B, n_pages = pool.page_table.shape
    dev = q.device
    w = fi.BatchPrefillWithPagedKVCacheWrapper(workspace, "NHD")
    qo = torch.tensor([0] + list(torch.tensor(q_lens).cumsum(0)), dtype=torch.int32, device=dev)
    indptr = torch.arange(0, B + 1, device=dev, dtype=torch.int32) * n_pages
    last = ((pool.seq_lens - 1) % PAGE + 1).to(torch.int32)
    w.plan(qo, indptr, pool.page_table.flatten(), last, HQ, HKV, D, PAGE, causal=True,
           q_data_type=q.dtype, kv_data_type=pool.k.dtype)
    return lambda: w.run(q, (pool.k, pool.v))


def contiguous_kv(pool: Pool) -> tuple[torch.Tensor, torch.Tensor]:
    """[B, HKV, ctx, D] copies for dense SDPA."""
    B = pool.page_table.shape[0]
    k = pool.k[pool.page_table.long()].view(B, -1, HKV, D).transpose(1, 2).contiguous()
    v = pool.v[pool.page_table.long()].view(B, -1, HKV, D).transpose(1, 2).contiguous()
    return k, v


def sdpa_decode(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    # q: [B, HQ, D] -> [B, HQ, 1, D]; k, v: [B, HKV, N, D]
    return torch.nn.functional.scaled_dot_product_attention(q.unsqueeze(2), k, v, enable_gqa=True).squeeze(2)


def gather_sdpa_decode(q: torch.Tensor, pool: Pool) -> torch.Tensor:
    B = q.shape[0]
    k = pool.k[pool.page_table.long()].view(B, -1, HKV, D).transpose(1, 2)
    v = pool.v[pool.page_table.long()].view(B, -1, HKV, D).transpose(1, 2)
    return sdpa_decode(q, k, v)


def sdpa_extend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, new: int) -> torch.Tensor:
    """q: [B*new, HQ, D] ragged-equal rows; k, v: [B, HKV, N, D] -> [B*new, HQ, D] (bottom-right causal)."""
    from torch.nn.attention.bias import causal_lower_right

    B, _, n, _ = k.shape
    qb = q.view(B, new, HQ, D).transpose(1, 2)
    g = HQ // HKV
    kk, vv = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
    out = torch.nn.functional.scaled_dot_product_attention(qb, kk, vv, attn_mask=causal_lower_right(new, n))
    return out.transpose(1, 2).reshape(B * new, HQ, D)


# ----------------------------------------------------------------------------- main phases
def bench_decode(ops, ref, fi, dev, gen, read_tbps, smoke, shapes, workspace) -> list[dict]:
    from radixkv.attention import choose_num_splits

    rows = []
    sms = torch.cuda.get_device_properties(dev).multi_processor_count if dev.type == "cuda" else 132
    for batch, ctx in shapes:
        pool = make_pool(batch, ctx, dev, gen)
        q = torch.randn(batch, HQ, D, device=dev, dtype=torch.bfloat16, generator=gen)
        splits = choose_num_splits(batch, HKV, ctx, sms)
        check = [0, batch - 1] if batch > 1 else [0]
        sm = 1 / math.sqrt(D)
        bf16_bytes = 2 * batch * ctx * HKV * D * 2

        def row(kernel, kv_dtype, t: Timing, err, nbytes, err_kernel=None):
            tbps = nbytes / t.us / 1e6
            r = {"kernel": kernel, "kv_dtype": kv_dtype, "batch": batch, "context": ctx, "us": round(t.us, 2),
                 "tbps": round(tbps, 3), "frac_read": round(tbps / read_tbps, 3), "rel_err": err,
                 "rel_err_kernel": err_kernel, "timing": t.method,
                 "num_splits": splits if kernel == "radixkv" else None}
            print(f"  decode {kernel:12s} {kv_dtype:9s} {batch:4d} x {ctx:6d}: {t.us:9.1f} us "
                  f"{tbps:6.3f} TB/s ({r['frac_read']:.2f} of read) rel_err {err:.2e} kernel-only {err_kernel}")
            rows.append(r)

        out = ops.paged_decode(q, pool.k, pool.v, pool.page_table, pool.seq_lens, num_splits=splits)
        row("radixkv", "bf16", time_fn(lambda: ops.paged_decode(q, pool.k, pool.v, pool.page_table, pool.seq_lens,
                                                                num_splits=splits), smoke),
            check_rows(out, q, pool, check, [1] * batch, sm), bf16_bytes)
        if not smoke:
            kc, vc = contiguous_kv(pool)
            out = sdpa_decode(q, kc, vc)
            row("sdpa-dense", "bf16", time_fn(lambda: sdpa_decode(q, kc, vc), smoke),
                check_rows(out, q, pool, check, [1] * batch, sm), bf16_bytes)
            del kc, vc
            out = gather_sdpa_decode(q, pool)
            row("gather-sdpa", "bf16", time_fn(lambda: gather_sdpa_decode(q, pool), smoke),
                check_rows(out, q, pool, check, [1] * batch, sm), bf16_bytes)
        if fi is not None:
            try:
                fn = flashinfer_decode(fi, pool, q, workspace)
                out = fn()
                row("flashinfer", "bf16", time_fn(fn, smoke), check_rows(out, q, pool, check, [1] * batch, sm), bf16_bytes)
            except Exception as exc:
                print(f"  flashinfer decode failed: {type(exc).__name__}: {str(exc)[:200]}")
        for name in ("fp8_e4m3", "fp8_e5m2"):
            if name == "fp8_e5m2" and (batch, ctx) not in ((16, 4096), (64, 4096), SMOKE_DECODE[0]):
                continue  # e5m2: accuracy (and a timing) at two shapes only
            kq, vq, ks, vs = quantize_pool(pool, FP8[name], ops)
            fp8_bytes = 2 * batch * ctx * HKV * (D + 4)

            def run_fp8():
                return ops.paged_decode(q, kq, vq, pool.page_table, pool.seq_lens, k_scale=ks, v_scale=vs,
                                        num_splits=splits)

            out = run_fp8()
            row("radixkv", name, time_fn(run_fp8, smoke), check_rows(out, q, pool, check, [1] * batch, sm), fp8_bytes,
                check_rows(out, q, pool, check, [1] * batch, sm, fp8=(kq, vq, ks, vs)))
            del kq, vq, ks, vs
        del pool
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    return rows


def bench_extend(ops, fi, dev, gen, smoke, shape, workspace) -> list[dict]:
    seqs, cached, new = shape
    pool = make_pool(seqs, cached + new, dev, gen)
    q_lens = [new] * seqs
    q = torch.randn(seqs * new, HQ, D, device=dev, dtype=torch.bfloat16, generator=gen)
    qs = torch.arange(0, seqs * new, new, dtype=torch.int32, device=dev)
    ql = torch.full((seqs,), new, dtype=torch.int32, device=dev)
    per_head = new * cached + new * (new + 1) / 2
    flops = 4 * D * per_head * HQ * seqs
    sm = 1 / math.sqrt(D)
    rows = []

    def row(kernel, kv_dtype, t: Timing, err, err_kernel=None):
        tf = flops / t.us / 1e6
        rows.append({"kernel": kernel, "kv_dtype": kv_dtype, "seqs": seqs, "cached": cached, "new": new,
                     "us": round(t.us, 2), "tflops": round(tf, 1), "rel_err": err, "rel_err_kernel": err_kernel,
                     "timing": t.method})
        print(f"  extend {kernel:12s} {kv_dtype:9s}: {t.us:9.1f} us {tf:6.1f} TFLOP/s rel_err {err:.2e} kernel-only {err_kernel}")

    def ours(kc, vc, ks=None, vs=None):
        return lambda: ops.paged_prefill(q, kc, vc, pool.page_table, pool.seq_lens, qs, ql, k_scale=ks, v_scale=vs,
                                         max_q_len=new)

    fn = ours(pool.k, pool.v)
    row("radixkv", "bf16", time_fn(fn, smoke), check_rows(fn(), q, pool, [0, seqs - 1], q_lens, sm))
    for name, dt in FP8.items():
        kq, vq, ks, vs = quantize_pool(pool, dt, ops)
        fn = ours(kq, vq, ks, vs)
        out = fn()
        row("radixkv", name, time_fn(fn, smoke), check_rows(out, q, pool, [0, seqs - 1], q_lens, sm),
            check_rows(out, q, pool, [0, seqs - 1], q_lens, sm, fp8=(kq, vq, ks, vs)))
        del kq, vq, ks, vs
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
    ALL = "all"  # + split counts and extend tiles


def sweeps(ops, dev, gen, read_tbps, smoke, which: Sweeps) -> list[dict]:
    """Split counts for small batches and tile configs for the two kernels (informs launch.py defaults)."""
    from radixkv.kernels.launch import KernelConfig

    rows = []
    if which is Sweeps.NONE:
        return rows
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
                               ("fp8_e4m3", (kq, vq, ks, vs), nbytes * (D + 4) // (2 * D))):
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
    seqs, cached, new = EXTEND
    pool = make_pool(seqs, cached + new, dev, gen)
    q = torch.randn(seqs * new, HQ, D, device=dev, dtype=torch.bfloat16, generator=gen)
    qs = torch.arange(0, seqs * new, new, dtype=torch.int32, device=dev)
    ql = torch.full((seqs,), new, dtype=torch.int32, device=dev)
    flops = 4 * D * (new * cached + new * (new + 1) / 2) * HQ * seqs
    for cfg in (KernelConfig(128, 128, 8, 3), KernelConfig(128, 128, 8, 2), KernelConfig(128, 64, 8, 3),
                KernelConfig(128, 128, 4, 3), KernelConfig(64, 128, 4, 3)):
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
    from radixkv.kernels import reference as ref

    dev = torch.device("cpu" if args.smoke else "cuda")
    gen = torch.Generator(device=dev).manual_seed(0)
    t0 = time.time()
    name = "cpu (interpreter smoke run)" if args.smoke else torch.cuda.get_device_name(dev)
    print(f"device {name}; torch {torch.__version__}; flashinfer {getattr(fi, '__version__', None)}")
    checks = correctness(ops, ref, dev, gen, args.smoke) if not args.only_sweeps else []
    bad = [c for c in checks if not c["ok"]]
    print(f"correctness: {len(checks) - len(bad)}/{len(checks)} checks pass" + "".join(f"\n  FAIL {c}" for c in bad))
    copy_tbps, read_tbps = ceilings(dev, args.smoke)
    print(f"ceilings: copy {copy_tbps:.3f} TB/s (read+write), streaming read {read_tbps:.3f} TB/s")
    workspace = torch.zeros(256 << 20, dtype=torch.uint8, device=dev) if fi is not None else None
    result = {"device": name, "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "torch": torch.__version__, "triton": __import__("triton").__version__,
              "flashinfer": getattr(fi, "__version__", None), "copy_tbps": round(copy_tbps, 3),
              "read_tbps": round(read_tbps, 3), "correctness": checks, "decode": [], "prefill": [], "sweeps": []}

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
    result["decode"] = bench_decode(ops, ref, fi, dev, gen, read_tbps, args.smoke,
                                    SMOKE_DECODE if args.smoke else DECODE_SHAPES, workspace)
    save()
    result["prefill"] = bench_extend(ops, fi, dev, gen, args.smoke, SMOKE_EXTEND if args.smoke else EXTEND, workspace)
    save()
    result["sweeps"] = sweeps(ops, dev, gen, read_tbps, args.smoke, Sweeps(args.sweeps))
    save()
    print_table(result)
    return 1 if bad else 0


def print_table(r: dict) -> None:
    print(f"\n{r['device']}  copy {r['copy_tbps']} TB/s  read {r['read_tbps']} TB/s")
    print(f"{'decode':>14s} {'kv':>9s} " + " ".join(f"{k:>12s}" for k in ("radixkv", "frac", "flashinfer", "sdpa-dense", "gather-sdpa")))
    keys = sorted({(d["batch"], d["context"], d["kv_dtype"]) for d in r["decode"]}, key=lambda x: (x[0], x[1], x[2]))
    for b, c, kv in keys:
        by = {d["kernel"]: d for d in r["decode"] if (d["batch"], d["context"], d["kv_dtype"]) == (b, c, kv)}
        cells = [f"{by['radixkv']['us']:12.1f}" if "radixkv" in by else " " * 12,
                 f"{by['radixkv']['frac_read']:12.2f}" if "radixkv" in by else " " * 12]
        cells += [f"{by[k]['us']:12.1f}" if k in by else f"{'-':>12s}" for k in ("flashinfer", "sdpa-dense", "gather-sdpa")]
        print(f"{b:5d} x {c:6d} {kv:>9s} " + " ".join(cells))
    for p in r["prefill"]:
        print(f"extend {p['kernel']:12s} {p['kv_dtype']:9s} {p['us']:9.1f} us {p['tflops']:6.1f} TFLOP/s rel_err {p['rel_err']:.1e}")


if __name__ == "__main__":
    sys.exit(main())
