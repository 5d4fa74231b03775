"""The engine core in a process of its own (serve/core_proc.py): outputs equal the in-process
engine's, and every fault (a malformed message, a core that dies, an abort mid-flight, a signal)
ends with a clear error, pages freed, and no process left behind."""
from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time

import httpx
import pytest

from radixkv import LLM, SamplingParams
from radixkv.serve.async_engine import AsyncLLM, EngineDeadError

GREEDY = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)


@pytest.fixture(scope="module")
def proc_engine(tiny_folder: str):
    engine = AsyncLLM.start(tiny_folder, dtype="float32", device="cpu", num_pages=64, log_interval_s=None,
                            log_level="warning")
    yield engine
    engine.shutdown()
    assert not engine.core.proc.is_alive()


async def _final(engine: AsyncLLM, prompt, params=GREEDY):
    stream = await engine.add_request(prompt, params)
    return await stream.final()


def _idle_and_whole(engine: AsyncLLM, timeout: float = 10.0) -> bool:
    """Wait until the core runs nothing, reset the cache: is every page free?"""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        asyncio.run(engine.reset_prefix_cache())
        s = engine.engine_stats
        if s.num_running == 0 and s.num_waiting == 0 and s.pages_used == 0:
            return True
        time.sleep(0.05)
    return False


def test_outputs_equal_the_offline_engine(proc_engine: AsyncLLM, tiny_folder: str) -> None:
    want = LLM(tiny_folder, dtype="float32", device="cpu", num_pages=64).generate(
        ["hello world", [5, 6, 7, 8]], GREEDY)

    async def run():
        return await asyncio.gather(_final(proc_engine, "hello world"), _final(proc_engine, [5, 6, 7, 8]))

    got = asyncio.run(run())
    assert [g.token_ids for g in got] == [w.token_ids for w in want]
    assert got[0].text == want[0].text
    assert _idle_and_whole(proc_engine)


def test_prompt_logprobs_cross_the_process_boundary(proc_engine: AsyncLLM, tiny_folder: str) -> None:
    """The core's columns of prompt scores (LogprobsBlock) travel as bytes and equal the offline engine's."""
    params = SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True, prompt_logprobs=2, logprobs=1)
    want = LLM(tiny_folder, dtype="float32", device="cpu", num_pages=64).generate(["hello there"], params)[0]
    got = asyncio.run(_final(proc_engine, "hello there", params))
    assert got.prompt_logprobs is not None and got.prompt_logprobs.n == len(want.prompt_token_ids) - 1
    positions = got.prompt_logprobs.positions()
    for p, d in zip(positions, want.prompt_logprobs[1:]):
        assert p.logprob == pytest.approx(d[p.token].logprob, abs=1e-5) and p.rank == d[p.token].rank
        assert set(p.top_ids) <= set(d)
    assert _idle_and_whole(proc_engine)


def test_stop_strings_and_streaming_deltas(proc_engine: AsyncLLM, tiny_folder: str) -> None:
    base = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    full = LLM(tiny_folder, dtype="float32", device="cpu", num_pages=64).generate(["hello world"], base)[0].text
    stop = full[3:5]
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, stop=[stop])

    async def run():
        return [o async for o in proc_engine.generate("hello world", params)]

    outs = asyncio.run(run())
    assert "".join(o.delta_text for o in outs) == outs[-1].text == full[: full.index(stop)]
    assert outs[-1].finish_reason == "stop" and outs[-1].stop_reason == stop
    assert _idle_and_whole(proc_engine)


def test_a_malformed_message_is_dropped_and_serving_goes_on(proc_engine: AsyncLLM) -> None:
    with proc_engine.core._send_lock:
        proc_engine.core._push.send(b"\x93not msgpack at all")
        proc_engine.core._push.send(b"\x81\xa4type\xa3add")  # right shape, wrong fields
    out = asyncio.run(_final(proc_engine, [9, 10, 11]))
    assert len(out.token_ids) == GREEDY.max_tokens and proc_engine.is_running


def test_abort_while_its_step_is_in_flight_frees_its_pages(proc_engine: AsyncLLM) -> None:
    long = SamplingParams(temperature=0.0, max_tokens=200, ignore_eos=True)

    async def run():
        stream = await proc_engine.add_request([3] * 40, long, "victim")
        first = await stream.__aiter__().__anext__()  # it runs: a step is in flight
        proc_engine.abort("victim")
        return first

    asyncio.run(run())
    assert _idle_and_whole(proc_engine)


def test_a_client_leaving_mid_stream_aborts_its_request(proc_engine: AsyncLLM) -> None:
    long = SamplingParams(temperature=0.0, max_tokens=200, ignore_eos=True)

    async def run():
        async for _ in proc_engine.generate([4] * 40, long):
            break  # the consumer leaves: the stream aborts its request

    asyncio.run(run())
    assert _idle_and_whole(proc_engine)


def test_a_core_that_dies_ends_every_stream_with_a_clear_error(tiny_folder: str) -> None:
    engine = AsyncLLM.start(tiny_folder, dtype="float32", device="cpu", num_pages=64, log_interval_s=None,
                            log_level="warning")
    long = SamplingParams(temperature=0.0, max_tokens=400, ignore_eos=True)

    async def run():
        stream = await engine.add_request([3] * 20, long)
        got = []
        with pytest.raises(EngineDeadError, match="exited"):
            async for out in stream:
                got.append(out)
                if len(got) == 2:
                    os.kill(engine.core.proc.pid, signal.SIGKILL)
        return got

    try:
        assert len(asyncio.run(asyncio.wait_for(run(), 60))) >= 2
        assert not engine.is_running
        with pytest.raises(EngineDeadError):
            asyncio.run(_final(engine, [1, 2, 3]))
        _assert_unhealthy(engine)
    finally:
        engine.shutdown()


