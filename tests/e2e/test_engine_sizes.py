"""Absurd sizes are refused naming the argument, before any allocation (issue 33 item 10): they once
ended in the allocator (`RuntimeError: can't allocate memory`) or in the pool after the KV store was built."""
from __future__ import annotations

import pytest

from radixkv import LLM
from radixkv.engine import size_checks

from .tiny_models import tiny_config


@pytest.mark.parametrize("kwargs, needle", [
    (dict(kv_dtype="int4", kv_window=10**9), "kv_window=1,000,000,000 is longer than the model's context"),
    (dict(kv_dtype="int4", kv_sink=10**6), "kv_sink=1,000,000 is longer than the model's context"),
    (dict(kv_dtype="int4", kv_window=16, kv_sink=2**20), "kv_sink="),
    (dict(num_pages=2**40), "num_pages=1,099,511,627,776 is more than 2,147,483,647"),
    (dict(num_pages=2**31 - 1), "num_pages=2,147,483,647: "),
    (dict(page_size=10**6, max_num_batched_tokens=10**6), "page_size=1,000,000 is more than 65,536"),
])
def test_absurd_sizes_are_a_value_error_naming_the_argument(monkeypatch, kwargs, needle) -> None:
    from radixkv.engine import kv_store

    def no_store(*args, **kw):
        raise AssertionError("the KV store was built before the sizes were checked")

    monkeypatch.setattr(kv_store.KVStore, "__init__", no_store)
    with pytest.raises(ValueError, match=needle.replace("(", r"\(").replace("*", r"\*")):
        LLM(tiny_config("llama"), dtype="float32", **kwargs)


def test_a_page_or_a_pool_larger_than_the_device_is_refused(monkeypatch) -> None:
    monkeypatch.setattr(size_checks, "device_memory", lambda device: 1 << 20)  # a 1 MiB device
    with pytest.raises(ValueError, match=r"num_pages=1,000: .* more than the cpu device's"):
        LLM(tiny_config("llama"), dtype="float32", page_size=16, num_pages=1000)
    with pytest.raises(ValueError, match=r"page_size=4,096: one KV page would take"):
        LLM(tiny_config("llama"), dtype="float32", page_size=4096, num_pages=1, max_num_batched_tokens=4096)


def test_sizes_that_fit_still_run() -> None:
    llm = LLM(tiny_config("llama"), dtype="float32", page_size=4, num_pages=32, kv_dtype="int4", kv_window=8, kv_sink=4)
    assert len(llm.generate([[5, 6, 7]])[0].token_ids) >= 1
