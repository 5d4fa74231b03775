"""Offline throughput on vLLM's `benchmark_throughput` ShareGPT recipe, one row an engine config.

Requests (bench_common.sharegpt_pairs): --num-prompts ShareGPT pairs, prompt = the first human turn,
output length = the token count of the reply that follows, both counted with SmolLM2's tokenizer; vLLM's
filters (prompt >= 4 and output >= 4 tokens, prompt <= 1024, prompt + output <= 2048), shuffled with
--prompt-seed. Fed as token ids to one `LLM.generate` with vLLM's sampling (temperature 1, top_p 1,
ignore_eos, max_tokens = the output length); timed from the call to its return (a short warm-up and a
prefix-cache reset before it, unless --no-warmup). Throughputs as vLLM's script reports them:
output_tok_s = output tokens / s, total_tok_s = (prompt + output tokens) / s.

Configs (--configs, each `default` or comma-separated LLM(...) keywords, vLLM's names allowed; the name is
the row's `config`): default = LLM(model) with nothing else; `max_num_seqs=1024`; `kv_dtype=fp8_e4m3`;
`kv_dtype=fp8_e4m3,max_num_seqs=1024`. Engine flags given on the command line (--dtype, --device, ...)
apply to every config. Rows merge into --json by config.

The model: a Llama-3-8B-shaped config.json with SmolLM2's 49,152-id vocabulary and random weights (issue 31's
measurement), or --model (any folder / .gguf / config.json, or `smollm2`).

H200 (~2.5 min for the four configs):
    python benchmarks/serve/sharegpt_offline.py
CPU smoke (tiny model, 32 prompts cut to 128 + 16 tokens, ~30 s):
    python benchmarks/serve/sharegpt_offline.py --smoke
"""
from __future__ import annotations

import argparse
import gc
import sys
import time
from typing import Any

from bench_common import (
    SMOLLM2_VOCAB,
    add_engine_flags,
    add_model_args,
    engine_kwargs,
    fold_ids,
    json_path,
    log_dir,
    merge_rows,
    model_label,
    resolve_model,
    sharegpt_file,
    sharegpt_pairs,
    smoke_engine_defaults,
    smollm2_tokenizer,
    table,
)

CONFIGS = ("default", "max_num_seqs=1024", "kv_dtype=fp8_e4m3", "kv_dtype=fp8_e4m3,max_num_seqs=1024")
SMOKE_CAP = (128, 16)  # --smoke: prompts cut to 128 tokens, outputs to 16


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_model_args(p, "SmolLM2's 49,152")
    add_engine_flags(p)
    p.add_argument("--configs", nargs="+", default=list(CONFIGS), metavar="CONFIG",
                   help=f"`default` or k=v[,k=v...] LLM keywords (default: {' '.join(CONFIGS)})")
    p.add_argument("--num-prompts", type=int, help="ShareGPT pairs (default 1000; smoke 32)")
    p.add_argument("--prompt-seed", type=int, default=0, help="the pairs' shuffle")
    p.add_argument("--sharegpt", help="ShareGPT JSONL (default: .devshare/sharegpt/ or ../shared/traces/sharegpt/)")
    p.add_argument("--tokenizer", help="SmolLM2 tokenizer folder (default: .devshare/smollm2-tokenizer or the GGUF's)")
    p.add_argument("--no-warmup", action="store_true", help="time the very first generate (vLLM's script has no "
                                                            "warm-up; its engine captures graphs at start-up)")
    p.add_argument("--step-profile", action="store_true",
                   help="also print where the timed run's wall time went, by running-set size (steps, ms a step)")
    p.add_argument("--json", help="rows merge into this file (default benchmarks/results/sharegpt_offline.json; "
                                  "--smoke: a temp file)")
    a = p.parse_args()
    if a.num_prompts is None:
        a.num_prompts = 32 if a.smoke else 1000
    for c in a.configs:
        config_kwargs(c)  # a bad config fails before anything loads
    return a


def _value(text: str) -> Any:
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    if low == "none":
        return None
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


def config_kwargs(config: str) -> dict[str, Any]:
    """`default` -> {}; `a=1,b=fp8_e4m3` -> {"a": 1, "b": "fp8_e4m3"}."""
    if config == "default":
        return {}
    out = {}
    for item in config.split(","):
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            sys.exit(f"error: --configs: expected `default` or k=v[,k=v], got {config!r}")
        out[key.strip()] = _value(value.strip())
    return out


def time_steps(core: Any) -> list[tuple[int, bool, float]]:
    """Record (running rows after the step, mixed step?, seconds) for every core.step() from now on."""
    log: list[tuple[int, bool, float]] = []
    step = core.step

    def timed() -> Any:
        mixed, t = core.mixed_steps, time.perf_counter()
        out = step()
        log.append((len(core.scheduler.running), core.mixed_steps > mixed, time.perf_counter() - t))
        return out

    core.step = timed
    return log


