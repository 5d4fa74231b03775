"""SamplingParams validation and the sampler's filtering / seeding."""
from __future__ import annotations

import pytest
import torch

from radixkv.engine.sampling import SamplingParams, _filtered_probs, sample


@pytest.mark.parametrize("kwargs, word", [
    (dict(temperature=-0.1), "temperature"),
    (dict(top_p=0.0), "top_p"),
    (dict(top_p=1.5), "top_p"),
    (dict(top_k=0), "top_k"),
    (dict(max_tokens=0), "max_tokens"),
    (dict(stop_token_ids=[-3]), "stop_token_ids"),
])
def test_bad_params_name_the_field(kwargs: dict, word: str) -> None:
    with pytest.raises(ValueError, match=word):
        SamplingParams(**kwargs)


def test_greedy_rows_take_argmax() -> None:
    logits = torch.tensor([[0.0, 3.0, 1.0], [5.0, 0.0, 1.0]])
    g = [torch.Generator(), torch.Generator()]
    assert sample(logits, [SamplingParams(temperature=0.0)] * 2, g) == [1, 0]


def test_top_k_and_top_p_keep_only_the_head() -> None:
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    k2 = _filtered_probs(logits, 2, 1.0)
    assert (k2[2:] == 0).all() and torch.allclose(k2[:2], torch.tensor([0.625, 0.375]))
    p = _filtered_probs(logits, None, 0.75)  # 0.5 + 0.3 reaches 0.75: two tokens kept
    assert (p[2:] == 0).all() and p[:2].sum() > 0.79
    first = _filtered_probs(logits, None, 0.1)  # the top token alone
    assert first.tolist()[1:] == [0.0, 0.0, 0.0]


def test_seeded_draws_repeat_and_follow_the_distribution() -> None:
    logits = torch.log(torch.tensor([[0.7, 0.2, 0.1]])).repeat(2000, 1)
    p = [SamplingParams(temperature=1.0)] * 2000
    a = sample(logits, p, [torch.Generator().manual_seed(i) for i in range(2000)])
    b = sample(logits, p, [torch.Generator().manual_seed(i) for i in range(2000)])
    assert a == b
    frac0 = a.count(0) / 2000
    assert 0.64 < frac0 < 0.76, frac0
