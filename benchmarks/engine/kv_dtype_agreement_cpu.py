"""First-token agreement of bf16 / fp8_e4m3 KV against fp32 KV on CPU (reference attention).

Same random model as gpu_engine_check.py's parity rows, so a low FP8 agreement there can be
told apart from a kernel error: here the reference path quantises with torch.

    python benchmarks/engine/kv_dtype_agreement_cpu.py [--prompts 16]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from gpu_engine_check import small_config  # noqa: E402

from radixkv import LLM, SamplingParams  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--arch", default="llama")
    args = ap.parse_args()
    cfg = small_config(args.arch, smoke=False)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, cfg.vocab_size, (64,), generator=g).tolist() for _ in range(args.prompts)]
    first: dict[str, list[int]] = {}
    for kv in ("fp32", "bf16", "fp8_e4m3", "fp8_e5m2"):
        llm = LLM(cfg, dtype="float32", kv_dtype=kv, page_size=16, num_pages=512, seed=0, device="cpu")
        outs = llm.generate(prompts, SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True))
        first[kv] = [o.token_ids[0] for o in outs]
    print(f"{'kv_dtype':10} first-token agreement with fp32 KV ({args.arch}, {args.prompts} prompts)")
    for kv in ("bf16", "fp8_e4m3", "fp8_e5m2"):
        agree = sum(a == b for a, b in zip(first["fp32"], first[kv])) / len(prompts)
        print(f"{kv:10} {agree:.3f}")


if __name__ == "__main__":
    main()
