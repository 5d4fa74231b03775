"""LLM(cascade=True) on the CPU reference path: decode steps whose rows share cached prefix pages attend
through the cascade twins (reference.cascade_decode_ref) and give plain decode's greedy tokens."""
from __future__ import annotations

import functools
import types

import pytest
import torch

from radixkv import LLM, SamplingParams
from radixkv.batch import Batch
from radixkv.engine.cuda_graphs import DecodeGraphs
from radixkv.scheduler.cascade_groups import (
    RULE_16BIT,
    RULE_ALWAYS,
    RULE_FP8,
    RULE_NEVER,
    CascadeRule,
)

from .tiny_models import tiny_config

GREEDY = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)


def _few_shot(seed: int = 7) -> tuple[list[list[int]], list[list[int]]]:
    """Warm-up prompts (a system prompt + each of two few-shot blocks) and questions over them:
    4 per block, plus an unrelated prompt (a row in no group)."""
    g = torch.Generator().manual_seed(seed)

    def rand(n: int) -> list[int]:
        return torch.randint(3, 160, (n,), generator=g).tolist()

    system = rand(24)
    blocks = [system + rand(40), system + rand(33)]
    questions = [b + rand(3 + 2 * i) for b in blocks for i in range(4)] + [rand(17)]
    return blocks, questions


def _run(kv_dtype: str, cascade: bool, outer_rule: CascadeRule | None = None) -> tuple[LLM, list[list[int]]]:
    llm = LLM(tiny_config("llama"), dtype="float32", kv_dtype=kv_dtype, page_size=4, num_pages=512,
              cascade=cascade)
    if cascade:
        llm.core.scheduler.cascade_rule = RULE_ALWAYS  # any shared page of any 2 rows: the tiny batch groups
    if outer_rule is not None:
        llm.runner.attention.cascade_outer_rule = outer_rule
    blocks, questions = _few_shot()
    llm.generate(blocks, SamplingParams(temperature=0.0, max_tokens=1))  # the blocks enter the radix tree
    return llm, [o.token_ids for o in llm.generate(questions, GREEDY)]


@functools.cache
def _plain(kv_dtype: str) -> tuple[LLM, list[list[int]]]:
    return _run(kv_dtype, cascade=False)


@pytest.mark.parametrize("kv_dtype", ["fp32", "fp8_e4m3"])
def test_cascade_greedy_equals_plain_decode(kv_dtype: str) -> None:
    plain, want = _plain(kv_dtype)
    llm, got = _run(kv_dtype, cascade=True)
    assert got == want
    assert plain.runner.attention.cascade_steps == 0
    assert llm.runner.attention.cascade_steps >= GREEDY.max_tokens - 1  # every decode step of the batch grouped
    assert llm.runner.attention.two_level_steps == 0  # two units over a 24-token system prompt: OUTER_RULE says no


def test_two_level_cascade_greedy_equals_plain_decode() -> None:
    """The system prompt as an outer group over the two few-shot blocks' groups (its rows read it once),
    the blocks after it, each row's own pages: plain decode's greedy tokens."""
    _, want = _plain("fp32")
    llm, got = _run("fp32", cascade=True, outer_rule=RULE_ALWAYS)
    assert got == want
    assert llm.runner.attention.two_level_steps >= GREEDY.max_tokens - 1


def test_cascade_rule_follows_the_kv_dtype() -> None:
    cfg = tiny_config("llama")
    for kv_dtype, rule in (("fp32", RULE_16BIT), ("fp8_e4m3", RULE_FP8), ("int4", RULE_NEVER)):
        assert LLM(cfg, dtype="float32", kv_dtype=kv_dtype, num_pages=16, cascade=True).core.scheduler.cascade_rule == rule


def test_cascade_steps_fit_cuda_graphs_only_with_cascade_buffers_and_few_groups() -> None:
    from radixkv.engine.cascade_inputs import MAX_GROUPS, CascadeInputs

    batch = Batch(requests=[object()], input_ids=[5], positions=[0], q_start=[0], q_lens=[1], seq_lens=[1],
                  page_tables=[[0]], slots=[0], sample=[True], page_size=4)
    graphs = types.SimpleNamespace(max_rows=8, max_pages=8, _cascade=None)
    assert DecodeGraphs.fits(graphs, batch)
    batch.cascade = types.SimpleNamespace(one_level=[object()] * 2)  # type: ignore[assignment]
    assert not DecodeGraphs.fits(graphs, batch)  # an engine built without cascade=True
    graphs._cascade = CascadeInputs(8, 8, 4, 0, torch.device("cpu"))
    assert DecodeGraphs.fits(graphs, batch)
    batch.cascade.levels = ((object(),), (object(),) * 2)  # two levels: replayed as its one level
    assert DecodeGraphs.fits(graphs, batch)
    batch.cascade.one_level = [object()] * (MAX_GROUPS + 1)
    assert not DecodeGraphs.fits(graphs, batch)  # more groups than the static plan holds: eager
