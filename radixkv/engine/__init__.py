"""The data plane (torch): model, paged attention over the KV store, sampling, the step loop.

llm.py (LLM: composes the parts; step; generate), session.py (multi-turn chat), weights.py
(ModelSpec, checkpoints), model.py (the forward pass), attention.py (plan once per step, run per
layer), kv_store.py (the paged K/V tensors and scales), sampling.py, bench.py (k-shot benchmark).
Import the modules themselves (`from radixkv.engine.llm import LLM`); `radixkv.LLM` is the public name.
"""