def print_step_profile(log: list[tuple[int, bool, float]]) -> None:
    """Wall time by running-set band: how much of the run the big batches take and how much the tail."""
    bands = [(0, 16), (16, 64), (64, 256), (256, 512), (512, 768), (768, 10**9)]
    print(f"  {'running':>11} {'steps':>6} {'mixed':>6} {'seconds':>8} {'ms/step':>8} {'tokens':>8}")
    for lo, hi in bands:
        sel = [(n, m, s) for n, m, s in log if lo <= n < hi]
        if sel:
            secs = sum(s for *_, s in sel)
            print(f"  {f'{lo}-{hi if hi < 10**9 else 1024}':>11} {len(sel):>6} {sum(m for _, m, _ in sel):>6} "
                  f"{secs:>8.2f} {secs / len(sel) * 1e3:>8.2f} {sum(n for n, *_ in sel):>8}", flush=True)


def run_config(model: str, base: dict, config: str, reqs: list[tuple[list[int], int]], warmup: bool,
               step_profile: bool = False) -> dict:
    import torch

    from radixkv import LLM, SamplingParams

    kw = {**base, **config_kwargs(config)}
    t = time.perf_counter()
    llm = LLM(model, **kw)
    build_s = time.perf_counter() - t
    sync = torch.cuda.synchronize if llm.runner.device.type == "cuda" else (lambda: None)
    if warmup:  # a few of the same requests, short: the first shapes' compiles stay out of the timing
        llm.generate([p for p, _ in reqs[:16]], SamplingParams(max_tokens=8, ignore_eos=True))
        llm.reset_prefix_cache()
    params = [SamplingParams(n=1, temperature=1.0, top_p=1.0, ignore_eos=True, max_tokens=n) for _, n in reqs]
    before = llm.core.stats()
    log = time_steps(llm.core) if step_profile else None
    sync()
    t = time.perf_counter()
    outs = llm.generate([p for p, _ in reqs], params)
    sync()
    wall = time.perf_counter() - t
    if log is not None:
        print_step_profile(log)
    after = llm.core.stats()
    n_in = sum(len(p) for p, _ in reqs)
    n_out = sum(len(o.outputs[0].token_ids) for o in outs)
    if n_out != sum(n for _, n in reqs):
        print(f"  warning: {n_out} output tokens, the requests asked for {sum(n for _, n in reqs)}", flush=True)
    row = dict(config=config, output_tok_s=n_out / wall, total_tok_s=(n_in + n_out) / wall, requests=len(reqs),
               requests_per_s=len(reqs) / wall, elapsed_s=wall, prompt_tokens=n_in, output_tokens=n_out,
               steps=after.num_steps - before.num_steps, mixed_steps=after.mixed_steps - before.mixed_steps,
               max_num_seqs=llm.config.scheduler.max_running, num_pages=llm.num_pages,
               kv_dtype=llm.runner.kv_dtype.value, hit_rate=(after.hit_tokens - before.hit_tokens) / max(1, n_in),
               build_s=build_s, warmup=warmup, engine_kwargs=kw or None)
    print(f"  {config}: {len(reqs)} requests in {wall:.2f} s, {row['output_tok_s']:.1f} out tok/s, "
          f"{row['total_tok_s']:.1f} total tok/s ({row['steps']} steps, max_num_seqs {row['max_num_seqs']}, "
          f"{row['num_pages']} pages, LLM built in {build_s:.1f} s)", flush=True)
    del llm, outs
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return row


def main() -> int:
    a = parse_args()
    smoke_engine_defaults(a)
    logs = log_dir(a, "sharegpt_offline")
    model, vocab = resolve_model(a, logs, default_vocab=SMOLLM2_VOCAB)
    label = model_label(a, vocab)
    pairs = sharegpt_pairs(sharegpt_file(a.sharegpt), smollm2_tokenizer(a.tokenizer), a.num_prompts, a.prompt_seed)
    cap_in, cap_out = SMOKE_CAP if a.smoke else (None, None)
    reqs = [(fold_ids(p[:cap_in], vocab), min(n, cap_out or n)) for p, n in pairs]
    print(f"model {model} ({label}); {len(reqs)} ShareGPT requests, {sum(len(p) for p, _ in reqs)} prompt / "
          f"{sum(n for _, n in reqs)} output tokens; configs: {' '.join(a.configs)}", flush=True)
    base = engine_kwargs(a)
    rows = []
    for config in a.configs:
        row = run_config(model, base, config, reqs, not a.no_warmup, a.step_profile)
        row.update(model=label, date=time.strftime("%Y-%m-%d %H:%M"))
        rows.append(row)
    out = json_path(a, "sharegpt_offline.json")
    merge_rows(out, rows, ("config",))
    print(f"  {len(rows)} rows merged into {out}\n", flush=True)
    print(table(rows, [("config", "config", ""), ("requests", "requests", "d"), ("output_tok_s", "out tok/s", ".1f"),
                       ("total_tok_s", "total tok/s", ".1f"), ("elapsed_s", "s", ".2f"),
                       ("max_num_seqs", "max seqs", "d"), ("num_pages", "pages", "d"), ("kv_dtype", "kv", "")]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
