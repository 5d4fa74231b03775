"""Whether an engine built with every default fits its GPU: the KV pool, the CUDA graphs and a full step.

    python benchmarks/engine/graph_memory.py            # H200: Llama-3-8B shape, 128,256-word vocabulary
    python benchmarks/engine/graph_memory.py --smoke    # CPU, tiny model: checks the script

Builds `LLM(folder, load_format="dummy")` with nothing else given (max_num_seqs decided from the pool), then
runs as many one-token-prompt requests as the running set holds, 16 tokens each, so the largest decode graph
replays. Prints the decided running set, the pool, the graphs captured, the memory the graph pools and the
reserve took (plan.graph_reserve_bytes) and the device memory left; a row to --json.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from gpu_engine_check import llama3_8b_config  # noqa: E402

from radixkv import LLM, SamplingParams, plan  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--json")
    a = ap.parse_args()
    cuda = torch.cuda.is_available()
    folder = Path(tempfile.mkdtemp(prefix="rkv-graph-memory-"))
    cfg = llama3_8b_config(a.smoke)
    (folder / "config.json").write_text(json.dumps(cfg.to_dict()))
    free0 = torch.cuda.mem_get_info()[0] if cuda else 0
    t = time.perf_counter()
    llm = LLM(str(folder), load_format="dummy", **({} if cuda else {"device": "cpu", "dtype": "float32"}))
    build = time.perf_counter() - t
    sched = llm.config.scheduler
    rows = sched.max_running
    graphs = llm.runner.graphs
    reserve = plan.graph_reserve_bytes(cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size, rows,
                                       min(sched.max_batch_tokens, plan.MIXED_GRAPH_MAX_TOKENS), 2 if cuda else 4)
    free_built = torch.cuda.mem_get_info()[0] if cuda else 0
    g = torch.Generator().manual_seed(0)
    prompts = [[int(x)] for x in torch.randint(100, cfg.vocab_size, (rows,), generator=g)]
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    t = time.perf_counter()
    outs = llm.generate(prompts, SamplingParams(max_tokens=16, ignore_eos=True))
    run = time.perf_counter() - t
    assert all(len(o.token_ids) == 16 for o in outs)
    row = {"vocab": cfg.vocab_size, "max_num_seqs": rows, "max_batch_tokens": sched.max_batch_tokens,
           "num_pages": llm.num_pages, "decode_graphs": graphs.num_graphs if graphs else 0,
           "graph_reserve_gib": round(reserve / 2**30, 3), "build_s": round(build, 1), "run_s": round(run, 2),
           "free_before_gib": round(free0 / 2**30, 2), "free_built_gib": round(free_built / 2**30, 2),
           "free_after_run_gib": round(torch.cuda.mem_get_info()[0] / 2**30, 2) if cuda else 0,
           "peak_allocated_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2) if cuda else 0,
           "reserved_gib": round(torch.cuda.memory_reserved() / 2**30, 2) if cuda else 0}
    if a.json:
        Path(a.json).write_text(json.dumps(row, indent=1))
    print("\n" + "\n".join(f"{k:>20} {v}" for k, v in row.items()))


if __name__ == "__main__":
    main()
