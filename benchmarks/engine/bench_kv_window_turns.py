"""What the recent-token window costs a decode-heavy engine: int4 KV with the default window and without.

Llama-3-8B shapes, random weights, bf16 compute (H200): 64 rows of 1,500-token prompts and 64 new tokens,
then a second turn on each (the first turn's text + 30 tokens, a prefix-cache hit), timed per turn; the
window's fills (pages whose full-precision copy is rebuilt from the pages) are counted. --profile prints
torch.profiler's kernel table of a short windowed run.

    python benchmarks/engine/bench_kv_window_turns.py [--rows 64] [--prompt 1500] [--new 64] [--profile]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_e2e_gpu import llama3_8b_config

from radixkv import LLM, SamplingParams


def timed(llm: LLM, prompts: list[list[int]], params: SamplingParams) -> tuple[float, list]:
    torch.cuda.synchronize()
    t = time.perf_counter()
    outs = llm.generate(prompts, params)
    torch.cuda.synchronize()
    return time.perf_counter() - t, outs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--prompt", type=int, default=1500)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--profile", action="store_true")
    a = ap.parse_args()
    cfg = llama3_8b_config(False)
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(3, 1000, (a.prompt,), generator=g).tolist() for _ in range(a.rows)]
    params = SamplingParams(temperature=0.0, max_tokens=a.new, ignore_eos=True)
    pages = a.rows * (-(-(2 * (a.prompt + a.new) + 64) // 16)) + 256
    rows = []
    for window in (None, 0):
        llm = LLM(cfg, dtype="bfloat16", device="cuda", kv_dtype="int4", num_pages=pages, kv_window=window)
        llm.generate(prompts[:4], params)  # compiles and captures outside the timing
        t1, outs = timed(llm, prompts, params)
        win = llm.runner.attention.window
        f0 = win.fills if win is not None else 0
        t2, _ = timed(llm, [p + o.token_ids + [5, 6, 7] * 10 for p, o in zip(prompts, outs)], params)
        rows.append((llm.runner.kv_window, t1, t2, win.fills - f0 if win is not None else None))
        print(f"window {llm.runner.kv_window}: turn 1 {t1:.2f} s, turn 2 {t2:.2f} s, fills in turn 2 {rows[-1][3]}",
              flush=True)
        if a.profile and win is not None:
            from torch.profiler import ProfilerActivity, profile

            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                llm.generate([p[:a.prompt - 100] + [9] * 50 for p in prompts],
                             SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True))
            print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=18), flush=True)
        del llm
        torch.cuda.empty_cache()
    print("\n| window | turn 1 (s) | turn 2 (s) | fills in turn 2 |\n|---:|---:|---:|---:|")
    for w, t1, t2, f in rows:
        print(f"| {w} | {t1:.2f} | {t2:.2f} | {'-' if f is None else f} |")


if __name__ == "__main__":
    main()
