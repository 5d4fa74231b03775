"""MixedGraphs: steps with prefill chunks replayed from piecewise CUDA graphs, attention eager between them.

A mixed step (decode rows plus prompt chunks) has an attention shape no graph can freeze (rows, chunk
lengths, split counts), but everything else in a layer depends only on the step's token count T. So, as
vLLM V1 does, the forward is cut at each attention: per token bucket Tb (token_buckets) one graph a
piece, num_layers + 1 pieces,

    piece 0:      embed, layer 0's norm, q/k/v, RoPE, store of its K/V
    piece i:      layer i-1's o_proj, residual, MLP, residual, layer i's norm, q/k/v, RoPE, store
    piece L:      layer L-1's o_proj, residual, MLP, residual -> h

and between piece i and piece i + 1 PagedAttention.attend(q, i) runs eagerly over the step's plan
(PagedAttention.plan: decode rows through paged_decode, chunks through paged_prefill), on the step's
real T tokens. What crosses a piece boundary lives in static buffers outside the graphs' memory pool:

    inputs (int64, one upload from a pinned twin, two of them, alternate steps): ids [Tm], positions [Tm],
           slots [Tm], and the sampling rows' token indices [Tm] (read by the eager logits)
    h [Tm, H] (residual stream, updated in place), q [Tm, Hq, D], o [Tm, Hq, D], cos, sin [Tm, 1, D]

with Tm the largest bucket. A step of T tokens replays bucket Tb >= T; tokens T..Tb are padding: token 0
at position 0, their K/V stored to the scratch page (a page of the KVStore the pool never hands out, as
DecodeGraphs' padding rows), their rows of h, q, o never read by a real row (every op but attention is
row-wise). The last piece leaves h; the sampled rows' logits are computed eagerly (model.logits). Steps
of more than Tm tokens, decode-only steps (DecodeGraphs), a recent-token window and tensor parallelism
run eagerly (the runner does not build MixedGraphs then). Without graphs (use_graphs=False, CPU tests)
the pieces run eagerly in the same order, on the same buffers.
"""
from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

import numpy as np
import torch
from torch import Tensor

from radixkv.batch import Batch
from radixkv.plan import MIXED_GRAPH_MAX_TOKENS

from .attention import PagedAttention
from .model import LlamaModel

# buckets: powers of two up to 128 (padding is nearly free while the weights' reads bound a step), then
# steps of 32 up to 512 and of 64 up to LARGEST_BUCKET (a step's padding at most 25%, 6% from 512 on; past
# plan.MIXED_GRAPH_MAX_TOKENS a step is eager)
LARGEST_BUCKET = MIXED_GRAPH_MAX_TOKENS


