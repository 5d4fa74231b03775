"""PagedAttention: the model's attention front over a KVStore. Plan once per step, run per layer.

Lifetime: `plan(batch)` converts the scheduler's Batch (host lists) into device tensors and
picks the path (decode when every row has q_len 1, else prefill) and asks radixkv.kernels.dispatch
for the split-KV count (by the kernel that will run).
`run(q, k, v, layer)` then stores the new K/V into the layer's pages and attends (`store`, then
`attend`: the piecewise CUDA graphs capture the store and call attend between their pieces); it reads
only tensors built by `plan`, so it does no host sync (CUDA-graph friendly on the Triton path).

Mixed steps (decode rows and prefill chunks) on the Triton kernels: the step's leading rows of one new
token each (the scheduler puts running decode rows first) run paged_decode, with the split count
dispatch chooses for them, and only the other rows paged_prefill (MixedSplit); a prefill tile per
decode row would compute BLOCK_M query rows for one. Rows of one token after a longer row stay with
paged_prefill (same result, slower).

Cascade steps (LLM(cascade=True)): a decode-only Batch whose `cascade` the scheduler filled is planned
as a kernels.cascade_plan.CascadePlan (one level: Batch.cascade.plan_groups()), and run attends through
cascade_decode (reference_attention.cascade_decode_ref on the reference backend): each group's shared
prefix once, each row's own pages, merged. Two levels (an outer group over inner ones: a system prompt
over few-shot blocks) when Batch.cascade has them and cascade_groups.outer_level_pays(levels, self.cascade_outer_rule).
On CUDA such steps usually replay a graph instead (cuda_graphs.py, its static plan from cascade_inputs.py,
always one level: a two-level step that fits a graph replays its one level); this eager plan serves the
rest. Planning one (kernels.cascade_plan) imports no Triton; running one through the Triton kernels does.

Recent-token window (PagedAttention(window=KVWindow), LLM(kv_window=N)): each query reads its N most
recent keys in full precision from the window's shadow pages (kv_window.py, kernels/window.py) and
only older keys from the (quantised) pages: the page attention runs on shifted rows (WindowPlan) and
returns its state, merged with the window's; with a sink, every sequence's first tokens are the window's
too and the page attention starts after them. No cascade steps then.
"""
from __future__ import annotations

import enum
from typing import TYPE_CHECKING, NamedTuple

import numpy as np
import torch
from torch import Tensor

from radixkv.batch import Batch
from radixkv.kernels import dispatch, reference_attention
from radixkv.kernels.cascade_plan import CascadePlan, plan_cascade
from radixkv.scheduler.cascade_groups import OUTER_RULE, CascadeRule, outer_level_pays

from .device import host_to_device
from .kv_store import KVStore
from .page_copies import distinct_pages

if TYPE_CHECKING:
    from radixkv.kernels.dequant_pages import PageCopies
    from radixkv.kernels.launch import LayerLaunch

    from .kv_window import KVWindow


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
    page_table: Tensor  # int32 [B, W]: W >= max pages of a row, a multiple of 16 (plan)
    seq_lens: Tensor  # int32 [B]
    q_start: Tensor  # int32 [B]
    q_lens: Tensor  # int32 [B]
    slots: Tensor  # int64 [T]
    num_tokens: int  # T
    max_q_len: int
    max_seq_len: int
    num_splits: int  # split-KV programs per (row, KV head) on the decode path
    cascade: CascadePlan | None = None  # decode path: groups [G], suffix tables [B, max_suffix_pages]
    window: WindowPlan | None = None  # with a KVWindow: the rows of the page attention
    split: MixedSplit | None = None  # prefill path on the Triton kernels: its leading decode rows apart
    copies: PageCopies | None = None  # prefill path over FP8 / INT4 pages: the prefill launch's distinct pages


