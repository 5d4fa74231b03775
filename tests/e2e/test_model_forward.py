"""Our Llama-family forward equals transformers' logits (fp32, contiguous test attention)."""
from __future__ import annotations

import pytest
import torch

from radixkv.engine.model import LlamaModel
from radixkv.engine.model_config import ModelSpec
from radixkv.engine.weights import random_checkpoint

from .tiny_models import hf_model, tiny_config

ARCHS = ["llama", "llama3", "mistral", "qwen2", "qwen3"]


class ContiguousAttention:
    """One sequence, K/V appended per layer; causal over everything stored so far."""

    def __init__(self, num_layers: int) -> None:
        self.k: list[torch.Tensor | None] = [None] * num_layers
        self.v: list[torch.Tensor | None] = [None] * num_layers

    def run(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int) -> torch.Tensor:
        # q: [T, Hq, D]; k, v: [T, Hkv, D]
        prev_k, prev_v = self.k[layer], self.v[layer]
        K = k if prev_k is None else torch.cat([prev_k, k])
        V = v if prev_v is None else torch.cat([prev_v, v])
        self.k[layer], self.v[layer] = K, V
        T, Hq, D = q.shape
        S = K.shape[0]
        group = Hq // K.shape[1]
        K = K.repeat_interleave(group, dim=1)
        V = V.repeat_interleave(group, dim=1)
        scores = torch.einsum("thd,shd->hts", q, K) / D**0.5  # [Hq, T, S]
        qpos = torch.arange(S - T, S)[:, None]
        scores = scores.masked_fill(torch.arange(S)[None, :] > qpos, float("-inf"))
        return torch.einsum("hts,shd->thd", scores.softmax(-1), V)


@pytest.mark.parametrize("arch", ARCHS)
def test_logits_match_transformers_prefill_then_decode(arch: str) -> None:
    config = tiny_config(arch)
    ckpt = random_checkpoint(config, seed=0, dtype=torch.float32, device=torch.device("cpu"))
    ours = LlamaModel(ModelSpec.from_hf(config), ckpt.state_dict, torch.float32, torch.device("cpu"))
    ref = hf_model(config, seed=0)
    ids = torch.randint(3, config.vocab_size, (1, 90), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = ref(ids).logits[0]  # [90, V]
        attn = ContiguousAttention(config.num_hidden_layers)
        # prefill 70 tokens (positions past llama3's original 64 exercise the scaling), then 20 decodes
        got = [ours.forward(ids[0, :70], torch.arange(70), attn, torch.arange(70))]
        for t in range(70, 90):
            got.append(ours.forward(ids[0, t:t + 1], torch.tensor([t]), attn, torch.tensor([0])))
    torch.testing.assert_close(torch.cat(got), want, rtol=1e-4, atol=1e-4)


def test_spec_rejects_unsupported_model_type() -> None:
    from transformers import GPT2Config

    with pytest.raises(ValueError, match="unsupported model_type 'gpt2'"):
        ModelSpec.from_hf(GPT2Config())
