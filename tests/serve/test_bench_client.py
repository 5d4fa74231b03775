"""`radixkv bench-serve` against the tiny model's real server on 127.0.0.1 (tests/serve/conftest.py),
and its parsing of SSE streams (radixkv's, OpenAI's without radixkv's fields, broken ones) served
by aiohttp.web on 127.0.0.1."""
from __future__ import annotations

import asyncio
import json
import math
import socket

import pytest

pytest.importorskip("aiohttp")
pytest.importorskip("msgspec")

from radixkv.cli import main
from radixkv.serve.bench_client import make_session, run_benchmark, send_request, send_times
from radixkv.serve.bench_results import BenchConfig, BenchRequest, RequestResult, summarize
from radixkv.serve.bench_datasets import prefix_repetition_dataset

VOCAB = ["--vocab-size", "160", "--token-id-low", "5"]  # the tiny model's ids, its specials (0-4) left out


def _bench(argv, tmp_path, capsys):
    out = tmp_path / "result.json"
    code = main(["bench-serve", *argv, "--save-result", "--save-detailed", "--result-filename", str(out)])
    captured = capsys.readouterr()
    return code, captured.out, captured.err, (json.loads(out.read_text()) if out.exists() else None)


def test_prefix_repetition_against_the_server(server, tmp_path, capsys):
    argv = ["--base-url", server.url, "--dataset-name", "prefix-repetition", "--num-prompts", "12",
            "--prefix-repetition-prefix-len", "48", "--prefix-repetition-suffix-len", "8",
            "--prefix-repetition-num-prefixes", "2", "--prefix-repetition-output-len", "5",
            "--max-concurrency", "3", "--ignore-eos", *VOCAB]
    code, out, err, res = _bench(argv, tmp_path, capsys)
    assert code == 0, err
    assert "Serving Benchmark Result" in out and "Prefix cache hit rate:" in out
    assert res["completed"] == 12 and res["failed"] == 0 and res["model"] == "tiny-llama"
    assert res["total_input_tokens"] == 12 * 56 and res["total_output_tokens"] == 12 * 5
    assert 0 < res["prefix_hit_rate"] <= 1 and res["total_cached_tokens"] > 0
    assert res["request_throughput"] > 0 and res["output_throughput"] > 0
    for r in res["requests"]:
        assert r["success"] and r["output_tokens"] == 5 and r["prompt_tokens"] == 56
        assert 0 < r["ttft"] <= r["latency"] and r["tpot"] > 0 and len(r["itl"]) <= 4  # one gap per text chunk
    assert res["mean_ttft_ms"] <= res["mean_e2el_ms"] and res["p99_ttft_ms"] <= res["p99_e2el_ms"] + 1e-6
    assert server.pool_whole()


def test_random_poisson_and_a_bundled_trace(server, tmp_path, capsys):
    code, out, err, res = _bench(["--base-url", server.url, "--model", "tiny-llama", "--num-prompts", "4",
                                  "--random-input-len", "16", "--random-output-len", "3", "--request-rate", "50",
                                  "--ignore-eos", "--metric-percentiles", "50,90", *VOCAB], tmp_path, capsys)
    assert code == 0, err
    assert res["completed"] == 4 and res["total_output_tokens"] == 12 and "p90_itl_ms" in res
    assert res["request_rate"] == 50.0 and "P90 TTFT (ms):" in out
    code, out, err, res = _bench(["--base-url", server.url, "--dataset-name", "trace", "--dataset-path",
                                  "mooncake-sample", "--num-prompts", "3", "--trace-max-input-len", "40",
                                  "--trace-output-len", "2", "--trace-time-scale", "0.001", "--ignore-eos",
                                  *VOCAB], tmp_path, capsys)
    assert code == 0, err
    assert res["completed"] == 3 and res["total_input_tokens"] == 120 and res["total_output_tokens"] == 6
    starts = [r["start"] for r in res["requests"]]
    assert starts[0] < starts[1] < starts[2]  # sent at the trace's (scaled) arrival times
    assert server.pool_whole()


def test_sharegpt_text_prompts(server, tmp_path, capsys):
    data = [{"conversations": [{"from": "human", "value": f"hello number {i}"},
                               {"from": "gpt", "value": "abcdefgh"}]} for i in range(3)]
    path = tmp_path / "sg.json"
    path.write_text(json.dumps(data))
    code, out, err, res = _bench(["--base-url", server.url, "--dataset-name", "sharegpt", "--dataset-path",
                                  str(path), "--num-prompts", "3", "--ignore-eos"], tmp_path, capsys)
    assert code == 0, err
    assert res["completed"] == 3 and res["total_output_tokens"] == 6  # 8 chars / 4
    assert res["total_input_tokens"] > 0


def test_nothing_listening_is_one_line_exit_2(tmp_path, capsys):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    code, out, err, res = _bench(["--base-url", f"http://127.0.0.1:{port}", "--num-prompts", "2"], tmp_path, capsys)
    assert code == 2 and res is None and out == ""
    assert err.startswith("radixkv: error: cannot reach the server at http://127.0.0.1:") and err.count("\n") == 1


