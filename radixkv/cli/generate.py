"""`radixkv generate MODEL PROMPT...`: generate text with a model (the engine)."""
from __future__ import annotations

import argparse
from typing import Any

from radixkv.argtypes import positive_int
from radixkv.cli.common import (
    DTYPE_CHOICES,
    KV_DTYPE_CHOICES,
    LOAD_FORMAT_HELP,
    CliError,
    load_format_arg,
)
from radixkv.cli.load_model import build_engine
from radixkv.config import DTYPE_ALIASES, DTYPES, KV_DTYPE_ALIASES, KV_DTYPES


def add_generate_parser(sub: Any) -> None:
    """Add `generate` to the subparsers; sets `run`."""
    e = sub.add_parser("generate", help="generate text with a model (the engine)")
    e.add_argument("model", help="Hugging Face model folder, a .gguf file, a hub id in the local cache, "
                                  "or a config.json (random weights)")
    e.add_argument("prompts", nargs="+", metavar="PROMPT", help="prompt text (token ids if the model has no tokenizer: "
                                                                "comma-separated, e.g. 1,2,3)")
    e.add_argument("--max-tokens", type=positive_int, default=32)
    e.add_argument("--temperature", type=float, default=0.0)
    e.add_argument("--dtype", default="auto", choices=DTYPE_CHOICES, metavar="DTYPE",
                   help=f"compute dtype: {', '.join(DTYPES)} (aliases: {', '.join(DTYPE_ALIASES)})")
    e.add_argument("--kv-dtype", default="auto", choices=KV_DTYPE_CHOICES, metavar="KV_DTYPE",
                   help=f"KV cache dtype: {', '.join(KV_DTYPES)} (aliases: {', '.join(KV_DTYPE_ALIASES)})")
    e.add_argument("--page-size", type=positive_int, default=16)
    e.add_argument("--device", help="cpu or cuda (default: cuda when available)")
    e.add_argument("--load-format", type=load_format_arg, default="auto", metavar="FORMAT", help=LOAD_FORMAT_HELP)
    e.set_defaults(run=_cmd_generate)


def _cmd_generate(a: argparse.Namespace) -> int:
    from radixkv.sampling_params import SamplingParams

    llm = build_engine(a.model, page_size=a.page_size, dtype=a.dtype, kv_dtype=a.kv_dtype, device=a.device,
                       load_format=a.load_format)
    prompts: list = []
    for p in a.prompts:
        if llm.tokenizer is None:
            try:
                prompts.append([int(t) for t in p.split(",")])
            except ValueError:
                raise CliError(f"the model has no tokenizer: give prompts as token ids like 1,2,3, got {p!r}") from None
        else:
            prompts.append(p)
    try:
        outs = llm.generate(prompts, SamplingParams(max_tokens=a.max_tokens, temperature=a.temperature))
    except ValueError as e:  # a prompt the engine refuses (empty, out of vocabulary, too long)
        raise CliError(str(e)) from None
    for p, o in zip(a.prompts, outs):
        shown = o.text if o.text is not None else ",".join(map(str, o.token_ids))
        print(f"[{o.request_id}] {p!r} -> {shown!r}  ({len(o.token_ids)} tokens, {o.cached_tokens} prompt tokens cached)")
    return 0
