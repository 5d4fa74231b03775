"""FP8 KV on CPU runs and stays close to the fp32/bf16 cache.

Agreement is teacher-forced: every prefix of the fp32-KV greedy continuation is sent as a
prompt, and the next token under each KV dtype is compared with fp32's (a free-running
comparison on a random model diverges at the first near-tie and then measures nothing).
"""
from __future__ import annotations

import pytest
import torch

from radixkv import LLM, SamplingParams

from .tiny_models import tiny_config

STEPS = 24


@pytest.fixture(scope="module")
def forced():
    # initializer_range 0.1 makes the random model's next-token distribution peaked, so
    # top-1 agreement measures KV error rather than ties
    cfg = tiny_config("llama", initializer_range=0.1)
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(3, cfg.vocab_size, (n,), generator=g).tolist() for n in (21, 40)]
    ref = LLM(cfg, kv_dtype="fp32", page_size=16, num_pages=64)
    conts = [o.token_ids for o in ref.generate(prompts, SamplingParams(temperature=0.0, max_tokens=STEPS,
                                                                       ignore_eos=True))]
    return cfg, [p + c[:t] for p, c in zip(prompts, conts) for t in range(STEPS)], [c[t] for c in conts
                                                                                     for t in range(STEPS)]


@pytest.mark.parametrize("kv_dtype, torch_dtype, min_agree", [
    ("bf16", torch.bfloat16, 0.97),
    ("fp8_e4m3", torch.float8_e4m3fn, 0.9),
    ("fp8_e5m2", torch.float8_e5m2, 0.75),
])
def test_low_precision_kv_agrees_with_fp32(forced, kv_dtype: str, torch_dtype, min_agree: float) -> None:
    cfg, prompts, want = forced
    llm = LLM(cfg, kv_dtype=kv_dtype, page_size=16, num_pages=256)
    assert llm.runner.kv.k_cache[0].dtype == torch_dtype and llm.runner.dtype == torch.float32
    got = [o.token_ids[0] for o in llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=1,
                                                                        ignore_eos=True))]
    agree = sum(a == b for a, b in zip(got, want)) / len(want)
    print(f"{kv_dtype}: teacher-forced greedy agreement with fp32 KV {agree:.3f} over {len(want)} tokens")
    assert agree >= min_agree