@pytest.mark.parametrize("argv, needle", [
    (["--dataset-name", "sharegpt"], "needs --dataset-path"),
    (["--dataset-name", "trace", "--dataset-path", "/nonexistent.jsonl"], "trace not found"),
    (["--vocab-size", "5", "--token-id-low", "5"], "--token-id-low 5 must lie in"),
    (["--request-rate", "0"], "argument --request-rate: expected a positive rate or inf, got '0'"),
    (["--timeout", "-1"], "argument --timeout: expected a finite number > 0, got '-1'"),  # issue 33 item 14
    (["--timeout", "nan"], "argument --timeout: expected a finite number > 0, got 'nan'"),
    (["--temperature", "nan"], "argument --temperature: expected a finite number >= 0, got 'nan'"),
])
def test_bad_flags_are_one_line(argv, needle, tmp_path, capsys):
    try:
        code, out, err, res = _bench(["--base-url", "http://127.0.0.1:9", *argv], tmp_path, capsys)
    except SystemExit as exit:  # argparse's own checks
        code, err = exit.code, capsys.readouterr().err
    assert code == 2 and needle in err and err.count("\n") == 1 and err.startswith("radixkv: error: ")


# ------------------------------------------------ parsing, against an aiohttp.web server on 127.0.0.1


def _chunk(text: str = "a", **extra) -> str:
    return json.dumps({"choices": [{"index": 0, "text": text, **extra}]})


USAGE = json.dumps({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 4,
                                             "prompt_tokens_details": {"cached_tokens": 2}}})


def _sse(events: list[str], sep: str = "\n\n") -> bytes:
    return "".join(f"data: {e}{sep}" for e in events).encode()


async def _serve(writes: list[bytes], status: int = 200, gap_s: float = 0.0, seen: list | None = None,
                 peers: set | None = None):
    """An aiohttp.web server on a free port of 127.0.0.1: POST /v1/completions answers `writes`,
    each its own write (and TCP segment: no Nagle, `gap_s` apart); GET /v1/models lists "m"."""
    from aiohttp import web

    async def completions(request: web.Request) -> web.StreamResponse:
        sent = await request.json()
        if seen is not None:
            seen.append((sent, dict(request.headers)))
        if peers is not None:
            peers.add(request.transport.get_extra_info("peername"))
        if status != 200:
            return web.Response(status=status, body=b'{"error": {"message": "bad\\nthing"}}',
                                content_type="application/json")
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for i, piece in enumerate(writes):
            if i and gap_s:
                await asyncio.sleep(gap_s)
            await resp.write(piece)
        await resp.write_eof()
        return resp

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "m", "object": "model"}]})

    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    app.router.add_get("/v1/models", models)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    return runner, f"http://127.0.0.1:{port}"


def _send(writes: list[bytes] | bytes, status: int = 200, gap_s: float = 0.0, timeout_s: float = 30.0,
          ignore_eos: bool = False) -> RequestResult:
    if isinstance(writes, bytes):
        writes = [writes]

    async def go():
        seen: list = []
        runner, url = await _serve(writes, status, gap_s, seen)
        try:
            cfg = BenchConfig(base_url=url, api_key="k", timeout_s=timeout_s, ignore_eos=ignore_eos)
            async with make_session(cfg, 4) as client:
                res = await send_request(client, cfg, "m", BenchRequest([1, 2, 3], 8), 0.0)
        finally:
            await runner.cleanup()
        (sent, headers), = seen
        assert sent["stream"] and sent["stream_options"] == {"include_usage": True} and sent["model"] == "m"
        assert sent["prompt"] == [1, 2, 3] and sent["max_tokens"] == 8
        assert ("ignore_eos" in sent) == ignore_eos and headers["Authorization"] == "Bearer k"
        return res
    return asyncio.run(go())


def _split(body: bytes, size: int) -> list[bytes]:
    return [body[i:i + size] for i in range(0, len(body), size)]


def test_a_server_without_usage_or_cached_tokens():
    chunk = _chunk()  # OpenAI's shape: no token_ids, no usage, no cached tokens
    r = _send(_sse([chunk, chunk, chunk, "[DONE]"]))
    assert r.success and r.output_tokens == 3 and r.prompt_tokens == 3 and r.cached_tokens is None
    assert len(r.itl) == 2 and r.ttft <= r.latency
    s = summarize([r], 1.0)
    assert s["prefix_hit_rate"] is None and s["total_cached_tokens"] is None and s["completed"] == 1
    r = _send(_sse([chunk, chunk, USAGE, "[DONE]"]))  # usage only in the last event
    assert r.output_tokens == 4 and r.cached_tokens == 2 and summarize([r], 1.0)["prefix_hit_rate"] == 2 / 3
    assert r.prompt_tokens == 3 and len(r.itl) == 1


