"""Issue 33, items 1, 5 and 13: request work off the event loop (request chat templates only when the
operator trusts them, size limits before any work, /health within 100 ms while a hostile request is
prepared, chat_template_kwargs that cannot smuggle refused fields); a lone surrogate in a chat message
is a 400 naming `messages`; /metrics behind the key and /reset_prefix_cache only when enabled."""
from __future__ import annotations

import json
import threading
import time
from typing import Any

import httpx
import pytest

from .conftest import MODEL_NAME, serve_in_thread

MSGS = [{"role": "user", "content": "hi"}]
HEALTH_BOUND_S = 0.1


@pytest.fixture(scope="module")
def trusting(server) -> Any:
    """The shared engine behind a second app that accepts request chat templates."""
    from radixkv.serve.app import create_app

    app = create_app(None, engine=server.engine, served_model_name=MODEL_NAME, trust_request_chat_template=True)
    url, uv, thread = serve_in_thread(app)
    yield url
    uv.should_exit = True
    thread.join(10)


def _health_while(url: str, path: str, body: Any, *, timeout: float = 60) -> tuple[httpx.Response, list[float]]:
    """POST body to url+path on another thread; GET /health every 10 ms meanwhile: (response, latencies)."""
    out: list[httpx.Response] = []

    def hostile() -> None:
        with httpx.Client(timeout=timeout) as c:
            out.append(c.post(url + path, json=body))

    lat: list[float] = []
    with httpx.Client(timeout=timeout) as c:
        assert c.get(url + "/health").status_code == 200  # the connection is open before the hostile request
        t = threading.Thread(target=hostile, daemon=True)
        t.start()
        while t.is_alive() or len(lat) < 5:
            t0 = time.perf_counter()
            assert c.get(url + "/health").status_code == 200
            lat.append(time.perf_counter() - t0)
            time.sleep(0.01)
    t.join(timeout)
    assert out, "the hostile request got no answer"
    return out[0], lat


def _refused(r: httpx.Response, param: str) -> dict:
    assert r.status_code == 400, r.text[:500]
    err = r.json()["error"]
    assert err["param"] == param and err["type"] == "invalid_request_error", err
    return err


# ------------------------------------------------------------------ item 1: the event loop

def test_request_chat_template_is_refused_unless_trusted(server, trusting) -> None:
    body = {"messages": MSGS, "max_tokens": 1, "chat_template": "{% for m in messages %}[{{ m['content'] }}]{% endfor %}"}
    err = _refused(httpx.post(server.url + "/v1/chat/completions", json=body, timeout=30), "chat_template")
    assert "--trust-request-chat-template" in err["message"]
    _refused(httpx.post(server.url + "/tokenize", json={"messages": MSGS, "chat_template": body["chat_template"]},
                        timeout=30), "chat_template")
    ok = httpx.post(trusting + "/v1/chat/completions", json={**body, "return_token_ids": True}, timeout=30)
    assert ok.status_code == 200, ok.text
    assert ok.json()["prompt_token_ids"] == server.engine.tokenizer("[hi]", add_special_tokens=False).input_ids
    tok = httpx.post(trusting + "/tokenize", json={"messages": MSGS, "chat_template": body["chat_template"]}, timeout=30)
    assert tok.status_code == 200 and tok.json()["tokens"] == ok.json()["prompt_token_ids"]
    for path, extra in (("/v1/chat/completions", {"max_tokens": 1}), ("/tokenize", {})):  # trusted, still checked
        _refused(httpx.post(trusting + path, json={"messages": MSGS, "chat_template": "{% for %}", **extra},
                            timeout=30), "chat_template")
        _refused(httpx.post(trusting + path, json={"messages": MSGS, "chat_template": "x" * (2**18 + 1), **extra},
                            timeout=30), "chat_template")


@pytest.mark.parametrize("key", ["tools", "documents", "chat_template", "tokenize", "add_generation_prompt",
                                 "tool_choice"])
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/tokenize"])
def test_chat_template_kwargs_cannot_smuggle_fields(server, path, key) -> None:
    value: Any = [{"type": "function", "function": {"name": "f"}}] if key == "tools" else \
        [{"title": "t", "text": "x"}] if key == "documents" else "{{ 'x' }}" if key == "chat_template" else True
    r = httpx.post(server.url + path, json={"messages": MSGS, "max_tokens": 1, "chat_template_kwargs": {key: value}}
                   if path != "/tokenize" else {"messages": MSGS, "chat_template_kwargs": {key: value}}, timeout=30)
    err = _refused(r, "chat_template_kwargs")
    assert repr(key) in err["message"], err
    fine = {"messages": MSGS, "chat_template_kwargs": {"enable_thinking": False}}
    assert httpx.post(server.url + path, json={**fine, "max_tokens": 1} if path != "/tokenize" else fine,
                      timeout=30).status_code == 200


