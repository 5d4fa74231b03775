"""Prompt logprobs through the server (issue 32, item 2): echo with logprobs (what lm-eval and older
scorers send), max_tokens 0 with echo, vLLM's prompt_logprobs, truncate_prompt_tokens and chat echo,
checked against the offline API on the same engine, with httpx and the official openai client."""
from __future__ import annotations

import httpx
import pytest

from radixkv import SamplingParams

from .conftest import MODEL_NAME, sse_chunks

C = "/v1/completions"
PROMPT = "hello there, general"


def _offline(server, k: int) -> tuple[list[int], list]:
    out = server.engine.call(lambda llm: llm.generate(
        [PROMPT], SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=k))[0]).result(60)
    return out.prompt_token_ids, out.prompt_logprobs


def _post(server, **body) -> dict:
    r = httpx.post(server.url + C, json={"prompt": PROMPT, "temperature": 0, **body}, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def test_echo_with_logprobs_scores_the_prompt_as_lm_eval_reads_it(server) -> None:
    ids, want = _offline(server, 1)
    tok = server.llm.tokenizer
    body = _post(server, echo=True, logprobs=1, max_tokens=1)
    c = body["choices"][0]
    lp = c["logprobs"]
    assert c["text"].startswith(tok.decode(ids, skip_special_tokens=False))
    assert len(lp["tokens"]) == len(ids) + 1 and lp["tokens"][: len(ids)] == [tok.decode([t]) for t in ids]
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    assert lp["token_logprobs"][1:-1] == pytest.approx([d[t].logprob for d, t in zip(want[1:], ids[1:])])
    for top, d, t in zip(lp["top_logprobs"][1:-1], want[1:], ids[1:]):
        assert top[tok.decode([t])] == pytest.approx(d[t].logprob) and 1 <= len(top) <= 2
    assert lp["text_offset"] == sorted(lp["text_offset"])
    assert body["usage"]["completion_tokens"] == 1


def test_max_tokens_zero_with_echo_returns_the_prompt_alone(server) -> None:
    ids, want = _offline(server, 0)
    body = _post(server, echo=True, logprobs=0, max_tokens=0, return_token_ids=True)
    c = body["choices"][0]
    assert c["text"] == server.llm.tokenizer.decode(ids, skip_special_tokens=False)
    assert c["token_ids"] == [] and c["finish_reason"] == "length"
    assert len(c["logprobs"]["tokens"]) == len(ids)
    assert c["logprobs"]["token_logprobs"][1:] == pytest.approx([d[t].logprob for d, t in zip(want[1:], ids[1:])])
    assert body["usage"] == {**body["usage"], "completion_tokens": 0, "prompt_tokens": len(ids)}
    r = httpx.post(server.url + C, json={"prompt": PROMPT, "echo": True, "logprobs": 0, "max_tokens": 0,
                                         "stream": True}, timeout=60)
    chunks = sse_chunks(r)
    text = "".join(ch["choices"][0]["text"] for ch in chunks)
    tokens = sum((ch["choices"][0]["logprobs"]["tokens"] for ch in chunks if ch["choices"][0]["logprobs"]), [])
    assert text == c["text"] and len(tokens) == len(ids)
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert server.pool_whole()


def test_streamed_echo_with_logprobs_equals_the_whole_answer(server) -> None:
    whole = _post(server, echo=True, logprobs=2, max_tokens=4, ignore_eos=True)["choices"][0]
    r = httpx.post(server.url + C, json={"prompt": PROMPT, "temperature": 0, "echo": True, "logprobs": 2,
                                         "max_tokens": 4, "ignore_eos": True, "stream": True}, timeout=60)
    chunks = sse_chunks(r)
    assert "".join(ch["choices"][0]["text"] for ch in chunks) == whole["text"]
    streamed = [ch["choices"][0]["logprobs"] for ch in chunks if ch["choices"][0]["logprobs"]]
    tokens, lps = (sum((s[key] for s in streamed), []) for key in ("tokens", "token_logprobs"))
    assert tokens == whole["logprobs"]["tokens"]
    assert lps[0] is None and lps[1:] == pytest.approx(whole["logprobs"]["token_logprobs"][1:])


def test_vllm_prompt_logprobs_field(server) -> None:
    ids, want = _offline(server, 2)
    c = _post(server, prompt_logprobs=2, max_tokens=2)["choices"][0]
    got = c["prompt_logprobs"]
    assert got[0] is None and len(got) == len(ids)
    for d, ref, t in zip(got[1:], want[1:], ids[1:]):
        assert d[str(t)]["logprob"] == pytest.approx(ref[t].logprob) and d[str(t)]["rank"] == ref[t].rank
        assert d[str(t)]["decoded_token"] == ref[t].decoded_token and 1 <= len(d) <= 3
    chat = httpx.post(server.url + "/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1, "prompt_logprobs": 0}, timeout=60)
    assert chat.status_code == 200 and chat.json()["choices"][0]["prompt_logprobs"][0] is None


def test_truncate_prompt_tokens_keeps_the_prompts_end(server) -> None:
    body = _post(server, truncate_prompt_tokens=3, max_tokens=2, return_token_ids=True)
    full = list(server.llm.tokenizer(PROMPT).input_ids)
    assert body["choices"][0]["prompt_token_ids"] == full[-3:] and body["usage"]["prompt_tokens"] == 3


def test_chat_echo_prepends_the_assistant_message_being_continued(server) -> None:
    msgs = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Well,"}]
    r = httpx.post(server.url + "/v1/chat/completions", json={
        "messages": msgs, "max_tokens": 3, "echo": True, "add_generation_prompt": False,
        "continue_final_message": True, "temperature": 0}, timeout=60)
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"].startswith("Well,")
    r = httpx.post(server.url + "/v1/chat/completions", json={
        "messages": msgs[:1], "max_tokens": 3, "echo": True, "temperature": 0}, timeout=60)
    plain = httpx.post(server.url + "/v1/chat/completions", json={
        "messages": msgs[:1], "max_tokens": 3, "temperature": 0}, timeout=60)
    assert r.json()["choices"][0]["message"] == plain.json()["choices"][0]["message"]  # last is the user's


def test_the_openai_client_reads_echoed_prompt_logprobs(server) -> None:
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused")
    ids, want = _offline(server, 1)
    out = client.completions.create(model=MODEL_NAME, prompt=PROMPT, echo=True, logprobs=1, max_tokens=0,
                                    temperature=0)
    lp = out.choices[0].logprobs
    assert lp.token_logprobs[0] is None and len(lp.tokens) == len(ids)
    assert lp.token_logprobs[1:] == pytest.approx([d[t].logprob for d, t in zip(want[1:], ids[1:])])
    assert out.usage.completion_tokens == 0
