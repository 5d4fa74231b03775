"""`radixkv bench-serve` against the tiny model's real server on 127.0.0.1 (tests/serve/conftest.py),
and its parsing of OpenAI streams without radixkv's fields (httpx.MockTransport)."""
from __future__ import annotations

import asyncio
import json
import math
import socket

import httpx
import pytest

from radixkv.cli import main
from radixkv.serve.bench_client import (BenchConfig, BenchRequest, RequestResult, send_request, send_times,
                                        summarize)
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
])
def test_bad_flags_are_one_line(argv, needle, tmp_path, capsys):
    try:
        code, out, err, res = _bench(["--base-url", "http://127.0.0.1:9", *argv], tmp_path, capsys)
    except SystemExit as exit:  # argparse's own checks
        code, err = exit.code, capsys.readouterr().err
    assert code == 2 and needle in err and err.count("\n") == 1 and err.startswith("radixkv: error: ")


def _mock_client(events: list[str], status: int = 200) -> httpx.AsyncClient:
    body = "".join(f"data: {e}\n\n" for e in events).encode()

    def handler(request: httpx.Request) -> httpx.Response:
        sent = json.loads(request.content)
        assert sent["stream"] and sent["stream_options"] == {"include_usage": True}
        assert "ignore_eos" not in sent and request.headers["authorization"] == "Bearer k"
        return httpx.Response(status, content=body if status == 200 else b'{"error": {"message": "bad\\nthing"}}',
                              headers={"content-type": "text/event-stream"})

    return httpx.AsyncClient(transport=httpx.MockTransport(handler))


def _send(events, status=200) -> RequestResult:
    async def go():
        async with _mock_client(events, status) as client:
            cfg = BenchConfig(base_url="http://x", api_key="k")
            return await send_request(client, cfg, "m", BenchRequest([1, 2, 3], 8), 0.0)
    return asyncio.run(go())


def test_a_server_without_usage_or_cached_tokens():
    chunk = json.dumps({"choices": [{"index": 0, "text": "a"}]})
    r = _send([chunk, chunk, chunk, "[DONE]"])
    assert r.success and r.output_tokens == 3 and r.prompt_tokens == 3 and r.cached_tokens is None
    assert len(r.itl) == 2 and r.ttft <= r.latency
    s = summarize([r], 1.0)
    assert s["prefix_hit_rate"] is None and s["total_cached_tokens"] is None and s["completed"] == 1
    usage = json.dumps({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 4,
                                                 "prompt_tokens_details": {"cached_tokens": 2}}})
    r = _send([chunk, chunk, usage, "[DONE]"])
    assert r.output_tokens == 4 and r.cached_tokens == 2 and summarize([r], 1.0)["prefix_hit_rate"] == 2 / 3
    r = _send([chunk, json.dumps({"error": {"message": "engine died"}})])
    assert not r.success and r.error == "engine died"
    r = _send([chunk])
    assert not r.success and "[DONE]" in r.error
    r = _send([], status=400)
    assert not r.success and r.error == "HTTP 400: bad thing"
    s = summarize([r], 1.0)
    assert s["failed"] == 1 and s["errors"] == {"HTTP 400: bad thing": 1} and s["mean_ttft_ms"] == 0.0


def test_send_times_and_datasets():
    reqs = [BenchRequest([1], 1, arrival_s=t) for t in (0.0, 0.5, 2.0)]
    assert send_times(reqs, None, 0) == [0.0, 0.5, 2.0]
    assert send_times(reqs, math.inf, 0) == [0.0, 0.0, 0.0]
    t = send_times(reqs * 100, 10.0, 0)
    assert t == sorted(t) and 20 < t[-1] < 40  # 299 Poisson gaps of mean 0.1 s
    ds = prefix_repetition_dataset(6, 4, 2, 2, 3, vocab_size=50, low=10, seed=1)
    assert len(ds) == 6 and len({tuple(r.prompt[:4]) for r in ds}) == 2
    assert all(10 <= i < 50 and len(r.prompt) == 6 and r.output_len == 3 for r in ds for i in r.prompt)
