"""A serving benchmark client for any OpenAI-compatible server (`radixkv bench-serve`).

Requests come from bench_datasets.py (a generator: `random`, `prefix-repetition`, `sharegpt`; or a
trace). Each is sent at its arrival time (the trace's, or Poisson at `request_rate`; `inf` sends all
at once), at most `max_concurrency` in flight, streaming to `POST /v1/completions` with
`stream_options.include_usage`. Per request: TTFT, ITL (gaps between content chunks), TPOT,
end-to-end latency, output tokens (usage, else the number of content chunks), prompt and cached
tokens (`usage.prompt_tokens_details.cached_tokens` when the server sends it). Nothing
radixkv-only is required; `ignore_eos` is sent only when asked for. Metric and flag names follow
`vllm bench serve`.
"""
from __future__ import annotations

import asyncio
import functools
import json
import math
import random
import time
from dataclasses import asdict
from typing import Any, List, Union

from .bench_results import BenchConfig, BenchError, BenchRequest, RequestResult, summarize


# ---------------------------------------------------------------- client
#
# aiohttp, one ClientSession (a TCPConnector of `max_concurrency` keep-alive connections), SSE lines
# split here over the bytes of each read, every `data:` line decoded by msgspec into the three fields
# the metrics need (choices' text/token_ids, usage, error) and nothing else: at hundreds of
# concurrent streams the client, not the server, must not be what sets the throughput.


def _headers(cfg: BenchConfig) -> dict[str, str]:
    return {"Authorization": f"Bearer {cfg.api_key}"} if cfg.api_key else {}


def _one_line(err: BaseException, timeout_s: float | None = None) -> str:
    msg = " ".join(str(err).split())
    if not msg and isinstance(err, (asyncio.TimeoutError, TimeoutError)) and timeout_s is not None:
        msg = f"no response within {timeout_s:g} s"
    return f"{type(err).__name__}: {msg or 'no message'}"


def _error_text(resp_body: bytes, status: int) -> str:
    try:
        err = json.loads(resp_body).get("error")
        msg = err.get("message") if isinstance(err, dict) else err
        if msg:
            return f"HTTP {status}: {' '.join(str(msg).split())}"
    except (ValueError, AttributeError):
        pass
    return f"HTTP {status}: {' '.join(resp_body.decode('utf-8', 'replace').split())[:200]}"


@functools.lru_cache(maxsize=None)
def _event_decoder() -> Any:
    """A msgspec decoder of one stream event into the fields the metrics read; the rest of the event
    (ids, logprobs, token ids' values, ...) is skipped without building Python objects."""
    import msgspec

    choice = msgspec.defstruct("Choice", [("text", Any, None), ("token_ids", Any, None)])
    event = msgspec.defstruct("Event", [("choices", Union[List[choice], None], None),  # type: ignore[valid-type]
                                        ("usage", Any, None), ("error", Any, None)])
    return msgspec.json.Decoder(event).decode


def _encode_body(body: dict[str, Any]) -> bytes:
    import msgspec

    return msgspec.json.encode(body)


def _timeout(cfg: BenchConfig) -> Any:
    """httpx's semantics (what `--timeout` meant before): connect (incl. waiting for a pooled
    connection) and each read within `timeout_s`, no bound on a whole stream."""
    import aiohttp

    return aiohttp.ClientTimeout(total=None, connect=cfg.timeout_s, sock_connect=cfg.timeout_s,
                                 sock_read=cfg.timeout_s)


def make_session(cfg: BenchConfig, connections: int) -> Any:
    """The aiohttp session of a run: `connections` keep-alive connections, none per-host capped."""
    import aiohttp

    connector = aiohttp.TCPConnector(limit=max(1, connections), limit_per_host=0, keepalive_timeout=60.0,
                                     ttl_dns_cache=300)
    return aiohttp.ClientSession(connector=connector, timeout=_timeout(cfg), trust_env=True,
                                 auto_decompress=False, raise_for_status=False)


