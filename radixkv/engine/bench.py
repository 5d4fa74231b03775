"""End-to-end prefix-cache benchmark: k-shot prompts through LLM.generate, cache off vs on.

Prompts of a few k-shot templates (GSM8K examples tokenised as UTF-8 bytes when a GSM8K folder
is given, random tokens otherwise) are served three ways by the same model:
- sequential, cache off: the tree is emptied before every prompt (every token computed);
- sequential, cache on: a template's later prompts hit its shared examples in the tree;
- batched, cache on: all prompts at once (the scheduler's in-batch sharing + the tree).
Greedy tokens must be identical in all three modes; `radixkv bench` and
benchmarks/engine/bench_e2e.py print the table.
"""
from __future__ import annotations

import enum
import time
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch

from .llm import LLM
from .sampling import SamplingParams


class BenchMode(enum.Enum):
    SEQUENTIAL_CACHE_OFF = "sequential, cache off"
    SEQUENTIAL_CACHE_ON = "sequential, cache on"
    BATCHED = "batched, cache on"


class BenchRow(NamedTuple):
    mode: BenchMode
    wall_s: float
    prompt_tokens: int
    cached_tokens: int
    output_tokens: int
    token_ids: list[list[int]]

    @property
    def hit_rate(self) -> float:
        return self.cached_tokens / self.prompt_tokens

    @property
    def total_tok_s(self) -> float:
        return (self.prompt_tokens + self.output_tokens) / self.wall_s

    def as_json(self) -> dict[str, Any]:
        return dict(mode=self.mode.value, wall_s=round(self.wall_s, 3), prompt_tokens=self.prompt_tokens,
                    cached_tokens=self.cached_tokens, computed_tokens=self.prompt_tokens - self.cached_tokens,
                    hit_rate=round(self.hit_rate, 3), total_tok_s=round(self.total_tok_s, 1),
                    out_tok_s=round(self.output_tokens / self.wall_s, 1))


def byte_llama(hidden: int, layers: int, page_size: int, num_pages: int, device: str | None,
               dtype: str = "auto") -> LLM:
    """A random Llama over a 256-token byte vocabulary (GSM8K text needs no tokenizer)."""
    from transformers import LlamaConfig

    cfg = LlamaConfig(vocab_size=256, hidden_size=hidden, intermediate_size=hidden * 3,
                      num_hidden_layers=layers, num_attention_heads=max(1, hidden // 64),
                      num_key_value_heads=max(1, hidden // 256), max_position_embeddings=16384)
    return LLM(cfg, page_size=page_size, device=device, num_pages=num_pages, seed=0, dtype=dtype)


def few_shot_prompts(vocab_size: int, shots: int, prompts_per_template: int, max_tokens: int,
                     gsm8k: str | Path | None, templates: int = 2) -> list[list[int]]:
    """Token-id prompts of `templates` k-shot templates, folded into the model's vocabulary."""
    from radixkv.workloads.few_shot import FewShotConfig, few_shot

    reqs = few_shot(FewShotConfig(templates=templates, shots=shots, prompts_per_template=prompts_per_template,
                                  max_tokens=max_tokens), gsm8k)
    return [(np.asarray(r.tokens(), dtype=np.int64) % vocab_size).tolist() for r in reqs]


def run_mode(llm: LLM, prompts: list[list[int]], params: SamplingParams, mode: BenchMode) -> BenchRow:
    llm.reset_prefix_cache()
    _sync(llm)
    t = time.perf_counter()
    if mode is BenchMode.BATCHED:
        outs = llm.generate(prompts, params)
    else:
        outs = []
        for p in prompts:
            if mode is BenchMode.SEQUENTIAL_CACHE_OFF:
                llm.reset_prefix_cache()
            outs.append(llm.generate([p], params)[0])
    _sync(llm)
    return BenchRow(mode, time.perf_counter() - t, sum(map(len, prompts)), sum(o.cached_tokens for o in outs),
                    sum(len(o.token_ids) for o in outs), [o.token_ids for o in outs])


def run_bench(llm: LLM, prompts: list[list[int]], max_tokens: int) -> list[BenchRow]:
    """All three modes after a short warm-up; raises RuntimeError if their greedy tokens differ."""
    llm.generate([prompts[0][:32]], SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True))
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    rows = [run_mode(llm, prompts, params, m) for m in BenchMode]
    if any(r.token_ids != rows[0].token_ids for r in rows):
        raise RuntimeError("greedy tokens differ between cache modes")
    return rows


def format_table(rows: list[BenchRow]) -> str:
    lines = [f"{'mode':22} {'wall s':>8} {'hit rate':>9} {'computed':>9} {'total tok/s':>12}"]
    for r in rows:
        lines.append(f"{r.mode.value:22} {r.wall_s:8.2f} {r.hit_rate:9.3f} {r.prompt_tokens - r.cached_tokens:9d} "
                     f"{r.total_tok_s:12.1f}")
    return "\n".join(lines)


def _sync(llm: LLM) -> None:
    if llm.runner.device.type == "cuda":
        torch.cuda.synchronize()
