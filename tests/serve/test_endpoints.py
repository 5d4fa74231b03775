"""vLLM's /tokenize, /detokenize and /version (issue 32, item 4), and `radixkv serve --chat-template`:
shapes, agreement with the tokenizer and the chat endpoint, 400s naming the field, the API key."""
from __future__ import annotations

import argparse
import logging
import os
import re

import httpx
import pytest

from .conftest import MODEL_NAME, serve_in_thread

SYSTEM_USER = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]


def _post(server, path: str, body, **kw) -> httpx.Response:
    return httpx.post(f"{server.url}{path}", json=body, timeout=30, **kw)


def _tok(server):
    return server.engine.tokenizer


# ------------------------------------------------------------------ /tokenize, /detokenize

def test_tokenize_a_prompt_as_vllm_answers(server) -> None:
    text = "The capital of France"
    r = _post(server, "/tokenize", {"prompt": text, "model": MODEL_NAME})
    assert r.status_code == 200
    out = r.json()
    assert set(out) == {"count", "max_model_len", "tokens"}  # token_strs only when asked
    assert out["tokens"] == list(_tok(server)(text).input_ids) and out["count"] == len(out["tokens"]) == len(text)
    assert out["max_model_len"] == server.engine.inputs.limits.max_model_len
    bare = _post(server, "/tokenize", {"prompt": text, "add_special_tokens": False}).json()
    assert bare["tokens"] == list(_tok(server)(text, add_special_tokens=False).input_ids)
    strs = _post(server, "/tokenize", {"prompt": "ab c", "return_token_strs": True}).json()
    assert strs["token_strs"] == ["a", "b", " ", "c"]


def test_tokenize_chat_messages_agrees_with_the_chat_endpoint(server) -> None:
    out = _post(server, "/tokenize", {"messages": SYSTEM_USER}).json()
    chat = _post(server, "/v1/chat/completions",
                 {"messages": SYSTEM_USER, "max_tokens": 1, "return_token_ids": True}).json()
    assert out["tokens"] == chat["prompt_token_ids"] and out["count"] == len(out["tokens"])
    text = _post(server, "/detokenize", {"tokens": out["tokens"]}).json()["prompt"]
    assert text == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n"
    no_gen = _post(server, "/tokenize", {"messages": SYSTEM_USER, "add_generation_prompt": False}).json()
    assert out["tokens"][:no_gen["count"]] == no_gen["tokens"] and no_gen["count"] < out["count"]
    own_template = {"messages": SYSTEM_USER, "chat_template": "{% for m in messages %}[{{ m['content'] }}]{% endfor %}"}
    assert _post(server, "/tokenize", own_template).json()["error"]["param"] == "chat_template"  # unless trusted
    from fastapi.testclient import TestClient

    from radixkv.serve.app import create_app

    trusting = TestClient(create_app(None, engine=server.engine, trust_request_chat_template=True))
    own = trusting.post("/tokenize", json=own_template).json()
    assert _post(server, "/detokenize", {"tokens": own["tokens"]}).json()["prompt"] == "[Be brief.][Hi there]"


def test_detokenize_round_trips_and_keeps_special_tokens(server) -> None:
    text = "Hello, world!"
    ids = _post(server, "/tokenize", {"prompt": text}).json()["tokens"]
    r = _post(server, "/detokenize", {"tokens": ids, "model": MODEL_NAME})
    assert r.status_code == 200 and r.json() == {"prompt": text}
    im_end = _tok(server).convert_tokens_to_ids("<|im_end|>")
    assert _post(server, "/detokenize", {"tokens": [im_end]}).json()["prompt"] == "<|im_end|>"
    assert _post(server, "/detokenize", {"tokens": []}).json() == {"prompt": ""}


@pytest.mark.parametrize(("path", "body", "status", "param"), [
    ("/tokenize", {}, 400, "prompt"),
    ("/tokenize", {"prompt": 5}, 400, "prompt"),
    ("/tokenize", {"prompt": "hi", "add_special_tokens": "maybe"}, 400, "add_special_tokens"),
    ("/tokenize", {"prompt": "hi", "temperature": 0.5}, 400, "temperature"),  # unknown: refused, not ignored
    ("/tokenize", {"prompt": "hi", "model": "gpt-9"}, 404, "model"),
    ("/tokenize", {"messages": []}, 400, "messages"),
    ("/tokenize", {"messages": [{"content": "no role"}]}, 400, "messages.0.role"),
    ("/tokenize", {"messages": SYSTEM_USER, "continue_final_message": True}, 400, "continue_final_message"),
    ("/tokenize", {"messages": SYSTEM_USER, "chat_template": "{% if %}"}, 400, "chat_template"),  # untrusted
    ("/tokenize", {"messages": SYSTEM_USER, "tools": [{"type": "function"}]}, 400, "tools"),
    ("/tokenize", ["hi"], 400, "body"),
    ("/detokenize", {}, 400, "tokens"),
    ("/detokenize", {"tokens": "abc"}, 400, "tokens"),
    ("/detokenize", {"tokens": [1, "x"]}, 400, "tokens.1"),
    ("/detokenize", {"tokens": [-1]}, 400, "tokens"),
    ("/detokenize", {"tokens": [10**6]}, 400, "tokens"),
    ("/detokenize", {"tokens": [1], "model": "gpt-9"}, 404, "model"),
])
def test_bad_bodies_are_refused_naming_the_field(server, path, body, status, param) -> None:
    r = _post(server, path, body)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["param"] == param and err["message"] and err["code"] == status


