"""The model's fused decode path (LlamaModel.decode_rows_fused: four decode_linear kernels a layer) against
its unfused path, both on the Triton kernels under the interpreter (fp16), prefill then decode steps."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from radixkv.engine.model import LlamaModel
from radixkv.engine.model_config import ModelSpec
from radixkv.engine.weights import random_checkpoint

sys.path.insert(0, str(Path(__file__).parents[1] / "e2e"))
from tiny_models import tiny_config  # noqa: E402


class PagedOnePerSlot:
    """K/V in pages of one token (slot = position); causal attention over what is stored."""

    def __init__(self, layers: int, hkv: int, d: int, store_in_kernel: bool) -> None:
        self.k = [torch.zeros(128, 1, hkv, d, dtype=torch.float16) for _ in range(layers)]
        self.v = [torch.zeros_like(c) for c in self.k]
        self.store_in_kernel = store_in_kernel
        self.slots = torch.zeros(0, dtype=torch.int64)
        self.decode_only = False  # the model takes its fused path for decode-only steps

    def store_target(self, layer: int):
        return (self.k[layer], self.v[layer], self.slots) if self.store_in_kernel else None

    def run(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int) -> torch.Tensor:
        self.k[layer][self.slots, 0] = k
        self.v[layer][self.slots, 0] = v
        return self.attend(q, layer)

    def attend(self, q: torch.Tensor, layer: int) -> torch.Tensor:
        T, hq, d = q.shape
        S = int(self.slots[-1]) + 1
        K, V = self.k[layer][:S, 0].float(), self.v[layer][:S, 0].float()
        K, V = (t.repeat_interleave(hq // t.shape[1], dim=1) for t in (K, V))
        scores = torch.einsum("thd,shd->hts", q.float(), K) / d ** 0.5
        scores = scores.masked_fill(torch.arange(S)[None, :] > self.slots[:, None], float("-inf"))
        return torch.einsum("hts,shd->thd", scores.softmax(-1), V).to(q.dtype)


@pytest.mark.parametrize("store_in_kernel", [True, False])
def test_fused_decode_matches_unfused(store_in_kernel: bool) -> None:
    config = tiny_config("llama3", hidden_size=128, intermediate_size=192)
    ckpt = random_checkpoint(config, seed=0, dtype=torch.float16, device=torch.device("cpu"))
    spec = ModelSpec.from_hf(config)
    models = [LlamaModel(spec, ckpt.state_dict, torch.float16, torch.device("cpu"), fused=True) for _ in range(2)]
    models[0].fused_decode_rows = 16  # CPU leaves it off: turned on here
    assert models[0]._fusable() and models[1].fused_decode_rows == 0
    attns = [PagedOnePerSlot(spec.num_layers, spec.num_kv_heads, spec.head_dim, store_in_kernel) for _ in models]
    ids = torch.randint(3, config.vocab_size, (14,), generator=torch.Generator().manual_seed(1))
    steps = [(0, 10)] + [(t, t + 1) for t in range(10, 14)]  # a prefill of 10 (unfused on both), 4 decodes
    for a, b in steps:
        pos = torch.arange(a, b)
        outs = []
        for m, attn in zip(models, attns):
            attn.slots, attn.decode_only = pos, b - a == 1
            outs.append(m.forward(ids[a:b], pos, attn, torch.tensor([b - a - 1])))
        torch.testing.assert_close(outs[0], outs[1], rtol=2e-2, atol=2e-2)
    for got, want in zip(attns[0].k + attns[0].v, attns[1].k + attns[1].v):
        torch.testing.assert_close(got, want, rtol=1e-2, atol=1e-2)


def test_unfused_decode_storing_in_the_rope_kernel_is_bit_exact() -> None:
    """Decode steps over pages the kernels may write (store_target given) take layer_q_stored (RoPE and
    the K/V store in one kernel): the same logits and pages as layer_qkv + run, bit for bit."""
    config = tiny_config("llama3", hidden_size=128, intermediate_size=192)
    ckpt = random_checkpoint(config, seed=0, dtype=torch.float16, device=torch.device("cpu"))
    spec = ModelSpec.from_hf(config)
    model = LlamaModel(spec, ckpt.state_dict, torch.float16, torch.device("cpu"), fused=True)
    assert model.fused_decode_rows == 0
    attns = [PagedOnePerSlot(spec.num_layers, spec.num_kv_heads, spec.head_dim, s) for s in (True, False)]
    calls = []
    model.layer_q_stored = lambda *a, _f=model.layer_q_stored: calls.append(1) or _f(*a)
    ids = torch.randint(3, config.vocab_size, (13,), generator=torch.Generator().manual_seed(2))
    for a, b in [(0, 10), (10, 11), (11, 12), (12, 13)]:
        pos = torch.arange(a, b)
        outs = []
        for attn in attns:
            attn.slots, attn.decode_only = pos, b - a == 1
            outs.append(model.forward(ids[a:b], pos, attn, torch.tensor([b - a - 1])))
        assert torch.equal(outs[0], outs[1])
    assert len(calls) == 3 * spec.num_layers, "every decode layer took the fused store"
    for got, want in zip(attns[0].k + attns[0].v, attns[1].k + attns[1].v):
        assert torch.equal(got, want)


class RowsOwnContexts(PagedOnePerSlot):
    """A decode batch of independent rows: row r attends to the slots in ctx[r] (its own earlier tokens and
    this step's), pages of one token."""

    def __init__(self, layers: int, hkv: int, d: int, store_in_kernel: bool) -> None:
        super().__init__(layers, hkv, d, store_in_kernel)
        self.ctx: list[list[int]] = []
        self.decode_only = True

    def attend(self, q: torch.Tensor, layer: int) -> torch.Tensor:
        out = torch.empty_like(q)
        for r, ctx in enumerate(self.ctx):
            K, V = self.k[layer][ctx, 0].float(), self.v[layer][ctx, 0].float()  # [S, hkv, d]
            K, V = (t.repeat_interleave(q.shape[1] // t.shape[1], dim=1) for t in (K, V))
            p = (torch.einsum("hd,shd->hs", q[r].float(), K) / q.shape[-1] ** 0.5).softmax(-1)
            out[r] = torch.einsum("hs,shd->hd", p, V).to(q.dtype)
        return out


@pytest.mark.parametrize("store_in_kernel", [True, False])
def test_tall_decode_batch_matches_unfused(store_in_kernel: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Decode batches of 33-64 rows take decode_rows_tall (qkv, gate/up and down as decode_linear kernels in
    one tile of 64 rows, here split over K in two shares as the GPU's tall tiles split qkv and down): two steps
    of 40 rows, logits and pages as the unfused path's."""
    from radixkv.kernels import decode_linear as dl, decode_linear_tiles as tiles
    from radixkv.kernels.launch import KernelConfig

    tall = tiles.Tile(KernelConfig(block_m=64, block_n=16, num_warps=4, num_stages=1), 32, split_k=2)
    pick = lambda epilogue, device, rows=1: tall if rows > tiles.SHORT_ROWS else tiles.CPU_TILE  # noqa: E731
    monkeypatch.setattr(tiles, "tile", pick)
    monkeypatch.setattr(dl, "tile", pick)
    config = tiny_config("llama3", hidden_size=128, intermediate_size=192)
    ckpt = random_checkpoint(config, seed=0, dtype=torch.float16, device=torch.device("cpu"))
    spec = ModelSpec.from_hf(config)
    models = [LlamaModel(spec, ckpt.state_dict, torch.float16, torch.device("cpu"), fused=True) for _ in range(2)]
    models[0].fused_decode_rows, models[0].tall_rows = 64, tiles.TALL_MIN_ROWS  # CPU leaves it off: on here
    assert models[0].split_scratch.counters.numel() > 0
    calls = []
    models[0].decode_rows_tall = lambda *a, _f=models[0].decode_rows_tall: calls.append(1) or _f(*a)
    attns = [RowsOwnContexts(spec.num_layers, spec.num_kv_heads, spec.head_dim, store_in_kernel) for _ in models]
    rows = 40
    g = torch.Generator().manual_seed(3)
    for step in range(2):
        ids = torch.randint(3, config.vocab_size, (rows,), generator=g)
        pos = torch.randint(0, 50, (rows,), generator=g) + step
        outs = []
        for m, attn in zip(models, attns):
            attn.slots = torch.arange(rows) + step * rows
            attn.ctx = [[r + s * rows for s in range(step + 1)] for r in range(rows)]
            outs.append(m.forward(ids, pos, attn, torch.arange(rows)))
        torch.testing.assert_close(outs[0], outs[1], rtol=2e-2, atol=2e-2)
    assert len(calls) == 2
    assert models[0].split_scratch.counters.eq(0).all()
    for got, want in zip(attns[0].k + attns[0].v, attns[1].k + attns[1].v):
        torch.testing.assert_close(got, want, rtol=1e-2, atol=1e-2)


def test_decode_paths_by_rows() -> None:
    """With the fused rows at 64: 1-16 rows decode_rows_fused, 17-32 the unfused layers, 33-64 the tall path
    (every CUDA-graph bucket, the cascade graphs' powers of two included, falls on its rows' side)."""
    from radixkv.kernels.decode_linear_tiles import TALL_MIN_ROWS

    config = tiny_config("llama3", hidden_size=128, intermediate_size=192)
    ckpt = random_checkpoint(config, seed=0, dtype=torch.float16, device=torch.device("cpu"))
    model = LlamaModel(ModelSpec.from_hf(config), ckpt.state_dict, torch.float16, torch.device("cpu"), fused=True)
    model.fused_decode_rows, model.tall_rows = 64, TALL_MIN_ROWS
    taken = []

    class Unfused(Exception):
        pass

    def unfused(*args):
        raise Unfused

    model.decode_rows_fused = lambda *a: taken.append("short")
    model.decode_rows_tall = lambda *a: taken.append("tall")
    model.embed_tokens = unfused  # the unfused layers' first step
    attn = RowsOwnContexts(1, 1, 1, True)
    for rows in (16, 17, 32, 33, 64):
        try:
            model.hidden(torch.zeros(rows, dtype=torch.long), torch.zeros(rows, dtype=torch.long), attn)
        except Unfused:
            taken.append("unfused")
    assert taken == ["short", "unfused", "unfused", "tall", "tall"]
    assert 32 < TALL_MIN_ROWS <= 33