def token_buckets(max_tokens: int, largest: int = LARGEST_BUCKET) -> list[int]:
    """Token-count buckets of the piecewise graphs: 16, 32, 64, 128, 160, ..., 512, 576, ..., up to
    min(max_tokens, largest) (itself the last, rounded up to a multiple of 16)."""
    if max_tokens < 1 or largest < 1:
        raise ValueError(f"token_buckets: max_tokens {max_tokens} and largest {largest} must be >= 1")
    top = -(-min(max_tokens, largest) // 16) * 16
    out, t = [], 16
    while t < top:
        out.append(t)
        t = t * 2 if t < 128 else t + (32 if t < 512 else 64)
    return out + [top]


def bucket_for(buckets: Sequence[int], num_tokens: int) -> int | None:
    """The smallest bucket >= num_tokens, or None when none is."""
    for b in buckets:
        if b >= num_tokens:
            return b
    return None


def fill_inputs(buf: np.ndarray, largest: int, bucket: int, ids: Sequence[int], positions: Sequence[int],
                slots: Sequence[int], scratch_slot: int, sample: Sequence[int] = ()) -> None:
    """Write a step's T tokens into buf (int64 [4 * largest]: ids, positions, slots, sample indices) and padding
    tokens up to bucket: id 0, position 0, the scratch slot; sample: the S sampling rows' token indices."""
    T = len(ids)
    if not len(positions) == len(slots) == T <= bucket <= largest:
        raise ValueError(f"fill_inputs: {T} ids, {len(positions)} positions, {len(slots)} slots, "
                         f"bucket {bucket}, largest {largest}")
    for i, (rows, pad) in enumerate(((ids, 0), (positions, 0), (slots, scratch_slot))):
        base = i * largest
        buf[base:base + T] = rows
        buf[base + T:base + bucket] = pad
    buf[3 * largest:3 * largest + len(sample)] = sample


class MixedGraphs:
    """Steps with prefill chunks of up to the largest bucket's tokens, replayed piecewise (module docstring)."""

    def __init__(self, model: LlamaModel, attention: PagedAttention, max_tokens: int, scratch_page: int,
                 largest: int = LARGEST_BUCKET, use_graphs: bool = True) -> None:
        kv = attention.kv
        if use_graphs and kv.device.type != "cuda":
            raise ValueError("CUDA graphs need a CUDA device")
        if not 0 <= scratch_page < kv.num_pages:
            raise ValueError(f"scratch page {scratch_page} outside the KVStore's {kv.num_pages} pages")
        if attention.window is not None or model.tp is not None:
            raise ValueError("piecewise graphs run without a recent-token window and without tensor parallelism")
        self.model, self.attention, self.use_graphs = model, attention, use_graphs
        self.buckets = token_buckets(max_tokens, largest)
        self.scratch_slot = scratch_page * kv.page_size
        s, dev, dt = model.shard_spec, kv.device, model.dtype
        Tm = self.largest = self.buckets[-1]
        pin = dev.type == "cuda"
        self._hosts = [torch.zeros(4 * Tm, dtype=torch.int64, pin_memory=pin) for _ in range(2)]
        self._hosts_np = [h.numpy() for h in self._hosts]
        self._turn = 0
        self._inputs = torch.zeros(4 * Tm, dtype=torch.int64, device=dev)
        self._ids, self._pos, self._slots, self._sample = self._inputs.view(4, Tm).unbind(0)
        self._h = torch.zeros(Tm, model.spec.hidden_size, dtype=dt, device=dev)  # [Tm, H]
        self._q = torch.zeros(Tm, s.num_q_heads, s.head_dim, dtype=dt, device=dev)  # [Tm, Hq, D]
        self._o = torch.zeros_like(self._q)  # [Tm, Hq, D]
        self._cos = torch.zeros(Tm, 1, s.head_dim, dtype=dt, device=dev)  # [Tm, 1, D]
        self._sin = torch.zeros_like(self._cos)
        self._pieces: dict[int, list[Callable[[], None]]] = {}
        self._pool = torch.cuda.graph_pool_handle() if use_graphs else None
        self.replays = 0  # steps served (for tests and benchmarks)

    @property
    def num_graphs(self) -> int:
        """Graphs captured so far (num_layers + 1 a bucket)."""
        return sum(len(p) for p in self._pieces.values()) if self.use_graphs else 0

    def fits(self, batch: Batch) -> bool:
        """A step with a prompt chunk (decode-only steps are DecodeGraphs') of at most the largest bucket's tokens."""
        return not batch.is_decode_only and batch.num_tokens <= self.largest

    def run(self, batch: Batch, input_ids: Tensor | None = None) -> Tensor:
        """Logits [S, V] float32 of the step's sampling rows (stores the step's K/V). input_ids: int64 [K] on
        the device in place of batch.input_ids[:K] (a step scheduled ahead: its rows that follow the last)."""
        h = self.hidden(batch, input_ids)
        return self.model.logits(h[self._sample[:sum(batch.sample)]])

    def hidden(self, batch: Batch, input_ids: Tensor | None = None) -> Tensor:
        """LlamaModel.hidden of the step: h [T, H], a view of the static buffer (use it before the next step)."""
        T = batch.num_tokens
        bucket = bucket_for(self.buckets, T)
        if bucket is None or batch.is_decode_only:
            raise ValueError(f"MixedGraphs: a step of {T} tokens (decode-only: {batch.is_decode_only}) does not fit")
        self.attention.plan(batch)
        last = [batch.q_start[b] + batch.q_lens[b] - 1 for b, s in enumerate(batch.sample) if s]
        fill_inputs(self._hosts_np[self._turn], self.largest, bucket, batch.input_ids, batch.positions, batch.slots,
                    self.scratch_slot, last)
        self._upload()
        if input_ids is not None:
            self._ids[:input_ids.shape[0]].copy_(input_ids)
        pieces = self._pieces_of(bucket)
        q, o = self._q[:T], self._o[:T]
        pieces[0]()
        for i in range(len(self.model.layers)):
            self.attention.attend(q, i, out=o)
            pieces[i + 1]()
        self.replays += 1
        return self._h[:T]

    def capture_all(self) -> None:
        """Capture every bucket now, largest first (vLLM's order: smaller ones reuse the pool's memory)."""
        for bucket in reversed(self.buckets):
            self._pieces_of(bucket)
        if self.use_graphs:
            torch.cuda.synchronize()

    # ------------------------------------------------------------------ pieces

    def _upload(self) -> None:
        """Copy this turn's pinned inputs to the device (one transfer) and turn to the other buffer."""
        self._inputs.copy_(self._hosts[self._turn], non_blocking=True)
        self._turn ^= 1

    def _pieces_of(self, bucket: int) -> list[Callable[[], None]]:
        if bucket not in self._pieces:
            self._pieces[bucket] = self._capture(bucket)
        return self._pieces[bucket]

    def _capture(self, bucket: int) -> list[Callable[[], None]]:
        """The bucket's pieces: graphs captured on padding-only inputs after one eager run (Triton compiles,
        cuBLAS settles), or the eager pieces themselves without graphs."""
        pieces = [functools.partial(self._piece, i, bucket) for i in range(len(self.model.layers) + 1)]
        if not self.use_graphs:
            return pieces
        fill_inputs(self._hosts_np[self._turn], self.largest, bucket, [], [], [], self.scratch_slot)
        self._upload()
        for piece in pieces:  # padding tokens only: their K/V go to the scratch page
            piece()
        torch.cuda.synchronize()
        graphs = []
        for piece in pieces:
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, pool=self._pool):
                piece()
            graphs.append(g.replay)
        return graphs

    def _piece(self, i: int, bucket: int) -> None:
        """Piece i of a bucket-token step (module docstring), over the static buffers' first `bucket` rows."""
        m, n = self.model, bucket
        h, cos, sin = self._h[:n], self._cos[:n], self._sin[:n]
        if i == 0:
            h0, x, c, s = m.embed_tokens(self._ids[:n], self._pos[:n])
            h.copy_(h0)
            cos.copy_(c)
            sin.copy_(s)
        else:
            x, h_new = m.layer_rest(i - 1, self._o[:n], h)  # h updated in place, or h + mlp after the last layer
            if x is None:
                h.copy_(h_new)
                return
        q, k, v = m.layer_qkv(i, x, cos, sin)
        self.attention.store(k, v, i, self._slots[:n])
        self._q[:n].copy_(q)