class MixedSplit(NamedTuple):
    """A mixed step's attention in two launches (module docstring): its leading rows of one new token each
    (decode rows; rows 0..rows-1, tokens 0..rows-1) through paged_decode with the plan's num_splits, the
    other rows through paged_prefill (their q_start still index the step's tokens). Views of the plan's
    upload, each 16-byte aligned."""

    rows: int  # D
    page_table: Tensor  # int32 [D, W]
    seq_lens: Tensor  # int32 [D]
    rest_page_table: Tensor  # int32 [B - D, W]
    rest_seq_lens: Tensor  # int32 [B - D]
    rest_q_start: Tensor  # int32 [B - D]
    rest_q_lens: Tensor  # int32 [B - D]


def leading_decode_rows(q_lens: list[int]) -> int:
    """How many of a step's first rows have one new token each (the rows MixedSplit sends to paged_decode)."""
    n = 0
    for q in q_lens:
        if q != 1:
            break
        n += 1
    return n


class WindowPlan(NamedTuple):
    """With a recent-token window of W keys and a sink of S (a multiple of the page size), each query's
    page attention covers keys S .. t - W: the page table from page S / page_size on, and row b's rows
    shifted so paged_prefill's causal rule says so (its first `skip` queries, t < S + W, see no page key)."""

    token_rows: Tensor  # int32 [T] the Batch row of each token
    page_table: Tensor  # int32 [B, >= 1] the step's table from the sink's end on
    seq_lens: Tensor  # int32 [B] max(0, seq_lens - S - W)
    q_start: Tensor  # int32 [B] q_start + skip
    q_lens: Tensor  # int32 [B] q_lens - skip, skip = clamp(S + W - (seq_lens - q_lens), 0, q_lens)


