"""`radixkv bench-serve --base-url URL`: the serving benchmark client, with `vllm bench serve`'s
flag names where they overlap. Self-contained: the `radixkv` command adds it with
`add_bench_serve(subparsers)`; `run_bench_serve(args)` returns the exit status (0 done, 1 no
request completed, 2 a user mistake or an unreachable server, one line on stderr).
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

from radixkv.argtypes import (MAX_REQUEST_TOKENS, count, finite_float_at_least, int_at_least, nonnegative_int,
                              token_count, token_count_or_0)


def _rate(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected requests per second or inf, got {text!r}") from None
    if not v > 0 or math.isnan(v):
        raise argparse.ArgumentTypeError(f"expected a positive rate or inf, got {text!r}")
    return v


def _percentiles(text: str) -> tuple[float, ...]:
    try:
        ps = tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated percentiles, got {text!r}") from None
    if not ps or any(not 0 <= p <= 100 for p in ps):
        raise argparse.ArgumentTypeError(f"expected percentiles in [0, 100], got {text!r}")
    return ps


def add_bench_serve(subparsers: Any) -> argparse.ArgumentParser:
    """Add the `bench-serve` subcommand to an argparse subparsers object; sets `run=run_bench_serve`."""
    b = subparsers.add_parser(
        "bench-serve", help="serving benchmark client for any OpenAI-compatible server (TTFT, TPOT, ITL, hit rate)",
        description="Send a generator's or a trace's requests to an OpenAI-compatible server "
                    "(POST /v1/completions, streaming) at their arrival times and report TTFT, TPOT, ITL and "
                    "end-to-end latency (mean, median, percentiles), throughput and the prefix cache hit rate "
                    "(usage.prompt_tokens_details.cached_tokens). Flags as in `vllm bench serve`.")
    b.add_argument("--base-url", required=True, metavar="URL", help="server root, e.g. http://127.0.0.1:8000")
    b.add_argument("--endpoint", default="/v1/completions", help="completions path (default /v1/completions)")
    b.add_argument("--model", help="model name to send (default: the first of GET /v1/models)")
    b.add_argument("--api-key", help="send `Authorization: Bearer KEY`")
    b.add_argument("--dataset-name", choices=["random", "prefix-repetition", "sharegpt", "trace"], default="random")
    b.add_argument("--dataset-path", metavar="PATH",
                   help="sharegpt: the JSON file; trace: a trace file/folder or a bundled trace name")
    b.add_argument("--num-prompts", type=count, default=None, metavar="N",
                   help="requests to send (default 1000; trace: all of it)")
    b.add_argument("--request-rate", type=_rate, default=None, metavar="RATE",
                   help="requests/s, Poisson arrivals; inf = all at once (default: inf, or a trace's arrival times)")
    b.add_argument("--max-concurrency", type=count, metavar="N", help="requests in flight at most")
    b.add_argument("--seed", type=int, default=0)
    b.add_argument("--ignore-eos", action="store_true", help="send ignore_eos: true (vLLM/radixkv extra field)")
    b.add_argument("--temperature", type=finite_float_at_least(0.0), default=0.0, help="sampling temperature (default 0, greedy)")
    b.add_argument("--vocab-size", type=int_at_least(1, 2**31 - 1, "token ids are int32"), default=256, metavar="N",
                   help="token-id prompts use ids below N (default 256; up to the model's vocab size)")
    b.add_argument("--token-id-low", type=nonnegative_int, default=0, metavar="N",
                   help="token-id prompts use ids >= N (e.g. to skip special tokens; default 0)")
    g = b.add_argument_group("random")
    g.add_argument("--random-input-len", type=token_count, default=1024, metavar="N")
    g.add_argument("--random-output-len", type=token_count, default=128, metavar="N")
    g.add_argument("--random-range-ratio", type=_range_ratio, default=0.0, metavar="R")
    g.add_argument("--random-prefix-len", type=token_count_or_0, default=0, metavar="N")
    g = b.add_argument_group("prefix-repetition")
    g.add_argument("--prefix-repetition-prefix-len", type=token_count_or_0, default=256, metavar="N")
    g.add_argument("--prefix-repetition-suffix-len", type=token_count_or_0, default=256, metavar="N")
    g.add_argument("--prefix-repetition-num-prefixes", type=count, default=10, metavar="N")
    g.add_argument("--prefix-repetition-output-len", type=token_count, default=128, metavar="N")
    g = b.add_argument_group("sharegpt / trace")
    g.add_argument("--sharegpt-output-len", type=token_count, metavar="N", help="output tokens (default: reply chars / 4)")
    g.add_argument("--trace-output-len", type=token_count, metavar="N", help="output tokens (default: the trace's)")
    g.add_argument("--trace-max-input-len", type=token_count, metavar="N", help="cut trace prompts to N tokens")
    g.add_argument("--trace-time-scale", type=float, default=1.0, metavar="F",
                   help="multiply the trace's arrival times (0.1 = 10x faster; default 1)")
    g = b.add_argument_group("results")
    g.add_argument("--metric-percentiles", type=_percentiles, default=(99.0,), metavar="P,P",
                   help="percentiles to report (default 99)")
    g.add_argument("--save-result", action="store_true", help="write the results as JSON")
    g.add_argument("--save-detailed", action="store_true", help="include every request's times in the JSON")
    g.add_argument("--result-dir", default=".", metavar="DIR")
    g.add_argument("--result-filename", metavar="FILE.json",
                   help="default: bench-serve-<dataset>-<date>.json in --result-dir")
    g.add_argument("--timeout", type=finite_float_at_least(0.0, exclusive=True), default=600.0, metavar="S", help="per-request timeout (default 600 s)")
    b.set_defaults(run=run_bench_serve)
    return b


MAX_BENCH_TOKENS = 1 << 26  # prompt tokens of one benchmark in all (the prompts are lists of ints: ~36 B each)


def _range_ratio(text: str) -> float:
    """--random-range-ratio: lengths uniform in [len * (1 - r), len * (1 + r)], so 0 <= r < 1 (as vLLM)."""
    v = finite_float_at_least(0.0)(text)
    if v >= 1:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1), got {text!r}")
    return v


def check_sizes(args: argparse.Namespace) -> str | None:
    """Why the synthetic request set asked for is too large to build (one line), else None: a prompt
    past 2**24 tokens, or more than MAX_BENCH_TOKENS prompt tokens in all."""
    n = args.num_prompts or 1000
    if args.dataset_name == "random":
        each = args.random_prefix_len + int(args.random_input_len * (1 + args.random_range_ratio))
        flags = "--random-prefix-len + --random-input-len x (1 + --random-range-ratio)"
    elif args.dataset_name == "prefix-repetition":
        each = args.prefix_repetition_prefix_len + args.prefix_repetition_suffix_len
        flags = "--prefix-repetition-prefix-len + --prefix-repetition-suffix-len"
    else:
        return None  # read from a file: bounded by the file (and its reader)
    if each > MAX_REQUEST_TOKENS:
        return f"prompts of up to {each:,} tokens ({flags}), more than {MAX_REQUEST_TOKENS:,} (2**24 tokens a request)"
    if n * each > MAX_BENCH_TOKENS:
        return (f"--num-prompts {n:,} x {each:,} tokens is {n * each:,} prompt tokens, more than a benchmark "
                f"builds ({MAX_BENCH_TOKENS:,}, 2**26)")
    return None


def build_requests(args: argparse.Namespace) -> list:
    from .bench_datasets import (prefix_repetition_dataset, random_dataset, sharegpt_dataset,
                               trace_dataset)

    n = args.num_prompts
    vocab = dict(vocab_size=args.vocab_size, low=args.token_id_low)
    if args.dataset_name == "random":
        return random_dataset(n or 1000, args.random_input_len, args.random_output_len,
                              range_ratio=args.random_range_ratio, prefix_len=args.random_prefix_len,
                              seed=args.seed, **vocab)
    if args.dataset_name == "prefix-repetition":
        return prefix_repetition_dataset(n or 1000, args.prefix_repetition_prefix_len,
                                         args.prefix_repetition_suffix_len, args.prefix_repetition_num_prefixes,
                                         args.prefix_repetition_output_len, seed=args.seed, **vocab)
    if args.dataset_name == "sharegpt":
        return sharegpt_dataset(args.dataset_path, n or 1000, output_len=args.sharegpt_output_len, seed=args.seed)
    return trace_dataset(args.dataset_path, n, max_input_len=args.trace_max_input_len,
                         output_len=args.trace_output_len, time_scale=args.trace_time_scale, **vocab)


def result_path(args: argparse.Namespace) -> Path:
    name = args.result_filename or f"bench-serve-{args.dataset_name}-{time.strftime('%Y%m%d-%H%M%S')}.json"
    return Path(args.result_dir) / name


def run_bench_serve(args: argparse.Namespace) -> int:
    from .bench_client import run_async, run_benchmark
    from .bench_results import BenchConfig, BenchError, format_table

    for module in ("aiohttp", "msgspec"):  # checked before anything is sent
        try:
            __import__(module)
        except ImportError:
            print(f"radixkv: error: `radixkv bench-serve` needs {module} (pip install {module})", file=sys.stderr)
            return 2
    too_large = check_sizes(args)
    if too_large:
        print(f"radixkv: error: {too_large}", file=sys.stderr)
        return 2
    out = result_path(args) if args.save_result else None
    if out is not None and (out.is_dir() or not out.parent.is_dir()):
        print(f"radixkv: error: --result-filename: cannot write {out}", file=sys.stderr)
        return 2
    cfg = BenchConfig(base_url=args.base_url, model=args.model, endpoint=args.endpoint, api_key=args.api_key,
                      max_concurrency=args.max_concurrency, ignore_eos=args.ignore_eos,
                      temperature=args.temperature, seed=args.seed, timeout_s=args.timeout,
                      percentiles=args.metric_percentiles)
    rate = args.request_rate
    if rate is None and args.dataset_name != "trace":
        rate = math.inf
    try:
        requests = build_requests(args)
        summary = run_async(run_benchmark(cfg, requests, rate))  # on uvloop when it is installed
    except BenchError as err:
        print(f"radixkv: error: {' '.join(str(err).split())}", file=sys.stderr)
        return 2
    print(format_table(summary, cfg.percentiles))
    if out is not None:
        if not args.save_detailed:
            summary.pop("requests", None)
        summary.update(dataset_name=args.dataset_name, num_prompts=len(requests), seed=args.seed,
                       date=time.strftime("%Y%m%d-%H%M%S"))
        out.write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
        print(f"results written to {out}")
    return 0 if summary["completed"] else 1
