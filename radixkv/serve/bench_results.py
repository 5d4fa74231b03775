"""The types of a serving benchmark run (BenchRequest, RequestResult, BenchConfig) and its report:
`summarize` (the numbers `vllm bench serve` reports, by the same names) and `format_table`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any


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