def run_async(coro: Any) -> Any:
    """asyncio.run on uvloop's event loop when uvloop is importable (else asyncio's)."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    if hasattr(asyncio, "Runner"):  # 3.11+
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            return runner.run(coro)
    loop = uvloop.new_event_loop()
    try:
        asyncio.set_event_loop(loop)
        return loop.run_until_complete(coro)
    finally:
        try:
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            asyncio.set_event_loop(None)
            loop.close()


async def probe(client: Any, cfg: BenchConfig) -> str:
    """The model name to send: `cfg.model`, else the first of GET /v1/models. Raises BenchError when
    the server cannot be reached (or refuses the key). `client`: an aiohttp.ClientSession."""
    import aiohttp

    url = cfg.base_url.rstrip("/") + "/v1/models"
    try:
        async with client.get(url, headers=_headers(cfg), timeout=aiohttp.ClientTimeout(total=30.0)) as resp:
            status, content = resp.status, await resp.read()
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError) as err:
        raise BenchError(f"cannot reach the server at {cfg.base_url}: {_one_line(err, 30.0)}") from None
    if status in (401, 403):
        raise BenchError(f"{url}: {_error_text(content, status)} (give --api-key)")
    if cfg.model:
        return cfg.model
    if status != 200:
        raise BenchError(f"{url}: {_error_text(content, status)}; give --model")
    try:
        return str(json.loads(content)["data"][0]["id"])
    except (ValueError, KeyError, IndexError, TypeError):
        raise BenchError(f"{url}: no model listed; give --model") from None


class _SSE:
    """One stream's SSE parse: `feed(bytes)` per read (lines may span reads; a read may hold
    several), each event timed as it is parsed (as the httpx client did: events of one read a few
    microseconds apart). True once [DONE] or an error event came; `end`: [DONE]'s time."""

    __slots__ = ("start", "buf", "chunks", "last", "ttft", "itl", "usage", "done", "end", "error", "decode")

    def __init__(self, start: float, itl: list[float]) -> None:
        self.start = self.last = start
        self.buf = b""
        self.chunks = 0
        self.ttft = 0.0
        self.itl = itl
        self.usage: Any = None
        self.done = False
        self.end = 0.0
        self.error = ""
        self.decode = _event_decoder()

    def feed(self, data: bytes) -> bool:
        if self.buf:
            data = self.buf + data
        if b"\r" in data:  # CRLF (or CR) line ends; a CR at the end may be half of a CRLF
            keep = data.endswith(b"\r")
            data = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
            if keep:
                data = data[:-1] + b"\r"
        lines = data.split(b"\n")
        self.buf = lines.pop()
        decode, chunks, last, perf_counter = self.decode, self.chunks, self.last, time.perf_counter
        try:
            for line in lines:
                if line[:5] != b"data:":
                    line = line.strip()
                    if line[:5] != b"data:":
                        continue  # blank separators, `event:`/`id:` lines, `: comments`
                payload = line[5:].strip()
                now = perf_counter()
                if payload == b"[DONE]":
                    self.done, self.end = True, now
                    return True
                event = decode(payload)
                if event.error:
                    err = event.error
                    self.error = " ".join(str(err.get("message") if isinstance(err, dict) else err).split())
                    return True
                if event.usage:
                    self.usage = event.usage
                if event.choices:
                    for choice in event.choices:
                        if choice.text or choice.token_ids:
                            if chunks == 0:
                                self.ttft = now - self.start
                            else:
                                self.itl.append(now - last)
                            chunks += 1
                            last = now
                            break
            return False
        finally:
            self.chunks, self.last = chunks, last


async def _drain(content: Any) -> None:
    while await content.readany():
        pass


