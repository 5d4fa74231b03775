"""AsyncLLM under abuse: a caller's closed event loop, a failing admission, n > 1, the params' stop
strings, add_request racing shutdown; the app's vLLM sampling fields, logprobs and error bodies."""
from __future__ import annotations

import asyncio
import threading
import time

import pytest

from radixkv import SamplingParams


@pytest.fixture
def engine(tiny_folder: str):
    from radixkv import LLM
    from radixkv.serve.async_engine import AsyncLLM

    eng = AsyncLLM(LLM(tiny_folder, dtype="float32", device="cpu", num_pages=64), log_interval_s=None)
    yield eng
    eng.shutdown()


def _idle_and_whole(eng, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while eng.call(lambda llm: llm.has_work()).result(timeout) and time.monotonic() < deadline:
        time.sleep(0.02)

    def whole(llm) -> bool:
        llm.reset_prefix_cache()
        return llm.core.pool.num_free == llm.core.pool.num_pages and not llm.has_work()

    return eng.call(whole).result(timeout)


def test_a_closed_caller_loop_abandons_its_request_only(engine) -> None:
    params = SamplingParams(temperature=0.0, max_tokens=50, ignore_eos=True)

    async def fire_and_forget():
        return await engine.add_request("hello", params)  # the loop closes with the stream unread

    asyncio.run(fire_and_forget())
    assert _idle_and_whole(engine)  # withdrawn, pages released
    assert engine.is_running and engine._dead is None

    async def served():
        return await (await engine.add_request("hello", SamplingParams(temperature=0.0, max_tokens=3))).final()

    assert len(asyncio.run(served()).token_ids) >= 1


def test_failing_admission_fails_the_waiting_head_not_the_running(engine) -> None:
    sch = engine.llm.core.scheduler
    real = sch._admit_all
    calls = [0]

    def faulty(rows, budget, shared, now):
        if any(e.req.namespace == "poison" for e in sch.waiting):
            calls[0] += 1
            raise RuntimeError("admission fault")
        return real(rows, budget, shared, now)

    sch._admit_all = faulty
    try:
        async def main():
            good = await engine.add_request("hello world", SamplingParams(temperature=0.0, max_tokens=40,
                                                                          ignore_eos=True))
            it = good.__aiter__()
            await it.__anext__()  # running now
            poison = await engine.add_request("abc", SamplingParams(temperature=0.0, max_tokens=4,
                                                                    cache_salt="poison"))
            with pytest.raises(Exception, match="admission fault"):
                await poison.final()
            last = None
            async for last in it:
                pass
            return last

        last = asyncio.run(main())
        assert last.finish_reason == "length" and len(last.token_ids) == 40  # the running one never noticed
        assert calls[0] == 1  # failed once, then the suspect was gone: no spinning
    finally:
        del sch._admit_all
    assert _idle_and_whole(engine)


def test_a_step_failing_with_no_suspect_backs_off(engine) -> None:
    llm = engine.llm
    real = llm.core.scheduler.schedule
    calls = [0]

    def failing(now):
        calls[0] += 1
        raise RuntimeError("no suspect")  # not in admission, nothing running: nobody to fail

    async def main():
        gate = threading.Event()
        engine.call(lambda _: gate.wait(10))
        llm.core.scheduler.schedule = failing
        s = await engine.add_request("abc", SamplingParams(temperature=0.0, max_tokens=2))
        gate.set()
        await asyncio.sleep(0.5)
        n = calls[0]
        llm.core.scheduler.schedule = real
        engine.abort(s.request_id)
        return n

    try:
        n = asyncio.run(main())
    finally:
        llm.core.scheduler.__dict__.pop("schedule", None)
    assert 1 <= n < 40, n  # backed off, not thousands of retries
    assert _idle_and_whole(engine)


def test_a_step_failing_on_a_dead_engine_stops_the_loop(engine) -> None:
    """A failure after which the LLM can serve nothing (a tensor-parallel rank died: LLM.dead) ends the loop,
    so /health reports it, instead of failing every later request one step at a time."""
    from radixkv.serve.async_engine import EngineDeadError

    llm = engine.llm

    def failing(now):
        type(llm.runner).dead = property(lambda self: True)  # the failure killed the engine
        raise RuntimeError("rank 1 died")

    async def main():
        llm.core.scheduler.schedule = failing
        s = await engine.add_request("abc", SamplingParams(temperature=0.0, max_tokens=2))
        with pytest.raises(EngineDeadError):
            async for _ in s:
                pass

    real_dead = type(llm.runner).dead
    try:
        asyncio.run(main())
        deadline = time.monotonic() + 5
        while engine.is_running and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not engine.is_running and "rank 1 died" in repr(engine._dead)
    finally:
        type(llm.runner).dead = real_dead
        llm.core.scheduler.__dict__.pop("schedule", None)


def test_n_above_one_is_refused_before_anything_is_queued(engine) -> None:
    async def main():
        with pytest.raises(ValueError, match="n=3"):
            await engine.add_request("hello", SamplingParams(temperature=0.0, max_tokens=4, n=3))

    asyncio.run(main())
    assert engine.call(lambda llm: llm.has_work()).result(5) is False


@pytest.mark.parametrize("include", [False, True])
def test_params_stop_strings_cut_the_streamed_text_as_offline(engine, include) -> None:
    base = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    full = engine.call(lambda llm: llm.generate(["hello world"], base)[0]).result(60).text
    stop = full[6:8]
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, stop=[stop],
                            include_stop_str_in_output=include)
    want = engine.call(lambda llm: llm.generate(["hello world"], params)[0]).result(60).outputs[0]

    async def main():
        s = await engine.add_request("hello world", params)
        outs = [o async for o in s]
        return outs

    outs = asyncio.run(main())
    assert "".join(o.delta_text for o in outs) == outs[-1].text == want.text
    assert outs[-1].finish_reason == "stop" and outs[-1].stop_reason == stop == want.stop_reason


