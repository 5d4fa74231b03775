"""Llama-family forward pass (Llama 2/3, Mistral, Qwen2, Qwen3) over a ragged batch.

The model knows nothing about pages: each layer hands its q, k, v to an attention object
(`PagedAttention` in the engine, planned once per step for the batch) whose `run` stores the
new K/V and attends over each row's cached prefix plus its new tokens. Only the rows that
sample this step go through the final norm and the LM head.

Numerics follow transformers' modeling code (RMSNorm in fp32, RoPE cos/sin in fp32 then cast,
SiLU-gated MLP), so greedy output matches `generate` token for token in fp32.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple, Protocol

import torch
import torch.nn.functional as F

from .parallel import TPGroup, shard_spec, shard_vocab
from .model_config import ModelSpec, RopeKind, RopeSpec


class LayerAttention(Protocol):
    """Per-step attention: `run` stores k/v for the new tokens, then attends causally."""

    def run(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int) -> torch.Tensor:
        """q: [T, Hq, D], k/v: [T, Hkv, D] -> [T, Hq, D]."""
        ...


class StoringAttention(LayerAttention, Protocol):
    """An attention that lets the fused decode qkv kernel store the new K/V (engine.attention.PagedAttention)."""

    def store_target(self, layer: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        """(k_cache, v_cache, slots) to write this step's K/V into, or None: then `run` must store them."""
        ...

    def attend(self, q: torch.Tensor, layer: int) -> torch.Tensor:
        """q: [T, Hq, D] over the layer's pages, the step's K/V already stored -> [T, Hq, D]."""
        ...

    @property
    def decode_only(self) -> bool:
        """Whether the planned step is decode-only (the fused path takes only those: as the graphs replay)."""
        ...


def rope_inv_freq(rope: RopeSpec, head_dim: int) -> torch.Tensor:
    """Inverse frequencies [head_dim // 2] in fp32, with linear or Llama-3 scaling applied."""
    inv = 1.0 / (rope.theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    if rope.kind is RopeKind.DEFAULT:
        return inv
    if rope.kind is RopeKind.LINEAR:
        return inv / rope.factor
    # Llama 3.1: long wavelengths divided by `factor`, short ones kept, a smooth blend between.
    low_wavelen = rope.original_max_position / rope.low_freq_factor
    high_wavelen = rope.original_max_position / rope.high_freq_factor
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > low_wavelen, inv / rope.factor, inv)
    smooth = (rope.original_max_position / wavelen - rope.low_freq_factor) / (
        rope.high_freq_factor - rope.low_freq_factor
    )
    blended = (1 - smooth) * scaled / rope.factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return torch.where(medium, blended, scaled)


class LayerOps(NamedTuple):
    """The elementwise steps of a layer: Triton kernels on the GPU, their PyTorch twins on the CPU
    (radixkv.kernels.reference_layers; the same semantics, transformers' numerics)."""

    rms_norm: Callable[..., tuple[torch.Tensor, torch.Tensor | None]]  # (x, w, eps, residual=None, *, out=None)
    silu_and_mul: Callable[[torch.Tensor], torch.Tensor]  # [T, 2I] -> [T, I]
    apply_rope_: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]  # in place on [T, N, D]
    rope_store_kv_: Callable[..., torch.Tensor]  # (qkv, cos, sin, Hq, k_cache, v_cache, slots): RoPE + K/V store


def layer_ops(fused: bool) -> LayerOps:
    """fused: the Triton kernels (imports Triton); else the reference twins."""
    if fused:
        from radixkv import kernels

        return LayerOps(kernels.rms_norm, kernels.silu_and_mul, kernels.apply_rope_, kernels.rope_store_kv_)
    from radixkv.kernels import reference_layers as ref

    return LayerOps(ref.rms_norm_ref, ref.silu_and_mul_ref, ref.apply_rope_ref, ref.rope_store_kv_ref)