def test_size_limits_come_before_any_work(server) -> None:
    bound = 16 * server.engine.inputs.limits.max_model_len
    big = "a" * (bound + 1)
    err = _refused(httpx.post(server.url + "/v1/completions", json={"prompt": big, "max_tokens": 1}, timeout=30),
                   "prompt")
    assert str(bound) in err["message"]
    _refused(httpx.post(server.url + "/v1/completions", json={"prompt": ["hi", big], "max_tokens": 1}, timeout=30),
             "prompt")
    _refused(httpx.post(server.url + "/v1/completions", json={"prompt": [5] * (bound + 1), "max_tokens": 1},
                        timeout=30), "prompt")
    _refused(httpx.post(server.url + "/v1/chat/completions", json={"messages": [{"role": "user", "content": big}]},
                        timeout=30), "messages")
    halves = [{"role": "user", "content": big[: bound // 2 + 1]}] * 2  # the bound is on all messages together
    _refused(httpx.post(server.url + "/v1/chat/completions", json={"messages": halves}, timeout=30), "messages")
    # at the bound, a prompt is tokenised as before (and refused for the context, which is smaller)
    r = httpx.post(server.url + "/v1/completions", json={"prompt": "a" * bound, "max_tokens": 1,
                                                         "truncate_prompt_tokens": 8}, timeout=30)
    assert r.status_code == 200, r.text
    assert server.pool_whole()


HOSTILE = [  # (path, body, the 400's param, what its message says)
    ("/v1/completions", {"prompt": "ab" * 2_500_000, "max_tokens": 1}, "prompt", "at most"),  # 5 MB of text
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "ab" * 2_500_000}]}, "messages", "at most"),
    ("/tokenize", {"prompt": "ab" * 2_500_000}, "prompt", "at most"),
    ("/v1/chat/completions", {"messages": MSGS, "chat_template": "{{ 'ab' * 2500000 }}"}, "chat_template",
     "more than"),
    ("/tokenize", {"messages": MSGS, "chat_template": "{{ 'ab' * 2500000 }}"}, "chat_template", "more than"),
    ("/v1/chat/completions", {"messages": MSGS, "chat_template":  # 10^10 iterations: bounded in time
     "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}x"}, "chat_template",
     "ran for more than"),
    ("/v1/chat/completions", {"messages": MSGS, "chat_template":  # 10^10 one-character writes: bounded in size
     "{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}"}, "chat_template",
     "wrote more than"),
]


@pytest.mark.alone  # a 100 ms bound: no other test loading the cores
@pytest.mark.parametrize("path,body,param,says", HOSTILE, ids=[f"{p.split('/')[-1]}-{len(str(b))}-{q}"
                                                               for p, b, q, _ in HOSTILE])
def test_health_answers_within_100ms_while_a_hostile_request_is_prepared(trusting, path, body, param, says) -> None:
    r, lat = _health_while(trusting, path, body)
    assert says in _refused(r, param)["message"]
    worst = max(lat)
    print(f"{path} {param}: /health {len(lat)} probes, worst {worst * 1e3:.1f} ms, "
          f"median {sorted(lat)[len(lat) // 2] * 1e3:.1f} ms")
    assert worst < HEALTH_BOUND_S, f"/health took {worst * 1e3:.0f} ms while {path} was prepared"


def test_request_template_products_run_at_render_time() -> None:
    """* and ** in a request template are not folded while jinja compiles (a 5 MB literal held the GIL for
    ~0.1 s in repr and compile): small ones render as before, a huge one is refused as it is written."""
    from e2e.conftest import CHATML, char_tokenizer
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    from radixkv.serve.api_errors import APIError
    from radixkv.serve.routes_extra import render_chat

    tok = char_tokenizer(CHATML)
    kw = dict(add_generation_prompt=False, continue_final_message=False)
    assert render_chat(tok, MSGS, "{{ messages[0]['content'] * 2 }}{{ 2 ** 3 }}", {}, 1000, **kw) == "hihi8"
    assert {"*", "**"} <= ImmutableSandboxedEnvironment.intercepted_binops
    t0 = time.perf_counter()
    with pytest.raises(APIError, match="wrote more than 1000"):
        render_chat(tok, MSGS, "{{ 'cd' * 2500000 }}", {}, 1000, **kw)
    assert time.perf_counter() - t0 < 1.0


