"""vLLM's logits controls on the tiny CPU model (issue 32, item 3): logit_bias, allowed_token_ids,
bad_words (one-token and multi-token), top_k 0 as off; validation by field name; the sampler's
batching (a row without a control is untouched)."""
from __future__ import annotations

import pytest
import torch

from radixkv import LLM, SamplingParams
from radixkv.engine.sampling import penalize

from .tiny_models import VOCAB, tiny_config

PROMPT = list(range(5, 17))


@pytest.fixture(scope="module")
def llm() -> LLM:
    return LLM(tiny_config("llama"), dtype="float32", page_size=4, num_pages=64, device="cpu")


def _gen(llm: LLM, **kw) -> list[int]:
    params = SamplingParams(max_tokens=kw.pop("max_tokens", 8), ignore_eos=True, **{"temperature": 0.0, **kw})
    return llm.generate([PROMPT], params)[0].outputs[0].token_ids


def test_logit_bias_plus_100_forces_the_token_greedy_and_sampled(llm: LLM) -> None:
    plain = _gen(llm)
    target = next(t for t in range(20, VOCAB) if t not in plain)
    assert _gen(llm, logit_bias={target: 100.0}) == [target] * 8
    assert _gen(llm, temperature=1.0, seed=3, logit_bias={str(target): 100}) == [target] * 8
    banned = _gen(llm, logit_bias={plain[0]: -100.0})
    assert banned[0] != plain[0]


def test_allowed_token_ids_restrict_every_token(llm: LLM) -> None:
    allowed = [30, 31, 77]
    for kw in ({}, {"temperature": 1.0, "seed": 5}, {"temperature": 0.8, "top_k": 2, "seed": 1}):
        out = _gen(llm, allowed_token_ids=allowed, max_tokens=12, **kw)
        assert out and set(out) <= set(allowed), (kw, out)


def test_bad_words_never_appear_one_token_and_multi_token(llm: LLM) -> None:
    plain = _gen(llm, max_tokens=10)
    # one-token bad word: the greedy first token is banned everywhere
    p = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True, bad_words_token_ids=[[plain[0]]])
    out = llm.generate([PROMPT], p)[0].outputs[0].token_ids
    assert plain[0] not in out
    # two-token bad word plain[0], plain[1]: the second is banned only right after the first
    p = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True,
                       bad_words_token_ids=[plain[:2]])
    out = llm.generate([PROMPT], p)[0].outputs[0].token_ids
    assert out[0] == plain[0] and out[1] != plain[1]
    assert not any(out[i:i + 2] == plain[:2] for i in range(len(out) - 1))


def test_bad_words_are_tokenised_as_vllm_does() -> None:
    class Tok:  # one token per character, as the tests' tokenizer
        def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
            return [ord(c) for c in text]

    p = SamplingParams(bad_words=["ab", " c"]).with_bad_words_tokenized(Tok())
    # " ab" is a token longer than "ab", so only the plain spelling; " c" is stripped to "c" first
    assert p.bad_words_token_ids == ((97, 98), (99,))
    assert p.penalized and not SamplingParams().penalized


def test_unresolved_bad_words_are_refused_not_ignored() -> None:
    logits = torch.zeros(1, VOCAB)
    with pytest.raises(ValueError, match="bad_words"):
        penalize(logits, [SamplingParams(bad_words=["x"])], [[1]], [[]], [()])


def test_top_k_zero_equals_no_top_k(llm: LLM) -> None:
    assert SamplingParams(top_k=0).top_k is None
    a = llm.generate([PROMPT], SamplingParams(temperature=1.0, seed=11, max_tokens=10, top_k=0, ignore_eos=True))
    b = llm.generate([PROMPT], SamplingParams(temperature=1.0, seed=11, max_tokens=10, ignore_eos=True))
    assert a[0].outputs[0].token_ids == b[0].outputs[0].token_ids


def test_controls_in_one_batch_touch_only_their_rows() -> None:
    torch.manual_seed(0)
    logits = torch.randn(4, VOCAB)
    params = [SamplingParams(), SamplingParams(logit_bias={3: 2.5, 7: -1.0}),
              SamplingParams(allowed_token_ids=[1, 2]), SamplingParams(bad_words_token_ids=[[9], [4, 5]])]
    outputs = [[], [], [], [8, 4]]
    out = penalize(logits, params, [[1]] * 4, outputs, [()] * 4)
    assert torch.equal(out[0], logits[0])
    diff = out[1] - logits[1]
    assert diff[3] == pytest.approx(2.5) and diff[7] == pytest.approx(-1.0) and (diff != 0).sum() == 2
    assert torch.isinf(out[2]).sum() == VOCAB - 2 and torch.equal(out[2, 1:3], logits[2, 1:3])
    assert out[3, 9] == float("-inf") and out[3, 5] == float("-inf") and torch.isinf(out[3]).sum() == 2
    # without the prefix, the multi-token word's last token stays
    out = penalize(logits[3:], params[3:], [[1]], [[8, 8]], [()])
    assert out[0, 5] == logits[3, 5] and out[0, 9] == float("-inf")


@pytest.mark.parametrize("kwargs, name", [
    (dict(logit_bias={1: 101.0}), "logit_bias"),
    (dict(logit_bias={-1: 1.0}), "logit_bias"),
    (dict(logit_bias={"x": 1.0}), "logit_bias"),
    (dict(logit_bias={1: float("nan")}), "logit_bias"),
    (dict(allowed_token_ids=[]), "allowed_token_ids"),
    (dict(allowed_token_ids=[-2]), "allowed_token_ids"),
    (dict(bad_words="word"), "bad_words"),
    (dict(bad_words=[" "]), "bad_words"),
    (dict(top_k=-2), "top_k"),
])
def test_bad_values_name_the_field(kwargs, name) -> None:
    with pytest.raises(ValueError, match=name):
        SamplingParams(**kwargs)


def test_vocabulary_check_names_the_field() -> None:
    for kw, name in ((dict(logit_bias={VOCAB: 1.0}), "logit_bias"), (dict(allowed_token_ids=[VOCAB]), "allowed_token_ids"),
                     (dict(bad_words_token_ids=[[1, VOCAB]]), "bad_words")):
        with pytest.raises(ValueError, match=name):
            SamplingParams(**kw).check_vocab(VOCAB)
    SamplingParams(logit_bias={VOCAB - 1: 1.0}).check_vocab(VOCAB)
