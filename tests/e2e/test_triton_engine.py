"""The engine on the Triton kernels (interpreted on CPU): same greedy tokens as transformers.

This is the GPU path's logic (plan -> store_kv -> paged_prefill/paged_decode) run through
TRITON_INTERPRET=1 in fp32; gpu_engine_check.py runs it compiled on CUDA in bf16.
"""
from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is first imported

import pytest  # noqa: E402
import torch  # noqa: E402

from radixkv import LLM, SamplingParams  # noqa: E402
from radixkv.engine.attention import Backend  # noqa: E402

from .tiny_models import hf_greedy, hf_model, tiny_config  # noqa: E402


@pytest.mark.parametrize("page_size", [1, 16])
def test_triton_backend_matches_transformers_cold_and_warm(page_size: int) -> None:
    cfg = tiny_config("qwen3")
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(3, 160, (n,), generator=g).tolist() for n in (23, 41)]
    ref = hf_model(cfg)
    want = [hf_greedy(ref, p, 4) for p in prompts]
    try:
        llm = LLM(cfg, page_size=page_size, num_pages=256 // page_size, attention_backend=Backend.TRITON)
        cold = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))
    except RuntimeError as e:
        if "compiled mode" in str(e):
            pytest.skip("Triton was imported before TRITON_INTERPRET=1 could be set")
        raise
    warm = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))
    assert [o.token_ids for o in cold] == want
    assert [o.token_ids for o in warm] == want
    assert all(o.cached_tokens > 0 for o in warm)