def test_bodies_that_are_not_json_and_sizes_over_the_limit(server, monkeypatch) -> None:
    from radixkv.serve import routes_extra

    r = httpx.post(f"{server.url}/tokenize", content=b"{not json", timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == "body"
    monkeypatch.setattr(routes_extra, "MAX_TEXT_CHARS", 100)
    monkeypatch.setattr(routes_extra, "MAX_DETOKENIZE_TOKENS", 10)
    r = _post(server, "/tokenize", {"prompt": "x" * 101})
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt" and "at most 100" in r.json()["error"]["message"]
    r = _post(server, "/tokenize", {"messages": [{"role": "user", "content": "x" * 101}]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages"
    assert _post(server, "/tokenize", {"prompt": "x" * 100}).json()["count"] == 100
    r = _post(server, "/detokenize", {"tokens": [40] * 11})
    assert r.status_code == 400 and r.json()["error"]["param"] == "tokens"


def test_tokenize_counts_past_the_context_without_refusing(server) -> None:
    n = server.engine.inputs.limits.max_model_len + 10  # a client asks "does it fit?": answered, not refused
    out = _post(server, "/tokenize", {"prompt": "y" * n}).json()
    assert out["count"] == n > out["max_model_len"]


# ------------------------------------------------------------------ /version, the API key, no tokenizer

def test_version_is_the_package_version(server) -> None:
    import radixkv

    r = httpx.get(f"{server.url}/version", timeout=30)
    assert r.status_code == 200 and r.json() == {"version": radixkv.__version__}
    pyproject = os.path.join(os.path.dirname(radixkv.__file__), os.pardir, "pyproject.toml")
    if os.path.exists(pyproject):  # a source tree: the installed metadata and pyproject agree
        with open(pyproject, encoding="utf-8") as f:
            assert f'version = "{radixkv.__version__}"' in f.read()
    assert re.fullmatch(r"\d+\.\d+\.\d+.*", radixkv.__version__)


def test_version_falls_back_to_pyproject_in_a_source_tree(monkeypatch) -> None:
    from importlib import metadata

    import radixkv

    def missing(name: str) -> str:
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "version", missing)
    pyproject = os.path.join(os.path.dirname(radixkv.__file__), os.pardir, "pyproject.toml")
    expected = radixkv.__version__ if os.path.exists(pyproject) else "0+unknown"
    assert radixkv._version() == expected


def test_the_api_key_guards_tokenize_and_detokenize(server) -> None:
    from fastapi.testclient import TestClient

    from radixkv.serve.app import create_app

    app = create_app(server.llm, served_model_name=MODEL_NAME, api_key="sekret", engine=server.engine)
    client = TestClient(app)
    for path, body in (("/tokenize", {"prompt": "hi"}), ("/detokenize", {"tokens": [40]})):
        r = client.post(path, json=body)
        assert r.status_code == 401 and r.json()["error"]["type"] == "AuthenticationError"
        assert client.post(path, json=body, headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert client.post(path, json=body, headers={"Authorization": "Bearer sekret"}).status_code == 200
    assert client.get("/version").status_code == 200  # open, like /health


def test_a_model_without_a_tokenizer_says_so() -> None:
    from fastapi.testclient import TestClient

    from e2e.tiny_models import tiny_config
    from radixkv import LLM
    from radixkv.serve.app import create_app

    llm = LLM(tiny_config("llama"), dtype="float32", device="cpu", num_pages=16)
    with TestClient(create_app(llm, log_interval_s=None)) as client:
        for path, body, param in (("/tokenize", {"prompt": "hi"}, "prompt"),
                                  ("/tokenize", {"messages": SYSTEM_USER}, "messages"),
                                  ("/detokenize", {"tokens": [5, 6]}, "tokens")):
            r = client.post(path, json=body)
            assert r.status_code == 400 and "no tokenizer" in r.json()["error"]["message"]
            assert r.json()["error"]["param"] == param
        assert client.get("/version").status_code == 200


# ------------------------------------------------------------------ radixkv serve --chat-template

def _parse(argv: list[str]) -> argparse.Namespace:
    from radixkv.serve.cli_serve import add_serve_parser

    p = argparse.ArgumentParser()
    add_serve_parser(p.add_subparsers(dest="command"))
    return p.parse_args(["serve", *argv])


def test_chat_template_flag_reads_a_file_or_the_template_itself(tmp_path) -> None:
    from radixkv.serve.cli_serve import load_chat_template, resolve_options, run_serve

    inline = "{% for m in messages %}<{{ m['content'] }}>{% endfor %}"
    f = tmp_path / "t.jinja"
    f.write_text(inline)
    assert load_chat_template(str(f)) == inline == load_chat_template(inline)
    assert resolve_options(_parse(["m", "--chat-template", inline]))["chat_template"] == inline
    cfg = tmp_path / "serve.yaml"
    cfg.write_text(f"model: m\nchat-template: {f}\n")
    assert resolve_options(_parse(["--config", str(cfg)]))["chat_template"] == str(f)
    with pytest.raises(ValueError, match="no such file"):
        load_chat_template(str(tmp_path / "missing.jinja"))
    with pytest.raises(ValueError, match="does not parse"):
        load_chat_template("{% for m in messages %}")
    assert run_serve(_parse(["m", "--chat-template", str(tmp_path / "missing.jinja")])) == 2


def test_serve_with_a_chat_template_renders_chat_and_tokenize_with_it(tiny_folder, tmp_path) -> None:
    from radixkv.serve.cli_serve import build_app, resolve_options

    f = tmp_path / "t.jinja"
    f.write_text("{% for m in messages %}<{{ m['content'] }}>{% endfor %}")
    app = build_app(resolve_options(_parse([tiny_folder, "--device", "cpu", "--dtype", "float32",
                                            "--num-gpu-blocks-override", "32", "--disable-log-stats",
                                            "--chat-template", str(f), "--enable-log-requests"])))
    assert resolve_options(_parse(["m"]))["enable_log_requests"] is False  # off by default
    url, uv, thread = serve_in_thread(app)
    try:
        ids = httpx.post(f"{url}/tokenize", json={"messages": SYSTEM_USER}, timeout=30).json()["tokens"]
        assert httpx.post(f"{url}/detokenize", json={"tokens": ids}, timeout=30).json()["prompt"] == \
            "<Be brief.><Hi there>"
        chat = httpx.post(f"{url}/v1/chat/completions", timeout=30,
                          json={"messages": SYSTEM_USER, "max_tokens": 1, "return_token_ids": True}).json()
        assert chat["prompt_token_ids"] == ids
        assert app.state.model_names == [tiny_folder] and app.state.log_requests
    finally:
        uv.should_exit = True
        thread.join(10)
    assert not app.state.engine.is_running


def test_a_served_model_is_retrieved_by_name(server) -> None:
    import httpx

    from .conftest import MODEL_NAME

    r = httpx.get(f"{server.url}/v1/models/{MODEL_NAME}", timeout=10)
    assert r.status_code == 200 and r.json()["id"] == MODEL_NAME and r.json()["object"] == "model"
    missing = httpx.get(f"{server.url}/v1/models/org/other-model", timeout=10)
    assert missing.status_code == 404 and missing.json()["error"]["param"] == "model"
    openai = pytest.importorskip("openai")
    assert openai.OpenAI(base_url=server.url + "/v1", api_key="x").models.retrieve(MODEL_NAME).id == MODEL_NAME


def test_every_served_name_is_accepted_and_requests_are_logged_when_asked(server, caplog) -> None:
    from fastapi.testclient import TestClient

    from radixkv.serve.app import create_app

    app = create_app(None, engine=server.engine, served_model_name=["a/b", "c"], log_requests=True)
    with TestClient(app) as client, caplog.at_level(logging.INFO, logger="radixkv.serve"):
        for name in ("a/b", "c"):
            r = client.post("/v1/completions", json={"model": name, "prompt": "hi", "max_tokens": 2})
            assert r.status_code == 200 and r.json()["model"] == name
        assert client.get("/v1/models/a/b").json()["id"] == "a/b"
        assert client.post("/v1/completions", json={"model": "d", "prompt": "hi"}).status_code == 404
    logged = [m for m in caplog.messages if m.startswith("request cmpl-")]
    assert len(logged) == 2 and "prompt tokens" in logged[0] and "max_tokens=2" in logged[0]
    quiet = create_app(None, engine=server.engine, served_model_name="q")
    caplog.clear()
    with TestClient(quiet) as client, caplog.at_level(logging.INFO, logger="radixkv.serve"):
        assert client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2}).status_code == 200
    assert not [m for m in caplog.messages if m.startswith("request cmpl-")]
