"""A tiny random Llama (character tokenizer with a ChatML template, fp32, CPU) behind a real
uvicorn server on 127.0.0.1 and a free port, shared by the serve tests (loaded once)."""
from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("prometheus_client")
pytest.importorskip("httpx")

MODEL_NAME = "tiny-llama"


@dataclass
class Server:
    url: str
    app: Any
    engine: Any  # AsyncLLM
    llm: Any  # radixkv.LLM (touch it only through engine.call)

    def pool_whole(self, timeout: float = 5.0) -> bool:
        """Wait for the engine to go idle, evict the cache: is every page free again?"""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.engine.call(lambda llm: llm.has_work()).result(timeout):
                break
            time.sleep(0.02)

        def whole(llm: Any) -> bool:
            llm.core.cache.check_invariants()
            llm.reset_prefix_cache()
            return llm.core.pool.num_free == llm.core.pool.num_pages and not llm.has_work()

        return self.engine.call(whole).result(timeout)


def serve_in_thread(app: Any) -> tuple[str, Any, threading.Thread]:
    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.01)
    return f"http://127.0.0.1:{port}", server, thread


@pytest.fixture(scope="session")
def tiny_folder(tmp_path_factory: pytest.TempPathFactory) -> str:
    from e2e.conftest import CHATML, char_tokenizer
    from e2e.tiny_models import hf_model, tiny_config

    path = tmp_path_factory.mktemp("serve-tiny")
    config = tiny_config("llama")
    config.eos_token_id = 4  # <|im_end|>
    hf_model(config, seed=0).save_pretrained(path)
    char_tokenizer(CHATML).save_pretrained(path)
    return str(path)


@pytest.fixture(scope="session")
def server(tiny_folder: str) -> Iterator[Server]:
    from radixkv import LLM
    from radixkv.serve.app import create_app

    llm = LLM(tiny_folder, dtype="float32", device="cpu", num_pages=128)
    app = create_app(llm, served_model_name=MODEL_NAME, log_interval_s=None)
    url, uv, thread = serve_in_thread(app)
    yield Server(url, app, app.state.engine, llm)
    uv.should_exit = True
    thread.join(10)
    assert not app.state.engine.is_running  # the lifespan stopped the engine loop


def sse_chunks(resp: Any) -> list[dict]:
    """The `data: {...}` events of an SSE response, checking it ends with [DONE]."""
    events = [line[len("data: "):] for line in resp.iter_lines() if line.startswith("data: ")]
    assert events and events[-1] == "[DONE]", events[-3:]
    return [json.loads(e) for e in events[:-1]]


def offline(server, prompt, max_tokens: int, **kw) -> list:
    from radixkv import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, **kw)
    return server.engine.call(lambda llm: llm.generate([prompt], params)[0]).result(60)