class _Layer:
    """Weights of one decoder layer, q/k/v and gate/up fused into single matmuls; under tensor parallelism
    this rank's share (parallel.py): q/k/v and gate/up rows of its heads and MLP columns, o/down columns."""

    def __init__(self, spec: ModelSpec, sd: dict[str, torch.Tensor], i: int, dtype: torch.dtype,
                 device: torch.device, rank: int = 0, world: int = 1) -> None:
        p = f"model.layers.{i}."

        def w(name: str, split: int | None = None) -> torch.Tensor:
            """split: the dim cut into `world` equal parts (0: column-parallel rows, 1: row-parallel columns)."""
            t = sd[p + name]
            if split is not None and world > 1:
                t = t.chunk(world, dim=split)[rank].contiguous()
            return t.to(device=device, dtype=dtype)

        Hq, Hkv = spec.num_q_heads // world, spec.num_kv_heads // world
        self.w_qkv = torch.cat([w("self_attn.q_proj.weight", 0), w("self_attn.k_proj.weight", 0),
                                w("self_attn.v_proj.weight", 0)])  # [(Hq + 2 Hkv) * D, H]
        self.b_qkv = (torch.cat([w("self_attn.q_proj.bias", 0), w("self_attn.k_proj.bias", 0),
                                 w("self_attn.v_proj.bias", 0)]) if spec.qkv_bias else None)
        self.w_o = w("self_attn.o_proj.weight", 1)  # [H, Hq * D]
        # the o_proj output is summed over the ranks: its bias is added once, by rank 0
        self.b_o = w("self_attn.o_proj.bias") if p + "self_attn.o_proj.bias" in sd and rank == 0 else None
        # Qwen3: q_norm / k_norm weights [D] laid out per head so one RMSNorm covers q and k
        self.qk_norm = (torch.cat([w("self_attn.q_norm.weight").expand(Hq, -1),
                                   w("self_attn.k_norm.weight").expand(Hkv, -1)])
                        if spec.qk_norm else None)  # [Hq + Hkv, D]
        self.w_gate_up = torch.cat([w("mlp.gate_proj.weight", 0), w("mlp.up_proj.weight", 0)])  # [2 I, H]
        self.w_down = w("mlp.down_proj.weight", 1)  # [H, I]
        self.ln_attn = w("input_layernorm.weight")
        self.ln_mlp = w("post_attention_layernorm.weight")


