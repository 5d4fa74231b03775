"""Completions and chat over HTTP equal the offline engine; streaming equals non-streaming;
cached_tokens; tenants; /v1/models, /health, /metrics, /reset_prefix_cache."""
from __future__ import annotations

import httpx

from .conftest import MODEL_NAME, offline, sse_chunks

PROMPT = "The quick brown fox jumps over the lazy dog. "


def test_completion_matches_generate_and_stream(server) -> None:
    want = offline(server, PROMPT, 8, ignore_eos=True)
    body = {"model": MODEL_NAME, "prompt": PROMPT, "max_tokens": 8, "temperature": 0, "ignore_eos": True,
            "return_token_ids": True}
    r = httpx.post(f"{server.url}/v1/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["object"] == "text_completion" and out["model"] == MODEL_NAME
    [choice] = out["choices"]
    assert choice["token_ids"] == want.token_ids and choice["text"] == want.text
    assert choice["finish_reason"] == "length"
    u = out["usage"]
    assert u["prompt_tokens"] == len(want.prompt_token_ids) and u["completion_tokens"] == 8
    assert u["total_tokens"] == u["prompt_tokens"] + 8
    # the same prompt again hits the blocks the first requests cached
    assert u["prompt_tokens_details"]["cached_tokens"] > 0

    with httpx.stream("POST", f"{server.url}/v1/completions", timeout=60,
                      json={**body, "stream": True, "stream_options": {"include_usage": True}}) as resp:
        assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/event-stream")
        chunks = sse_chunks(resp)
    usage = chunks[-1]["usage"]
    chunks = chunks[:-1]
    assert "".join(c["choices"][0]["text"] for c in chunks) == want.text
    assert sum((c["choices"][0]["token_ids"] for c in chunks), []) == want.token_ids
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-1])
    assert usage["completion_tokens"] == 8 and usage["prompt_tokens_details"]["cached_tokens"] > 0


def test_token_id_prompts_and_lists(server) -> None:
    prompts = [[5, 6, 7, 8, 9] * 4, [10, 11, 12] * 7]
    want = [offline(server, p, 5, ignore_eos=True).token_ids for p in prompts]
    r = httpx.post(f"{server.url}/v1/completions", timeout=60, json={
        "prompt": prompts, "max_tokens": 5, "temperature": 0, "ignore_eos": True, "return_token_ids": True})
    assert r.status_code == 200, r.text
    choices = r.json()["choices"]
    assert [c["index"] for c in choices] == [0, 1]
    assert [c["token_ids"] for c in choices] == want
    r1 = httpx.post(f"{server.url}/v1/completions", timeout=60, json={
        "prompt": prompts[0], "max_tokens": 5, "temperature": 0, "ignore_eos": True, "return_token_ids": True})
    assert r1.json()["choices"][0]["token_ids"] == want[0]


def test_chat_uses_template_and_matches_generate(server) -> None:
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there!"}]
    tok = server.llm.tokenizer
    ids = tok(tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True),
              add_special_tokens=False).input_ids
    want = offline(server, ids, 6, ignore_eos=True)
    body = {"model": MODEL_NAME, "messages": messages, "max_tokens": 6, "temperature": 0, "ignore_eos": True,
            "return_token_ids": True}
    r = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["object"] == "chat.completion" and out["prompt_token_ids"] == ids
    msg = out["choices"][0]["message"]
    assert msg["role"] == "assistant" and msg["content"] == want.text
    assert out["choices"][0]["token_ids"] == want.token_ids

    with httpx.stream("POST", f"{server.url}/v1/chat/completions", json={**body, "stream": True},
                      timeout=60) as resp:
        chunks = sse_chunks(resp)
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    assert text == want.text and chunks[-1]["choices"][0]["finish_reason"] == "length"

    # a chat_template override renders the prompt instead of the tokenizer's (on a server that trusts them)
    from fastapi.testclient import TestClient

    from radixkv.serve.app import create_app

    plain = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}assistant:"
    trusting = TestClient(create_app(None, engine=server.engine, served_model_name=MODEL_NAME,
                                     trust_request_chat_template=True))
    r = trusting.post("/v1/chat/completions", json={**body, "chat_template": plain})
    assert r.status_code == 200, r.text
    assert r.json()["prompt_token_ids"] == tok("system: Be brief.\nuser: Hi there!\nassistant:",
                                               add_special_tokens=False).input_ids


def test_stop_string_ends_the_text(server) -> None:
    want = offline(server, PROMPT + "x", 12, ignore_eos=True)
    assert len(want.text) >= 4
    stop = want.text[2:4]
    r = httpx.post(f"{server.url}/v1/completions", timeout=60, json={
        "prompt": PROMPT + "x", "max_tokens": 12, "temperature": 0, "ignore_eos": True, "stop": [stop]})
    choice = r.json()["choices"][0]
    assert choice["text"] == want.text[: want.text.index(stop)] and choice["finish_reason"] == "stop"
    assert server.pool_whole()


def test_tenants_never_share_prefixes(server) -> None:
    prompt = "Tenant isolation: a long shared system prompt that fills several pages. " * 2
    body = {"prompt": prompt, "max_tokens": 2, "temperature": 0, "ignore_eos": True}

    def cached(**extra) -> int:
        r = httpx.post(f"{server.url}/v1/completions", json={**body, **extra}, timeout=60)
        assert r.status_code == 200, r.text
        return r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]

    assert cached(cache_salt="tenant-a") == 0
    assert cached(cache_salt="tenant-a") > 0  # the same tenant hits its own prefix
    assert cached(cache_salt="tenant-b") == 0  # another tenant never sees it
    assert cached() == 0  # nor does the unsalted namespace
    assert cached(cache_salt="tenant-b") > 0


def test_models_health_metrics_reset(server) -> None:
    r = httpx.get(f"{server.url}/v1/models")
    assert [m["id"] for m in r.json()["data"]] == [MODEL_NAME]
    assert httpx.get(f"{server.url}/health").status_code == 200
    httpx.post(f"{server.url}/v1/completions", timeout=60,
               json={"prompt": PROMPT * 2, "max_tokens": 3, "temperature": 0})
    httpx.post(f"{server.url}/v1/completions", timeout=60,
               json={"prompt": PROMPT * 2, "max_tokens": 3, "temperature": 0})
    text = httpx.get(f"{server.url}/metrics").text
    for series in ("radixkv:prompt_tokens_total", "radixkv:generation_tokens_total",
                   "radixkv:prefix_cache_queries_total", "radixkv:prefix_cache_hits_total",
                   "radixkv:num_requests_running", "radixkv:num_requests_waiting", "radixkv:kv_cache_usage_perc",
                   "radixkv:time_to_first_token_seconds_bucket", "radixkv:e2e_request_latency_seconds_bucket",
                   "radixkv:time_per_output_token_seconds_bucket", "radixkv:request_success_total",
                   "radixkv:num_preemptions_total", "radixkv:http_requests_total"):
        assert series in text, series
    hits = [line for line in text.splitlines() if line.startswith("radixkv:prefix_cache_hits_total{")]
    assert float(hits[0].split()[-1]) > 0
    assert 'endpoint="/v1/completions"' in text and f'model_name="{MODEL_NAME}"' in text
    assert httpx.post(f"{server.url}/reset_prefix_cache").status_code == 404  # only when the operator enables it
    from fastapi.testclient import TestClient

    from radixkv.serve.app import create_app

    r = TestClient(create_app(None, engine=server.engine, enable_reset_prefix_cache=True)).post("/reset_prefix_cache")
    assert r.status_code == 200 and r.json() == {"success": True}
    assert server.pool_whole()