def test_add_request_racing_shutdown_never_hangs(tiny_folder: str) -> None:
    from radixkv import LLM
    from radixkv.serve.async_engine import AsyncLLM, EngineDeadError

    llm = LLM(tiny_folder, dtype="float32", device="cpu", num_pages=64)
    for _ in range(20):
        eng = AsyncLLM(llm, log_interval_s=None)

        async def add(eng=eng):
            try:
                s = await eng.add_request("hi", SamplingParams(temperature=0.0, max_tokens=2))
                await s.final()
            except EngineDeadError:
                pass

        async def race(eng=eng):
            t = asyncio.ensure_future(add())
            await asyncio.sleep(0)
            eng.shutdown()
            await asyncio.wait_for(t, 5)

        asyncio.run(race())
        with pytest.raises(EngineDeadError):
            eng.call(lambda _: None)
    # posting after the last drain raises, it is never left unread
    eng.core._thread.join(5)
    with pytest.raises(EngineDeadError):
        eng.core.call(lambda _: None)


# ---- the app -----------------------------------------------------------------------------------

def test_vllm_sampling_fields_pass_through(server) -> None:
    import httpx

    from .conftest import offline

    kw = {"presence_penalty": 0.5, "frequency_penalty": 0.3, "repetition_penalty": 1.3, "min_tokens": 3}
    want = offline(server, "hello world", 8, **kw)
    r = httpx.post(f"{server.url}/v1/completions", timeout=60, json={
        "prompt": "hello world", "max_tokens": 8, "temperature": 0, "return_token_ids": True, **kw})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["token_ids"] == want.token_ids
    assert want.token_ids != offline(server, "hello world", 8).token_ids  # the penalties did something


def test_completion_and_chat_logprobs_in_openai_shape(server) -> None:
    import httpx

    from .conftest import sse_chunks

    want = server.engine.call(lambda llm: llm.generate(
        ["hello"], SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True, logprobs=2))[0]).result(60)
    body = {"prompt": "hello", "max_tokens": 5, "temperature": 0, "ignore_eos": True, "logprobs": 2}
    c = httpx.post(f"{server.url}/v1/completions", json=body, timeout=60).json()["choices"][0]
    lp = c["logprobs"]
    assert set(lp) == {"tokens", "token_logprobs", "top_logprobs", "text_offset"}
    tok = server.llm.tokenizer
    assert lp["tokens"] == [tok.decode([t]) for t in want.token_ids]
    assert lp["text_offset"] == [sum(len(t) for t in lp["tokens"][:i]) for i in range(5)]
    got = want.outputs[0].logprobs
    assert lp["token_logprobs"] == pytest.approx([d[t].logprob for d, t in zip(got, want.token_ids)])
    assert all(2 <= len(top) <= 3 for top in lp["top_logprobs"])
    streamed = sse_chunks(httpx.post(f"{server.url}/v1/completions", json={**body, "stream": True}, timeout=60))
    toks = sum((ch["choices"][0]["logprobs"]["tokens"] for ch in streamed if ch["choices"][0]["logprobs"]), [])
    assert toks == lp["tokens"]

    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "temperature": 0,
            "ignore_eos": True, "logprobs": True, "top_logprobs": 2}
    m = httpx.post(f"{server.url}/v1/chat/completions", json=chat, timeout=60).json()["choices"][0]
    content = m["logprobs"]["content"]
    assert len(content) == 4
    for e in content:
        assert set(e) == {"token", "logprob", "bytes", "top_logprobs"} and len(e["top_logprobs"]) == 2
        assert e["top_logprobs"][0]["logprob"] >= e["top_logprobs"][1]["logprob"]
        assert e["top_logprobs"][0] == {k: e[k] for k in ("token", "logprob", "bytes")}  # greedy: the argmax
    plain = httpx.post(f"{server.url}/v1/chat/completions", json={**chat, "logprobs": False, "top_logprobs": None},
                       timeout=60).json()["choices"][0]
    assert plain["logprobs"] is None