class LlamaModel:
    """Forward pass of a Llama-family causal LM held as plain tensors on one device.

    tp: this rank's place in a tensor-parallel group (parallel.py), or None for the whole model. Under
    tensor parallelism the model holds its shard (`shard_spec`: its q/KV heads and MLP width), all-reduces
    the o_proj and down_proj outputs and all-gathers the logits; every rank returns the whole logits."""

    def __init__(self, spec: ModelSpec, state_dict: dict[str, torch.Tensor], dtype: torch.dtype,
                 device: torch.device, fused: bool = False, tp: TPGroup | None = None) -> None:
        """fused: run norms, RoPE and SiLU-and-multiply as Triton kernels (CUDA, or the interpreter)."""
        missing = [k for k in ("model.embed_tokens.weight", "model.norm.weight") if k not in state_dict]
        if missing:
            raise ValueError(f"checkpoint lacks {missing}; is this a Llama-family causal LM?")
        rank, world = (tp.rank, tp.world) if tp is not None else (0, 1)
        self.spec = spec
        self.shard_spec = shard_spec(spec, world)  # ValueError when `world` does not divide the heads
        self.tp = tp
        self.dtype = dtype
        self.device = device
        self.embed = state_dict["model.embed_tokens.weight"].to(device=device, dtype=dtype)  # [V, H], whole
        if spec.tie_embeddings or "lm_head.weight" not in state_dict:
            lm_head = self.embed
        else:
            lm_head = state_dict["lm_head.weight"]
        self.vocab_rows = lm_head.shape[0]  # logits columns (a checkpoint may pad its vocabulary)
        # [V, H], or this rank's ceil(V / world) rows
        self.lm_head = shard_vocab(lm_head, rank, world).to(device=device, dtype=dtype)
        self.norm = state_dict["model.norm.weight"].to(device=device, dtype=dtype)
        self.layers = [_Layer(spec, state_dict, i, dtype, device, rank, world) for i in range(spec.num_layers)]
        self.inv_freq = rope_inv_freq(spec.rope, spec.head_dim).to(device)  # [D/2] fp32
        self.ops = layer_ops(fused)
        # decode steps of up to fused_decode_rows rows run their projections as decode_linear's fused kernels:
        # up to short_rows rows four kernels a layer (decode_rows_fused), from tall_rows decode_rows_tall;
        # the rows between take cuBLAS
        self.fused_decode_rows, self.short_rows, self.tall_rows = 0, 16, 33
        self.split_scratch = None  # where decode_linear's launches split over K leave their partials
        if fused and self._fusable():
            from radixkv.kernels.decode_linear_tiles import SHORT_ROWS, TALL_MIN_ROWS, SplitScratch
            from radixkv.kernels.dispatch import fused_decode_rows

            L = self.layers[0]
            self.split_scratch = SplitScratch.for_weights(device, [
                ("rope", L.w_qkv), ("residual", L.w_o), ("silu_mul", L.w_gate_up), ("residual", L.w_down),
                ("store", L.w_down)])
            if device.type == "cuda":
                self.fused_decode_rows, self.short_rows, self.tall_rows = (fused_decode_rows(), SHORT_ROWS,
                                                                           TALL_MIN_ROWS)

    def _fusable(self) -> bool:
        """Whether decode_linear's fused kernels cover this model: 16-bit weights, one device, no biases or
        per-head norms, RoPE halves that split into the kernel's column tiles."""
        from radixkv.kernels.decode_linear_tiles import rope_fits

        L = self.layers[0]
        return (self.dtype in (torch.float16, torch.bfloat16) and self.tp is None and L.b_qkv is None
                and L.b_o is None and L.qk_norm is None and rope_fits(self.spec.head_dim, self.device))

    def rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """positions: [T] int -> cos, sin: [T, 1, D] in the compute dtype."""
        freqs = positions.float()[:, None] * self.inv_freq[None, :]  # [T, D/2]
        emb = torch.cat((freqs, freqs), dim=-1)  # [T, D]
        return emb.cos().to(self.dtype)[:, None, :], emb.sin().to(self.dtype)[:, None, :]

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, attn: LayerAttention,
                sample_index: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """Run all layers over the step's new tokens; return logits of the sampled rows.

        input_ids, positions: [T] int64 (new tokens of all rows, concatenated).
        sample_index: [S] int64 indices into T (each sampling row's last token).
        out: float32 [S, V] to write the logits into (a CUDA graph's static output), or None.
        Returns logits: [S, V] float32 (`out` when given).
        """
        return self.logits(self.hidden(input_ids, positions, attn)[sample_index], out)

    def logits(self, h: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """h: [S, H] residual-stream rows (hidden's output) -> logits [S, V] float32 (final norm, LM head;
        gathered over the vocabulary shards under tensor parallelism), written into `out` [S, V] when given."""
        x, _ = self.ops.rms_norm(h, self.norm, self.spec.rms_norm_eps)  # [S, H]
        logits = F.linear(x, self.lm_head)  # [S, V], or [S, ceil(V / world)] of this rank's rows
        if self.tp is not None:
            logits = self.tp.gather_vocab(logits, self.vocab_rows)  # [S, V]
        return logits.float() if out is None else out.copy_(logits)

    def hidden(self, input_ids: torch.Tensor, positions: torch.Tensor, attn: LayerAttention) -> torch.Tensor:
        """Run all layers over the step's new tokens (storing their K/V); return the residual stream
        h: [T, H] before the final norm (`logits` turns rows of it into logits).

        Built from the pieces piecewise_graphs.py captures (embed, layer_qkv, layer_rest): a step replayed
        from those graphs runs the same ops, with attention between them. Decode steps over 16-bit pages
        take layer_q_stored instead of layer_qkv (RoPE and the K/V store in one kernel: the same q and pages)."""
        T = input_ids.shape[0]
        if (0 < T <= self.fused_decode_rows and (T <= self.short_rows or T >= self.tall_rows)
                and hasattr(attn, "store_target") and attn.decode_only):  # eager steps run what graphs replay
            fused = self.decode_rows_fused if T <= self.short_rows else self.decode_rows_tall
            return fused(input_ids, positions, attn)
        h, x, cos, sin = self.embed_tokens(input_ids, positions)
        stores = hasattr(attn, "store_target") and attn.decode_only  # decode steps: RoPE and K/V store fused
        for i in range(len(self.layers)):
            kv = attn.store_target(i) if stores else None
            if kv is None:
                q, k, v = self.layer_qkv(i, x, cos, sin)
                o = attn.run(q, k, v, i)  # o: [T, Hq, D]
            else:
                o = attn.attend(self.layer_q_stored(i, x, cos, sin, kv), i)
            x, h = self.layer_rest(i, o, h)
        return h

    def decode_rows_fused(self, input_ids: torch.Tensor, positions: torch.Tensor, attn: StoringAttention
                          ) -> torch.Tensor:
        """hidden() for a few rows (a decode batch) in four kernels a layer besides attention
        (kernels/decode_linear.py): qkv with the input norm, RoPE and the K/V store; o_proj adding into the
        residual stream h; gate/up with the MLP's norm and SiLU-and-mul; down_proj adding into h. The
        residual adds leave h's sums of squares by column tile (ssq), from which the next norm takes rstd.
        input_ids, positions: [T] int64 -> h [T, H]."""
        from radixkv.kernels.decode_linear import decode_linear
        from radixkv.kernels.decode_linear_tiles import partials

        s, eps, scratch = self.shard_spec, self.spec.rms_norm_eps, self.split_scratch
        T, H, Hq, Hkv, D = input_ids.shape[0], self.spec.hidden_size, s.num_q_heads, s.num_kv_heads, s.head_dim
        cos, sin = self.rope(positions)
        h = F.embedding(input_ids, self.embed)  # [T, H], the residual stream (updated in place)
        ssq = h.float().pow(2).sum(-1, keepdim=True)  # [T, 1]: layer 0's norm input
        # h's sums of squares by column tile: each residual kernel writes them after the kernel before it
        # read them (one stream), so one buffer serves every norm after layer 0's
        parts = torch.empty(T, partials(H, h.device, T), dtype=torch.float32, device=h.device)
        qkv = torch.empty(T, (Hq + 2 * Hkv) * D, dtype=h.dtype, device=h.device)
        heads = qkv.view(T, Hq + 2 * Hkv, D)
        act = torch.empty(T, self.layers[0].w_down.shape[1], dtype=h.dtype, device=h.device)  # [T, I]
        for i, L in enumerate(self.layers):
            kv = attn.store_target(i)
            decode_linear(h, L.w_qkv, "rope", out=qkv, norm=(L.ln_attn, eps), ssq=ssq, rope=(cos, sin),
                          heads=(Hq, Hkv, D), kv=kv, scratch=scratch)
            q = heads[:, :Hq]
            o = attn.attend(q, i) if kv is not None else attn.run(q, heads[:, Hq:Hq + Hkv], heads[:, Hq + Hkv:], i)
            decode_linear(o.reshape(T, -1), L.w_o, "residual", out=h, ssq_out=parts, scratch=scratch)
            decode_linear(h, L.w_gate_up, "silu_mul", out=act, norm=(L.ln_mlp, eps), ssq=parts, scratch=scratch)
            decode_linear(act, L.w_down, "residual", out=h, ssq_out=parts, scratch=scratch)
            ssq = parts
        return h

    def decode_rows_tall(self, input_ids: torch.Tensor, positions: torch.Tensor, attn: StoringAttention
                         ) -> torch.Tensor:
        """hidden() for a decode batch of tall_rows-64 rows: decode_linear's kernels for qkv (RoPE and the K/V
        store in its epilogue), gate/up (SiLU-and-mul) and down; o_proj on cuBLAS, and the norms as rms_norm's
        kernel adding into h (at 64 rows a norm prologue costs more than that kernel: benchmarks/RESULTS.md).
        input_ids, positions: [T] int64 -> h [T, H]."""
        from radixkv.kernels.decode_linear import decode_linear

        s, eps, ops, scratch = self.shard_spec, self.spec.rms_norm_eps, self.ops, self.split_scratch
        T, Hq, Hkv, D = input_ids.shape[0], s.num_q_heads, s.num_kv_heads, s.head_dim
        h, x, cos, sin = self.embed_tokens(input_ids, positions)
        qkv = torch.empty(T, (Hq + 2 * Hkv) * D, dtype=h.dtype, device=h.device)
        heads = qkv.view(T, Hq + 2 * Hkv, D)
        act = torch.empty(T, self.layers[0].w_down.shape[1], dtype=h.dtype, device=h.device)  # [T, I]
        down = torch.empty_like(h)
        for i, L in enumerate(self.layers):
            kv = attn.store_target(i)
            decode_linear(x, L.w_qkv, "rope", out=qkv, rope=(cos, sin), heads=(Hq, Hkv, D), kv=kv, scratch=scratch)
            q = heads[:, :Hq]
            o = attn.attend(q, i) if kv is not None else attn.run(q, heads[:, Hq:Hq + Hkv], heads[:, Hq + Hkv:], i)
            x, h = ops.rms_norm(F.linear(o.reshape(T, -1), L.w_o), L.ln_mlp, eps, h)  # h += attn
            decode_linear(x, L.w_gate_up, "silu_mul", out=act, scratch=scratch)
            decode_linear(act, L.w_down, out=down, scratch=scratch)
            if i + 1 < len(self.layers):
                x, h = ops.rms_norm(down, self.layers[i + 1].ln_attn, eps, h)  # h += mlp, next layer's norm
        return h + down

    def embed_tokens(self, input_ids: torch.Tensor, positions: torch.Tensor
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """input_ids, positions: [T] int64 -> h [T, H] (the residual stream), x [T, H] (layer 0's normed
        input), cos, sin [T, 1, D] (RoPE, every layer's)."""
        cos, sin = self.rope(positions)
        h = F.embedding(input_ids, self.embed)  # h: [T, H], the residual stream (updated in place)
        x, _ = self.ops.rms_norm(h, self.layers[0].ln_attn, self.spec.rms_norm_eps)
        return h, x, cos, sin

    def layer_qkv(self, i: int, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Layer i's q, k, v from its normed input x [T, H]: q [T, Hq, D], k, v [T, Hkv, D] (strided views of
        one buffer), q and k rotated (and normed per head, Qwen3)."""
        Hq, Hkv = self.shard_spec.num_q_heads, self.shard_spec.num_kv_heads  # this rank's heads
        qkv = self._qkv(i, x)
        qk, v = qkv[:, :Hq + Hkv], qkv[:, Hq + Hkv:]  # qk: [T, Hq + Hkv, D], v: [T, Hkv, D] (views)
        self.ops.apply_rope_(qk, cos, sin)  # q and k rotated together, in place
        return qk[:, :Hq], qk[:, Hq:], v  # q: [T, Hq, D], k: [T, Hkv, D] (strided views)

    def layer_q_stored(self, i: int, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                       kv: tuple[torch.Tensor, torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """layer_qkv for a step whose K/V go straight into their pages, kv = (k_cache, v_cache, slots) from
        attention's store_target: RoPE and the store in one kernel. Returns q [T, Hq, D] (rotated)."""
        Hq = self.shard_spec.num_q_heads
        qkv = self._qkv(i, x)
        self.ops.rope_store_kv_(qkv, cos, sin, Hq, *kv)
        return qkv[:, :Hq]

    def _qkv(self, i: int, x: torch.Tensor) -> torch.Tensor:
        """Layer i's projection of x [T, H] -> qkv [T, Hq + 2 Hkv, D] (q and k normed per head for Qwen3)."""
        s, L = self.shard_spec, self.layers[i]
        T, Hq, Hkv, D = x.shape[0], s.num_q_heads, s.num_kv_heads, s.head_dim
        qkv = F.linear(x, L.w_qkv, L.b_qkv).view(T, Hq + 2 * Hkv, D)
        if L.qk_norm is not None:
            qk = qkv[:, :Hq + Hkv]
            self.ops.rms_norm(qk, L.qk_norm, self.spec.rms_norm_eps, out=qk)
        return qkv

    def layer_rest(self, i: int, o: torch.Tensor, h: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor]:
        """Layer i after attention: o [T, Hq, D] -> o_proj, residual, MLP, residual. Returns (x, h): the next
        layer's normed input and the residual stream h (updated in place), or (None, h + mlp) after the last
        layer (a new tensor)."""
        ops, eps, tp, L = self.ops, self.spec.rms_norm_eps, self.tp, self.layers[i]
        T = o.shape[0]
        attn_out = F.linear(o.reshape(T, -1), L.w_o, L.b_o)  # [T, H] (a partial sum under TP)
        if tp is not None:
            tp.all_reduce_(attn_out)
        x, h = ops.rms_norm(attn_out, L.ln_mlp, eps, h)  # h += attn
        down = F.linear(ops.silu_and_mul(F.linear(x, L.w_gate_up)), L.w_down)  # [T, H] (partial under TP)
        if tp is not None:
            tp.all_reduce_(down)
        if i + 1 < len(self.layers):
            return ops.rms_norm(down, self.layers[i + 1].ln_attn, eps, h)  # h += mlp, next layer's norm
        return None, h + down
