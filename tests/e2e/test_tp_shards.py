"""Tensor-parallel shards in one process: two LlamaModel shards, run by two threads over a fake group
that sums and concatenates in memory, give the whole model's logits (every architecture; fast, no
processes). The real group (gloo, 2 processes) is tested in test_tensor_parallel.py."""
from __future__ import annotations

import threading

import pytest
import torch

from radixkv.engine.model import LlamaModel
from radixkv.engine.parallel import shard_vocab
from radixkv.engine.model_config import ModelSpec
from radixkv.engine.weights import random_checkpoint

from .test_model_forward import ARCHS, ContiguousAttention
from .tiny_models import tiny_config


class ThreadRank:
    """Rank `rank` of `world` threads: LlamaModel's collectives through shared slots and a barrier."""

    def __init__(self, rank: int, world: int, slots: list, barrier: threading.Barrier) -> None:
        self.rank, self.world, self._slots, self._barrier = rank, world, slots, barrier

    def _exchange(self, x: torch.Tensor) -> list[torch.Tensor]:
        self._slots[self.rank] = x.clone()
        self._barrier.wait()
        parts = list(self._slots)
        self._barrier.wait()  # nobody overwrites a slot before every rank has read them all
        return parts

    def all_reduce_(self, x: torch.Tensor) -> torch.Tensor:
        parts = self._exchange(x)
        return x.copy_(sum(parts[1:], parts[0]))

    def gather_vocab(self, logits: torch.Tensor, rows: int) -> torch.Tensor:
        return torch.cat(self._exchange(logits), dim=1)[:, :rows]


def _run(model: LlamaModel, ids: torch.Tensor, layers: int) -> torch.Tensor:
    """Prefill 20 tokens, then 5 decodes: logits [25, V]."""
    attn = ContiguousAttention(layers)
    out = [model.forward(ids[:20], torch.arange(20), attn, torch.arange(20))]
    for t in range(20, 25):
        out.append(model.forward(ids[t:t + 1], torch.tensor([t]), attn, torch.tensor([0])))
    return torch.cat(out)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("over", [{}, {"vocab_size": 161, "attention_bias": True}], ids=["plain", "bias-odd-vocab"])
def test_two_shards_give_the_whole_models_logits(arch: str, over: dict) -> None:
    if over and not arch.startswith("llama"):
        over = {"vocab_size": 161}  # attention_bias is Llama's (qwen2 has q/k/v biases of its own)
    config = tiny_config(arch, **over)
    spec = ModelSpec.from_hf(config)
    sd = random_checkpoint(config, seed=0, dtype=torch.float32, device=torch.device("cpu")).state_dict
    ids = torch.randint(3, config.vocab_size, (25,), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        want = _run(LlamaModel(spec, sd, torch.float32, torch.device("cpu")), ids, spec.num_layers)
        world, slots, barrier = 2, [None, None], threading.Barrier(2, timeout=30)
        shards = [LlamaModel(spec, sd, torch.float32, torch.device("cpu"), tp=ThreadRank(r, world, slots, barrier))
                  for r in range(world)]
        assert shards[0].shard_spec.num_kv_heads == spec.num_kv_heads // 2
        got: list[torch.Tensor | None] = [None, None]

        def rank(r: int) -> None:
            got[r] = _run(shards[r], ids, spec.num_layers)

        threads = [threading.Thread(target=rank, args=(r,)) for r in range(world)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    torch.testing.assert_close(got[0], want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got[1], want, rtol=1e-5, atol=1e-5)


def test_vocab_shares_pad_the_last_rank() -> None:
    w = torch.arange(10.0).view(5, 2)  # [V=5, H=2]
    a, b = shard_vocab(w, 0, 2), shard_vocab(w, 1, 2)  # 3 rows each
    assert a.data_ptr() == w.data_ptr() and a.shape == (3, 2)  # a view
    assert b.tolist() == [[6.0, 7.0], [8.0, 9.0], [0.0, 0.0]]
