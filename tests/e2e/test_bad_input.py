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
    queued = llm.scheduler.has_work()
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


def test_request_larger_than_the_pool_is_refused() -> None:
    small = LLM(tiny_config("llama"), page_size=4, num_pages=3)
    with pytest.raises(ValueError, match="more than the pool's 3"):
        small.generate([[4] * 10], GREEDY)
