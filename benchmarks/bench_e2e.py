"""End-to-end engine benchmark: k-shot GSM8K prompts through LLM.generate, prefix cache on vs off.

    python benchmarks/bench_e2e.py [--gsm8k ../shared/traces/gsm8k] [--shots 5] [--prompts 16]
                                   [--device cpu|cuda] [--json OUT.json]

A small random byte-level Llama (vocab 256: GSM8K text is tokenised as UTF-8 bytes by
workloads/few_shot.py, so no tokenizer is needed) serves the prompts of two few-shot
templates in three ways:
- sequential, cache off: the tree is emptied before every prompt (every token computed);
- sequential, cache on: prompts of a template after its first hit the shared examples;
- batched, cache on: all prompts at once (the scheduler's in-batch sharing + the tree).
It reports prompt tokens served from cache, wall time and tokens/s, and checks that every
mode produced the same greedy tokens.
"""
from __future__ import annotations

import argparse
import json
import os
import time

import torch
from transformers import LlamaConfig

from radixkv import LLM, SamplingParams
from radixkv.workloads.few_shot import FewShotConfig, few_shot

DEFAULT_GSM8K = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "traces", "gsm8k")


def build(args: argparse.Namespace) -> LLM:
    cfg = LlamaConfig(vocab_size=256, hidden_size=args.hidden, intermediate_size=args.hidden * 3,
                      num_hidden_layers=args.layers, num_attention_heads=args.hidden // 64,
                      num_key_value_heads=max(1, args.hidden // 256), max_position_embeddings=16384)
    return LLM(cfg, page_size=args.page_size, device=args.device, num_pages=args.num_pages, seed=0)


def run_mode(llm: LLM, prompts: list[list[int]], params: SamplingParams, mode: str) -> dict:
    llm.cache.evict(llm.num_pages)
    _sync(llm)
    t = time.perf_counter()
    if mode == "batched":
        outs = llm.generate(prompts, params)
    else:
        outs = []
        for p in prompts:
            if mode == "sequential_cache_off":
                llm.cache.evict(llm.num_pages)
            outs.append(llm.generate([p], params)[0])
    _sync(llm)
    dt = time.perf_counter() - t
    prompt_tokens = sum(len(p) for p in prompts)
    cached = sum(o.cached_tokens for o in outs)
    out_tokens = sum(len(o.token_ids) for o in outs)
    return dict(mode=mode, wall_s=round(dt, 3), prompt_tokens=prompt_tokens, cached_tokens=cached,
                hit_rate=round(cached / prompt_tokens, 3), computed_tokens=prompt_tokens - cached,
                total_tok_s=round((prompt_tokens + out_tokens) / dt, 1), out_tok_s=round(out_tokens / dt, 1),
                tokens=[o.token_ids for o in outs])


def _sync(llm: LLM) -> None:
    if llm.device.type == "cuda":
        torch.cuda.synchronize()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gsm8k", default=DEFAULT_GSM8K, help="folder with train.jsonl and test.jsonl")
    ap.add_argument("--shots", type=int, default=5)
    ap.add_argument("--prompts", type=int, default=8, help="prompts per template (2 templates)")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--page-size", type=int, default=16)
    ap.add_argument("--num-pages", type=int, default=4096)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--json", help="write the table as JSON here")
    args = ap.parse_args()
    torch.set_num_threads(max(1, min(torch.get_num_threads(), 2)))
    reqs = few_shot(FewShotConfig(templates=2, shots=args.shots, prompts_per_template=args.prompts,
                                  max_tokens=args.max_tokens), args.gsm8k)
    prompts = [r.tokens().tolist() for r in reqs]
    llm = build(args)
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
    llm.generate([prompts[0][:64]], SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True))  # warm-up
    rows = [run_mode(llm, prompts, params, m) for m in ("sequential_cache_off", "sequential_cache_on", "batched")]
    same = all(r["tokens"] == rows[0]["tokens"] for r in rows)
    print(f"{len(prompts)} GSM8K {args.shots}-shot prompts (2 templates, mean {sum(map(len, prompts)) / len(prompts):.0f}"
          f" byte tokens), random Llama hidden {args.hidden} x {args.layers} layers, {args.device}, "
          f"page {args.page_size}, {args.max_tokens} new tokens each")
    print(f"{'mode':22} {'wall s':>8} {'hit rate':>9} {'computed':>9} {'total tok/s':>12} {'out tok/s':>10}")
    for r in rows:
        print(f"{r['mode']:22} {r['wall_s']:8.2f} {r['hit_rate']:9.3f} {r['computed_tokens']:9d} "
              f"{r['total_tok_s']:12.1f} {r['out_tok_s']:10.1f}")
    print(f"greedy tokens identical across modes: {same}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(args=vars(args), identical=same,
                           rows=[{k: v for k, v in r.items() if k != "tokens"} for r in rows]), f, indent=1)
    if not same:
        raise SystemExit("modes disagree")


if __name__ == "__main__":
    main()
