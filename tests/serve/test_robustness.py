"""Bad bodies -> 400 naming the field; API key; a disconnect aborts and frees pages; a failing
step fails only its request; concurrent requests share steps."""
from __future__ import annotations

import json
import threading
import time

import httpx
import pytest

from .conftest import MODEL_NAME, offline

BAD = [
    ("/v1/completions", {}, "prompt"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": -1}, "max_tokens"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": "many"}, "max_tokens"),
    ("/v1/completions", {"prompt": "hi", "temperature": "hot"}, "temperature"),
    ("/v1/completions", {"prompt": "hi", "top_p": 0}, "top_p"),
    ("/v1/completions", {"prompt": "hi", "top_k": -2}, "top_k"),
    ("/v1/completions", {"prompt": "hi", "n": 0}, "n"),
    ("/v1/completions", {"prompt": [[]]}, "prompt"),
    ("/v1/completions", {"prompt": []}, "prompt"),
    ("/v1/completions", {"prompt": [99999]}, "prompt"),  # outside the vocabulary
    ("/v1/completions", {"prompt": "hi", "logprobs": -1}, "logprobs"),
    ("/v1/completions", {"prompt": "hi", "presence_penalty": 3}, "presence_penalty"),
    ("/v1/completions", {"prompt": "hi", "repetition_penalty": 0}, "repetition_penalty"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 2, "min_tokens": 5}, "min_tokens"),
    ("/v1/completions", {"prompt": "hi", "logit_bias": {"99999": 1.0}}, "logit_bias"),  # outside the vocabulary
    ("/v1/completions", {"prompt": "x" * 600}, "prompt"),  # longer than the 512-token context
    ("/v1/completions", {"prompt": "x" * 400, "max_tokens": 200}, "prompt"),  # prompt + output too long
    ("/v1/completions", {"prompt": "hi", "cache_salt": ""}, "cache_salt"),
    ("/v1/completions", {"prompt": "hi", "stream_options": {"include_usage": "maybe"}},
     "stream_options.include_usage"),
    ("/v1/chat/completions", {"messages": []}, "messages"),
    ("/v1/chat/completions", {"messages": [{"content": "hi"}]}, "messages.0.role"),
    ("/v1/chat/completions", {"messages": "hi"}, "messages"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "chat_template": "{% for %}"},
     "chat_template"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "top_logprobs": 2}, "top_logprobs"),
]


@pytest.mark.parametrize("path,body,param", BAD, ids=[f"{p.split('/')[-1]}-{b}"[:60] for p, b, _ in BAD])
def test_bad_body_is_400_naming_the_field(server, path, body, param) -> None:
    r = httpx.post(server.url + path, json=body, timeout=30)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["param"] == param and err["message"], err


def test_bad_json_unknown_model_and_serving_goes_on(server) -> None:
    r = httpx.post(f"{server.url}/v1/completions", content=b"{not json", timeout=30,
                   headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "body"
    r = httpx.post(f"{server.url}/v1/completions", json={"model": "gpt-9", "prompt": "hi"}, timeout=30)
    assert r.status_code == 404 and r.json()["error"]["param"] == "model"
    r = httpx.post(f"{server.url}/v1/completions", json={"prompt": "still serving", "max_tokens": 2}, timeout=30)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] >= 1
    assert server.pool_whole()


def test_api_key(server) -> None:
    from fastapi.testclient import TestClient

    from radixkv.serve.app import create_app

    app = create_app(server.llm, served_model_name=MODEL_NAME, api_key="sekret", engine=server.engine)
    client = TestClient(app)
    r = client.get("/v1/models")
    assert r.status_code == 401 and r.json()["error"]["type"] == "AuthenticationError"
    assert client.get("/v1/models", headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert client.post("/reset_prefix_cache").status_code == 401
    assert client.get("/v1/models", headers={"Authorization": "Bearer sekret"}).status_code == 200
    r = client.post("/v1/completions", headers={"Authorization": "Bearer sekret"},
                    json={"prompt": "hi", "max_tokens": 2})
    assert r.status_code == 200
    assert client.get("/health").status_code == 200 and client.get("/metrics").status_code == 200


def test_disconnect_aborts_and_frees_pages(server) -> None:
    body = {"prompt": "A long story: " * 3, "max_tokens": 400, "temperature": 0, "ignore_eos": True,
            "stream": True}
    with httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=60) as resp:
        for line in resp.iter_lines():
            if line.startswith("data: ") and json.loads(line[6:])["choices"][0]["text"]:
                break  # one delta read, then hang up
    t0 = time.monotonic()
    assert server.pool_whole(timeout=10)  # aborted, not run to its 400 tokens
    assert time.monotonic() - t0 < 10
    # a non-streaming client that gives up aborts too (steps slowed: 400 tokens outlast its timeout)
    real = server.llm.runner.forward_logits

    def slow(*args, **kwargs):
        time.sleep(0.01)
        return real(*args, **kwargs)

    server.llm.runner.forward_logits = slow
    try:
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{server.url}/v1/completions", json={**body, "stream": False}, timeout=1.0)
        assert server.pool_whole(timeout=10)
    finally:
        server.llm.runner.__dict__.pop("forward_logits", None)
    text = httpx.get(f"{server.url}/metrics").text
    assert 'finished_reason="abort"' in text


