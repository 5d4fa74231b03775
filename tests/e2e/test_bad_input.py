"""Bad input raises a clear exception before anything is scheduled; in-flight work is unaffected."""
from __future__ import annotations

import pytest

from radixkv import LLM, SamplingParams

from .tiny_models import VOCAB, tiny_config

GREEDY = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)


@pytest.fixture(scope="module")
def llm() -> LLM:
    return LLM(tiny_config("llama", max_position_embeddings=64), page_size=4, num_pages=64)


@pytest.mark.parametrize("prompt, exc, words", [
    ([], ValueError, "prompt 1 is empty"),
    ([5, VOCAB], ValueError, f"token id {VOCAB} is outside the vocabulary"),
    ([5, -1], ValueError, "token id -1 is outside the vocabulary"),
    ([5, 2.5], TypeError, "not an integer"),
    ("hello", ValueError, "no tokenizer"),
    (list(range(3, 62)), ValueError, "exceeds the model's context of 64"),
    (7, TypeError, "must be a string or a sequence of token ids"),
])
def test_bad_prompt_raises_and_in_flight_request_finishes(llm: LLM, prompt, exc, words: str) -> None:
    good = [5, 6, 7, 8, 9, 10, 11]
    alone = llm.generate([good], GREEDY)[0].token_ids
    (inflight,) = llm.add_requests([good], GREEDY)
    llm.step()  # the good request is now running, its prefill done
    queued = llm.core.scheduler.has_work()
    with pytest.raises(exc, match=words):
        llm.add_requests([[3, 4, 5], prompt], GREEDY)  # all or nothing: [3, 4, 5] is not queued either
    assert queued and llm.has_work()
    finished = []
    while llm.has_work():
        finished += llm.step()
    assert [r.rid for r in finished] == [inflight.rid]
    assert inflight.output == alone


def test_bad_engine_options_name_the_problem() -> None:
    cfg = tiny_config("llama")
    with pytest.raises(ValueError, match="unknown kv_dtype 'int3'"):
        LLM(cfg, kv_dtype="int3")
    with pytest.raises(ValueError, match="unknown dtype 'float8'"):
        LLM(cfg, dtype="float8")
    with pytest.raises(TypeError, match="PretrainedConfig"):
        LLM(42)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        LLM("/nonexistent/model/folder")


def test_params_list_must_match_prompts(llm: LLM) -> None:
    with pytest.raises(ValueError, match="2 prompts but 1 SamplingParams"):
        llm.generate([[4, 5], [6, 7]], [GREEDY])
    with pytest.raises(TypeError, match="sampling_params must be a SamplingParams or a list of them, got 'greedy'"):
        llm.generate([[4, 5]], "greedy")


def test_request_larger_than_the_pool_is_refused() -> None:
    small = LLM(tiny_config("llama"), page_size=4, num_pages=3)
    with pytest.raises(ValueError, match="more than the pool's 3"):
        small.generate([[4] * 10], GREEDY)


def test_bool_token_ids_are_refused(llm: LLM) -> None:
    with pytest.raises(TypeError, match="not an integer"):
        llm.generate([[5, True]], GREEDY)


def test_kv_dtype_spellings_from_vllm_and_torch() -> None:
    import torch

    cfg = tiny_config("llama")
    for given, kind in (("fp8", "fp8_e4m3"), ("bfloat16", "bf16"), (torch.float16, "fp16"), ("float32", "fp32")):
        assert LLM(cfg, kv_dtype=given, num_pages=4).runner.kv_dtype.value == kind


def test_bare_prompt_of_numpy_ints_is_one_prompt(llm: LLM) -> None:
    import numpy as np

    good = [5, 6, 7, 8]
    want = llm.generate([good], GREEDY)[0].token_ids
    assert [o.token_ids for o in llm.generate(np.array(good), GREEDY)] == [want]
    assert [o.token_ids for o in llm.generate([np.int64(t) for t in good], GREEDY)] == [want]


def test_bad_generate_leaks_nothing(llm: LLM) -> None:
    good = [[5, 6, 7, 8, 9, 10, 11], [5, 6, 7, 12]]
    want = [o.token_ids for o in llm.generate(good, GREEDY)]
    for bad in ([], [5, VOCAB], "text", list(range(3, 70))):
        with pytest.raises((ValueError, TypeError)):
            llm.generate([good[0], bad], GREEDY)
        assert not llm.has_work()
    assert [o.token_ids for o in llm.generate(good, GREEDY)] == want
    assert llm.reset_prefix_cache()
    assert llm.core.pool.num_free == llm.num_pages