# ------------------------------------------------------------------ item 5: lone surrogates

def _post_ascii(url: str, body: Any) -> httpx.Response:
    """POST body as JSON with \\u escapes (a lone surrogate cannot be sent as UTF-8)."""
    return httpx.post(url, content=json.dumps(body).encode(), headers={"content-type": "application/json"},
                      timeout=30)


@pytest.mark.parametrize("content", ["\ud800", "a\udfffb", [{"type": "text", "text": "x\ud83d"}]])
def test_chat_with_a_lone_surrogate_is_400_naming_messages(server, content) -> None:
    msgs = [{"role": "user", "content": content}]
    _refused(_post_ascii(server.url + "/v1/chat/completions", {"messages": msgs, "max_tokens": 1}), "messages")
    _refused(_post_ascii(server.url + "/tokenize", {"messages": msgs}), "messages")
    _refused(_post_ascii(server.url + "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi",
                                                                             "name": "x\udc00"}]}), "messages")
    for body in ({"prompt": "a\udfffb", "max_tokens": 1}, {"prompt": "a\udfffb", "add_special_tokens": False}):
        _refused(_post_ascii(server.url + "/v1/completions", body), "prompt")
    _refused(_post_ascii(server.url + "/tokenize", {"prompt": "a\udfffb"}), "prompt")


# ------------------------------------------------------------------ item 13: tenant exposure

def test_metrics_behind_the_key_only_when_asked(server) -> None:
    from fastapi.testclient import TestClient

    from radixkv.serve.app import create_app

    auth = {"Authorization": "Bearer sekret"}
    open_ = TestClient(create_app(None, engine=server.engine, api_key="sekret"))
    assert open_.get("/metrics").status_code == 200  # the default: open for scrapers, as before
    closed = TestClient(create_app(None, engine=server.engine, api_key="sekret", metrics_require_key=True))
    r = closed.get("/metrics")
    assert r.status_code == 401 and r.json()["error"]["type"] == "AuthenticationError"
    assert closed.get("/metrics", headers=auth).status_code == 200
    assert "radixkv:" in closed.get("/metrics", headers=auth).text
    assert closed.get("/health").status_code == 200  # probes stay open


def test_reset_prefix_cache_only_when_enabled(server) -> None:
    from fastapi.testclient import TestClient

    from radixkv.serve.app import create_app

    assert httpx.post(server.url + "/reset_prefix_cache", timeout=30).status_code == 404  # off by default
    on = TestClient(create_app(None, engine=server.engine, enable_reset_prefix_cache=True))
    r = on.post("/reset_prefix_cache")
    assert r.status_code == 200 and r.json() == {"success": True}
    keyed = TestClient(create_app(None, engine=server.engine, api_key="k", enable_reset_prefix_cache=True))
    assert keyed.post("/reset_prefix_cache").status_code == 401
    assert keyed.post("/reset_prefix_cache", headers={"Authorization": "Bearer k"}).status_code == 200


def test_serve_flags(tmp_path) -> None:
    import argparse

    from radixkv.serve.cli_serve import add_serve_parser, resolve_options

    def parse(argv: list[str]) -> dict:
        p = argparse.ArgumentParser()
        add_serve_parser(p.add_subparsers(dest="command"))
        return resolve_options(p.parse_args(["serve", *argv]))

    off = parse(["m"])
    assert not off["trust_request_chat_template"] and not off["metrics_require_key"]
    assert not off["enable_reset_prefix_cache"]
    on = parse(["m", "--trust-request-chat-template", "--enable-reset-prefix-cache"])
    assert on["trust_request_chat_template"] and on["enable_reset_prefix_cache"]
    with pytest.raises(ValueError, match="needs an API key"):
        parse(["m", "--metrics-require-key"])
    assert parse(["m", "--metrics-require-key", "--api-key", "k"])["metrics_require_key"]
    cfg = tmp_path / "serve.yaml"
    cfg.write_text("model: m\ntrust-request-chat-template: true\nenable-reset-prefix-cache: true\n")
    from_file = parse(["--config", str(cfg)])
    assert from_file["trust_request_chat_template"] and from_file["enable_reset_prefix_cache"]