def test_events_split_across_writes_and_several_per_write():
    events = [_chunk("a", token_ids=[7]), _chunk("", token_ids=[8]), _chunk("c", token_ids=[9],
              finish_reason="length"), USAGE, "[DONE]"]
    for sep in ("\n\n", "\r\n\r\n", "\r\r"):
        body = _sse(events, sep)
        whole = _send(body)  # every event in one write
        assert whole.success and whole.output_tokens == 4 and whole.cached_tokens == 2, sep
        assert len(whole.itl) == 2  # three content chunks: a token id counts without text
        for size in (1, 5, 17, 64):  # events (and CRLFs) cut anywhere
            r = _send(_split(body, size))
            assert r.success and (r.output_tokens, r.prompt_tokens, r.cached_tokens) == (4, 3, 2), (sep, size)
            assert len(r.itl) == 2 and r.ttft <= r.latency
    # a `data:` line without the last newline, comments and other fields are fine too
    r = _send([b": ping\n\nevent: x\nid: 1\n", _sse([_chunk()]), b"  data:" + _chunk().encode() + b"\n\n",
               b"data:[DONE]"])
    assert r.success and r.output_tokens == 2 and len(r.itl) == 1


@pytest.mark.alone  # a 40 ms bound on the first chunk's time
def test_chunk_times_are_when_the_chunks_arrive():
    r = _send([_sse([_chunk()]), _sse([_chunk()]), _sse([_chunk(), USAGE, "[DONE]"])], gap_s=0.05)
    assert r.success and r.ttft < 0.04 and len(r.itl) == 2
    assert 0.04 < r.itl[0] < 1.0 and 0.04 < r.itl[1] < 1.0 and r.latency >= r.ttft + sum(r.itl) - 1e-6
    assert abs(r.tpot - (r.latency - r.ttft) / 3) < 1e-9


def test_errors_are_one_line():
    chunk = _chunk()
    r = _send(_sse([chunk, json.dumps({"error": {"message": "engine\ndied", "code": 500}})]))
    assert not r.success and r.error == "engine died"
    r = _send(_sse([chunk, json.dumps({"error": "plain"}), "[DONE]"]))
    assert not r.success and r.error == "plain"
    r = _send(_sse([chunk]))
    assert not r.success and r.error == "stream ended without [DONE]"
    r = _send(_sse([json.dumps({"choices": [{"index": 0, "text": ""}]}), "[DONE]"]))
    assert not r.success and r.error == "no output tokens"
    r = _send(_sse([json.dumps({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2}}), "[DONE]"]))
    assert r.success and r.output_tokens == 2 and r.ttft == r.latency  # tokens that decoded to nothing
    r = _send([b"data: {not json\n\n"])
    assert not r.success and r.error.startswith("DecodeError: ") and "\n" not in r.error
    r = _send(b"", status=400, ignore_eos=True)
    assert not r.success and r.error == "HTTP 400: bad thing"
    s = summarize([r], 1.0)
    assert s["failed"] == 1 and s["errors"] == {"HTTP 400: bad thing": 1} and s["mean_ttft_ms"] == 0.0
    r = _send([_sse([chunk]), _sse(["[DONE]"])], gap_s=1.0, timeout_s=0.2)  # stalls past --timeout
    assert not r.success and "Timeout" in r.error and "\n" not in r.error


def test_run_benchmark_keeps_its_connections():
    peers: set = set()
    body = _sse([_chunk(token_ids=[1]), _chunk("b", token_ids=[2]), USAGE, "[DONE]"])

    async def go():
        runner, url = await _serve(_split(body, 40), peers=peers)
        try:
            cfg = BenchConfig(base_url=url, max_concurrency=2)
            return await run_benchmark(cfg, [BenchRequest([1, 2, 3], 2) for _ in range(10)])
        finally:
            await runner.cleanup()

    res = asyncio.run(go())
    assert res["completed"] == 10 and res["model"] == "m" and res["total_output_tokens"] == 40
    assert res["total_cached_tokens"] == 20 and res["max_concurrency"] == 2
    assert len(peers) <= 2  # each stream read to its end: its connection goes back to the pool


def test_send_times_and_datasets():
    reqs = [BenchRequest([1], 1, arrival_s=t) for t in (0.0, 0.5, 2.0)]
    assert send_times(reqs, None, 0) == [0.0, 0.5, 2.0]
    assert send_times(reqs, math.inf, 0) == [0.0, 0.0, 0.0]
    t = send_times(reqs * 100, 10.0, 0)
    assert t == sorted(t) and 20 < t[-1] < 40  # 299 Poisson gaps of mean 0.1 s
    ds = prefix_repetition_dataset(6, 4, 2, 2, 3, vocab_size=50, low=10, seed=1)
    assert len(ds) == 6 and len({tuple(r.prompt[:4]) for r in ds}) == 2
    assert all(10 <= i < 50 and len(r.prompt) == 6 and r.output_len == 3 for r in ds for i in r.prompt)
