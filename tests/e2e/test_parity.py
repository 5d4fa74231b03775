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
    assert llm.runner.dtype == torch.float32
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
    llm.core.cache.check_invariants()
    assert llm.core.pool.num_free + llm.core.cache.num_cached_pages == llm.num_pages  # nothing leaked


@pytest.mark.parametrize("arch", ["llama", "mistral", "qwen2"])
def test_greedy_stops_at_eos_like_transformers(expected, model_folder, arch: str) -> None:
    """The acceptance test's shape: a folder whose config EOS is a token greedy decoding reaches,
    default SamplingParams (EOS in effect), two rounds: output equals transformers' generate up to
    and including EOS (vLLM also returns the EOS id in token_ids)."""
    _, prompts, full = expected(arch)
    eos = full[0][4]  # greedy reaches it at step <= 4 for prompt 0
    folder = model_folder(arch, eos_token_id=eos)
    ref = AutoModelForCausalLM.from_pretrained(folder).eval()
    want = [hf_greedy(ref, p, MAX_TOKENS, stop_at_eos=True) for p in prompts]
    assert want[0][-1] == eos and len(want[0]) < MAX_TOKENS
    llm = LLM(folder, dtype="float32")
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0)
    for round_ in range(2):
        outs = llm.generate(prompts, params)
        assert [o.token_ids for o in outs] == want
        assert all(type(o.token_ids) is list and all(type(t) is int for t in o.token_ids) for o in outs)
        assert all(type(o.cached_tokens) is int and o.text is None for o in outs)
        assert outs[0].finish_reason.value == "stop"
        if round_:
            assert sum(o.cached_tokens for o in outs) > 0
    assert llm.reset_prefix_cache() and llm.core.pool.num_free == llm.num_pages
