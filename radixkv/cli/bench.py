"""`radixkv bench`: the end-to-end prefix-cache benchmark (k-shot prompts, cache off vs on)."""
from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from radixkv.argtypes import positive_int
from radixkv.cli.common import (
    DTYPE_CHOICES,
    LOAD_FORMAT_HELP,
    CliError,
    check_output,
    load_format_arg,
    not_utf8,
    one_line,
    out_of_memory,
    pages_arg,
    write_output,
)
from radixkv.cli.load_model import build_engine, pool_words
from radixkv.config import DTYPE_ALIASES, DTYPES


def add_bench_parser(sub: Any) -> None:
    """Add `bench` to the subparsers; sets `run`."""
    b = sub.add_parser("bench", help="end-to-end prefix-cache benchmark: k-shot prompts, cache off vs on",
                       description="Serve k-shot prompts with the prefix cache off, on, and batched; "
                                   "print wall time, hit rate and tokens/s (greedy output must agree).")
    b.add_argument("--model", metavar="PATH", help="model folder, .gguf or config.json (default: a random byte-level Llama)")
    b.add_argument("--gsm8k", metavar="DIR", help="GSM8K folder (train.jsonl, test.jsonl); default: random tokens")
    b.add_argument("--shots", type=positive_int, default=3)
    b.add_argument("--prompts", type=positive_int, default=4, help="prompts per template (2 templates)")
    b.add_argument("--max-tokens", type=positive_int, default=8)
    b.add_argument("--hidden", type=positive_int, default=128, help="hidden size of the default random model")
    b.add_argument("--layers", type=positive_int, default=2, help="layers of the default random model")
    b.add_argument("--page-size", type=positive_int, default=16)
    b.add_argument("--num-pages", type=pages_arg, default=4096)
    b.add_argument("--device", help="cpu or cuda (default: cuda when available)")
    b.add_argument("--dtype", default="auto", choices=DTYPE_CHOICES, metavar="DTYPE",
                   help=f"compute dtype: {', '.join(DTYPES)} (aliases: {', '.join(DTYPE_ALIASES)})")
    b.add_argument("--load-format", type=load_format_arg, default="auto", metavar="FORMAT",
                   help=LOAD_FORMAT_HELP + "; needs --model")
    b.add_argument("--json", metavar="OUT.json", help="write the rows as JSON")
    b.set_defaults(run=_cmd_bench)


def _cmd_bench(a: argparse.Namespace) -> int:
    from radixkv.engine import bench
    from radixkv.engine.device import pick_device
    from radixkv.engine.model_config import config_errors, error_detail

    check_output("--json", a.json)
    if a.load_format != "auto" and not a.model:
        raise CliError(f"--load-format {a.load_format} needs --model (a model folder with config.json)")
    try:
        pick_device(a.device)
    except ValueError as e:  # a device this torch build lacks
        raise CliError(one_line(e)) from None
    if a.model:
        llm = build_engine(a.model, page_size=a.page_size, num_pages=a.num_pages, device=a.device,
                           load_format=a.load_format, dtype=a.dtype)
    else:
        try:
            llm = bench.byte_llama(a.hidden, a.layers, a.page_size, a.num_pages, a.device, a.dtype)
        except config_errors() as e:  # a --hidden no Llama has (odd head_dim)
            raise CliError(f"cannot build the default random model (--hidden {a.hidden}, --layers {a.layers}): "
                           f"{error_detail(e)}") from None
        except (RuntimeError, MemoryError) as e:
            if not out_of_memory(e):
                raise
            raise CliError(f"out of memory for the default random model (--hidden {a.hidden}, --layers "
                           f"{a.layers}) and a KV pool of {pool_words(vars(a))}") from None
    try:
        prompts = bench.few_shot_prompts(llm.runner.spec.vocab_size, a.shots, a.prompts, a.max_tokens, a.gsm8k)
    except UnicodeDecodeError as e:
        raise CliError(not_utf8("--gsm8k", a.gsm8k, e)) from None
    except OSError as e:  # missing, a folder where a file belongs
        raise CliError(f"--gsm8k {a.gsm8k}: {e.strerror or e}: {e.filename}") from None
    longest = max(map(len, prompts)) + a.max_tokens
    if longest > llm.max_model_len:
        raise CliError(f"the longest prompt ({longest - a.max_tokens:,} tokens: --shots {a.shots}) plus --max-tokens "
                       f"{a.max_tokens} exceeds the model's context of {llm.max_model_len:,} tokens; "
                       f"use fewer --shots or --max-tokens")
    need = -(-longest // a.page_size)
    if need > llm.num_pages:
        raise CliError(f"--num-pages {llm.num_pages:,} is too small: the longest prompt ({longest - a.max_tokens:,} "
                       f"tokens) plus --max-tokens {a.max_tokens} needs {need:,} pages of {a.page_size} tokens")
    if a.model and llm.runner.device.type == "cpu":  # a real model serves 3 x the prompts on the CPU
        print(f"radixkv bench: {len(prompts)} prompts x 3 modes with {a.model} on the CPU: this can take minutes "
              f"(fewer with --prompts 1 --shots 1)", file=sys.stderr, flush=True)
    try:
        rows = bench.run_bench(llm, prompts, a.max_tokens)
    except ValueError as e:  # a prompt the engine refuses
        raise CliError(one_line(e)) from None
    print(f"{len(prompts)} {a.shots}-shot prompts (2 templates, mean {sum(map(len, prompts)) / len(prompts):.0f} "
          f"tokens), {a.max_tokens} new tokens each, page {a.page_size}, {llm.runner.device}")
    print(bench.format_table(rows))
    print("greedy tokens identical across modes: True")
    if a.json:
        write_output("--json", a.json, json.dumps([r.as_json() for r in rows], indent=1) + "\n")
    return 0
