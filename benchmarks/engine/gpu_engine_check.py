"""Engine check on CUDA: parity with transformers (Triton kernels, bf16) and 8B-shaped throughput.

    python benchmarks/engine/gpu_engine_check.py OUT.json            # on the GPU machine
    python benchmarks/engine/gpu_engine_check.py OUT.json --smoke    # tiny shapes on CPU: checks the script

1. Parity: small random Llama / Qwen2 / Mistral / Qwen3 models are saved with save_pretrained
   and loaded by both transformers (its own attention) and our engine (Triton paged kernels),
   both in bf16. Over 256 greedy tokens we report the exact-match prefix, position-wise
   agreement of the free-running continuations, and teacher-forced agreement (every prefix of
   transformers' continuation is a prompt; our next token is compared with theirs). In bf16
   exact equality is not expected: a near-tie flips and the free-running texts part ways, so
   the teacher-forced number is the one that measures numerical agreement. The random models
   use initializer_range 0.1 so the next-token distribution is peaked, not a flat near-tie.
   Page sizes 1 and 16; KV in bf16 and fp8_e4m3.
2. Throughput: a Llama-3-8B-shaped model (random bf16 weights built from a config, nothing
   downloaded) generates for a batch; cold (no cache) and warm (all prompts share a long
   prefix already in the cache) rounds, tokens/s.

Needs only torch, triton, transformers (tested for PyTorch 2.11 / Triton 3.6 / transformers 5.17).
"""
from __future__ import annotations

import argparse
import json
import platform
import tempfile
import time
import traceback
from typing import Any

import torch

from radixkv import LLM, SamplingParams


def small_config(arch: str, smoke: bool) -> Any:
    from transformers import LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config

    dims = (dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=256) if smoke else
            dict(hidden_size=512, intermediate_size=1536, num_hidden_layers=4, num_attention_heads=8,
                 num_key_value_heads=2, vocab_size=2048))
    common = dict(max_position_embeddings=4096, initializer_range=0.1, bos_token_id=1, eos_token_id=2,
                  pad_token_id=0, **dims)
    cls = {"llama": LlamaConfig, "qwen2": Qwen2Config, "mistral": MistralConfig, "qwen3": Qwen3Config}[arch]
    extra = {"sliding_window": None} if arch == "mistral" else {}
    if arch == "llama":
        extra["rope_parameters"] = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                    "high_freq_factor": 4.0, "original_max_position_embeddings": 256,
                                    "rope_theta": 500000.0}
    return cls(**common, **extra)


def llama3_8b_config(smoke: bool) -> Any:
    from transformers import LlamaConfig

    rope = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192, "rope_theta": 500000.0}
    if smoke:
        return LlamaConfig(hidden_size=128, intermediate_size=448, num_hidden_layers=2, num_attention_heads=4,
                           num_key_value_heads=1, vocab_size=512, max_position_embeddings=16384,
                           rope_parameters=rope)
    return LlamaConfig(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                       num_key_value_heads=8, vocab_size=128256, max_position_embeddings=131072,
                       rms_norm_eps=1e-5, rope_parameters=rope)


def hf_greedy(model: Any, prompt: list[int], n: int) -> list[int]:
    """Exactly n greedy tokens, EOS an ordinary token (min_new_tokens would mask it out instead)."""
    ids = torch.tensor([prompt], device=model.device)
    model.generation_config.eos_token_id = model.config.eos_token_id = None
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False,
                         pad_token_id=0)
    return out[0, len(prompt):].tolist()


def parity(arch: str, args: argparse.Namespace, device: str, dtype: torch.dtype) -> list[dict]:
    from transformers import AutoModelForCausalLM

    n = args.tokens
    cfg = small_config(arch, args.smoke)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, cfg.vocab_size, (L,), generator=g).tolist() for L in (37, 150)]
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        torch.manual_seed(0)
        AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).save_pretrained(folder)
        ref = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).to(device).eval()
        want = [hf_greedy(ref, p, n) for p in prompts]
        del ref
        for page_size in (1, 16):
            for kv in ("auto", "fp8_e4m3"):
                try:
                    rows.append(_parity_row(folder, arch, prompts, want, page_size, kv, device, dtype, n))
                except Exception as e:  # keep going: one failing configuration must not lose the others
                    traceback.print_exc()
                    rows.append(dict(arch=arch, page_size=page_size, kv_dtype=kv, error=f"{type(e).__name__}: {e}"))
    return rows


