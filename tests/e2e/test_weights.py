"""Checkpoint loading (sharded safetensors, legacy .bin) and the model facts read from configs."""
from __future__ import annotations

import os

import pytest
import torch

from radixkv.engine.model import rope_inv_freq
from radixkv.engine.weights import Arch, ModelSpec, RopeKind, load_checkpoint

from .tiny_models import hf_model, tiny_config


def test_sharded_safetensors_and_legacy_bin_load_the_same_weights(tmp_path) -> None:
    model = hf_model(tiny_config("qwen2"))
    model.save_pretrained(tmp_path / "sharded", max_shard_size="50KB")
    assert len([f for f in os.listdir(tmp_path / "sharded") if f.endswith(".safetensors")]) > 1
    want = model.state_dict()
    sharded = load_checkpoint(str(tmp_path / "sharded"))
    assert sharded.tokenizer is None and sharded.config.model_type == "qwen2"
    legacy = tmp_path / "legacy"
    legacy.mkdir()
    model.config.save_pretrained(legacy)
    torch.save({k: v for k, v in want.items() if k != "lm_head.weight"}, legacy / "pytorch_model.bin")
    for ckpt in (sharded, load_checkpoint(str(legacy))):
        for k, v in ckpt.state_dict.items():
            torch.testing.assert_close(v, want[k], rtol=0, atol=0)
        assert "model.embed_tokens.weight" in ckpt.state_dict


def test_folder_without_weights_is_named(tmp_path) -> None:
    tiny_config("llama").save_pretrained(tmp_path)
    with pytest.raises(FileNotFoundError, match="no \\*.safetensors or pytorch_model\\*.bin"):
        load_checkpoint(str(tmp_path))


def test_spec_reads_each_family() -> None:
    q3 = ModelSpec.from_hf(tiny_config("qwen3"))
    assert (q3.arch, q3.head_dim, q3.qk_norm, q3.qkv_bias) == (Arch.QWEN3, 32, True, False)
    q2 = ModelSpec.from_hf(tiny_config("qwen2"))
    assert (q2.qkv_bias, q2.tie_embeddings, q2.sliding_window) == (True, True, None)
    l3 = ModelSpec.from_hf(tiny_config("llama3"))
    assert l3.rope.kind is RopeKind.LLAMA3 and l3.rope.theta == 500000.0 and l3.eos_token_ids == {2}
    assert ModelSpec.from_hf(tiny_config("mistral", sliding_window=64)).sliding_window == 64


def test_llama3_and_linear_rope_frequencies_match_transformers() -> None:
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    for cfg in (tiny_config("llama3"), tiny_config("llama", rope_parameters={"rope_type": "linear", "factor": 4.0,
                                                                               "rope_theta": 10000.0})):
        spec = ModelSpec.from_hf(cfg)
        want, _ = ROPE_INIT_FUNCTIONS[spec.rope.kind.value](cfg, torch.device("cpu"))
        torch.testing.assert_close(rope_inv_freq(spec.rope, spec.head_dim), want.float())


def test_unsupported_rope_and_activation_are_refused() -> None:
    with pytest.raises(ValueError, match="unsupported rope_type 'yarn'"):
        ModelSpec.from_hf(tiny_config("llama", rope_parameters={"rope_type": "yarn", "factor": 4.0,
                                                                "rope_theta": 10000.0}))
    with pytest.raises(ValueError, match="unsupported hidden_act 'gelu'"):
        ModelSpec.from_hf(tiny_config("llama", hidden_act="gelu"))


def test_generation_config_eos_ids_also_stop(tmp_path) -> None:
    from transformers import GenerationConfig

    from radixkv import LLM, SamplingParams

    cfg = tiny_config("llama")
    hf_model(cfg).save_pretrained(tmp_path)
    GenerationConfig(eos_token_id=[2, 7, 9], bos_token_id=1).save_pretrained(tmp_path)
    llm = LLM(str(tmp_path), page_size=4, num_pages=64)
    assert llm.eos_token_ids == {2, 7, 9}
    free = llm.generate([[5, 6, 7]], SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True))[0].token_ids
    stop_id = free[2]
    GenerationConfig(eos_token_id=[2, stop_id]).save_pretrained(tmp_path)
    out = LLM(str(tmp_path), page_size=4, num_pages=64).generate([[5, 6, 7]], SamplingParams(temperature=0.0,
                                                                                           max_tokens=8))[0]
    assert out.token_ids == free[:free.index(stop_id) + 1] and out.finish_reason == "stop"
