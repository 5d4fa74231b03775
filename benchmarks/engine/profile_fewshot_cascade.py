"""torch.profiler over Part B's few-shot workload with LLM(cascade=True) against cascade off (issue 21).

    python benchmarks/engine/profile_fewshot_cascade.py --gsm8k .devshare/gsm8k > OUT.txt   # H200
    python benchmarks/engine/profile_fewshot_cascade.py --smoke                            # CPU check

Same model, inputs and pool as bench_e2e_gpu.py's few-shot rows; prints, per config, the wall time, how
many decode steps took the cascade path and replayed a graph, and the top ops by CPU and by CUDA time.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).parent))
from bench_e2e_gpu import (  # noqa: E402
    SMOKE,
    SMOKE_PAGES,
    Sizes,
    build_inputs,
    run_engine_workload,
    warm_shared_prefix,
)
from gpu_engine_check import llama3_8b_config  # noqa: E402

from radixkv import LLM, SamplingParams  # noqa: E402
from radixkv.engine.kv_store import KVStore  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gsm8k", default=None)
    ap.add_argument("--smoke", action="store_true")
    a = ap.parse_args()
    sz = SMOKE if a.smoke else Sizes()
    dev = torch.device("cuda" if torch.cuda.is_available() and not a.smoke else "cpu")
    cfg = llama3_8b_config(a.smoke)
    inp = build_inputs(sz, cfg.vocab_size, cfg.max_position_embeddings, a.gsm8k, None, {"few-shot"})
    L, H, D = cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.hidden_size // cfg.num_attention_heads
    budget = SMOKE_PAGES * KVStore.bytes_per_page(16, L, H, D, "bfloat16") if sz.kv_gb <= 0 else int(sz.kv_gb * 1e9)
    pages = KVStore.pages_for_budget(budget, 16, L, H, D, "bfloat16")
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
    for cascade in (False, True):
        t0 = time.perf_counter()
        llm = LLM(cfg, dtype="bfloat16" if dev.type == "cuda" else "float32", device=dev, num_pages=pages,
                  cascade=cascade)
        warm = [p[:] for p in inp.few_shot[:4]]
        llm.generate(warm, SamplingParams(temperature=0.0, max_tokens=sz.new, ignore_eos=True))
        warm_shared_prefix(llm, cfg.vocab_size, torch.Generator().manual_seed(5))  # resets the prefix cache
        print(f"# cascade={cascade}: built and warmed in {time.perf_counter() - t0:.1f} s, "
              f"{llm.runner.graphs.num_graphs if llm.runner.graphs is not None else 0} graphs", flush=True)
        t = time.perf_counter()
        with profile(activities=acts) as prof:
            row = run_engine_workload(llm, "few-shot", f"cascade={cascade}", inp, sz)
        wall = time.perf_counter() - t
        replays = llm.runner.graphs.cascade_replays if llm.runner.graphs is not None else 0
        print(f"== cascade={cascade}: {wall:.2f} s (profiled), {row['steps']} steps, cascade steps "
              f"{row['cascade_steps']}, cascade graph replays {replays}, graphs captured {row['graphs_captured']}, "
              f"{row['output_tokens_per_s']} tok/s")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=14))
        if dev.type == "cuda":
            print(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=14))
        del llm
    return 0


if __name__ == "__main__":
    sys.exit(main())
