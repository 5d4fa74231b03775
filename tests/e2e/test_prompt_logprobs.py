"""Prompt logprobs (issue 32, item 2), vLLM's Logprob objects, truncate_prompt_tokens and assignable
SamplingParams (item 5), on a tiny random model on the CPU against transformers' own forward pass."""
from __future__ import annotations

import pytest
import torch

from radixkv import LLM, SamplingParams
from radixkv.request import Logprob

from .tiny_models import VOCAB, hf_model, tiny_config

PROMPT = [(7 * i + 3) % VOCAB for i in range(30)]  # 30 tokens: several chunks of 8, pages of 4


def _llm(**more) -> LLM:
    return LLM(tiny_config("llama"), dtype="float32", page_size=4, device="cpu",
               **{"num_pages": 64, "max_num_batched_tokens": 8, **more})


@pytest.fixture(scope="module")
def hf_logprobs() -> torch.Tensor:
    """log_softmax of transformers' logits at every prompt position: [len(PROMPT), V]."""
    model = hf_model(tiny_config("llama"))
    with torch.no_grad():
        logits = model(torch.tensor([PROMPT])).logits[0].float()
    return torch.log_softmax(logits, dim=-1)


def _check_against_hf(prompt_lps: list, ref: torch.Tensor, k: int) -> None:
    assert prompt_lps[0] is None and len(prompt_lps) == len(PROMPT)
    for i, d in enumerate(prompt_lps[1:]):
        want = ref[i]  # the logits at position i score prompt token i + 1
        tok = PROMPT[i + 1]
        assert isinstance(d[tok], Logprob)
        assert d[tok].logprob == pytest.approx(float(want[tok]), abs=1e-4)
        assert d[tok].rank == int((want > want[tok]).sum()) + 1
        top = want.topk(k).indices.tolist()
        assert set(top) <= set(d) and len(d) <= k + 1
        for r, t in enumerate(top, 1):
            assert d[t].logprob == pytest.approx(float(want[t]), abs=1e-4)
            if t != tok:
                assert d[t].rank == r


def test_prompt_logprobs_equal_transformers_over_chunked_prefill(hf_logprobs: torch.Tensor) -> None:
    llm = _llm()
    out = llm.generate([PROMPT], SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True, prompt_logprobs=2))[0]
    _check_against_hf(out.prompt_logprobs, hf_logprobs, 2)
    assert out.outputs[0].logprobs is None
    plain = llm.generate([PROMPT], SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True))[0]
    assert plain.prompt_logprobs is None and plain.token_ids == out.token_ids


def test_a_cached_prefix_is_recomputed_for_prompt_logprobs_and_stays_cached(hf_logprobs: torch.Tensor) -> None:
    llm = _llm()
    params = SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True)
    llm.generate([PROMPT], params)
    scored = llm.generate([PROMPT], SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True,
                                                   prompt_logprobs=0))[0]
    assert scored.num_cached_tokens == 0  # every position's logits were needed
    _check_against_hf(scored.prompt_logprobs, hf_logprobs, 0)
    assert all(len(d) == 1 for d in scored.prompt_logprobs[1:])  # k = 0: the prompt's token only
    again = llm.generate([PROMPT], params)[0]
    assert again.num_cached_tokens >= 24  # the tree still serves others
    llm.core.cache.check_invariants()


def test_prompt_logprobs_survive_preemption_and_batching(hf_logprobs: torch.Tensor) -> None:
    llm = _llm(num_pages=14)  # 30 + 24 tokens a request: three of them cannot run at once
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, prompt_logprobs=1, logprobs=1)
    outs = llm.generate([PROMPT, PROMPT, PROMPT[:10]], params)
    assert llm.core.stats().preemptions > 0
    for out in outs[:2]:
        _check_against_hf(out.prompt_logprobs, hf_logprobs, 1)
        assert len(out.outputs[0].logprobs) == 24
    assert len(outs[2].prompt_logprobs) == 10
    assert llm.core.pool.num_free + llm.core.cache.num_cached_pages == llm.num_pages


def test_a_one_token_prompt_has_one_none() -> None:
    out = _llm().generate([[5]], SamplingParams(max_tokens=1, prompt_logprobs=3))[0]
    assert out.prompt_logprobs == [None]


def test_truncate_prompt_tokens_keeps_the_last_tokens() -> None:
    llm = _llm()
    out = llm.generate([PROMPT], SamplingParams(temperature=0.0, max_tokens=2, truncate_prompt_tokens=9))[0]
    assert out.prompt_token_ids == PROMPT[-9:]
    same = llm.generate([PROMPT[-9:]], SamplingParams(temperature=0.0, max_tokens=2))[0]
    assert same.token_ids == out.token_ids
    whole = llm.generate([PROMPT], SamplingParams(max_tokens=2, truncate_prompt_tokens=-1))[0]
    assert whole.prompt_token_ids == PROMPT  # -1: the context's room, which 30 tokens fit


@pytest.mark.parametrize("field, value", [("prompt_logprobs", -1), ("prompt_logprobs", 1.5),
                                          ("truncate_prompt_tokens", 0), ("truncate_prompt_tokens", -2)])
def test_bad_values_are_refused_by_name(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=field):
        SamplingParams(**{field: value})


def test_prompt_logprobs_beyond_the_vocabulary_are_refused() -> None:
    with pytest.raises(ValueError, match="prompt_logprobs"):
        _llm().generate([PROMPT], SamplingParams(prompt_logprobs=VOCAB + 1))


def test_sampling_params_fields_are_assignable_and_checked_when_queued() -> None:
    llm = _llm()
    params = SamplingParams(temperature=0.0, ignore_eos=True)
    params.max_tokens = 5  # as vLLM's examples do
    out = llm.generate([PROMPT], params)[0]
    assert len(out.token_ids) == 5
    params.temperature = -1.0
    with pytest.raises(ValueError, match="temperature"):
        llm.generate([PROMPT], params)
    params.temperature = 0.0
    assert llm.generate([PROMPT], params)[0].token_ids == out.token_ids
