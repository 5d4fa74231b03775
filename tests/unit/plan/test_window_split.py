"""The recent-token window's shadow pages sized to the requests the pool can hold (issue 34 item 4): INT pages
never give fewer requests than FP8 or bf16 in the same memory, and `radixkv plan` and the engine size their
pools with the one function (plan.kv_pool_split)."""
from __future__ import annotations

import pytest
import torch

from radixkv.config import EngineConfig, KVDtype
from radixkv.engine import kv_store
from radixkv.engine.model_config import ModelSpec
from radixkv.model_shape import ModelShape
from radixkv.plan import (DTYPE_BYTES, engine_reserve_bytes, kv_budget_bytes, kv_pool_split, parse_bytes, plan_memory,
                          window_rows)

LLAMA31_70B = dict(num_hidden_layers=80, hidden_size=8192, num_attention_heads=64, num_key_value_heads=8,
                   intermediate_size=28672, vocab_size=128256, torch_dtype="bfloat16")


def test_70b_on_141_gib_int4_holds_more_requests_than_fp8_than_bf16() -> None:
    """The issue's case: Llama-3.1-70B, 141 GiB at 0.9, 4k context. INT4 used to get 0 pages (its shadow pages
    were reserved for 256 rows that could never all run)."""
    p = plan_memory(ModelShape.from_config(LLAMA31_70B, "70b"), parse_bytes("141GiB"), context=4096)
    most = {r.kv_dtype: r.max_requests for r in p.rows}
    assert most["int4"] > most["fp8_e4m3"] > most["bf16"] > 0, most
    int4 = next(r for r in p.rows if r.kv_dtype == "int4")
    assert int4.max_requests == int4.window_rows and int4.pages * 16 >= int4.window_rows * 4096


@pytest.mark.parametrize("budget", [0, 10**6, 10**9, 5 * 2**30, 50 * 2**30])
@pytest.mark.parametrize("tokens", [512, 4096, 32768])
def test_window_rows_is_the_largest_that_fits(budget: int, tokens: int) -> None:
    per_page, row, scratch, ps = 1_474_560, 15_728_640, 5_242_880, 16
    rows = window_rows(budget, per_page, row, scratch, 256, tokens, ps)
    need = -(-tokens // ps)

    def fits(r: int) -> bool:
        left = budget - scratch - r * row
        return left >= 0 and left // per_page >= r * need

    assert 0 <= rows <= 256 and (rows == 0 or fits(rows)) and (rows == 256 or not fits(rows + 1))
    pages, got = kv_pool_split(budget, per_page, 0, ps, 256, tokens, 80, 8, 128, 2)
    assert (pages, got) == (budget // per_page, 256)  # no window: every byte is pages, every row runs


def test_the_engine_sizes_its_pool_as_the_plan_does(monkeypatch) -> None:
    """default_num_pages on a (pretend) 141 GiB GPU holding the 70B weights, max_model_len = the plan's context:
    the same pages and rows as `radixkv plan`, and the INT4 engine's running set is the plan's request count."""
    gpu, shape = parse_bytes("141GiB"), ModelShape.from_config(LLAMA31_70B, "70b")
    free = gpu - shape.num_params * DTYPE_BYTES["bfloat16"]
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (free, gpu))
    from transformers import LlamaConfig

    spec = ModelSpec.from_hf(LlamaConfig(**{k: v for k, v in LLAMA31_70B.items() if k != "torch_dtype"},
                                         max_position_embeddings=131072))
    plan = {r.kv_dtype: r for r in plan_memory(shape, gpu, context=4096).rows}
    for kv in ("bf16", "fp8_e4m3", "int4"):
        cfg = EngineConfig.from_kwargs(kv_dtype=kv, max_model_len=4096, max_num_batched_tokens=8192)
        pages, rows = kv_store.default_num_pages(spec, cfg, KVDtype(kv), torch.bfloat16, torch.device("cuda"))
        assert pages == plan[kv].pages, kv
        assert min(rows, pages * 16 // 4096) == plan[kv].max_requests, kv
    reserve = engine_reserve_bytes(8192, 28672, 128256, 8192, 256, 2)
    assert kv_budget_bytes(free, 0.9, reserve) == plan_memory(shape, gpu, context=4096).kv_budget_bytes
