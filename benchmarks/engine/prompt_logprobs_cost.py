"""What prompt logprobs cost (issue 32 target: 64 x 1k-token prompts with prompt_logprobs=1 within 1.3x
of the same batch without), on the H200.

    python benchmarks/engine/prompt_logprobs_cost.py --json OUT.json     # GPU machine
    python benchmarks/engine/prompt_logprobs_cost.py --smoke             # CPU, tiny model: checks the script

A Llama-3-8B-shaped model (random bf16 weights, its 128,256-word vocabulary: the LM head over every
prompt position is the added work). One generate of `--prompts` random prompts of `--len` tokens,
max_tokens 1, timed with and without prompt_logprobs (k = 1, and k = 20 for the top-k's cost), each
after a warm-up run of the same shapes, the prefix cache reset before every run so both compute
every prompt token. RequestOutput.prompt_logprobs builds vLLM's dicts when read: the time to read them
all is its own column. Prints a table last; rows to --json.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from gpu_engine_check import llama3_8b_config  # noqa: E402

from radixkv import LLM, SamplingParams  # noqa: E402


def timed(llm: LLM, prompts: list[list[int]], k: int | None, device: str) -> tuple[float, object]:
    params = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True, prompt_logprobs=k)
    llm.reset_prefix_cache()
    if device == "cuda":
        torch.cuda.synchronize()
    t = time.perf_counter()
    outs = llm.generate(prompts, params)
    if device == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - t, outs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--len", type=int, default=1024)
    ap.add_argument("--smoke", action="store_true", help="tiny model, CPU sizes")
    ap.add_argument("--json", help="write the rows here")
    ap.add_argument("--profile", action="store_true", help="also profile one k=1 run (cProfile + torch.profiler)")
    a = ap.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    n, length = (4, 40) if a.smoke else (a.prompts, a.len)
    llm = LLM(llama3_8b_config(a.smoke), dtype="bfloat16" if device == "cuda" else "float32", device=device,
              **({"num_pages": 64, "page_size": 16} if a.smoke else {}))
    g = torch.Generator().manual_seed(0)
    vocab = llm.inputs.limits.vocab_size
    prompts = [torch.randint(10, vocab, (length,), generator=g).tolist() for _ in range(n)]
    rows = []
    base = None
    for k in (None, 1, 20):
        timed(llm, prompts, k, device)  # warm-up: same shapes, compiles and captures
        secs, outs = timed(llm, prompts, k, device)
        dicts = 0.0
        if k is not None:
            assert all(len(o.prompt_logprobs) == length and o.num_cached_tokens == 0 for o in outs)
            t = time.perf_counter()  # vLLM's {token id: Logprob} dicts, built when read: read them all
            assert sum(len(d) for o in outs for d in o.prompt_logprobs[1:]) >= n * (length - 1)
            dicts = time.perf_counter() - t
        base = secs if k is None else base
        rows.append({"prompts": n, "prompt_len": length, "prompt_logprobs": k, "seconds": round(secs, 4),
                     "prompt_tok_s": round(n * length / secs, 1), "vs_without": round(secs / base, 3),
                     "read_all_dicts_s": round(dicts, 4),
                     "device": torch.cuda.get_device_name() if device == "cuda" else "cpu"})
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))
    if a.profile:
        import cProfile
        import io
        import pstats

        from torch.profiler import ProfilerActivity, profile

        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
        pr = cProfile.Profile()
        with profile(activities=acts) as prof:
            pr.enable()
            timed(llm, prompts[: max(2, n // 4)], 1, device)
            pr.disable()
        out = io.StringIO()
        pstats.Stats(pr, stream=out).sort_stats("tottime").print_stats(18)
        print(out.getvalue()[-6000:])
        key = "self_cuda_time_total" if device == "cuda" else "self_cpu_time_total"
        print(prof.key_averages().table(sort_by=key, row_limit=14, max_name_column_width=60))
    print(f"\n{'prompt_logprobs':>15} {'seconds':>9} {'prompt tok/s':>13} {'vs without':>11} {'read all dicts s':>17}")
    for r in rows:
        print(f"{str(r['prompt_logprobs']):>15} {r['seconds']:>9.3f} {r['prompt_tok_s']:>13,.0f} {r['vs_without']:>11.3f} "
              f"{r['read_all_dicts_s']:>17.3f}")


if __name__ == "__main__":
    main()
