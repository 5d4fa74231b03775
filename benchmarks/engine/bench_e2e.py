"""End-to-end engine benchmark: k-shot GSM8K prompts through LLM.generate, prefix cache on vs off.

    python benchmarks/engine/bench_e2e.py [--gsm8k ../shared/traces/gsm8k] [--shots 5] [--prompts 8]
                                   [--device cpu|cuda] [--json OUT.json]

The same as `radixkv bench` (radixkv/bench.py) with larger defaults: a random byte-level Llama
(hidden 256 x 4 layers) serves two 5-shot GSM8K templates sequentially with the cache off,
sequentially with it on, and batched; greedy tokens must agree across the three modes.
"""
from __future__ import annotations

import argparse
import json
import os

import torch

from radixkv.engine import bench

DEFAULT_GSM8K = os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared", "traces", "gsm8k")


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
    llm = bench.byte_llama(args.hidden, args.layers, args.page_size, args.num_pages, args.device)
    prompts = bench.few_shot_prompts(256, args.shots, args.prompts, args.max_tokens, args.gsm8k)
    rows = bench.run_bench(llm, prompts, args.max_tokens)
    print(f"{len(prompts)} GSM8K {args.shots}-shot prompts (2 templates, mean {sum(map(len, prompts)) / len(prompts):.0f}"
          f" byte tokens), random Llama hidden {args.hidden} x {args.layers} layers, {args.device}, "
          f"page {args.page_size}, {args.max_tokens} new tokens each")
    print(bench.format_table(rows))
    print("greedy tokens identical across modes: True")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(args=vars(args), rows=[r.as_json() for r in rows]), f, indent=1)


if __name__ == "__main__":
    main()
