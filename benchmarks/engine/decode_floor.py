"""A decode step's floor, measured in the run that is compared with it: the machine's streaming-read rate
and dense bf16 GEMM rate, and what a step of an engine reads (weights, KV) and computes (matrix FLOPs).
bench_e2e_gpu.py's decode sweep sets each step against max(bytes / read rate, FLOPs / GEMM rate)."""
from __future__ import annotations

import time
from typing import Callable

import torch

from radixkv import LLM


def _best_seconds(fn: Callable[[], object], device: torch.device, reps: int) -> float:
    best = float("inf")
    for _ in range(reps):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t)
    return best


def read_bandwidth(device: torch.device, smoke: bool) -> float:
    """Streaming-read bandwidth in bytes/s: the best of several sums over a 4 GiB bf16 tensor."""
    n = (1 << 20) if smoke else (2 << 30)
    x = torch.ones(n, dtype=torch.bfloat16, device=device)
    return 2 * n / _best_seconds(lambda: x.sum(dtype=torch.float32), device, 3 if smoke else 10)


def dense_gemm_rate(device: torch.device, smoke: bool) -> float:
    """Dense bf16 GEMM rate in FLOP/s: the best of several 8192^3 products, the rate a compute-bound
    step's GEMMs could reach at best."""
    n = 256 if smoke else 8192
    a = torch.randn(n, n, dtype=torch.bfloat16, device=device)
    b = torch.randn(n, n, dtype=torch.bfloat16, device=device)
    return 2 * n ** 3 / _best_seconds(lambda: a @ b, device, 3 if smoke else 10)


def weight_bytes(llm: LLM) -> int:
    """Bytes a decode step reads of the weights: every layer, the final norm and the LM head."""
    m = llm.runner.model
    layer = sum(t.numel() * t.element_size() for L in m.layers for t in vars(L).values()
                if isinstance(t, torch.Tensor))
    return layer + m.norm.numel() * m.norm.element_size() + m.lm_head.numel() * m.lm_head.element_size()


def kv_bytes_per_token(llm: LLM) -> int:
    s = llm.runner.spec
    return llm.runner.kv.bytes_per_page(1, s.num_layers, s.num_kv_heads, s.head_dim, llm.runner.kv_dtype)


def step_flops(llm: LLM, rows: int, cached_tokens: float) -> float:
    """Matrix FLOPs of a decode step of `rows` rows reading `cached_tokens` tokens in all: 2 x every
    linear layer's weights (the LM head's too) a row, and attention's 4 x q heads x head_dim a cached
    token a layer."""
    s = llm.runner.spec
    return linear_flops(llm, rows) + 4 * s.num_layers * s.num_q_heads * s.head_dim * cached_tokens


def linear_flops(llm: LLM, rows: int) -> float:
    """Matrix FLOPs of a decode step's linear layers (the LM head's too) for `rows` rows."""
    m = llm.runner.model
    linear = sum(t.numel() for L in m.layers for t in vars(L).values() if isinstance(t, torch.Tensor) and t.dim() == 2)
    return 2 * (linear + m.lm_head.numel()) * rows
