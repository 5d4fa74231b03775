"""INT4 / INT2 KV on CPU (the reference path): LLM(model, kv_dtype="int4" / "int2") allocates packed pages
with group scales, greedy generation runs, and stays close to fp32 KV.

Agreement is teacher-forced as in test_fp8_kv.py: every prefix of the fp32-KV greedy continuation is a
prompt, and the next token under each KV dtype is compared with fp32's. Measured on this model: int4
0.875, int2 0.60 (fp8_e4m3 0.96), without the recent-token window. The real model (SmolLM2) is the accuracy benchmark's business
(benchmarks/engine/kv_accuracy.py); at head_dim 16 here a row is one group. INT2 is not offered to users
(config.INT2_OPT_IN): these tests turn it on, and check it is refused without.
"""
from __future__ import annotations

import pytest
import torch

from radixkv import LLM, SamplingParams
from radixkv.config import INT2_OPT_IN

from .tiny_models import tiny_config

STEPS = 24


@pytest.fixture(autouse=True)
def int2_allowed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(INT2_OPT_IN, "1")


def test_int2_is_refused_by_name_without_the_opt_in(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(INT2_OPT_IN)
    for kw in ({"kv_dtype": "int2"}, {"kv_cache_dtype": "int2"}):
        with pytest.raises(ValueError, match="kv_dtype int2 is not offered: its decode is slower than bf16"):
            LLM(tiny_config("llama"), page_size=16, num_pages=8, **kw)
    LLM(tiny_config("llama"), page_size=16, num_pages=8, kv_dtype="int4")  # the other INT pages are offered


@pytest.fixture(scope="module")
def forced():
    cfg = tiny_config("llama", initializer_range=0.1)  # peaked next-token distributions (see test_fp8_kv)
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(3, cfg.vocab_size, (n,), generator=g).tolist() for n in (21, 40)]
    ref = LLM(cfg, kv_dtype="fp32", page_size=16, num_pages=64)
    conts = [o.token_ids for o in ref.generate(prompts, SamplingParams(temperature=0.0, max_tokens=STEPS,
                                                                       ignore_eos=True))]
    return cfg, prompts, conts


def _agreement(cfg, prompts, conts, **kw) -> float:
    llm = LLM(cfg, page_size=16, num_pages=256, **kw)
    forced_prompts = [p + c[:t] for p, c in zip(prompts, conts) for t in range(STEPS)]
    want = [c[t] for c in conts for t in range(STEPS)]
    got = [o.token_ids[0] for o in llm.generate(forced_prompts, SamplingParams(temperature=0.0, max_tokens=1,
                                                                               ignore_eos=True))]
    return sum(a == b for a, b in zip(got, want)) / len(want)


@pytest.mark.parametrize("kv_dtype, min_agree", [("int4", 0.8), ("int2", 0.5)])
def test_int_kv_agrees_with_fp32(forced, kv_dtype: str, min_agree: float) -> None:
    """With the default recent-token window (16) and without it; the window never hurts here."""
    cfg, prompts, conts = forced
    llm = LLM(cfg, kv_dtype=kv_dtype, page_size=16, num_pages=16)
    bits = 4 if kv_dtype == "int4" else 2
    assert llm.runner.kv_dtype.value == kv_dtype and llm.runner.kv.k_cache[0].dtype == torch.uint8 and llm.runner.kv_window == 16
    assert llm.runner.kv.k_cache[0].shape[-1] == 16 * bits // 8 and llm.runner.kv.k_scale[0].shape[-2:] == (1, 2)
    windowed = _agreement(cfg, prompts, conts, kv_dtype=kv_dtype)
    plain = _agreement(cfg, prompts, conts, kv_dtype=kv_dtype, kv_window=0)
    print(f"{kv_dtype}: teacher-forced greedy agreement with fp32 KV {windowed:.3f} (window 16), {plain:.3f} "
          f"(none) over {STEPS * len(prompts)} tokens")
    assert plain >= min_agree and windowed >= plain


@pytest.mark.parametrize("kv_dtype, page_size", [("int4", 1), ("int2", 4)])
def test_int_kv_greedy_generation_runs_and_hits_the_cache(forced, kv_dtype: str, page_size: int) -> None:
    """Greedy decode over INT pages (page size 1: token-level radix), then the same prompts again (vLLM's
    argument names): every prompt token but the last served from cached INT pages. Without a window the
    tokens are the same; with one (the default) the cached run reads the window keys before its first new
    token back from the pages (fills: the full-precision copies went with the first run), so it may not."""
    cfg, prompts, _ = forced
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    for window in (0, None):
        llm = LLM(cfg, kv_cache_dtype=kv_dtype, block_size=page_size, num_pages=512, kv_window=window)
        first = llm.generate(prompts, params)
        fills = llm.runner.attention.window.fills if window is None else 0
        again = llm.generate(prompts, params)
        assert all(len(o.token_ids) == 8 for o in first + again)
        if window == 0:
            assert llm.runner.attention.window is None
            assert [o.token_ids for o in again] == [o.token_ids for o in first]
        else:
            assert llm.runner.attention.window.fills > fills
        assert [o.cached_tokens for o in again] == [(len(p) - 1) // page_size * page_size for p in prompts]
