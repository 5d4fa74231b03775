"""PagedAttention: the model's attention front over a KVStore. Plan once per step, run per layer.

Lifetime: `plan(batch)` converts the scheduler's Batch (host lists) into device tensors and
picks the path (decode when every row has q_len 1, else prefill) and the split-KV count.
`run(q, k, v, layer)` then stores the new K/V into the layer's pages and attends; it reads
only tensors built by `plan`, so it does no host sync (CUDA-graph friendly on the Triton path).
"""
from __future__ import annotations

import enum
from typing import NamedTuple

import torch
from torch import Tensor

from radixkv.batch import Batch
from radixkv.kernels import reference
from radixkv.kernels.launch import FP8_WIDE_PROGRAMS_PER_SM
from .kv_store import KVStore


class Backend(enum.Enum):
    AUTO = "auto"  # Triton on CUDA tensors, reference on CPU
    TRITON = "triton"
    REFERENCE = "reference"


class Path(enum.Enum):
    DECODE = "decode"  # every row has exactly one new token
    PREFILL = "prefill"  # ragged new tokens (prefill chunks, possibly mixed with decode rows)


class AttentionPlan(NamedTuple):
    """Device tensors for one step (built by PagedAttention.plan)."""

    path: Path
    page_table: Tensor  # int32 [B, max_pages]
    seq_lens: Tensor  # int32 [B]
    q_start: Tensor  # int32 [B]
    q_lens: Tensor  # int32 [B]
    slots: Tensor  # int64 [T]
    num_tokens: int  # T
    max_q_len: int
    max_seq_len: int
    num_splits: int  # split-KV programs per (row, KV head) on the decode path


