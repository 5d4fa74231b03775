"""What the kernels are measured against: the bandwidth ceilings measured in the same run
(device-to-device copy, a streaming-read Triton kernel) and the peers (SDPA on contiguous K/V,
gather-then-SDPA, FlashInfer's paged wrappers)."""
from __future__ import annotations

from typing import NamedTuple

import torch

from kernel_common import D, HKV, HQ, PAGE, REP_MS, WARMUP_MS, Pool, time_fn, time_rotated


class Ceilings(NamedTuple):
    copy_tbps: float  # device-to-device copy, read + write bytes, L2 flushed before each copy
    read_tbps: float  # streaming-read kernel over 4 GiB, L2 flushed (time_fn)
    read_rotated_tbps: float  # the same kernel over two 2 GiB halves in turn, no flush (time_rotated)


def ceilings(dev: torch.device, smoke: bool) -> Ceilings:
    """Bandwidth ceilings measured in this run, by both timing methods of kernel_common."""
    if smoke:
        return Ceilings(1.0, 1.0, 1.0)
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
    copy_us = do_bench(lambda: y.copy_(x), warmup=WARMUP_MS, rep=REP_MS, return_mode="median") * 1e3
    copy_tbps = 2 * x.numel() * 2 / copy_us / 1e6
    print(f"  torch copy_: {copy_tbps:.3f} TB/s (read + write)")
    del y
    configs = ((4096, 16, 8), (8192, 8, 8), (2048, 32, 4), (16384, 4, 16))  # BLOCK, ITERS, warps
    partial = torch.empty(triton.cdiv(n, min(b * i for b, i, _ in configs)), device=dev, dtype=torch.float32)

    def read(x, block, iters, warps):
        return lambda: _read_kernel[(triton.cdiv(x.numel(), block * iters),)](
            x, partial, x.numel(), BLOCK=block, ITERS=iters, num_warps=warps)

    best, best_cfg = 0.0, None
    for cfg in configs:
        tbps = x.numel() * 2 / time_fn(read(x, *cfg), False).us / 1e6
        print(f"  read kernel BLOCK={cfg[0]} ITERS={cfg[1]} warps={cfg[2]}: {tbps:.3f} TB/s")
        best, best_cfg = max((best, best_cfg), (tbps, cfg))
    half = x.numel() // 2
    rotated = half * 2 / time_rotated([read(x[:half], *best_cfg), read(x[half:], *best_cfg)]).us / 1e6
    print(f"  read kernel {best_cfg}, two 2 GiB halves in turn, no flush: {rotated:.3f} TB/s")
    del x, partial
    torch.cuda.empty_cache()
    return Ceilings(copy_tbps, best, rotated)


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
