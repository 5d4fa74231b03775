"""Greedy output equals transformers' generate token for token (fp32, CPU), cold and warm."""
from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from radixkv import LLM, SamplingParams

from .tiny_models import hf_greedy

MAX_TOKENS = 10


def _prompts(vocab: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(7)
    shared = torch.randint(3, vocab, (37,), generator=g).tolist()
    return [shared + torch.randint(3, vocab, (n,), generator=g).tolist() for n in (5, 12)] + [
        torch.randint(3, vocab, (19,), generator=g).tolist()]


@pytest.fixture(scope="module")
def expected(model_folder):
    """arch -> (folder, prompts, transformers' greedy continuations)."""
    made = {}

    def get(arch: str):
        if arch not in made:
            folder = model_folder(arch)
            ref = AutoModelForCausalLM.from_pretrained(folder).eval()
            prompts = _prompts(ref.config.vocab_size)
            made[arch] = folder, prompts, [hf_greedy(ref, p, MAX_TOKENS) for p in prompts]
        return made[arch]

    return get


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("arch", ["llama", "llama3", "mistral", "qwen2", "qwen3"])
def test_greedy_matches_transformers_cold_then_warm(expected, arch: str, page_size: int) -> None:
    folder, prompts, want = expected(arch)
    llm = LLM(folder, page_size=page_size, num_pages=512 // page_size)
    assert llm.dtype == torch.float32
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    cold = llm.generate(prompts, params)
    assert [o.token_ids for o in cold] == want
    warm = llm.generate(prompts, params)
    assert [o.token_ids for o in warm] == want
    for p, o in zip(prompts, warm):
        # everything but the last prompt token is cached (block-aligned)
        assert o.cached_tokens == (len(p) - 1) // page_size * page_size
        assert o.cached_tokens > 0
        assert o.finish_reason.value == "length"
    llm.cache.check_invariants()
    assert llm.pool.num_free + llm.cache.num_cached_pages == llm.num_pages  # nothing leaked
