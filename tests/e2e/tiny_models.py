"""Tiny random Llama-family configs for CPU tests (2 layers, hidden 64, vocab 160)."""
from __future__ import annotations

from typing import Any

VOCAB = 160


def tiny_config(arch: str, **over: Any) -> Any:
    """A 2-layer, hidden-64 config of `arch` (llama, llama3, mistral, qwen2, qwen3), GQA 4:2."""
    from transformers import LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config

    common = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                  bos_token_id=1, eos_token_id=2, pad_token_id=0)
    common.update(over)
    if arch == "llama":
        return LlamaConfig(**common)
    if arch == "llama3":  # Llama 3.1 rope scaling, tied embeddings
        rope = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64, "rope_theta": 500000.0}
        return LlamaConfig(rope_parameters=rope, tie_word_embeddings=True, **common)
    if arch == "mistral":
        return MistralConfig(**{"sliding_window": None, **common})
    if arch == "qwen2":
        return Qwen2Config(tie_word_embeddings=True, **common)
    if arch == "qwen3":
        return Qwen3Config(head_dim=32, **common)
    raise ValueError(f"unknown test arch {arch!r}")


def hf_model(config: Any, seed: int = 0) -> Any:
    """transformers' own model with the weights LLM(config, seed=seed) builds."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    return model.eval()


def hf_greedy(model: Any, prompt: list[int], max_tokens: int, stop_at_eos: bool = False) -> list[int]:
    """transformers' greedy generate; returns only the new tokens.

    stop_at_eos=False generates exactly max_tokens with EOS an ordinary token (our ignore_eos);
    `min_new_tokens` would not do: it masks EOS out of the logits instead.
    """
    import torch

    ids = torch.tensor([prompt])
    saved = model.generation_config.eos_token_id, model.config.eos_token_id
    if not stop_at_eos:
        model.generation_config.eos_token_id = model.config.eos_token_id = None
    try:
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_tokens,
                             do_sample=False, pad_token_id=0)
    finally:
        model.generation_config.eos_token_id, model.config.eos_token_id = saved
    return out[0, len(prompt):].tolist()