def _poison(server, token: int):
    """Make every step whose batch holds a prompt with `token` raise; returns the undo."""
    llm = server.llm
    real = llm.runner.forward_logits

    def failing(batch, *args, **kwargs):
        if any(token in r.prompt for r in batch.requests):
            raise RuntimeError("injected kernel failure")
        return real(batch, *args, **kwargs)

    llm.runner.forward_logits = failing
    return lambda: llm.runner.__dict__.pop("forward_logits", None)


def test_failing_step_fails_only_its_request(server) -> None:
    good = [20, 21, 22, 23] * 6
    want = offline(server, good, 24, ignore_eos=True)
    undo = _poison(server, 150)
    try:
        body = {"prompt": good, "max_tokens": 24, "temperature": 0, "ignore_eos": True, "stream": True,
                "return_token_ids": True}
        with httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=60) as resp:
            lines = resp.iter_lines()
            first = next(json.loads(x[6:]) for x in lines if x.startswith("data: "))  # running now
            r = httpx.post(f"{server.url}/v1/completions", timeout=60,
                           json={"prompt": [150, 3, 4, 5], "max_tokens": 4})
            assert r.status_code == 500, r.text
            assert r.json()["error"]["type"] == "InternalServerError"
            with httpx.stream("POST", f"{server.url}/v1/completions", timeout=60,
                              json={"prompt": [150, 6], "max_tokens": 4, "stream": True}) as bad:
                events = [x[6:] for x in bad.iter_lines() if x.startswith("data: ")]
            assert events[-1] == "[DONE]" and "error" in json.loads(events[0])
            rest = [json.loads(x[6:]) for x in lines if x.startswith("data: ") and x != "data: [DONE]"]
        tokens = sum((c["choices"][0]["token_ids"] for c in [first] + rest), [])
        assert tokens == want.token_ids  # the running request never noticed
    finally:
        undo()
    assert server.pool_whole()
    r = httpx.post(f"{server.url}/v1/completions", json={"prompt": [150, 3, 4, 5], "max_tokens": 2}, timeout=30)
    assert r.status_code == 200
    assert "radixkv:request_failure_total" in httpx.get(f"{server.url}/metrics").text


def test_concurrent_requests_share_steps(server) -> None:
    prompts = [[30 + i, 31, 32, 33, 34, 35] * 3 for i in range(4)]
    want = [offline(server, p, 6, ignore_eos=True).token_ids for p in prompts]
    llm, engine = server.llm, server.engine
    sizes: list[int] = []
    real = llm.runner.forward_logits

    def recording(batch, *args, **kwargs):
        sizes.append(len(batch.requests))
        return real(batch, *args, **kwargs)

    gate = threading.Event()
    blocked = engine.call(lambda _: gate.wait(30))  # hold the loop between steps
    llm.runner.forward_logits = recording
    results: dict[int, list[int]] = {}

    def client(i: int) -> None:
        r = httpx.post(f"{server.url}/v1/completions", timeout=60, json={
            "prompt": prompts[i], "max_tokens": 6, "temperature": 0, "ignore_eos": True, "return_token_ids": True})
        results[i] = r.json()["choices"][0]["token_ids"]

    threads = [threading.Thread(target=client, args=(i,)) for i in range(4)]
    try:
        for t in threads:
            t.start()
        deadline = time.monotonic() + 20
        while engine.core._inbox.qsize() < 4 and time.monotonic() < deadline:  # all four posted
            time.sleep(0.01)
        gate.set()
        blocked.result(30)
        for t in threads:
            t.join(60)
    finally:
        gate.set()
        llm.runner.__dict__.pop("forward_logits", None)
    assert [results[i] for i in range(4)] == want
    assert sizes[0] == 4 and len(sizes) == 6  # one prefill step for all four, then 5 batched decodes