def test_stop_reason_is_the_stop_string(server) -> None:
    import httpx

    full = offline(server, "hello world", 12, ignore_eos=True).text
    stop = full[4:6]
    r = httpx.post(f"{server.url}/v1/completions", timeout=60, json={
        "prompt": "hello world", "max_tokens": 12, "temperature": 0, "ignore_eos": True, "stop": [stop]})
    c = r.json()["choices"][0]
    want = offline(server, "hello world", 12, ignore_eos=True, stop=[stop]).outputs[0]
    assert c["finish_reason"] == "stop" and c["stop_reason"] == stop == want.stop_reason
    assert c["text"] == want.text and len(c["text"]) < len(full)


def offline(server, prompt, max_tokens, **kw):
    from .conftest import offline as run

    return run(server, prompt, max_tokens, **kw)


def test_dead_engine_is_503_json_everywhere(tiny_folder: str) -> None:
    from fastapi.testclient import TestClient

    from radixkv import LLM
    from radixkv.serve.app import create_app

    app = create_app(LLM(tiny_folder, dtype="float32", device="cpu", num_pages=64), log_interval_s=None,
                     enable_reset_prefix_cache=True)
    client = TestClient(app, raise_server_exceptions=False)
    app.state.engine.shutdown()
    for path in ("/reset_prefix_cache", "/health", "/v1/completions"):
        r = (client.get(path) if path == "/health"
             else client.post(path, json={"prompt": "hi", "max_tokens": 2}))
        assert r.status_code == 503, (path, r.text)
        assert r.json()["error"]["type"] == "ServiceUnavailableError"
    assert client.get("/metrics").status_code == 200  # the series stay readable


def test_another_threads_generate_is_refused_and_serving_goes_on(engine) -> None:
    """Issue 33 item 4: a second thread calling the served LLM gets the refusal; the loop and its
    requests go on."""
    llm = engine.llm

    async def main():
        stream = await engine.add_request("hello world", SamplingParams(temperature=0.0, max_tokens=30,
                                                                        ignore_eos=True))
        it = stream.__aiter__()
        await it.__anext__()  # running now
        for call in (lambda: llm.generate(["hi"], SamplingParams(max_tokens=2)), llm.step,
                     lambda: llm.add_requests([[5, 6]], SamplingParams(max_tokens=2))):
            with pytest.raises(RuntimeError, match="AsyncLLM serves this LLM"):
                await asyncio.to_thread(call)
        last = None
        async for last in it:
            pass
        return last

    last = asyncio.run(main())
    assert last.finish_reason == "length" and len(last.token_ids) == 30 and engine.is_running
    assert engine.call(lambda m: m.generate([[5, 6]], SamplingParams(max_tokens=2))[0]).result(30).token_ids


def test_a_model_without_a_tokenizer_streams_a_chunk_a_step() -> None:
    """Issue 33 item 2: one chunk per step with new tokens, not one at the end."""
    import json

    from fastapi.testclient import TestClient

    from e2e.tiny_models import tiny_config
    from radixkv import LLM
    from radixkv.serve.app import create_app

    app = create_app(LLM(tiny_config("llama"), dtype="float32", device="cpu", num_pages=32), log_interval_s=None)
    with TestClient(app) as client:
        with client.stream("POST", "/v1/completions", json={"prompt": [5, 6, 7], "max_tokens": 5, "temperature": 0,
                                                             "ignore_eos": True, "stream": True}) as r:
            events = [json.loads(x[6:]) for x in r.iter_lines() if x.startswith("data: {")]
    assert len([e for e in events if e["choices"]]) == 5 and events[-1]["choices"][0]["finish_reason"] == "length"
