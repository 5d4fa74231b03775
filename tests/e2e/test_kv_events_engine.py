"""LLM(..., kv_events=publisher): the engine's prefix cache publishes what it stores (CPU, tiny model)."""
from __future__ import annotations

from radixkv import LLM, SamplingParams
from radixkv.cache.events import BlockStored, QueuePublisher

from .tiny_models import tiny_config


def test_engine_publishes_the_blocks_it_caches():
    pub = QueuePublisher()
    llm = LLM(tiny_config("llama"), dtype="float32", device="cpu", page_size=4, num_pages=64, kv_events=pub)
    prompt = list(range(3, 13))  # 10 tokens: two full blocks of 4
    llm.generate([prompt], SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True))
    stored = [e for e in pub.drain().events if isinstance(e, BlockStored)]
    assert stored and stored[0].block_size == 4
    tokens = [t for e in stored for t in e.token_ids]
    assert tokens[:8] == prompt[:8]  # the prompt's full blocks first, chained from the root
    assert stored[0].parent_block_hash is None
