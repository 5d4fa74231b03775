"""The data plane (torch): the engine core, the model runner, paged attention over the KV store, sampling.

llm.py (LLM: the offline front end), core.py (EngineCore: scheduler + runner, one step at a time),
runner.py (ModelRunner: model, KV store, attention, graphs, sampler), inputs.py (prompts -> validated
Requests), outputs.py (deltas -> text, stop strings, RequestOutputs), session.py (multi-turn chat),
weights.py / model_config.py / gguf.py (loading), model.py (the forward pass), attention.py (plan once per
step, run per layer), kv_store.py (the paged K/V tensors and scales), sampling.py, device.py, bench.py.
docs/design.md has the map. Import the modules themselves (`from radixkv.engine.llm import LLM`);
`radixkv.LLM` is the public name.
"""
