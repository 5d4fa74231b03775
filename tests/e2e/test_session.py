"""Multi-turn sessions reuse the KV of every earlier turn."""
from __future__ import annotations

import pytest

from radixkv import LLM, SamplingParams

PARAMS = SamplingParams(temperature=0.0, max_tokens=12)


@pytest.mark.parametrize("template", ["chatml", "plain"])
@pytest.mark.parametrize("page_size", [1, 16])
def test_second_turn_hits_the_whole_first_exchange(model_folder, template: str, page_size: int) -> None:
    llm = LLM(model_folder("qwen2", tokenizer=template), page_size=page_size, num_pages=2048 // page_size)
    chat = llm.session(system="You are terse.", params=PARAMS)
    first = chat.send("What is 2+2?")
    assert isinstance(first, str)
    first_exchange = len(chat.history)  # prompt + reply of turn 1
    assert chat.outputs[0].cached_tokens == 0
    chat.send("And 3+3?")
    # the last generated token has no KV yet; only full pages are shared
    assert chat.last.cached_tokens >= (first_exchange - 1) // page_size * page_size
    assert chat.last.cached_tokens >= first_exchange - page_size
    two_exchanges = len(chat.history)
    chat.send("Thanks!")
    assert chat.last.cached_tokens >= (two_exchanges - 1) // page_size * page_size
    assert chat.last.prompt_token_ids[:two_exchanges] == chat.outputs[1].prompt_token_ids + chat.outputs[1].token_ids
    if template == "chatml":
        rendered = llm.tokenizer.apply_chat_template(chat.messages[:-1], add_generation_prompt=False,
                                                     tokenize=False)
        assert rendered.startswith("<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nWhat is 2+2?")


def test_session_reply_equals_generate_on_the_same_tokens(model_folder) -> None:
    llm = LLM(model_folder("llama", tokenizer="chatml"), page_size=4, num_pages=512)
    chat = llm.session(system=None, params=PARAMS)
    chat.send("hi")
    chat.send("more")
    prompt2 = chat.outputs[1].prompt_token_ids
    again = llm.generate([prompt2], PARAMS)[0]
    assert again.token_ids == chat.outputs[1].token_ids
    assert again.cached_tokens >= len(prompt2) - 4


def test_token_id_session_without_tokenizer(model_folder) -> None:
    llm = LLM(model_folder("mistral"), page_size=2, num_pages=512)
    chat = llm.session(params=SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True))
    r1 = chat.send([5, 6, 7, 8, 9])
    assert len(r1) == 5
    chat.send([10, 11])
    assert chat.last.prompt_token_ids == [5, 6, 7, 8, 9] + r1 + [10, 11]
    assert chat.last.cached_tokens == 8  # 10 tokens with KV, page 2 -> all of them
    with pytest.raises(ValueError, match="no tokenizer"):
        chat.send("text")


def test_system_prompt_without_tokenizer_is_ids_or_refused(model_folder) -> None:
    llm = LLM(model_folder("mistral"), page_size=2, num_pages=512)
    params = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)
    with pytest.raises(ValueError, match="system prompt is text but the model has no tokenizer"):
        llm.session(system="You are terse.")
    with pytest.raises(ValueError, match="outside the vocabulary"):
        llm.session(system=[5, 10**6])
    chat = llm.session(system=[20, 21, 22, 23], params=params)
    reply = chat.send([5, 6])
    assert chat.last.prompt_token_ids == [20, 21, 22, 23, 5, 6]
    assert reply == llm.generate([[20, 21, 22, 23, 5, 6]], params)[0].token_ids