def _parity_row(folder: str, arch: str, prompts: list[list[int]], want: list[list[int]], page_size: int, kv: str,
                device: str, dtype: torch.dtype, n: int) -> dict:
    llm = LLM(folder, dtype=dtype, kv_dtype=kv, page_size=page_size, device=device,
              num_pages=(len(prompts) * (150 + 2 * n) * 4) // page_size + 64)
    greedy = SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)
    got = [o.token_ids for o in llm.generate(prompts, greedy)]
    forced = [p + w[:t] for p, w in zip(prompts, want) for t in range(n)]
    one = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    nxt = [o.token_ids[0] for o in llm.generate(forced, one)]
    target = [w[t] for w in want for t in range(n)]
    prefix = [next((i for i, (a, b) in enumerate(zip(x, y)) if a != b), n) for x, y in zip(got, want)]
    return dict(arch=arch, page_size=page_size, kv_dtype=llm.runner.kv_dtype.value, tokens=n,
                exact_prefix_min=min(prefix),
                free_agreement=sum(a == b for x, y in zip(got, want) for a, b in zip(x, y)) / (n * len(want)),
                forced_agreement=sum(a == b for a, b in zip(nxt, target)) / len(target))


def hf_baseline(cfg: Any, B: int, P: int, N: int, device: str, dtype: torch.dtype) -> dict:
    """transformers' own generate on the same shapes (random weights, no cache reuse), for scale."""
    from transformers import AutoModelForCausalLM

    with torch.device(device):
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype).eval()
    model.generation_config.eos_token_id = model.config.eos_token_id = None
    ids = torch.randint(3, cfg.vocab_size, (B, P), device=device)
    model.generate(ids[:, :32], attention_mask=torch.ones_like(ids[:, :32]), max_new_tokens=4, do_sample=False,
                   pad_token_id=0)  # warm-up
    _sync(device)
    t = time.perf_counter()
    model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=N, do_sample=False, pad_token_id=0)
    _sync(device)
    dt = time.perf_counter() - t
    del model
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    return dict(wall_s=round(dt, 3), output_tok_s=round(B * N / dt, 1), total_tok_s=round(B * (P + N) / dt, 1))


