"""SamplingParams validation and the batched sampler: filtering, seeding, batch independence."""
from __future__ import annotations

import math

import pytest
import torch

from radixkv.engine.sampling import sample, sampling_rows
from radixkv.sampling_params import SamplingParams
from radixkv.kernels.reference_sampling import gumbel, uniform_bits


@pytest.mark.parametrize("kwargs, word", [
    (dict(temperature=-0.1), "temperature"),
    (dict(temperature=float("nan")), "temperature"),
    (dict(temperature=10**400), "temperature"),
    (dict(temperature="hot"), "temperature"),
    (dict(top_p=0.0), "top_p"),
    (dict(top_p=1.5), "top_p"),
    (dict(top_k=-2), "top_k"),
    (dict(top_k=2.5), "top_k"),
    (dict(top_k=True), "top_k"),
    (dict(min_p=1.5), "min_p"),
    (dict(max_tokens=0), "max_tokens"),
    (dict(seed=1.5), "seed"),
    (dict(stop_token_ids=[-3]), "stop_token_ids"),
])
def test_bad_params_name_the_field(kwargs: dict, word: str) -> None:
    with pytest.raises(ValueError, match=word):
        SamplingParams(**kwargs)


def test_tiny_temperature_is_greedy_and_minus_one_top_k_is_off() -> None:
    assert SamplingParams(temperature=1e-40).greedy and not SamplingParams(temperature=0.01).greedy
    assert SamplingParams(top_k=-1).top_k is None


def _draw(logits: torch.Tensor, params: list[SamplingParams], seeds: list[int], counters: list[int]) -> list[int]:
    rows = sampling_rows(params, seeds, counters, logits.shape[1], logits.device)
    return sample(logits, rows).tolist()


def test_greedy_rows_take_argmax() -> None:
    logits = torch.tensor([[0.0, 3.0, 1.0], [5.0, 0.0, 1.0]])
    assert _draw(logits, [SamplingParams(temperature=0.0)] * 2, [1, 2], [0, 0]) == [1, 0]
    mixed = [SamplingParams(temperature=0.0), SamplingParams(temperature=1.0)]
    assert _draw(logits, mixed, [1, 2], [0, 0])[0] == 1


def test_top_k_top_p_min_p_keep_only_the_head() -> None:
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]])).repeat(4000, 1)
    seeds, counters = list(range(4000)), [0] * 4000
    k2 = _draw(logits, [SamplingParams(top_k=2)] * 4000, seeds, counters)
    assert set(k2) == {0, 1} and 0.58 < k2.count(0) / 4000 < 0.67  # 0.625 renormalised
    p = _draw(logits, [SamplingParams(top_p=0.75)] * 4000, seeds, counters)  # 0.5 + 0.3 reach 0.75
    assert set(p) == {0, 1}
    assert set(_draw(logits, [SamplingParams(top_p=0.1)] * 4000, seeds, counters)) == {0}
    m = _draw(logits, [SamplingParams(min_p=0.35)] * 4000, seeds, counters)  # 0.15 < 0.35 * 0.5
    assert set(m) == {0, 1}


def test_draws_follow_the_distribution_and_repeat() -> None:
    logits = torch.log(torch.tensor([[0.7, 0.2, 0.1]])).repeat(6000, 1)
    params = [SamplingParams(temperature=1.0)] * 6000
    a = _draw(logits, params, list(range(6000)), [3] * 6000)
    assert a == _draw(logits, params, list(range(6000)), [3] * 6000)
    for tok, want in enumerate((0.7, 0.2, 0.1)):
        got = a.count(tok) / 6000
        assert abs(got - want) < 4 * math.sqrt(want * (1 - want) / 6000) + 1e-3, (tok, got)
    b = _draw(logits, params, list(range(6000)), [4] * 6000)  # the next token of each request
    assert sum(x != y for x, y in zip(a, b)) > 1000


def test_a_row_draws_the_same_whatever_shares_its_batch() -> None:
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(5, 50, generator=g)
    params = [SamplingParams(temperature=0.9, top_p=0.9, seed=s) for s in range(5)]
    together = _draw(logits, params, list(range(5)), [7] * 5)
    alone = [_draw(logits[i:i + 1], [params[i]], [i], [7])[0] for i in range(5)]
    reordered = _draw(logits.flip(0), params[::-1], list(range(5))[::-1], [7] * 5)[::-1]
    assert together == alone == reordered


def test_uniform_bits_are_uniform_and_distinct_per_seed() -> None:
    bits = uniform_bits(torch.tensor([0, 1, -5, 2**62]), torch.tensor([0, 0, 9, 1]), 4096)  # [4, 4096]
    assert bits.min() >= 0 and bits.max() < 2**32
    u = bits.double() / 2**32
    assert (u.mean(dim=1) - 0.5).abs().max() < 0.02
    assert len({tuple(r[:8].tolist()) for r in bits}) == 4
    g = gumbel(torch.tensor([3]), torch.tensor([0]), 100000)
    assert torch.isfinite(g).all() and abs(g.mean().item() - 0.5772) < 0.02  # Euler-Mascheroni