async def send_request(client: Any, cfg: BenchConfig, model: str, req: BenchRequest, t_bench: float) -> RequestResult:
    """Stream one completion over `client` (an aiohttp.ClientSession); the result's times are
    seconds (perf_counter)."""
    body: dict[str, Any] = {"model": model, "prompt": req.prompt, "max_tokens": req.output_len,
                            "temperature": cfg.temperature, "stream": True,
                            "stream_options": {"include_usage": True}}
    if cfg.ignore_eos:
        body["ignore_eos"] = True
    headers = {"Content-Type": "application/json", **_headers(cfg)}
    data = _encode_body(body)
    res = RequestResult()
    url = cfg.base_url.rstrip("/") + cfg.endpoint
    start = time.perf_counter()
    res.start = start - t_bench
    sse = _SSE(start, res.itl)
    try:
        async with client.post(url, data=data, headers=headers) as resp:
            if resp.status != 200:
                res.error = _error_text(await resp.read(), resp.status)
                return res
            content = resp.content
            feed = sse.feed
            while True:
                chunk = await content.readany()
                if not chunk:  # end of the body: a last line without its newline still counts
                    if sse.buf:
                        feed(b"\n")
                    break
                if feed(chunk):
                    break
            if sse.done and not content.is_eof():
                # read the body's end so that the connection goes back to the pool (a server that
                # keeps it open past [DONE] only costs this connection)
                try:
                    await asyncio.wait_for(_drain(content), 1.0)
                except Exception:  # noqa: BLE001 - the result is complete already
                    resp.close()
    except Exception as err:  # noqa: BLE001 - any transport or parse failure fails this request only
        if not sse.error:
            res.error = _one_line(err, cfg.timeout_s)
            return res
    if sse.error:
        res.error = sse.error
        return res
    res.latency = (sse.end if sse.done else time.perf_counter()) - start
    if not sse.done:
        res.error = "stream ended without [DONE]"
        return res
    usage = sse.usage if isinstance(sse.usage, dict) else None
    chunks = sse.chunks
    if chunks == 0 and not (usage and usage.get("completion_tokens")):
        res.error = "no output tokens"
        return res
    res.ttft = sse.ttft if chunks else res.latency  # tokens that decoded to nothing: the first time is the end
    res.output_tokens = int(usage["completion_tokens"]) if usage and usage.get("completion_tokens") else chunks
    res.prompt_tokens = (int(usage["prompt_tokens"]) if usage and usage.get("prompt_tokens") is not None
                         else (len(req.prompt) if isinstance(req.prompt, list) else 0))
    details = (usage or {}).get("prompt_tokens_details") or {}
    if details.get("cached_tokens") is not None:
        res.cached_tokens = int(details["cached_tokens"])
    res.success = True
    return res


def send_times(requests: list[BenchRequest], request_rate: float, seed: int) -> list[float]:
    """Seconds from the start at which each request is sent: the trace's arrival times when the
    requests carry them and `request_rate` is None; else 0 for `inf`, else Poisson gaps."""
    if request_rate is None:
        if all(r.arrival_s is not None for r in requests):
            return [float(r.arrival_s) for r in requests]  # type: ignore[arg-type]
        request_rate = math.inf
    if math.isinf(request_rate):
        return [0.0] * len(requests)
    rng = random.Random(seed)
    t, out = 0.0, []
    for _ in requests:
        out.append(t)
        t += rng.expovariate(request_rate)
    return out


async def run_benchmark(cfg: BenchConfig, requests: list[BenchRequest],
                        request_rate: float | None = math.inf) -> dict[str, Any]:
    """Send every request at its time and return the summary (see `summarize`) with per-request
    results under "requests"."""
    if not requests:
        raise BenchError("no requests to send (--num-prompts)")
    async with make_session(cfg, cfg.max_concurrency or len(requests)) as client:
        model = await probe(client, cfg)
        times = send_times(requests, request_rate, cfg.seed)
        sem = asyncio.Semaphore(cfg.max_concurrency) if cfg.max_concurrency else None
        t0 = time.perf_counter()

        async def one(req: BenchRequest, at: float) -> RequestResult:
            delay = t0 + at - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            if sem is None:
                return await send_request(client, cfg, model, req, t0)
            async with sem:
                return await send_request(client, cfg, model, req, t0)

        results = await asyncio.gather(*(one(r, t) for r, t in zip(requests, times)))
        duration = time.perf_counter() - t0
    summary = summarize(list(results), duration, cfg.percentiles)
    summary.update(model=model, base_url=cfg.base_url, endpoint=cfg.endpoint,
                   request_rate=request_rate if request_rate is None or not math.isinf(request_rate) else "inf",
                   max_concurrency=cfg.max_concurrency)
    summary["requests"] = [{**asdict(r), "tpot": r.tpot} for r in results]
    return summary
