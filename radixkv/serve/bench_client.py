"""A serving benchmark client for any OpenAI-compatible server (`radixkv bench-serve`).

Requests come from a generator (`random`, `prefix-repetition`: token-id prompts, a list of ints
being a valid OpenAI prompt; `sharegpt`: text prompts from a ShareGPT JSON file) or a trace
(`trace`: radixkv/Mooncake/WEKA files or a bundled trace name, read with `load_trace`, token ids
folded into `[token_id_low, vocab_size)` so equal prefixes stay equal). Each is sent at its arrival
time (the trace's, or Poisson at `request_rate`; `inf` sends all at once), at most
`max_concurrency` in flight, streaming to `POST /v1/completions` with
`stream_options.include_usage`. Per request: TTFT, ITL (gaps between content chunks), TPOT,
end-to-end latency, output tokens (usage, else the number of content chunks), prompt and cached
tokens (`usage.prompt_tokens_details.cached_tokens` when the server sends it). Nothing
radixkv-only is required; `ignore_eos` is sent only when asked for. Metric and flag names follow
`vllm bench serve`.
"""
from __future__ import annotations

import asyncio
import json
import math
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

DATASETS = ("random", "prefix-repetition", "sharegpt", "trace")


class BenchError(Exception):
    """A user-facing error (bad dataset, unreachable server): one line, exit status 2."""


@dataclass
class BenchRequest:
    prompt: list[int] | str
    output_len: int
    arrival_s: float | None = None  # the trace's arrival time (seconds from the first)


@dataclass
class RequestResult:
    success: bool = False
    error: str = ""
    prompt_tokens: int = 0  # usage.prompt_tokens, else len(prompt) for token ids
    output_tokens: int = 0
    cached_tokens: int | None = None
    ttft: float = 0.0
    latency: float = 0.0
    itl: list[float] = field(default_factory=list)
    start: float = 0.0  # send time, seconds from the benchmark start

    @property
    def tpot(self) -> float | None:
        if not self.success or self.output_tokens < 2:
            return None
        return (self.latency - self.ttft) / (self.output_tokens - 1)


@dataclass
class BenchConfig:
    base_url: str
    model: str | None = None
    endpoint: str = "/v1/completions"
    api_key: str | None = None
    request_rate: float = math.inf
    max_concurrency: int | None = None
    ignore_eos: bool = False
    temperature: float = 0.0
    seed: int = 0
    timeout_s: float = 600.0
    percentiles: tuple[float, ...] = (99.0,)
    disable_tqdm: bool = True


# ---------------------------------------------------------------- datasets


def _rand_ids(rng: random.Random, n: int, low: int, high: int) -> list[int]:
    return [rng.randrange(low, high) for _ in range(n)]


def _check_vocab(low: int, vocab_size: int) -> None:
    if not 0 <= low < vocab_size:
        raise BenchError(f"--token-id-low {low} must lie in [0, --vocab-size {vocab_size})")


def random_dataset(num_prompts: int, input_len: int, output_len: int, *, range_ratio: float = 0.0,
                   prefix_len: int = 0, vocab_size: int = 256, low: int = 0, seed: int = 0) -> list[BenchRequest]:
    """vLLM's `random`: input/output lengths uniform in [len * (1 - r), len * (1 + r)], plus an
    optional shared prefix of `prefix_len` random ids."""
    _check_vocab(low, vocab_size)
    if not 0.0 <= range_ratio < 1.0:
        raise BenchError(f"--random-range-ratio must lie in [0, 1), got {range_ratio}")
    rng = random.Random(seed)
    prefix = _rand_ids(rng, prefix_len, low, vocab_size)
    out = []
    for _ in range(num_prompts):
        n_in = max(1, rng.randint(int(input_len * (1 - range_ratio)), int(input_len * (1 + range_ratio))))
        n_out = max(1, rng.randint(int(output_len * (1 - range_ratio)), int(output_len * (1 + range_ratio))))
        out.append(BenchRequest(prefix + _rand_ids(rng, n_in, low, vocab_size), n_out))
    return out


