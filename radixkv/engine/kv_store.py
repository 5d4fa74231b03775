"""KVStore: the paged K/V tensors of every layer, in fp32/bf16/fp16, FP8 with scales, or INT4/INT2 with
group scales and zeros.

Layout per layer: k_cache[l], v_cache[l] are [num_pages, page_size, Hkv, D].

FP8 scale granularity: one float16 scale per token per KV head, k_scale[l] and v_scale[l]
of shape [num_pages, page_size, Hkv] (a stored row means `fp8 * scale`). Chosen because it
needs no calibration and a page is written once and then read by every request sharing it
through the prefix tree, so its scales never go stale. The row is quantised by the scale as
stored (amax / fp8_max rounded to float16), so the 16-bit scale costs no accuracy; rows whose
amax is below 2^-14 * fp8_max (0.027 for e4m3, 3.5 for e5m2) get float16's smallest normal
scale, 2^-14, and keep full relative precision for values above 2^-20 (e4m3) / 2^-28 (e5m2);
scales stop at float16's 65504, so rows beyond 65504 * fp8_max saturate.
Cost: 2 bytes per D-element row, 1.6% of an FP8 page at D = 128 (float32 scales take 4 and made
FP8 decode slower; figures in benchmarks/RESULTS.md).
INT4/INT2 (radixkv/kernels/intq.py): pages are uint8 [num_pages, page_size, Hkv, D * bits / 8] of
packed codes, and k_scale[l], v_scale[l] float16 [num_pages, page_size, Hkv, G, 2] hold each group's
(scale, zero), G = plan.kv_int_groups (int4: groups of 16 values up to head_dim 64, 64 above; int2: 32).
Per-token groups, like FP8's per-token scales, are written once with their page and never go stale.
Both are head-major like FP8's. Memory: plan.kv_row_bytes, scales and zeros included.
Float stores have no scale tensors (empty lists).
FP8 pages and scales are stored head-major (memory order [num_pages, Hkv, page_size, ...], shapes
as above, strides permuted): a head's rows of a page are one contiguous run (2 KB at page 16,
D 128), which the FP8 decode kernel reads faster than rows of 128 bytes 1 KB apart (benchmarks/RESULTS.md),
and its scales one 32-byte run. INT pages and (scale, zero) pairs too; 16/32-bit pages are contiguous.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from radixkv import plan
from radixkv.config import ENGINE_POOL_TOKENS_PER_ROW, EngineConfig, KVDtype
from radixkv.plan_host import HOST_STAGING_BYTES

from .model_config import ModelSpec


_TORCH = {
    KVDtype.FP32: torch.float32,
    KVDtype.BF16: torch.bfloat16,
    KVDtype.FP16: torch.float16,
    KVDtype.FP8_E4M3: torch.float8_e4m3fn,
    KVDtype.FP8_E5M2: torch.float8_e5m2,
    KVDtype.INT4: torch.uint8,  # packed codes
    KVDtype.INT2: torch.uint8,
}

SCALE_DTYPE = torch.float16  # FP8 scales (the kernels also take float32 ones); INT (scale, zero) pairs


def head_major_scales(cache_shape: tuple[int, ...], device: torch.device) -> Tensor:
    """Ones of shape [P, S, Hkv] (cache_shape[:3]) laid out as [P, Hkv, S] in memory."""
    num_pages, page_size, hkv = cache_shape[:3]
    return torch.ones(num_pages, hkv, page_size, dtype=SCALE_DTYPE, device=device).transpose(1, 2)


def head_major_pages(cache_shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> Tensor:
    """Zeros of shape [P, S, Hkv, D] laid out as [P, Hkv, S, D] in memory."""
    num_pages, page_size, hkv, d = cache_shape
    return torch.zeros(num_pages, hkv, page_size, d, dtype=dtype, device=device).transpose(1, 2)


def head_major_int_scales(cache_shape: tuple[int, ...], groups: int, device: torch.device) -> Tensor:
    """INT4/INT2 (scale, zero) pairs of shape [P, S, Hkv, groups, 2] (cache_shape[:3] + ...) laid out as
    [P, Hkv, S, groups, 2] in memory; scale 1, zero 0."""
    num_pages, page_size, hkv = cache_shape[:3]
    pairs = torch.zeros(num_pages, hkv, page_size, groups, 2, dtype=SCALE_DTYPE, device=device)
    pairs[..., 0] = 1.0
    return pairs.transpose(1, 2)


class KVStore:
    """Per-layer K/V pages (+ FP8 scales or INT (scale, zero) pairs) on one device.

    compute_dtype: dtype of q and of attention outputs (the model's activations).
    """

    def __init__(self, num_layers: int, num_pages: int, page_size: int, num_kv_heads: int, head_dim: int,
                 kv_dtype: "str | KVDtype", device: "torch.device | str", compute_dtype: torch.dtype = torch.float32):
        for name, val in (("num_layers", num_layers), ("num_pages", num_pages), ("page_size", page_size),
                          ("num_kv_heads", num_kv_heads), ("head_dim", head_dim)):
            if not isinstance(val, int) or val < 1:
                raise ValueError(f"KVStore: {name} must be a positive int, got {val!r}")
        self.kv_dtype = KVDtype.parse(kv_dtype)
        self.num_layers = num_layers
        self.num_pages = num_pages
        self.page_size = page_size
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.device = torch.device(device)
        self.compute_dtype = compute_dtype
        kd = self.kv_dtype
        if kd.is_int and not plan.kv_dtype_fits(head_dim, kd):
            raise ValueError(f"KVStore: {kd.value} pages need head_dim a multiple of {8 // kd.bits}, got {head_dim}")
        width = head_dim * kd.bits // 8 if kd.is_int else head_dim  # bytes (INT) or values a row
        shape = (num_pages, page_size, num_kv_heads, width)
        dt = _TORCH[kd]
        if kd.is_fp8 or kd.is_int:
            caches = [head_major_pages(shape, dt, self.device) for _ in range(2 * num_layers)]
        else:
            caches = [torch.zeros(shape, dtype=dt, device=self.device) for _ in range(2 * num_layers)]
        self.k_cache: list[Tensor] = caches[:num_layers]
        self.v_cache: list[Tensor] = caches[num_layers:]
        self.k_scale: list[Tensor] = []
        self.v_scale: list[Tensor] = []
        if kd.is_fp8:
            self.k_scale = [head_major_scales(shape, self.device) for _ in range(num_layers)]
            self.v_scale = [head_major_scales(shape, self.device) for _ in range(num_layers)]
        elif kd.is_int:
            groups = plan.kv_int_groups(head_dim, kd)
            self.k_scale = [head_major_int_scales(shape, groups, self.device) for _ in range(num_layers)]
            self.v_scale = [head_major_int_scales(shape, groups, self.device) for _ in range(num_layers)]

    def scales(self, layer: int) -> tuple[Tensor | None, Tensor | None]:
        """(k_scale, v_scale) of a layer: FP8 [P, S, Hkv] scales, INT4/INT2 [P, S, Hkv, G, 2] (scale, zero)
        pairs, or (None, None) for a float store."""
        if not self.k_scale:
            return None, None
        return self.k_scale[layer], self.v_scale[layer]

    @property
    def total_bytes(self) -> int:
        return self.num_pages * self.bytes_per_page(self.page_size, self.num_layers, self.num_kv_heads,
                                                     self.head_dim, self.kv_dtype)

    @staticmethod
    def bytes_per_page(page_size: int, num_layers: int, num_kv_heads: int, head_dim: int,
                       kv_dtype: "str | KVDtype") -> int:
        """Bytes one page costs over all layers, K and V, FP8 scales and INT scales and zeros included
        (radixkv/plan.py)."""
        assert SCALE_DTYPE.itemsize == plan.FP8_SCALE_BYTES and 2 * SCALE_DTYPE.itemsize == plan.INT_GROUP_BYTES
        return plan.kv_bytes_per_page(page_size, num_layers, num_kv_heads, head_dim, kv_dtype)

    @staticmethod
    def pages_for_budget(budget_bytes: int, page_size: int, num_layers: int, num_kv_heads: int, head_dim: int,
                         kv_dtype: "str | KVDtype") -> int:
        """How many whole pages fit in budget_bytes (0 if not even one)."""
        return plan.pages_in_budget(budget_bytes, KVStore.bytes_per_page(page_size, num_layers, num_kv_heads,
                                                                         head_dim, kv_dtype))


# CPU pools without an explicit num_pages: room for this many tokens, capped at this many bytes.
_CPU_DEFAULT_TOKENS = 65536
_CPU_DEFAULT_BYTES = 1 << 30


class PoolSize(NamedTuple):
    """What default_num_pages decided: the KV pages, and how many running rows a recent-token window holds
    shadow pages for (the scheduler's max_running when there is no window)."""

    pages: int
    window_rows: int


def default_num_pages(spec: ModelSpec, cfg: EngineConfig, kv: KVDtype, dtype: torch.dtype,
                      device: torch.device) -> PoolSize:
    """KV pages when `num_pages` is not given: on CUDA, `gpu_memory_utilization` of the device memory
    free after the weights, less a step's activations and logits, the CUDA graphs' memory and the
    recent-token window's shadow pages for the rows the pool can hold (plan.kv_pool_split: rows of
    max_model_len tokens when the user gave one, else ENGINE_POOL_TOKENS_PER_ROW); elsewhere a fixed token
    budget."""
    ps, sched = cfg.page_size, cfg.scheduler
    per_page = KVStore.bytes_per_page(ps, spec.num_layers, spec.num_kv_heads, spec.head_dim, kv)
    if device.type != "cuda":
        return PoolSize(max(1, min(-(-_CPU_DEFAULT_TOKENS // ps), _CPU_DEFAULT_BYTES // per_page)), sched.max_running)
    torch.cuda.empty_cache()  # blocks freed while loading weights count as used otherwise
    free, _ = torch.cuda.mem_get_info(device)
    itemsize = torch.empty((), dtype=dtype).element_size()
    # (the reference backend captures no graphs: a small over-reserve there)
    reserve = plan.engine_reserve_bytes(spec.hidden_size, spec.intermediate_size, spec.vocab_size,
                                        sched.max_batch_tokens, sched.max_running, itemsize, not cfg.enforce_eager)
    if cfg.host_kv_cache_bytes or cfg.hicache_ratio:
        reserve += HOST_STAGING_BYTES  # the host tier's device staging buffer (engine/host_kv.py)
    window = plan.kv_window_for(kv, cfg.kv_window)
    budget = plan.kv_budget_bytes(free, cfg.gpu_memory_utilization, reserve)
    row_tokens = min(cfg.max_model_len, spec.max_position) if cfg.max_model_len else ENGINE_POOL_TOKENS_PER_ROW
    pages, rows = plan.kv_pool_split(budget, per_page, window, ps, sched.max_running, row_tokens, spec.num_layers,
                                     spec.num_kv_heads, spec.head_dim, itemsize,
                                     plan.kv_sink_for(kv, window, ps, cfg.kv_sink))
    if pages < 1 or rows < 1:
        raise RuntimeError(f"no device memory left for KV pages ({free / 2**30:.1f} GiB free after weights)")
    return PoolSize(pages, rows)