def test_a_hung_core_is_reported_dead_and_killed(tiny_folder: str) -> None:
    engine = AsyncLLM.start(tiny_folder, dtype="float32", device="cpu", num_pages=64, log_interval_s=None,
                            log_level="warning", hang_timeout_s=2.0)
    long = SamplingParams(temperature=0.0, max_tokens=400, ignore_eos=True)

    async def run():
        stream = await engine.add_request([3] * 20, long)
        with pytest.raises(EngineDeadError, match="hung"):
            async for _ in stream:
                os.kill(engine.core.proc.pid, signal.SIGSTOP)  # stops answering, as a stuck kernel would

    try:
        asyncio.run(asyncio.wait_for(run(), 60))
        engine.core.proc.join(10)
        assert not engine.core.proc.is_alive() and not engine.is_running
        _assert_unhealthy(engine)
    finally:
        engine.shutdown()


def _assert_unhealthy(engine: AsyncLLM) -> None:
    from fastapi.testclient import TestClient

    from radixkv.serve.app import create_app

    client = TestClient(create_app(None, engine=engine), raise_server_exceptions=False)
    assert client.get("/health").status_code == 503
    r = client.post("/v1/completions", json={"prompt": [1, 2], "max_tokens": 2})
    assert r.status_code == 503 and "engine" in r.json()["error"]["message"]


def test_a_failed_load_names_the_problem() -> None:
    with pytest.raises(ValueError, match="does not exist"):
        AsyncLLM.start("/no/such/model", device="cpu", log_interval_s=None, log_level="warning")


def _children(pid: int) -> list[int]:
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True).stdout
    return [int(x) for x in out.split()]


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_radixkv_serve_stops_cleanly_on_a_signal(tiny_folder: str, sig: int) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "radixkv", "serve", tiny_folder, "--device", "cpu", "--dtype", "float32",
           "--num-gpu-blocks-override", "64", "--port", str(port), "--disable-log-stats"]
    server = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert server.poll() is None, server.stderr.read().decode()[-2000:]
            assert time.monotonic() < deadline, "the server did not start"
            time.sleep(0.2)
        r = httpx.post(f"http://127.0.0.1:{port}/v1/completions",
                       json={"prompt": "hello", "max_tokens": 3, "temperature": 0}, timeout=60)
        assert r.status_code == 200, r.text
        kids = _children(server.pid)
        assert kids, "the engine core runs in a child process"
        server.send_signal(sig)
        assert server.wait(60) == 0 or sig == signal.SIGTERM
        _assert_gone(kids)
    finally:
        if server.poll() is None:
            server.kill()
            server.wait(10)


def test_a_tensor_parallel_core_serves_as_one_rank(tiny_folder: str) -> None:
    """The core process starts its worker ranks itself (it is not daemonic), and shutdown leaves none."""
    engine = AsyncLLM.start(tiny_folder, dtype="float32", device="cpu", num_pages=64, tensor_parallel_size=2,
                            log_interval_s=None, log_level="warning")
    try:
        kids = _children(engine.core.proc.pid)
        got = asyncio.run(_final(engine, [5, 6, 7, 8]))
    finally:
        engine.shutdown()
    want = LLM(tiny_folder, dtype="float32", device="cpu", num_pages=64).generate([[5, 6, 7, 8]], GREEDY)[0]
    assert got.token_ids == want.token_ids and kids
    _assert_gone(kids)


def _assert_gone(pids: list[int], timeout: float = 15.0) -> None:
    """Every pid has exited (its helpers, the forkserver and resource tracker, exit once their parent has)."""
    deadline = time.monotonic() + timeout
    alive = pids
    while alive and time.monotonic() < deadline:
        time.sleep(0.2)
        alive = [k for k in pids if os.path.exists(f"/proc/{k}") and open(f"/proc/{k}/stat").read().split()[2] != "Z"]
    assert not alive, [open(f"/proc/{k}/cmdline").read().replace("\0", " ")[:200] for k in alive]


def test_the_openai_client_streams_through_the_core_process(proc_engine: AsyncLLM, tiny_folder: str) -> None:
    from openai import OpenAI

    from radixkv.serve.app import create_app

    from .conftest import serve_in_thread

    want = LLM(tiny_folder, dtype="float32", device="cpu", num_pages=64).generate(["hello"], GREEDY)[0]
    url, uv, thread = serve_in_thread(create_app(None, served_model_name="tiny", engine=proc_engine))
    try:
        client = OpenAI(base_url=f"{url}/v1", api_key="none")
        chunks = list(client.completions.create(model="tiny", prompt="hello", max_tokens=6, temperature=0,
                                                stream=True, extra_body={"ignore_eos": True}))
        assert "".join(c.choices[0].text for c in chunks) == want.text
        assert chunks[-1].choices[0].finish_reason == "length"
    finally:
        uv.should_exit = True
        thread.join(10)
    assert proc_engine.is_running  # an engine the app was given is the caller's to stop