def prefix_repetition_dataset(num_prompts: int, prefix_len: int, suffix_len: int, num_prefixes: int,
                              output_len: int, *, vocab_size: int = 256, low: int = 0,
                              seed: int = 0) -> list[BenchRequest]:
    """vLLM's `prefix-repetition`: `num_prefixes` random prefixes, each prompt one of them plus a
    random suffix, shuffled (so a prefix-caching server hits on all but the first of each)."""
    _check_vocab(low, vocab_size)
    if num_prefixes < 1:
        raise BenchError("--prefix-repetition-num-prefixes must be >= 1")
    rng = random.Random(seed)
    prefixes = [_rand_ids(rng, prefix_len, low, vocab_size) for _ in range(num_prefixes)]
    out = [BenchRequest(prefixes[i % num_prefixes] + _rand_ids(rng, suffix_len, low, vocab_size), output_len)
           for i in range(num_prompts)]
    rng.shuffle(out)
    return out


def sharegpt_dataset(path: str | None, num_prompts: int, *, output_len: int | None = None,
                     seed: int = 0) -> list[BenchRequest]:
    """ShareGPT JSON (a list of {"conversations": [{"from": "human", "value": ...}, {"from": "gpt", ...}]}):
    the first human turn as the prompt text; output length `output_len`, else the reply's
    characters / 4 (no tokenizer on the client), at least 1."""
    if not path:
        raise BenchError("--dataset-name sharegpt needs --dataset-path FILE.json")
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as err:
        raise BenchError(f"cannot read --dataset-path {path}: {err.strerror or err}") from None
    except json.JSONDecodeError as err:
        raise BenchError(f"{path}: not JSON ({err})") from None
    if not isinstance(data, list):
        raise BenchError(f"{path}: expected a JSON list of conversations")
    pairs = []
    for conv in data:
        turns = conv.get("conversations") if isinstance(conv, dict) else None
        if not isinstance(turns, list) or len(turns) < 2:
            continue
        first, second = turns[0], turns[1]
        if not (isinstance(first, dict) and isinstance(second, dict)):
            continue
        text, reply = first.get("value"), second.get("value")
        if isinstance(text, str) and text and isinstance(reply, str):
            pairs.append((text, output_len or max(1, len(reply) // 4)))
    if not pairs:
        raise BenchError(f"{path}: no conversation with a prompt and a reply")
    random.Random(seed).shuffle(pairs)
    return [BenchRequest(text, n) for text, n in pairs[:num_prompts]]


def trace_dataset(path: str | None, num_prompts: int | None, *, vocab_size: int = 256, low: int = 0,
                  max_input_len: int | None = None, output_len: int | None = None,
                  time_scale: float = 1.0) -> list[BenchRequest]:
    """A trace file (or a bundled trace name): token ids folded into [low, vocab_size) (equal ids
    stay equal, so shared prefixes stay shared), optionally cut to `max_input_len`; arrival times
    times `time_scale`, relative to the first request."""
    from radixkv.workloads.data import BUNDLED, DEFAULT_TRACE, bundled_trace
    from radixkv.workloads.traces import TraceError, load_trace

    _check_vocab(low, vocab_size)
    name = path or DEFAULT_TRACE
    file = Path(name)
    if not file.exists() and name in BUNDLED:
        file = bundled_trace(name)
    try:
        trace = load_trace(file)
    except (TraceError, FileNotFoundError) as err:
        raise BenchError(str(err)) from None
    reqs = trace.requests[:num_prompts] if num_prompts else trace.requests
    if not reqs:
        raise BenchError(f"{name}: no requests")
    t0 = min(r.arrival_s for r in reqs)
    out = []
    for r in reqs:
        ids = r.tokens()
        if max_input_len:
            ids = ids[:max_input_len]
        folded = [int(t) % (vocab_size - low) + low for t in ids]
        out.append(BenchRequest(folded, output_len or max(1, int(r.max_tokens)),
                                (r.arrival_s - t0) * time_scale))
    return out


# ---------------------------------------------------------------- client


def _headers(cfg: BenchConfig) -> dict[str, str]:
    return {"Authorization": f"Bearer {cfg.api_key}"} if cfg.api_key else {}


def _error_text(resp_body: bytes, status: int) -> str:
    try:
        err = json.loads(resp_body).get("error")
        msg = err.get("message") if isinstance(err, dict) else err
        if msg:
            return f"HTTP {status}: {' '.join(str(msg).split())}"
    except (ValueError, AttributeError):
        pass
    return f"HTTP {status}: {' '.join(resp_body.decode('utf-8', 'replace').split())[:200]}"


async def probe(client: Any, cfg: BenchConfig) -> str:
    """The model name to send: `cfg.model`, else the first of GET /v1/models. Raises BenchError when
    the server cannot be reached (or refuses the key)."""
    import httpx

    url = cfg.base_url.rstrip("/") + "/v1/models"
    try:
        resp = await client.get(url, headers=_headers(cfg), timeout=30.0)
    except httpx.HTTPError as err:
        raise BenchError(f"cannot reach the server at {cfg.base_url}: {type(err).__name__}: "
                         f"{' '.join(str(err).split()) or 'no response'}") from None
    if resp.status_code in (401, 403):
        raise BenchError(f"{url}: {_error_text(resp.content, resp.status_code)} (give --api-key)")
    if cfg.model:
        return cfg.model
    if resp.status_code != 200:
        raise BenchError(f"{url}: {_error_text(resp.content, resp.status_code)}; give --model")
    try:
        return str(resp.json()["data"][0]["id"])
    except (ValueError, KeyError, IndexError, TypeError):
        raise BenchError(f"{url}: no model listed; give --model") from None


async def send_request(client: Any, cfg: BenchConfig, model: str, req: BenchRequest, t_bench: float) -> RequestResult:
    """Stream one completion; the result's times are seconds (perf_counter)."""
    body: dict[str, Any] = {"model": model, "prompt": req.prompt, "max_tokens": req.output_len,
                            "temperature": cfg.temperature, "stream": True,
                            "stream_options": {"include_usage": True}}
    if cfg.ignore_eos:
        body["ignore_eos"] = True
    res = RequestResult()
    url = cfg.base_url.rstrip("/") + cfg.endpoint
    start = time.perf_counter()
    res.start = start - t_bench
    last = start
    chunks = 0
    usage: dict[str, Any] | None = None
    done = False
    try:
        async with client.stream("POST", url, json=body, headers=_headers(cfg), timeout=cfg.timeout_s) as resp:
            if resp.status_code != 200:
                res.error = _error_text(await resp.aread(), resp.status_code)
                return res
            async for line in resp.aiter_lines():
                line = line.strip()
                if not line.startswith("data:"):
                    continue
                data = line[len("data:"):].strip()
                if data == "[DONE]":
                    done = True
                    break
                now = time.perf_counter()
                event = json.loads(data)
                if event.get("error"):
                    err = event["error"]
                    res.error = str(err.get("message") if isinstance(err, dict) else err)
                    return res
                if event.get("usage"):
                    usage = event["usage"]
                for choice in event.get("choices") or ():
                    if choice.get("text") or choice.get("token_ids"):
                        if chunks == 0:
                            res.ttft = now - start
                        else:
                            res.itl.append(now - last)
                        chunks += 1
                        last = now
                        break
    except Exception as err:  # noqa: BLE001 - any transport or parse failure fails this request only
        res.error = f"{type(err).__name__}: {' '.join(str(err).split())}"
        return res
    res.latency = time.perf_counter() - start
    if not done:
        res.error = "stream ended without [DONE]"
        return res
    if chunks == 0 and not (usage and usage.get("completion_tokens")):
        res.error = "no output tokens"
        return res
    if chunks == 0:  # tokens that decoded to nothing: the first time is the end
        res.ttft = res.latency
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
    import httpx

    if not requests:
        raise BenchError("no requests to send (--num-prompts)")
    limits = httpx.Limits(max_connections=cfg.max_concurrency or len(requests) + 1,
                          max_keepalive_connections=cfg.max_concurrency or len(requests) + 1)
    async with httpx.AsyncClient(limits=limits, timeout=cfg.timeout_s) as client:
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


# ---------------------------------------------------------------- report


def _percentile(values: list[float], p: float) -> float:
    """Linear-interpolated percentile (numpy's default)."""
    s = sorted(values)
    if not s:
        return 0.0
    k = (len(s) - 1) * p / 100.0
    lo, hi = math.floor(k), math.ceil(k)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def _stats(prefix: str, values_s: list[float], percentiles: tuple[float, ...]) -> dict[str, float]:
    ms = [v * 1000.0 for v in values_s]
    out = {f"mean_{prefix}_ms": sum(ms) / len(ms) if ms else 0.0,
           f"median_{prefix}_ms": _percentile(ms, 50.0)}
    mean = out[f"mean_{prefix}_ms"]
    out[f"std_{prefix}_ms"] = math.sqrt(sum((v - mean) ** 2 for v in ms) / len(ms)) if ms else 0.0
    for p in percentiles:
        out[f"p{p:g}_{prefix}_ms"] = _percentile(ms, p)
    return out


def summarize(results: list[RequestResult], duration: float, percentiles: tuple[float, ...] = (99.0,)) -> dict[str, Any]:
    """vLLM's result keys (completed, request_throughput, output_throughput, mean/median/std/pXX of
    ttft, tpot, itl, e2el in ms) plus failed, errors, cached tokens and the prefix hit rate
    (sum cached / sum prompt tokens over completed requests reporting cached tokens; None when
    the server reports none)."""
    ok = [r for r in results if r.success]
    prompt = sum(r.prompt_tokens for r in ok)
    output = sum(r.output_tokens for r in ok)
    reporting = [r for r in ok if r.cached_tokens is not None]
    cached = sum(r.cached_tokens or 0 for r in reporting)
    reported_prompt = sum(r.prompt_tokens for r in reporting)
    errors: dict[str, int] = {}
    for r in results:
        if not r.success:
            errors[r.error] = errors.get(r.error, 0) + 1
    d = max(duration, 1e-9)
    out: dict[str, Any] = {
        "duration": duration, "num_prompts": len(results), "completed": len(ok), "failed": len(results) - len(ok),
        "errors": errors, "total_input_tokens": prompt, "total_output_tokens": output,
        "total_cached_tokens": cached if reporting else None,
        "prefix_hit_rate": cached / reported_prompt if reporting and reported_prompt else None,
        "request_throughput": len(ok) / d, "output_throughput": output / d,
        "total_token_throughput": (prompt + output) / d,
    }
    out.update(_stats("ttft", [r.ttft for r in ok], percentiles))
    out.update(_stats("tpot", [t for r in ok if (t := r.tpot) is not None], percentiles))
    out.update(_stats("itl", [g for r in ok for g in r.itl], percentiles))
    out.update(_stats("e2el", [r.latency for r in ok], percentiles))
    return out


def format_table(s: dict[str, Any], percentiles: tuple[float, ...] = (99.0,)) -> str:
    """vLLM's `Serving Benchmark Result` table."""
    rows: list[tuple[str, str] | str] = ["Serving Benchmark Result"]

    def row(label: str, value: Any, fmt: str = "{:.2f}") -> None:
        rows.append((label, "n/a" if value is None else (fmt.format(value) if not isinstance(value, str) else value)))

    row("Successful requests:", s["completed"], "{}")
    row("Failed requests:", s["failed"], "{}")
    row("Benchmark duration (s):", s["duration"])
    row("Total input tokens:", s["total_input_tokens"], "{}")
    row("Total generated tokens:", s["total_output_tokens"], "{}")
    row("Total cached prompt tokens:", s["total_cached_tokens"], "{}")
    row("Prefix cache hit rate:", None if s["prefix_hit_rate"] is None else 100 * s["prefix_hit_rate"], "{:.1f} %")
    row("Request throughput (req/s):", s["request_throughput"])
    row("Output token throughput (tok/s):", s["output_throughput"])
    row("Total token throughput (tok/s):", s["total_token_throughput"])
    for key, title in (("ttft", "Time to First Token"), ("tpot", "Time per Output Token (excl. 1st token)"),
                       ("itl", "Inter-token Latency"), ("e2el", "End-to-end Latency")):
        rows.append(title)
        row(f"Mean {key.upper()} (ms):", s[f"mean_{key}_ms"])
        row(f"Median {key.upper()} (ms):", s[f"median_{key}_ms"])
        for p in percentiles:
            row(f"P{p:g} {key.upper()} (ms):", s[f"p{p:g}_{key}_ms"])
    width = 50
    lines = ["=" * width, str(rows[0]).center(width), "=" * width]
    for r in rows[1:]:
        if isinstance(r, str):
            lines.append(f" {r} ".center(width, "-"))
        else:
            lines.append(f"{r[0]:<38}{r[1]:>12}")
    lines.append("=" * width)
    if s["errors"]:
        for msg, n in list(s["errors"].items())[:5]:
            lines.append(f"failed x{n}: {msg}")
    return "\n".join(lines)