def choose_num_splits(batch_size: int, num_kv_heads: int, max_seq_len: int, num_sms: int = 132,
                      min_tokens_per_split: int = 256, max_splits: int = 128, warps_per_sm: int = 0) -> int:
    """Flash-decoding split count for the decode kernel (one program per KV head, row and split).

    Triton kernel (warps_per_sm 0): with at least two programs per multiprocessor the rows already
    fill the GPU: no split (the merge would cost a launch). Below that, aim at about four programs
    per multiprocessor, each with at least `min_tokens_per_split` tokens. On the H200 this picks 66
    splits for 1 x 32k and 4 for 16 x 4k, the best of bench_kernels.py's sweep.
    warps_per_sm > 0: the programs are paged_decode_fp8's single warps, that many resident per
    multiprocessor (launch.fp8_decode_warps_per_sm). Their programs all take about as long, so
    the count is chosen by waves: the fewest splits whose ceil(programs / resident) / splits (the
    time in unsplit programs) is within 5% of the best. A last wave a quarter full costs nearly
    a whole one (64 x 16k at 12 per SM: 3 or 6 splits 538 us, 4 splits 687). From
    launch.FP8_WIDE_PROGRAMS_PER_SM programs per SM: no split (paged_decode_fp8 then runs 8 per SM).
    """
    programs = max(1, batch_size * num_kv_heads)
    cap = int(max(1, min(max_splits, max_seq_len // min_tokens_per_split)))
    if warps_per_sm > 0:
        if programs >= FP8_WIDE_PROGRAMS_PER_SM * num_sms:
            return 1  # paged_decode_fp8 runs such launches at 8 programs per SM: about two whole waves
        slots = warps_per_sm * num_sms
        cost = [-(-programs * s // slots) / s for s in range(1, cap + 1)]
        best = min(cost)
        return next(s for s, c in enumerate(cost, 1) if c <= best * 1.05)
    if programs >= 2 * num_sms:
        return 1
    return int(max(1, min(4 * num_sms // programs, cap)))


def _resolve(backend: Backend, device: torch.device) -> Backend:
    if not isinstance(backend, Backend):
        raise TypeError(f"backend must be a Backend, got {backend!r}")
    if backend is Backend.AUTO:
        return Backend.TRITON if device.type == "cuda" else Backend.REFERENCE
    return backend


class PagedAttention:
    """Attention of one model over `kv` (all layers). sm_scale multiplies q.k (usually D ** -0.5)."""

    def __init__(self, kv: KVStore, num_q_heads: int, head_dim: int, sm_scale: float, backend: Backend = Backend.AUTO):
        if head_dim != kv.head_dim:
            raise ValueError(f"head_dim {head_dim} != KVStore head_dim {kv.head_dim}")
        if num_q_heads < 1 or num_q_heads % kv.num_kv_heads != 0:
            raise ValueError(f"num_q_heads {num_q_heads} must be a positive multiple of num_kv_heads {kv.num_kv_heads}")
        self.kv = kv
        self.num_q_heads = num_q_heads
        self.head_dim = head_dim
        self.sm_scale = float(sm_scale)
        self.backend = _resolve(backend, kv.device)
        self._plan: AttentionPlan | None = None
        self._num_sms = 132
        self._fp8_warps_per_sm = 0  # FP8 decode runs paged_decode_fp8's one-warp programs, this many per SM
        if self.backend is Backend.TRITON:
            from radixkv import kernels  # imports Triton only when it is used
            from radixkv.kernels.launch import fp8_decode_kernel_supported, fp8_decode_warps_per_sm, fp8_offsets_64

            self._ops = kernels
            if kv.device.type == "cuda":
                self._num_sms = torch.cuda.get_device_properties(kv.device).multi_processor_count
                group = num_q_heads // kv.num_kv_heads
                # fp32 q, or shapes the Gluon kernel does not take: the Triton kernel and its split rule
                if (kv.kv_dtype.is_fp8 and kv.compute_dtype != torch.float32
                        and fp8_decode_kernel_supported(kv.device, head_dim, group)):
                    off64 = fp8_offsets_64(kv.k_cache[0], kv.k_scale[0])  # every layer has the same layout
                    self._fp8_warps_per_sm = fp8_decode_warps_per_sm(kv.device, head_dim, group, off64,
                                                                     kv.page_size)
        else:
            self._ops = None

    @property
    def current_plan(self) -> AttentionPlan:
        if self._plan is None:
            raise RuntimeError("PagedAttention.run called before plan(batch)")
        return self._plan

    def plan(self, batch: Batch) -> None:
        """Build this step's device tensors from the scheduler's Batch."""
        if batch.page_size != self.kv.page_size:
            raise ValueError(f"batch page_size {batch.page_size} != KVStore page_size {self.kv.page_size}")
        B = len(batch.seq_lens)
        if B == 0:
            raise ValueError("empty batch")
        max_pages = max(1, max(len(p) for p in batch.page_tables))
        table = [list(p) + [0] * (max_pages - len(p)) for p in batch.page_tables]
        for p in batch.page_tables:
            if p and (min(p) < 0 or max(p) >= self.kv.num_pages):
                raise ValueError(f"page id out of range [0, {self.kv.num_pages}) in page table {p}")
        dev = self.kv.device
        max_seq = max(batch.seq_lens)
        decode = batch.is_decode_only
        splits = (choose_num_splits(B, self.kv.num_kv_heads, max_seq, self._num_sms,
                                    warps_per_sm=self._fp8_warps_per_sm) if decode else 1)
        self._plan = AttentionPlan(
            path=Path.DECODE if decode else Path.PREFILL,
            page_table=torch.tensor(table, dtype=torch.int32, device=dev),
            seq_lens=torch.tensor(batch.seq_lens, dtype=torch.int32, device=dev),
            q_start=torch.tensor(batch.q_start, dtype=torch.int32, device=dev),
            q_lens=torch.tensor(batch.q_lens, dtype=torch.int32, device=dev),
            slots=torch.tensor(batch.slots, dtype=torch.int64, device=dev),
            num_tokens=len(batch.slots),
            max_q_len=max(batch.q_lens),
            max_seq_len=max_seq,
            num_splits=splits,
        )

    def run(self, q: Tensor, k: Tensor, v: Tensor, layer: int) -> Tensor:
        """q: [T, Hq, D], k/v: [T, Hkv, D] (new tokens, Batch row order) -> [T, Hq, D] in q's dtype."""
        plan = self.current_plan
        T = plan.num_tokens
        kv = self.kv
        if q.shape != (T, self.num_q_heads, self.head_dim):
            raise ValueError(f"q shape {tuple(q.shape)} != {(T, self.num_q_heads, self.head_dim)}")
        if k.shape != (T, kv.num_kv_heads, kv.head_dim) or v.shape != k.shape:
            raise ValueError(f"k/v shapes {tuple(k.shape)}/{tuple(v.shape)} != {(T, kv.num_kv_heads, kv.head_dim)}")
        if not 0 <= layer < kv.num_layers:
            raise ValueError(f"layer {layer} out of range [0, {kv.num_layers})")
        k_cache, v_cache = kv.k_cache[layer], kv.v_cache[layer]
        k_scale, v_scale = kv.scales(layer)
        if self._ops is None:
            reference.store_kv_ref(k, v, k_cache, v_cache, plan.slots, k_scale=k_scale, v_scale=v_scale)
            if plan.path is Path.DECODE:
                return reference.paged_decode_ref(q, k_cache, v_cache, plan.page_table, plan.seq_lens,
                                                  self.sm_scale, k_scale=k_scale, v_scale=v_scale)
            return reference.paged_prefill_ref(q, k_cache, v_cache, plan.page_table, plan.seq_lens,
                                               plan.q_start, plan.q_lens, self.sm_scale,
                                               k_scale=k_scale, v_scale=v_scale)
        ops = self._ops
        ops.store_kv(k, v, k_cache, v_cache, plan.slots, k_scale=k_scale, v_scale=v_scale)
        if plan.path is Path.DECODE:
            return ops.paged_decode(q, k_cache, v_cache, plan.page_table, plan.seq_lens, self.sm_scale,
                                    k_scale=k_scale, v_scale=v_scale, num_splits=plan.num_splits)
        return ops.paged_prefill(q, k_cache, v_cache, plan.page_table, plan.seq_lens, plan.q_start,
                                 plan.q_lens, self.sm_scale, k_scale=k_scale, v_scale=v_scale,
                                 max_q_len=plan.max_q_len)