def window_plan(page_table: Tensor, seq_lens: Tensor, q_start: Tensor, q_lens: Tensor, token_rows: Tensor,
                window: int, sink: int = 0, page_size: int = 1) -> WindowPlan:
    """WindowPlan from a step's row tensors (device ops only: a CUDA graph records them)."""
    skip = torch.clamp(sink + window - (seq_lens - q_lens), min=0)
    skip = torch.minimum(skip, q_lens)
    # a table no wider than the sink: every row ends inside it, so no row reads a page key
    table = page_table[:, min(sink // page_size, page_table.shape[1] - 1):].contiguous()  # once, not per layer
    return WindowPlan(token_rows, table, torch.clamp(seq_lens - sink - window, min=0), q_start + skip,
                      q_lens - skip)


def _round4(n: int) -> int:
    return -(-n // 4) * 4


def _resolve(backend: Backend, device: torch.device) -> Backend:
    if not isinstance(backend, Backend):
        raise TypeError(f"backend must be a Backend, got {backend!r}")
    if backend is Backend.AUTO:
        return Backend.TRITON if device.type == "cuda" else Backend.REFERENCE
    return backend


class PagedAttention:
    """Attention of one model over `kv` (all layers). sm_scale multiplies q.k (usually D ** -0.5)."""

    def __init__(self, kv: KVStore, num_q_heads: int, head_dim: int, sm_scale: float, backend: Backend = Backend.AUTO,
                 window: KVWindow | None = None):
        if window is not None and window.kv is not kv:
            raise ValueError("PagedAttention: the KVWindow belongs to another KVStore")
        if head_dim != kv.head_dim:
            raise ValueError(f"head_dim {head_dim} != KVStore head_dim {kv.head_dim}")
        if num_q_heads < 1 or num_q_heads % kv.num_kv_heads != 0:
            raise ValueError(f"num_q_heads {num_q_heads} must be a positive multiple of num_kv_heads {kv.num_kv_heads}")
        self.kv = kv
        self.num_q_heads = num_q_heads
        self.head_dim = head_dim
        self.sm_scale = float(sm_scale)
        self.backend = _resolve(backend, kv.device)
        self.window = window
        self._plan: AttentionPlan | None = None
        self._launches: dict[tuple, LayerLaunch] = {}  # the plan's attention launches (attend), by q / out
        self._num_sms = dispatch.DEFAULT_NUM_SMS
        self._decode_warps_per_sm = 0  # > 0: decode runs one-warp Gluon programs (FP8, INT4), this many per SM
        if self.backend is Backend.TRITON:
            from radixkv import kernels  # imports Triton only when it is used

            self._ops = kernels
            self._num_sms = dispatch.sm_count(kv.device)
            k_scale, _ = kv.scales(0)  # every layer has the same layout
            self._decode_warps_per_sm = dispatch.decode_warps_per_sm(
                kv.compute_dtype, kv.k_cache[0], kv.v_cache[0], k_scale, num_q_heads // kv.num_kv_heads,
                head_dim)
        else:
            self._ops = None
        self.cascade_steps = 0  # steps planned as cascade decode (for tests and benchmarks)
        self.two_level_steps = 0  # of which eager steps on two levels
        self.cascade_outer_rule: CascadeRule = OUTER_RULE  # when a step's outer level runs (outer_level_pays)
        self.split_mixed = True  # MixedSplit on the Triton kernels (False: every row of a mixed step in paged_prefill)
        # memory an extend or a cascade prefix may take for fp16 copies of FP8 / INT4 pages (dequant_pages.py);
        # the runner sets what its step reserve holds free during attention, None: the kernels' default
        self.widen_max_bytes: int | None = None

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
        decode = batch.is_decode_only
        # a mixed step on the Triton kernels: its leading decode rows through paged_decode (one query row a
        # program, the GQA group in one dot) instead of a prefill tile each
        D = (leading_decode_rows(batch.q_lens) if not decode and self.split_mixed and self._ops is not None
             and self.window is None else 0)
        # one int32 upload: page_table [B, W] (unused entries page 0), seq_lens, q_start, q_lens [B] and, for a
        # split step, its other rows' seq_lens, q_start, q_lens [B - D]. Every part, and every page-table row,
        # starts 16-byte aligned and W is a multiple of 16, so the kernels see one pointer and stride
        # specialisation whatever the step's shape (none compiles mid-run: the warm-up covered it)
        W = -(-max(1, max(len(p) for p in batch.page_tables)) // 16) * 16
        table = np.zeros((B, W), dtype=np.int32)
        for b, p in enumerate(batch.page_tables):
            table[b, :len(p)] = p
        if table.min() < 0 or table.max() >= self.kv.num_pages:
            bad = next(p for p in batch.page_tables if p and (min(p) < 0 or max(p) >= self.kv.num_pages))
            raise ValueError(f"page id out of range [0, {self.kv.num_pages}) in page table {bad}")
        kd = self.kv.kv_dtype
        # an extend over FP8 / INT4 pages may widen them to fp16 copies: each distinct page of its rows once
        distinct = (distinct_pages(table[D:], batch.seq_lens[D:], self.kv.page_size, self.kv.num_pages)
                    if not decode and self._ops is not None and self.window is None and (kd.is_fp8 or kd.bits == 4)
                    and dispatch.extend_copies_wanted(self.kv.device, self.head_dim, max(batch.q_lens[D:]))
                    else None)
        sizes = ([B * W, B, B, B] + ([B - D] * 3 if D else [])
                 + ([len(distinct.pages), (B - D) * W] if distinct is not None else []))
        cut = [0]
        for n in sizes:
            cut.append(cut[-1] + _round4(n))
        ints = np.zeros(cut[-1], dtype=np.int32)
        ints[:B * W] = table.ravel()
        for k, values in enumerate((batch.seq_lens, batch.q_start, batch.q_lens), 1):
            ints[cut[k]:cut[k] + B] = values
            if D:
                ints[cut[k + 3]:cut[k + 3] + B - D] = values[D:]
        if distinct is not None:
            ints[cut[-3]:cut[-3] + len(distinct.pages)] = distinct.pages
            ints[cut[-2]:cut[-2] + (B - D) * W] = distinct.table.ravel()
        dev = self.kv.device
        max_seq = max(batch.seq_lens)
        cascade = (self._cascade_plan(batch) if decode and batch.cascade is not None and self.window is None
                   else None)
        num_splits = (self.decode_splits(B, max_seq) if decode
                      else self.decode_splits(D, max(batch.seq_lens[:D])) if D else 1)
        ints_dev = host_to_device(ints, torch.int32, dev)
        part = [ints_dev[lo:lo + n] for lo, n in zip(cut, sizes)]
        plan = AttentionPlan(
            path=Path.DECODE if decode else Path.PREFILL,
            page_table=part[0].view(B, W),
            seq_lens=part[1],
            q_start=part[2],
            q_lens=part[3],
            slots=host_to_device(batch.slots, torch.int64, dev),
            num_tokens=len(batch.slots),
            max_q_len=max(batch.q_lens),
            max_seq_len=max_seq,
            num_splits=num_splits,
            cascade=cascade,
        )
        if D:
            plan = plan._replace(split=MixedSplit(D, plan.page_table[:D], plan.seq_lens[:D], plan.page_table[D:],
                                                  *part[4:7]))
        if distinct is not None:
            from radixkv.kernels.dequant_pages import PageCopies

            plan = plan._replace(copies=PageCopies(part[-2], part[-1].view(B - D, W), distinct.reads))
        if self.window is not None:
            self.window.prepare(batch)
            rows = np.repeat(np.arange(B, dtype=np.int32), batch.q_lens)
            plan = plan._replace(window=self._window_plan(plan, host_to_device(rows, torch.int32, dev)))
        self._plan = plan
        self._launches = {}

    def prepare_window(self, batch: Batch) -> None:
        """Map the window's shadow pages for a step that runs from a CUDA graph (plan() does it otherwise)."""
        if self.window is not None:
            self.window.prepare(batch)

    def _cascade_plan(self, batch: Batch) -> CascadePlan | None:
        """Batch.cascade's one level as device tensors: groups (rows, shared tokens) -> group_start [G + 1],
        group_rows [R], prefix_pages [G, max_prefix_pages], prefix_lens [G]; suffix_pages [B, max_suffix_pages],
        suffix_lens [B]; and its outer level (CascadePlan.outer, the same layout) when it pays. None (plain
        decode) for integer pages, which the cascade kernels do not read."""
        groups = batch.cascade.plan_groups()
        if not groups or self.kv.kv_dtype.is_int:
            return None
        outer = batch.cascade.plan_outer() if outer_level_pays(batch.cascade, self.cascade_outer_rule) else []
        self.cascade_steps += 1
        self.two_level_steps += bool(outer)
        return plan_cascade(batch.page_tables, batch.seq_lens, groups, self.kv.page_size, self.kv.device,
                            outer=outer)

    def decode_splits(self, batch_size: int, max_seq_len: int) -> int:
        """Split-KV programs per (row, KV head) of a decode step, as radixkv.kernels.dispatch chooses."""
        return dispatch.choose_num_splits(batch_size, self.kv.num_kv_heads, max_seq_len, self._num_sms,
                                          warps_per_sm=self._decode_warps_per_sm)

    def install(self, plan: AttentionPlan) -> None:
        """Run the next layers over a plan built elsewhere (the CUDA-graph runner's static buffers: a decode
        plan, whose WindowPlan is derived here with device ops when there is a window)."""
        if self.window is not None and plan.window is None:
            plan = plan._replace(window=self._window_plan(plan, plan.q_start))
        self._plan = plan
        self._launches = {}

    def _window_plan(self, plan: AttentionPlan, token_rows: Tensor) -> WindowPlan:
        win = self.window
        return window_plan(plan.page_table, plan.seq_lens, plan.q_start, plan.q_lens, token_rows, win.window,
                           win.sink, self.kv.page_size)

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
        if plan.window is not None:
            return self._run_windowed(plan, q, k, v, layer)
        self.store(k, v, layer, plan.slots)
        return self.attend(q, layer)

    def store_target(self, layer: int) -> tuple[Tensor, Tensor, Tensor] | None:
        """(k_cache, v_cache, slots) for a projection kernel that writes this step's K/V itself (the fused
        decode qkv kernel), after which `attend` runs; None where `run` must store: the reference ops, a
        recent-token window, or pages not in the activations' dtype (FP8 and INT pages are written with their
        scales, 16-bit pages of the other 16-bit dtype converted)."""
        plan = self.current_plan
        k_cache = self.kv.k_cache[layer]
        if self._ops is None or plan.window is not None or k_cache.dtype != self.kv.compute_dtype:
            return None
        return k_cache, self.kv.v_cache[layer], plan.slots

    @property
    def decode_only(self) -> bool:
        """Whether the planned step is decode-only (one new token a row): the steps the CUDA graphs replay."""
        return self.current_plan.path is Path.DECODE

    def store(self, k: Tensor, v: Tensor, layer: int, slots: Tensor) -> None:
        """Store the new tokens' K/V (k/v: [T', Hkv, D]) into layer's pages at slots (int64 [T']). The
        piecewise CUDA graphs (piecewise_graphs.py) capture this with their static slots."""
        kv = self.kv
        k_cache, v_cache = kv.k_cache[layer], kv.v_cache[layer]
        k_scale, v_scale = kv.scales(layer)
        if self._ops is None:
            reference_attention.store_kv_ref(k, v, k_cache, v_cache, slots, k_scale=k_scale, v_scale=v_scale)
        else:
            self._ops.store_kv(k, v, k_cache, v_cache, slots, k_scale=k_scale, v_scale=v_scale)

    def attend(self, q: Tensor, layer: int, out: Tensor | None = None) -> Tensor:
        """Attention of the planned step's queries q [T, Hq, D] over layer's pages (its new K/V already
        stored) -> [T, Hq, D] in q's dtype; `out` (like q), when given, is written and returned (on the
        Triton kernels; the reference copies into it). Not for a plan with a window (run does that)."""
        plan = self.current_plan
        kv = self.kv
        k_cache, v_cache = kv.k_cache[layer], kv.v_cache[layer]
        k_scale, v_scale = kv.scales(layer)
        if self._ops is None:
            if plan.cascade is not None:
                o = reference_attention.cascade_decode_ref(q, k_cache, v_cache, plan.cascade, self.sm_scale,
                                                           k_scale=k_scale, v_scale=v_scale)
            elif plan.path is Path.DECODE:
                o = reference_attention.paged_decode_ref(q, k_cache, v_cache, plan.page_table, plan.seq_lens,
                                                         self.sm_scale, k_scale=k_scale, v_scale=v_scale)
            else:
                o = reference_attention.paged_prefill_ref(q, k_cache, v_cache, plan.page_table, plan.seq_lens,
                                                          plan.q_start, plan.q_lens, self.sm_scale,
                                                          k_scale=k_scale, v_scale=v_scale)
            return o if out is None else out.copy_(o)
        if plan.cascade is not None:
            from radixkv.kernels.cascade import cascade_decode

            o = cascade_decode(q, k_cache, v_cache, plan.cascade, self.sm_scale, k_scale=k_scale, v_scale=v_scale,
                               widen_max_bytes=self.widen_max_bytes)
            return o if out is None else out.copy_(o)
        # the step's launch, checked once and reused by every layer (q and out alike, the same cache layout):
        # what a mixed step's eager attention costs the host between its graph pieces. Bound to `out` when one
        # is given (the graphs' static buffers); without, each call gets a new output
        key = (q.shape, q.stride(), None if out is None else id(out))
        launch = self._launches.get(key)
        if launch is None:
            launch = self._launches[key] = self._launcher(plan, q, out, k_cache, v_cache, k_scale, v_scale)
        return launch(q, k_cache, v_cache, k_scale, v_scale)

    def _launcher(self, plan: AttentionPlan, q: Tensor, out: Tensor | None, k_cache: Tensor, v_cache: Tensor,
                  k_scale: Tensor | None, v_scale: Tensor | None) -> LayerLaunch:
        """The Triton kernels' launch of this plan's attention for tensors like q, out and one layer's caches
        (kernels.decode_launcher / prefill_launcher; a mixed step's split runs both); bound to out when given."""
        ops = self._ops
        if plan.path is Path.DECODE:
            return ops.decode_launcher(q, k_cache, v_cache, plan.page_table, plan.seq_lens, self.sm_scale,
                                       k_scale, v_scale, num_splits=plan.num_splits, out=out)
        sp = plan.split
        if sp is None:
            return ops.prefill_launcher(q, k_cache, v_cache, plan.page_table, plan.seq_lens, plan.q_start,
                                        plan.q_lens, self.sm_scale, k_scale, v_scale, max_q_len=plan.max_q_len,
                                        out=out, widen_max_bytes=self.widen_max_bytes, copies=plan.copies)
        D = sp.rows
        decode = ops.decode_launcher(q[:D], k_cache, v_cache, sp.page_table, sp.seq_lens, self.sm_scale, k_scale,
                                     v_scale, num_splits=plan.num_splits)
        rest = ops.prefill_launcher(q, k_cache, v_cache, sp.rest_page_table, sp.rest_seq_lens, sp.rest_q_start,
                                    sp.rest_q_lens, self.sm_scale, k_scale, v_scale, max_q_len=plan.max_q_len,
                                    widen_max_bytes=self.widen_max_bytes, copies=plan.copies)
        given = out

        def launch(q: Tensor, k_cache: Tensor, v_cache: Tensor, k_scale: Tensor | None,
                   v_scale: Tensor | None) -> Tensor:
            out = torch.empty_like(q) if given is None else given
            decode(q[:D], k_cache, v_cache, k_scale, v_scale, out[:D])
            return rest(q, k_cache, v_cache, k_scale, v_scale, out)
        return launch

    def _run_windowed(self, plan: AttentionPlan, q: Tensor, k: Tensor, v: Tensor, layer: int) -> Tensor:
        """Store, then attend: the window's state (its own keys in full precision, kernels/window.py) merged
        with the page attention's over each query's older keys (plan.window's shifted rows)."""
        kv, win, wp = self.kv, self.window, plan.window
        k_cache, v_cache = kv.k_cache[layer], kv.v_cache[layer]
        k_scale, v_scale = kv.scales(layer)
        shadow_k, shadow_v = win.layer(layer)
        decode = plan.path is Path.DECODE
        args = (q, k, v, shadow_k, shadow_v, win.shadow_of, plan.page_table, plan.seq_lens, plan.q_start,
                plan.q_lens, wp.token_rows, win.window, self.sm_scale, win.sink)
        if self._ops is None:
            reference_attention.store_kv_ref(k, v, k_cache, v_cache, plan.slots, k_scale=k_scale, v_scale=v_scale)
            o_w, lse_w = reference_attention.window_attention_ref(*args)
            if decode:
                o_p, lse_p = reference_attention.paged_decode_partial_ref(q, k_cache, v_cache, wp.page_table,
                                                                          wp.seq_lens, self.sm_scale, k_scale, v_scale)
            else:
                o_p, lse_p = reference_attention.paged_prefill_ref(q, k_cache, v_cache, wp.page_table, wp.seq_lens,
                                                                   wp.q_start, wp.q_lens, self.sm_scale, k_scale,
                                                                   v_scale, return_lse=True)
            return reference_attention.merge_attention_states_ref(o_p, lse_p, o_w, lse_w, out_dtype=q.dtype)
        from radixkv.kernels.cascade import merge_attention_states, paged_decode_partial
        from radixkv.kernels.window import window_attention

        self._ops.store_kv(k, v, k_cache, v_cache, plan.slots, k_scale=k_scale, v_scale=v_scale)
        o_w, lse_w = window_attention(*args)
        if decode:
            o_p, lse_p = paged_decode_partial(q, k_cache, v_cache, wp.page_table, wp.seq_lens, self.sm_scale,
                                              k_scale, v_scale, num_splits=plan.num_splits)
        else:
            o_p = torch.empty_like(q)
            lse_p = torch.full(q.shape[:2], float("-inf"), dtype=torch.float32, device=q.device)
            self._ops.paged_prefill(q, k_cache, v_cache, wp.page_table, wp.seq_lens, wp.q_start, wp.q_lens,
                                    self.sm_scale, k_scale=k_scale, v_scale=v_scale, max_q_len=plan.max_q_len,
                                    out=o_p, lse=lse_p, widen_max_bytes=self.widen_max_bytes)
        return merge_attention_states(o_p, lse_p, o_w, lse_w, out_dtype=q.dtype)
