"""Shapes, timing, random page pools and fp64 oracles shared by the kernel benchmarks
(bench_kernels.py, kernel_checks.py, kernel_peers.py, profile_*.py). GPU timings are
medians of triton's do_bench over CUDA-graph replays; smoke runs time one wall-clock call."""
from __future__ import annotations

import time
from typing import Callable, NamedTuple

import torch

HQ, HKV, D, PAGE = 32, 8, 128, 16
EXTEND = (8, 4096, 512)  # the extend benchmark: sequences, cached tokens, new tokens each
FP8 = {"fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}


# Timing windows. Under sustained load the H200 sits at its 700 W power cap and the SM clock
# oscillates between about 0.8 and 1.75 GHz within each second (nvidia-smi at 100 ms, 2026-11-29:
# throttle reason "SW power cap"). Memory-bound kernels barely notice; ones with more work per byte
# (FP8 decode's conversions) move by up to 5% between 150 ms windows. Each timing therefore warms
# up for WARMUP_MS and takes the median over REP_MS of calls.
WARMUP_MS, REP_MS = 300, 1000


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
        return Timing(do_bench(graph.replay, warmup=WARMUP_MS, rep=REP_MS, return_mode="median") * 1e3, "graph")
    except Exception as exc:  # some peers cannot be captured; time them eagerly
        print(f"  (graph capture failed: {type(exc).__name__}: {str(exc)[:80]}; timing eagerly)")
        torch.cuda.synchronize()
        return Timing(do_bench(fn, warmup=WARMUP_MS, rep=REP_MS, return_mode="median") * 1e3, "eager")


def time_rotated(fns: list[Callable[[], object]], reps: int = 10, samples: int = 15) -> Timing:
    """Median microseconds per call of `fns` (the same kernel over different KV pools) run round-robin
    inside one CUDA graph (at least `samples` replays over REP_MS), without flushing L2. With pools larger than L2 no call finds its data in
    cache, and, unlike a flush (which leaves L2 full of dirty lines that the timed kernel must write
    back first, ~11 us on the H200), nothing but the kernel's own traffic is timed."""
    for fn in fns:
        fn()
    torch.cuda.synchronize()

    def run_all() -> None:
        for _ in range(reps):
            for fn in fns:
                fn()

    step, method = run_all, "graph-rotated"
    try:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for fn in fns:
                fn()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            run_all()
        step = graph.replay
    except Exception as exc:  # some peers cannot be captured; time them eagerly
        print(f"  (graph capture failed: {type(exc).__name__}: {str(exc)[:80]}; timing eagerly)")
        torch.cuda.synchronize()
        method = "eager-rotated"
    until = time.perf_counter() + WARMUP_MS / 1e3
    while time.perf_counter() < until:
        step()
        torch.cuda.synchronize()
    per_call = []
    until = time.perf_counter() + REP_MS / 1e3
    while len(per_call) < samples or time.perf_counter() < until:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step()
        end.record()
        end.synchronize()
        per_call.append(start.elapsed_time(end) * 1e3 / (reps * len(fns)))
    return Timing(sorted(per_call)[len(per_call) // 2], method)


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


def make_pool(batch: int, ctx: int, dev: torch.device, gen: torch.Generator, head_dim: int = D) -> Pool:
    pages = batch * (-(-ctx // PAGE))
    k = torch.randn(pages, PAGE, HKV, head_dim, device=dev, dtype=torch.bfloat16, generator=gen)
    v = torch.randn(pages, PAGE, HKV, head_dim, device=dev, dtype=torch.bfloat16, generator=gen)
    table = torch.randperm(pages, device=dev, generator=gen).to(torch.int32).view(batch, -1)
    return Pool(k, v, table, torch.full((batch,), ctx, dtype=torch.int32, device=dev))


class Extend(NamedTuple):
    """An extend batch: every sequence has `cached` tokens in the pool plus `new` ones to attend."""

    pool: Pool  # seq_lens = cached + new for every row
    q: torch.Tensor  # [seqs * new, HQ, D] bf16
    q_start: torch.Tensor  # int32 [seqs]
    q_lens: torch.Tensor  # int32 [seqs]
    flops: float  # causal attention FLOPs of the batch (both matrix products)


def make_extend(seqs: int, cached: int, new: int, dev: torch.device, gen: torch.Generator) -> Extend:
    pool = make_pool(seqs, cached + new, dev, gen)
    q = torch.randn(seqs * new, HQ, D, device=dev, dtype=torch.bfloat16, generator=gen)
    q_start = torch.arange(0, seqs * new, new, dtype=torch.int32, device=dev)
    q_lens = torch.full((seqs,), new, dtype=torch.int32, device=dev)
    flops = 4 * D * (new * cached + new * (new + 1) / 2) * HQ * seqs
    return Extend(pool, q, q_start, q_lens, flops)


def store_pool(pool: Pool, caches: tuple[torch.Tensor, ...], ops) -> tuple[torch.Tensor, ...]:
    """Write a pool's true rows into quantised caches (k, v, k_scale, v_scale) with the store_kv kernel
    (in-kernel quantisation), in chunks of 2^18 rows. Returns the caches."""
    kq, vq, ks, vs = caches
    rows = pool.k.shape[0] * PAGE
    d = pool.k.shape[-1]
    step = 1 << 18
    for lo in range(0, rows, step):
        hi = min(rows, lo + step)
        slots = torch.arange(lo, hi, device=pool.k.device, dtype=torch.int64)
        ops.store_kv(pool.k.view(-1, HKV, d)[lo:hi], pool.v.view(-1, HKV, d)[lo:hi], kq, vq, slots,
                     k_scale=ks, v_scale=vs)
    return caches


def quantize_pool(pool: Pool, dtype: torch.dtype, ops) -> tuple[torch.Tensor, ...]:
    """FP8 copy of a pool written by the store_kv kernel, pages and scales head-major like KVStore's."""
    from radixkv.engine.kv_store import head_major_pages, head_major_scales

    shape, dev = pool.k.shape, pool.k.device
    return store_pool(pool, (head_major_pages(shape, dtype, dev), head_major_pages(shape, dtype, dev),
                             head_major_scales(shape, dev), head_major_scales(shape, dev)), ops)


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


class RaggedKV(NamedTuple):
    """A paged K/V cache of random rows of different lengths, pages shuffled."""

    k: torch.Tensor  # [P, page_size, HKV, D] in the cache dtype
    v: torch.Tensor
    k_scale: torch.Tensor | None  # float16 [P, page_size, HKV] for FP8 caches (KVStore's), else None
    v_scale: torch.Tensor | None
    page_table: torch.Tensor  # int32 [rows, max pages of a row]
    seq_lens: torch.Tensor  # int32 [rows]


def ragged_kv(lens: list[int], page_size: int, cache_dtype: torch.dtype, spare_pages: int,
              dev: torch.device, gen: torch.Generator, head_dim: int = D) -> RaggedKV:
    """Random K/V for rows of `lens` tokens (plus `spare_pages` unused pages), quantised with
    fp8.py's quantize_fp8 when `cache_dtype` is an FP8 type, laid out as KVStore lays FP8
    out (head-major pages, float16 scales). Draws K, V, then the page order."""
    need = [-(-n // page_size) for n in lens]
    P = sum(need) + spare_pages
    kt = torch.randn(P, page_size, HKV, head_dim, device=dev, generator=gen)
    vt = torch.randn(P, page_size, HKV, head_dim, device=dev, generator=gen)
    if cache_dtype in FP8.values():
        from radixkv.engine.kv_store import SCALE_DTYPE, head_major_pages, head_major_scales
        from radixkv.kernels.fp8 import quantize_fp8

        (kq, ks), (vq, vs) = (quantize_fp8(x, cache_dtype, SCALE_DTYPE) for x in (kt, vt))
        kq, vq = (head_major_pages(x.shape, cache_dtype, dev).copy_(x) for x in (kq, vq))
        ks, vs = (head_major_scales(x.shape, dev).copy_(x) for x in (ks, vs))
    else:
        kq, vq, ks, vs = kt.to(cache_dtype), vt.to(cache_dtype), None, None
    perm = torch.randperm(P, device=dev, generator=gen).to(torch.int32)
    table = torch.zeros(len(lens), max(need), dtype=torch.int32, device=dev)
    pos = 0
    for b, n in enumerate(need):
        table[b, :n] = perm[pos:pos + n]
        pos += n
    return RaggedKV(kq, vq, ks, vs, table, torch.tensor(lens, dtype=torch.int32, device=dev))
