"""DecodeGraphs: decode-only steps replayed from CUDA graphs, one per batch bucket and split count.

A decode step launches a few hundred small kernels (32 layers x norms, matmuls, RoPE, store,
attention); launched one by one from Python the GPU waits on the CPU between them. Captured once
in a CUDA graph, the whole forward is one launch.

Static inputs, one int32 device buffer filled by one host-to-device copy from a pinned twin:
    ids [R], positions [R], seq_lens [R], slots [R], page_table [R, W]
The pinned twin is double-buffered: with async scheduling the host fills step N+1's inputs while
step N's copy may still be queued; the buffer it writes was last copied two steps ago, before a step
whose tokens the host has read since. A step scheduled ahead (Batch.follows) takes its ids from the
previous step's sampled tokens with one device-to-device copy after the upload.
with R = the largest bucket (max_running rounded up) and W = pages of the longest sequence the
engine admits. A step of B rows runs the graph of the smallest bucket >= B; rows B.. of the
bucket are padding: token 0 at position 0 of a one-token sequence whose K/V go to the scratch
page (a page of the KVStore the pool never hands out), so they touch nothing real.

The decode kernel's split count is a launch parameter, frozen in a graph: graphs are keyed by
(bucket, splits) with the split count PagedAttention would choose rounded up to a power of two,
and captured on first use (an eager run of the same step first, so Triton has compiled and
the step's K/V are stored; storing them again on replay writes the same values).
Cascade steps (Batch.cascade, with cascade=True) read a static cascade plan too (cascade_inputs.py),
padded to a power-of-two bucket, and are keyed by (bucket, CascadeGraphKey(groups bucket, prefix splits,
suffix splits, prefix width: narrow where FP8 prefixes are widened to fp16 copies, widened_prefix_pages));
a step with more than MAX_GROUPS groups runs eagerly. Graphs are one level: a step whose
Batch.cascade has two levels replays its one level (CascadeLevels.plan_groups: exact, one launch fewer);
only eager steps run two (attention.py, when the outer level pays). warm_cascade, run at start-up
after capture_all, captures every such key a cascade rule lets a step reach (padding rows only: their
eager runs compile the cascade kernels' Triton specialisations, kernels/cascade.py), so no cascade step
of a workload compiles a kernel or captures a graph.
Graphs share one memory pool and run one at a time, and write their logits into one buffer [max_rows, V]
(a step's logits are read before the next step). Sampling runs after the graph, eagerly.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import Tensor

from radixkv.batch import Batch

from .attention import AttentionPlan, PagedAttention, Path
from .model import LlamaModel

if TYPE_CHECKING:  # the cascade modules import Triton: only an engine built with cascade=True loads them
    from .cascade_inputs import CascadeGraphKey, CascadeKey


def batch_buckets(max_rows: int) -> list[int]:
    """1, 2, 4, 8, then steps of 8 to 64, then of 16, up to max_rows (itself the last)."""
    out, b = [], 1
    while b < max_rows:
        out.append(b)
        b = b * 2 if b < 8 else b + (8 if b < 64 else 16)
    return out + [max_rows]


class DecodeGraphs:
    """Decode steps of up to `max_rows` rows of up to `max_pages` pages, replayed from CUDA graphs."""

    def __init__(self, model: LlamaModel, attention: PagedAttention, max_rows: int, max_pages: int,
                 scratch_page: int, cascade: bool = False) -> None:
        """cascade: also replay cascade steps (float KV pages only: the cascade kernels read no INT pages)."""
        kv = attention.kv
        if kv.device.type != "cuda":
            raise ValueError("CUDA graphs need a CUDA device")
        if not 0 <= scratch_page < kv.num_pages:
            raise ValueError(f"scratch page {scratch_page} outside the KVStore's {kv.num_pages} pages")
        self.model, self.attention = model, attention
        self.buckets = batch_buckets(max_rows)
        self.max_rows, self.max_pages = max_rows, max_pages
        self.scratch_page = scratch_page
        self.scratch_slot = scratch_page * kv.page_size  # where padding rows store their K/V
        R, W = max_rows, max_pages
        self._n = 4 * R + R * W
        self._hosts = [torch.zeros(self._n, dtype=torch.int32, pin_memory=True) for _ in range(2)]
        self._hosts_np = [h.numpy() for h in self._hosts]
        self._turn = 0  # which pinned buffer the next step fills
        self._dev = torch.zeros(self._n, dtype=torch.int32, device=kv.device)
        # Everything a graph reads must outlive it: these are sliced per bucket, never reallocated.
        self._rows = torch.arange(R, dtype=torch.int64, device=kv.device)  # sample index: every row
        self._q_start = torch.arange(R, dtype=torch.int32, device=kv.device)
        self._q_lens = torch.ones(R, dtype=torch.int32, device=kv.device)
        # every graph writes its logits into this one buffer, outside the graphs' pool: one output each would
        # keep sum(buckets) x V floats alive (~16 GiB at 1,024 rows and a 128k vocabulary; plan.graph_reserve_bytes)
        self._logits = torch.empty(R, model.vocab_rows, dtype=torch.float32, device=kv.device)
        self._graphs: dict[tuple, tuple[torch.cuda.CUDAGraph, Tensor]] = {}
        self._pool = torch.cuda.graph_pool_handle()
        self.replays = 0  # steps served from a graph (for tests and benchmarks)
        self.cascade_replays = 0  # of which cascade steps
        self._cascade = None
        if cascade:
            from .cascade_inputs import CascadeInputs  # imports the cascade kernels (Triton)

            self._cascade = CascadeInputs(R, W, kv.page_size, scratch_page, kv.device)
        self.cascade_buckets = [b for b in self.buckets if b & (b - 1) == 0 or b == max_rows]

    @property
    def num_graphs(self) -> int:
        """Graphs captured so far (plain buckets at start-up, the rest on first use)."""
        return len(self._graphs)

    def fits(self, batch: Batch) -> bool:
        """Whether this step can be replayed: decode-only, every row samples, within the buffers; a cascade
        step only with cascade=True and at most MAX_GROUPS groups (of its one level: a two-level step fits
        too, and replays as one level)."""
        if batch.cascade is not None and (self._cascade is None
                                          or not self._cascade.fits(batch.cascade.one_level)):
            return False
        return (batch.is_decode_only and len(batch.requests) <= self.max_rows and all(batch.sample)
                and max(len(p) for p in batch.page_tables) <= self.max_pages)

    def run(self, batch: Batch, input_ids: Tensor | None = None) -> Tensor:
        """The step's logits [B, V] float32 (a view into the graph's output: use before the next step).
        input_ids: int64 [K] on the device, in place of batch.input_ids[:K] (a step scheduled ahead)."""
        B = len(batch.requests)
        self.attention.prepare_window(batch)
        cascade = batch.cascade is not None  # power-of-two buckets only: fewer cascade keys (cascade_inputs.py)
        bucket = next(b for b in (self.cascade_buckets if cascade else self.buckets) if b >= B)
        self._fill(bucket, batch.input_ids, batch.positions, batch.seq_lens, batch.slots, batch.page_tables)
        key: tuple = (bucket, _pow2_at_least(self.attention.decode_splits(bucket, max(batch.seq_lens))))
        if cascade:
            shape = self._cascade.fill(self._turn, bucket, batch.cascade.plan_groups(), batch.page_tables,
                                       batch.seq_lens)
            key = (bucket, self.cascade_graph_key(bucket, shape))
            self._cascade.upload(self._turn, bucket)
        self._upload(bucket)
        if input_ids is not None:
            self._dev[:input_ids.shape[0]].copy_(input_ids)
        graph, logits = self._graph(key)
        graph.replay()
        self.replays += 1
        if cascade:
            self.cascade_replays += 1
            self.attention.cascade_steps += 1
        return logits[:B]

    def capture_all(self) -> None:
        """Capture every bucket now (at the split count of short sequences), as vLLM does at start-up,
        so the first steps of a workload do not pay for captures. Longer contexts that choose more
        splits are captured on first use."""
        for bucket in self.buckets:
            self._fill(bucket, [], [], [], [], [])  # padding rows only: they write the scratch page
            self._upload(bucket)
            self._graph((bucket, _pow2_at_least(self.attention.decode_splits(bucket, 1))))
        torch.cuda.synchronize()

    def cascade_graph_key(self, bucket: int, key: CascadeKey) -> CascadeGraphKey:
        """The graph key of a step of this shape: the split counts cascade_decode would choose for it."""
        from radixkv.kernels.cascade_plan import default_prefix_splits

        from .cascade_inputs import CascadeGraphKey

        kv = self.attention.kv
        width = min(key.prefix_pages, self.max_pages) * kv.page_size
        prefix = default_prefix_splits(kv.compute_dtype, kv.k_cache[0], self.attention.num_q_heads, key.groups,
                                       bucket, width)
        narrow = self.widened_prefix_pages(key.groups)
        return CascadeGraphKey(key.groups, prefix, self.attention.decode_splits(bucket, key.suffix_len),
                               narrow if key.prefix_pages <= narrow else 0)

    def widened_prefix_pages(self, groups: int) -> int:
        """The prefix table width (pages, a power of two; 0: none) of cascade graphs whose FP8 prefixes
        kernels/cascade.py widens to fp16 copies: `groups` groups' copies of that many pages fit both the
        attention's widen budget and the graphs' 16-bit logits [max_rows, V] (their pool holds those at the
        LM head; during attention, where the copies live, it does not), so the copies add nothing to the
        pool's peak. A step whose prefixes are longer replays a graph over the whole table, which never widens
        (CascadeInputs.plan: its copies would be the whole context's)."""
        from radixkv.kernels.dequant_pages import widen_budget

        kv, att = self.attention.kv, self.attention
        if not kv.kv_dtype.is_fp8:
            return 0
        page16 = 2 * kv.page_size * kv.num_kv_heads * kv.head_dim * 2  # a page's fp16 K and V copies
        budget = min(self.max_rows * self.model.vocab_rows * kv.compute_dtype.itemsize,
                     widen_budget(att.widen_max_bytes))
        pages = min(self.max_pages, budget // (groups * page16))
        return 1 << (pages.bit_length() - 1) if pages else 0

    def cascade_warm_keys(self, min_rows: int, min_prefix_tokens: int) -> list[tuple[int, CascadeGraphKey]]:
        """Every (bucket, CascadeGraphKey) a cascade step can reach when a group needs >= min_rows rows
        sharing >= min_prefix_tokens tokens, fewest groups and rows first (cascade_inputs.cascade_keys)."""
        from .cascade_inputs import cascade_keys

        keys = {(b, self.cascade_graph_key(b, k)) for b, k in
                cascade_keys(self.cascade_buckets, self.max_pages, self.attention.kv.page_size, min_rows,
                             min_prefix_tokens)}
        return sorted(keys, key=lambda bk: (bk[1].groups, bk[0], bk[1]))

    def warm_cascade(self, min_rows: int, min_prefix_tokens: int, limit: int = 64) -> int:
        """Capture the graphs of cascade_warm_keys (a group needs >= min_rows rows sharing >=
        min_prefix_tokens tokens: CascadeRule.floor of the scheduler's rule), at most `limit` (the rest on
        first use), on padding rows; returns how many were captured (0 without cascade=True). The eager
        run before each capture compiles what the cascade kernels have not compiled for its split counts
        (kernels/cascade.py's docstring lists what varies), so a workload's cascade steps compile nothing.
        Llama-3-8B on the H200 (256 rows, bf16, the 16-bit rule): 7 graphs, 3 split pairs, 3 compiles."""
        if self._cascade is None:
            return 0
        n = self.num_graphs
        for bucket, key in self.cascade_warm_keys(min_rows, min_prefix_tokens)[:limit]:
            if (bucket, key) in self._graphs:
                continue
            self._fill(bucket, [], [], [], [], [])  # padding rows only: they write the scratch page
            self._cascade.fill_padding(self._turn, bucket)
            self._cascade.upload(self._turn, bucket)
            self._upload(bucket)
            self._graph((bucket, key))
        torch.cuda.synchronize()
        return self.num_graphs - n

    def _upload(self, bucket: int) -> None:
        """Copy the filled pinned buffer to the device (one transfer) and turn to the other buffer."""
        used = 4 * self.max_rows + bucket * self.max_pages
        self._dev[:used].copy_(self._hosts[self._turn][:used], non_blocking=True)
        self._turn ^= 1

    def _graph(self, key: tuple) -> tuple[torch.cuda.CUDAGraph, Tensor]:
        """The graph of key = (bucket, splits) or (bucket, CascadeGraphKey), captured first if needed (on
        the inputs just uploaded)."""
        if key not in self._graphs:
            self._graphs[key] = self._capture(*key)
        return self._graphs[key]

    # ------------------------------------------------------------------ buffers

    def _views(self, bucket: int) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        """ids, positions, seq_lens, slots [bucket] and page_table [bucket, W] of the device buffer."""
        R, W, d = self.max_rows, self.max_pages, self._dev
        return (d[:bucket], d[R:R + bucket], d[2 * R:2 * R + bucket], d[3 * R:3 * R + bucket],
                d[4 * R:4 * R + bucket * W].view(bucket, W))

    def _fill(self, bucket: int, ids: Sequence[int], positions: Sequence[int], seq_lens: Sequence[int],
              slots: Sequence[int], page_tables: Sequence[Sequence[int]]) -> None:
        """Write B rows (and padding rows up to bucket) into this turn's pinned host buffer."""
        R, W, h, B = self.max_rows, self.max_pages, self._hosts_np[self._turn], len(ids)
        for i, (rows, pad) in enumerate(((ids, 0), (positions, 0), (seq_lens, 1), (slots, self.scratch_slot))):
            h[i * R:i * R + B] = rows
            h[i * R + B:i * R + bucket] = pad
        _fill_table(h[4 * R:4 * R + bucket * W].reshape(bucket, W), page_tables, self.scratch_page)

    # ------------------------------------------------------------------ capture

    def _capture(self, bucket: int, splits: int | CascadeGraphKey) -> tuple[torch.cuda.CUDAGraph, Tensor]:
        """splits: the decode split count, or a CascadeGraphKey (the cascade plan's views and splits)."""
        ids, pos, seq_lens, slots, table = self._views(bucket)
        cascade = None if isinstance(splits, int) else self._cascade.plan(bucket, splits)
        plan = AttentionPlan(path=Path.DECODE, page_table=table, seq_lens=seq_lens, q_start=self._q_start[:bucket],
                             q_lens=self._q_lens[:bucket], slots=slots, num_tokens=bucket, max_q_len=1,
                             max_seq_len=0, num_splits=splits if cascade is None else 1, cascade=cascade)
        rows = self._rows[:bucket]
        self.attention.install(plan._replace(slots=slots.long()))
        out = self._logits[:bucket]
        self.model.forward(ids.long(), pos.long(), self.attention, rows, out)  # eager warm-up, real inputs
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            slots64 = slots.long()
            self.attention.install(plan._replace(slots=slots64))
            logits = self.model.forward(ids.long(), pos.long(), self.attention, rows, out)
        return graph, logits


def _pow2_at_least(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def _fill_table(table: np.ndarray, page_tables: Sequence[Sequence[int]], scratch: int) -> None:
    """table: [bucket, W] int32 view; rows past the batch and columns past a row's pages up to the
    longest row -> scratch. Columns past the longest row keep stale ids: no kernel reads a page past
    a row's sequence length (padding rows have one token, in column 0)."""
    width = max(1, max((len(p) for p in page_tables), default=1))
    table[:, :width] = scratch
    for b, pages in enumerate(page_tables):
        table[b, :len(pages)] = pages
