"""LLM(...)'s keyword arguments: vLLM's names, unknown names, prefix caching off, max_model_len."""
from __future__ import annotations

import pytest
import torch

from radixkv import LLM, SamplingParams

from .tiny_models import tiny_config

GREEDY = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)


def _prompt(n: int, seed: int = 1) -> list[int]:
    return torch.randint(3, 160, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def test_vllm_names_set_the_same_knobs() -> None:
    llm = LLM(tiny_config("llama"), dtype="float32", block_size=8, kv_cache_dtype="fp8", max_num_seqs=3,
              max_num_batched_tokens=64, num_gpu_blocks_override=40, enforce_eager=True)
    cfg = llm.config
    assert (cfg.page_size, cfg.kv_dtype, cfg.num_pages, cfg.enforce_eager) == (8, "fp8_e4m3", 40, True)
    assert (cfg.scheduler.max_running, cfg.scheduler.max_batch_tokens) == (3, 64)
    assert llm.num_pages == 40


@pytest.mark.parametrize("kwargs, word", [(dict(bogus_knob=1), "bogus_knob"),
                                          (dict(block_size=8, page_size=4), "twice")])
def test_unknown_or_doubled_names_raise_type_error(kwargs: dict, word: str) -> None:
    with pytest.raises(TypeError, match=word):
        LLM(tiny_config("llama"), dtype="float32", **kwargs)


def test_prefix_caching_off_computes_everything_with_the_same_output() -> None:
    prompt = _prompt(40)
    on = LLM(tiny_config("llama"), dtype="float32", page_size=4, num_pages=64)
    off = LLM(tiny_config("llama"), dtype="float32", page_size=4, num_pages=64, enable_prefix_caching=False)
    first = [llm.generate([prompt], GREEDY)[0] for llm in (on, off)]
    again = [llm.generate([prompt, prompt], GREEDY) for llm in (on, off)]
    assert first[0].token_ids == first[1].token_ids == again[1][0].token_ids == again[1][1].token_ids
    assert [o.cached_tokens for o in again[0]] == [36, 36]  # the last prompt token is always computed
    assert [o.cached_tokens for o in again[1]] == [0, 0] and off.core.cache.num_cached_pages == 0
    assert off.core.pool.num_free == off.core.pool.num_pages  # nothing kept, nothing leaked


def test_max_model_len_caps_the_context() -> None:
    llm = LLM(tiny_config("llama"), dtype="float32", max_model_len=32)
    assert llm.max_model_len == 32
    with pytest.raises(ValueError, match="context of 32"):
        llm.generate([_prompt(30)], SamplingParams(max_tokens=8))
    assert llm.generate([_prompt(20)], GREEDY)[0].token_ids


def test_kv_sink_defaults_and_bad_values() -> None:
    """INT pages take a window of 16 and a sink of 16 by default; a sink must be whole pages and needs a window."""
    llm = LLM(tiny_config("llama"), dtype="float32", kv_dtype="int4", page_size=8, num_pages=16)
    assert (llm.runner.kv_window, llm.runner.kv_sink, llm.runner.attention.window.sink) == (16, 16, 16)
    assert LLM(tiny_config("llama"), dtype="float32", kv_dtype="int4", num_pages=16, kv_sink=0).runner.kv_sink == 0
    from radixkv.config import EngineConfig

    for kwargs, word in ((dict(kv_sink=12), "multiple of page_size 16"), (dict(kv_sink=-16), "kv_sink"),
                         (dict(kv_sink=16, kv_window=0), "needs a recent-token window")):
        with pytest.raises(ValueError, match=word):
            EngineConfig(**kwargs)
