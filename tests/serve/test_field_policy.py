"""The field policy (docs/serving.md; issue 32, item 1): every field of vLLM's CompletionRequest and
ChatCompletionRequest, sent with a non-default value, is honoured (200), accepted because it cannot
change the output (200), or refused with 400 naming it; unknown fields are refused by name."""
from __future__ import annotations

import httpx
import pytest

from radixkv.serve.protocol import ACCEPTED, REFUSED, ChatCompletionRequest, CompletionRequest

C, CHAT = "/v1/completions", "/v1/chat/completions"
MSGS = [{"role": "user", "content": "hi"}]

# vLLM's request fields (vllm/entrypoints/openai: CompletionRequest, ChatCompletionRequest), each with a
# non-default value; OK: honoured or accepted (200), else the refused field's name (400).
OK = "ok"
COMMON = {
    "model": ("tiny-llama", OK), "frequency_penalty": (0.5, OK), "presence_penalty": (0.5, OK),
    "logit_bias": ({"10": 5.0}, OK), "n": (2, OK), "seed": (7, OK), "stop": (["zz"], OK), "stream": (True, OK),
    "stream_options": ({"include_usage": True}, OK), "temperature": (0.5, OK), "top_p": (0.9, OK),
    "user": ("alice", OK), "use_beam_search": (True, "use_beam_search"), "top_k": (0, OK), "min_p": (0.1, OK),
    "repetition_penalty": (1.2, OK), "watermarking": (True, "watermarking"), "length_penalty": (0.5, OK),
    "stop_token_ids": ([7], OK), "include_stop_str_in_output": (True, OK), "ignore_eos": (True, OK),
    "min_tokens": (1, OK), "skip_special_tokens": (False, OK),
    "spaces_between_special_tokens": (False, "spaces_between_special_tokens"),
    "truncate_prompt_tokens": (1, OK), "truncation_side": ("right", "truncation_side"),
    "allowed_token_ids": ([10, 11], OK), "prompt_logprobs": (1, OK),
    "logprob_token_ids": ([3], "logprob_token_ids"), "bad_words": (["a"], OK), "add_special_tokens": (True, OK),
    "response_format": ({"type": "json_object"}, OK),
    "structured_outputs": ({"regex": "a+"}, OK), "guided_json": ({"type": "object"}, OK),
    "guided_regex": ("a+", OK), "guided_choice": (["a", "b"], OK),
    "guided_grammar": ("root ::= \"a\"", OK), "structural_tag": ("{}", "structural_tag"),
    "guided_decoding_backend": ("xgrammar", OK),
    "guided_whitespace_pattern": (" ", "guided_whitespace_pattern"), "priority": (1, "priority"),
    "request_id": ("mine", OK), "session_id": ("s1", OK), "logits_processors": (["m.P"], "logits_processors"),
    "return_tokens_as_token_ids": (True, "return_tokens_as_token_ids"), "return_token_ids": (True, OK),
    "routed_experts_prompt_start": (1, OK), "return_token_offsets": (True, OK), "return_mm_kwargs": (False, OK),
    "cache_salt": ("salt", OK), "kv_transfer_params": ({"a": 1}, "kv_transfer_params"),
    "ec_transfer_params": ({"a": 1}, "ec_transfer_params"), "vllm_xargs": ({"a": 1}, "vllm_xargs"),
    "repetition_detection": ({"max_pattern_size": 4}, "repetition_detection"),
    "thinking_token_budget": (10, "thinking_token_budget"), "stream_interval": (2, OK),
}
COMPLETION = {**COMMON, "prompt": ("hello", OK), "echo": (True, OK), "logprobs": (20, OK), "max_tokens": (3, OK),
              "suffix": ("end", "suffix"), "best_of": (3, "best_of"), "prompt_embeds": ("AAAA", "prompt_embeds")}
CHAT_FIELDS = {**COMMON, "messages": (MSGS, OK), "logprobs": (True, OK), "top_logprobs": (0, OK),
               "max_tokens": (3, OK), "max_completion_tokens": (3, OK), "tools": (
                   [{"type": "function", "function": {"name": "f"}}], OK),
               "tool_choice": ("auto", "tool_choice"),  # without tools: refused by name
               "reasoning_effort": ("low", OK),
               "include_reasoning": (False, OK), "parallel_tool_calls": (False, OK), "best_of": (3, "best_of"),
               "echo": (True, OK), "add_generation_prompt": (False, OK), "continue_final_message": (True, OK),
               "documents": ([{"title": "t", "text": "x"}], OK), "chat_template": ("{{ messages[0]['content'] }}", "chat_template"),  # unless trusted
               "chat_template_kwargs": ({"x": 1}, OK), "mm_processor_kwargs": ({"a": 1}, "mm_processor_kwargs"),
               "media_io_kwargs": ({"image": {}}, "media_io_kwargs"), "return_prompt_text": (True, "return_prompt_text")}
NEEDS = {"continue_final_message": {"add_generation_prompt": False}, "stream_options": {"stream": True},
         "prompt_logprobs": {"stream": False},
         "top_logprobs": {"logprobs": True}}


def _cases(path: str, fields: dict) -> list:
    return [(path, name, value, want) for name, (value, want) in fields.items()]


CASES = _cases(C, COMPLETION) + _cases(CHAT, CHAT_FIELDS)


def test_every_field_has_a_policy() -> None:
    for model, fields in ((CompletionRequest, COMPLETION), (ChatCompletionRequest, CHAT_FIELDS)):
        for name in fields:
            assert name in model.model_fields or name in ACCEPTED or name in REFUSED, name