def throughput(args: argparse.Namespace, device: str, dtype: torch.dtype) -> dict:
    cfg = llama3_8b_config(args.smoke)
    B, P, N, S = (4, 64, 16, 48) if args.smoke else (args.batch, args.prompt_len, args.gen_len, args.shared_len)
    baseline = None
    if not args.no_hf_baseline:  # before our engine takes most of the free memory for KV pages
        try:
            baseline = hf_baseline(cfg, B, P, N, device, dtype)
        except Exception as e:
            traceback.print_exc()
            baseline = dict(error=f"{type(e).__name__}: {e}")
    t0 = time.perf_counter()
    llm = LLM(cfg, dtype=dtype, page_size=16, device=device, seed=0,
              **({"num_pages": 4096} if args.smoke else {"gpu_memory_utilization": 0.85}))
    build_s = time.perf_counter() - t0
    g = torch.Generator().manual_seed(1)
    params = SamplingParams(temperature=0.0, max_tokens=N, ignore_eos=True)
    result = dict(model="llama3-8b-shaped" if not args.smoke else "smoke", batch=B, prompt_len=P, gen_len=N,
                  num_pages=llm.num_pages, build_s=round(build_s, 1), transformers_generate=baseline)
    llm.generate([[5] * 32], SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))  # warm-up
    shared = torch.randint(3, cfg.vocab_size, (S,), generator=g).tolist()
    for name, prompts in (
        ("cold", [torch.randint(3, cfg.vocab_size, (P,), generator=g).tolist() for _ in range(B)]),
        ("shared_prefix_warm", [shared + torch.randint(3, cfg.vocab_size, (P - S,), generator=g).tolist()
                                for _ in range(B)]),
    ):
        if name == "shared_prefix_warm":  # put the shared prefix in the cache first
            llm.generate([shared + [7]], SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True))
        _sync(device)
        steps0 = llm.core.num_steps
        t = time.perf_counter()
        reqs = llm.add_requests(prompts, params)
        t_first = None
        while llm.has_work():
            llm.step()
            if t_first is None and all(r.output for r in reqs):
                _sync(device)
                t_first = time.perf_counter()  # every prompt prefilled and has its first token
        _sync(device)
        end = time.perf_counter()
        dt = end - t
        cached = sum(r.cached_tokens for r in reqs)
        result[name] = dict(wall_s=round(dt, 3), steps=llm.core.num_steps - steps0,
                            prefill_s=round(t_first - t, 3), decode_tok_s=round(B * (N - 1) / (end - t_first), 1),
                            output_tok_s=round(B * N / dt, 1), total_tok_s=round(B * (P + N) / dt, 1),
                            cached_prompt_tokens=cached, prompt_tokens=B * P)
    return result


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out", help="JSON file to write")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes on CPU in fp32 (checks the script)")
    ap.add_argument("--tokens", type=int, default=256, help="greedy tokens compared per prompt")
    ap.add_argument("--archs", default="llama,qwen2,mistral,qwen3")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--gen-len", type=int, default=256)
    ap.add_argument("--shared-len", type=int, default=448)
    ap.add_argument("--skip-8b", action="store_true")
    ap.add_argument("--no-hf-baseline", action="store_true", help="skip transformers' generate on the 8B shapes")
    args = ap.parse_args()
    if args.smoke:
        device, dtype, args.tokens = "cpu", torch.float32, min(args.tokens, 24)
    else:
        if not torch.cuda.is_available():
            raise SystemExit("no CUDA device; use --smoke to check the script on CPU")
        device, dtype = "cuda", torch.bfloat16
    import transformers
    import triton

    report: dict[str, Any] = dict(
        device=torch.cuda.get_device_name() if device == "cuda" else platform.processor() or "cpu",
        torch=torch.__version__, triton=triton.__version__, transformers=transformers.__version__,
        dtype=str(dtype).removeprefix("torch."), parity=[])
    print(f"{'arch':8} {'page':>4} {'kv':9} {'tokens':>6} {'exact':>6} {'free':>6} {'forced':>7}")
    for arch in args.archs.split(","):
        try:
            rows = parity(arch, args, device, dtype)
        except Exception as e:  # keep going: one failing family must not lose the others' figures
            traceback.print_exc()
            report.setdefault("errors", []).append(f"parity {arch}: {type(e).__name__}: {e}")
            rows = []
        for row in rows:
            report["parity"].append(row)
            if "error" in row:
                report.setdefault("errors", []).append(f"parity {arch} page {row['page_size']} {row['kv_dtype']}: "
                                                       f"{row['error']}")
                print(f"{row['arch']:8} {row['page_size']:>4} {row['kv_dtype']:9} ERROR {row['error'][:80]}")
                continue
            print(f"{row['arch']:8} {row['page_size']:>4} {row['kv_dtype']:9} {row['tokens']:>6} "
                  f"{row['exact_prefix_min']:>6} {row['free_agreement']:>6.3f} {row['forced_agreement']:>7.3f}",
                  flush=True)
        _save(args.out, report)
    if not args.skip_8b:
        try:
            tp = throughput(args, device, dtype)
        except Exception as e:
            traceback.print_exc()
            report.setdefault("errors", []).append(f"throughput: {type(e).__name__}: {e}")
            _save(args.out, report)
            raise SystemExit(1)
        report["throughput"] = tp
        print(f"\n{tp['model']}: batch {tp['batch']} x (prompt {tp['prompt_len']} + gen {tp['gen_len']}), "
              f"{tp['num_pages']} pages, built in {tp['build_s']} s")
        for name in ("cold", "shared_prefix_warm"):
            r = tp[name]
            print(f"  {name:20} {r['wall_s']:8.2f} s  prefill {r['prefill_s']:.2f} s  "
                  f"decode {r['decode_tok_s']:9.1f} tok/s  {r['output_tok_s']:9.1f} out tok/s  "
                  f"{r['total_tok_s']:9.1f} total tok/s  cached {r['cached_prompt_tokens']}/{r['prompt_tokens']}")
        hf = tp.get("transformers_generate")
        if hf and "error" not in hf:
            print(f"  {'transformers generate':20} {hf['wall_s']:8.2f} s  {hf['output_tok_s']:9.1f} out tok/s  "
                  f"{hf['total_tok_s']:9.1f} total tok/s (same shapes, cold)")
    _save(args.out, report)
    if report.get("errors"):
        raise SystemExit(f"{len(report['errors'])} part(s) failed: {report['errors']}")


def _save(path: str, report: dict) -> None:
    with open(path, "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