@pytest.mark.parametrize("path,name,value,want", CASES, ids=[f"{'chat' if p == CHAT else 'cmpl'}-{n}" for p, n, _, _ in CASES])
def test_field_is_honoured_or_refused_by_name(server, path, name, value, want) -> None:
    base = {"prompt": "hello", "max_tokens": 3} if path == C else {"messages": MSGS, "max_tokens": 3}
    body = {**base, **NEEDS.get(name, {}), name: value}
    r = httpx.post(server.url + path, json=body, timeout=60)
    if want == OK:
        assert r.status_code == 200, (name, r.text)
    else:
        assert r.status_code == 400, (name, r.text)
        err = r.json()["error"]
        assert err["param"] == want and want in err["message"] and err["type"] == "invalid_request_error", err


@pytest.mark.parametrize("path", [C, CHAT])
def test_neutral_values_of_refused_fields_are_accepted(server, path) -> None:
    base = {"prompt": "hello", "max_tokens": 2} if path == C else {"messages": MSGS, "max_tokens": 2}
    neutral = {"use_beam_search": False, "priority": 0, "guided_json": None, "structured_outputs": None,
               "spaces_between_special_tokens": True, "prompt_logprobs": None, "logits_processors": [],
               "vllm_xargs": {}, "thinking_token_budget": -1}
    r = httpx.post(server.url + path, json={**base, **neutral}, timeout=60)
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("path", [C, CHAT])
def test_unknown_field_is_refused_by_name(server, path) -> None:
    base = {"prompt": "hello"} if path == C else {"messages": MSGS}
    r = httpx.post(server.url + path, json={**base, "frobnicate": 1}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == "frobnicate", r.text
    other = "max_completion_tokens" if path == C else "suffix"  # the other endpoint's field
    r = httpx.post(server.url + path, json={**base, other: 3}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == other, r.text


def _ids(server, text: str) -> list[int]:
    return list(server.engine.tokenizer(text, add_special_tokens=False).input_ids)


def _completion(server, **kw) -> dict:
    body = {"prompt": "hello", "max_tokens": 6, "temperature": 0, "ignore_eos": True, "return_token_ids": True, **kw}
    r = httpx.post(f"{server.url}{C}", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]


def test_logit_bias_allowed_token_ids_and_bad_words_are_honoured(server) -> None:
    [q] = _ids(server, "Q")
    assert _completion(server, logit_bias={str(q): 100})["token_ids"] == [q] * 6
    allowed = _ids(server, "ab")
    out = _completion(server, allowed_token_ids=allowed, temperature=1.0, seed=1)["token_ids"]
    assert set(out) <= set(allowed)
    plain = _completion(server)
    word = plain["text"][0]
    assert word.strip()
    banned = _completion(server, bad_words=[word])
    assert word not in banned["text"]
    chat = httpx.post(f"{server.url}{CHAT}", json={"messages": MSGS, "max_tokens": 4, "temperature": 0,
                                                   "logit_bias": {str(q): 100}, "return_token_ids": True}, timeout=60)
    assert chat.status_code == 200 and chat.json()["choices"][0]["token_ids"] == [q] * 4


def test_top_k_zero_logprobs_twenty_and_many_stop_strings(server) -> None:
    a = _completion(server, temperature=1.0, seed=5, top_k=0)
    b = _completion(server, temperature=1.0, seed=5)
    assert a["token_ids"] == b["token_ids"]
    lp = _completion(server, logprobs=20)["logprobs"]
    # keyed by token text, so tokens that decode alike (special ones to "") share a key
    assert len(lp["tokens"]) == 6 and all(len(d) >= 10 for d in lp["top_logprobs"])
    stops = [f"stop{i}" for i in range(40)]
    assert _completion(server, stop=stops)["finish_reason"] in ("length", "stop")
    r = httpx.post(f"{server.url}{CHAT}", json={"messages": MSGS, "max_tokens": 2, "logprobs": True,
                                                "top_logprobs": 20}, timeout=60)
    assert r.status_code == 200 and len(r.json()["choices"][0]["logprobs"]["content"][0]["top_logprobs"]) == 20


@pytest.mark.parametrize("path,body,param", [
    (C, {"logit_bias": {"99999": 1}}, "logit_bias"),
    (C, {"logit_bias": {"3": 101}}, "logit_bias"),
    (C, {"logit_bias": {"x": 1}}, "logit_bias"),
    (C, {"allowed_token_ids": [99999]}, "allowed_token_ids"),
    (C, {"allowed_token_ids": []}, "allowed_token_ids"),
    (C, {"bad_words": [""]}, "bad_words"),
    (C, {"top_k": -2}, "top_k"),
    (C, {"logprobs": 21}, "logprobs"),
    (C, {"max_tokens": 0}, "max_tokens"),
    (C, {"prompt_logprobs": 1, "stream": True}, "prompt_logprobs"),
    (C, {"prompt_logprobs": 21}, "prompt_logprobs"),
    (C, {"truncate_prompt_tokens": 0}, "truncate_prompt_tokens"),
    (CHAT, {"top_logprobs": 21, "logprobs": True}, "top_logprobs"),
    (CHAT, {"allowed_token_ids": [-1]}, "allowed_token_ids"),
])
def test_bad_values_of_the_new_controls_are_400_naming_them(server, path, body, param) -> None:
    base = {"prompt": "hello"} if path == C else {"messages": MSGS}
    r = httpx.post(server.url + path, json={**base, **body}, timeout=30)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param, r.text
