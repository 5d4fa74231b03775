"""Checkpoint loading (sharded safetensors, legacy .bin) and the model facts read from configs."""
from __future__ import annotations

import os

import pytest
import torch

from radixkv.engine.model import rope_inv_freq
from radixkv.engine.model_config import Arch, ModelSpec, RopeKind
from radixkv.engine.weights import load_checkpoint

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


def test_nonexistent_path_is_named(tmp_path) -> None:
    from radixkv import LLM

    for missing in (str(tmp_path / "nope"), str(tmp_path / "model.gguf"), "./not/here"):
        with pytest.raises(FileNotFoundError, match="does not exist"):
            LLM(missing)


def test_folder_without_config_is_named(tmp_path) -> None:
    from radixkv import LLM

    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(FileNotFoundError, match=f"{tmp_path}.*has no config.json"):
        LLM(str(tmp_path))
    (tmp_path / "m.Q4_0.gguf").write_bytes(b"GGUF")
    with pytest.raises(FileNotFoundError, match="pass the GGUF file itself"):
        LLM(str(tmp_path))


def test_uncached_hub_id_fails_without_downloading(tmp_path, monkeypatch) -> None:
    from huggingface_hub import constants

    from radixkv import LLM

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))  # an empty cache
    with pytest.raises(FileNotFoundError, match="'radixkv-test/not-cached'.*nothing is downloaded"):
        LLM("radixkv-test/not-cached")
    assert not any(tmp_path.rglob("*.safetensors"))  # nothing was fetched


def test_cached_hub_id_resolves_to_its_snapshot(tmp_path, monkeypatch) -> None:
    from huggingface_hub import constants

    from radixkv import LLM

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    repo = tmp_path / "models--radixkv-test--tiny"
    snap = repo / "snapshots" / ("0" * 40)
    hf_model(tiny_config("llama")).save_pretrained(snap)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0" * 40)
    llm = LLM("radixkv-test/tiny", page_size=4, num_pages=64)
    assert llm.runner.spec.num_layers == 2 and llm.runner.spec.vocab_size == tiny_config("llama").vocab_size


def test_existing_path_wins_over_hub_id(tmp_path, monkeypatch) -> None:
    from radixkv import LLM

    hf_model(tiny_config("qwen2")).save_pretrained(tmp_path / "org" / "name")
    monkeypatch.chdir(tmp_path)
    assert LLM("org/name", page_size=4, num_pages=64).runner.spec.arch is Arch.QWEN2


def test_unsupported_architecture_is_refused_before_weights(tmp_path) -> None:
    from transformers import GPT2Config

    from radixkv import LLM

    GPT2Config(n_layer=1, n_embd=32, n_head=2).save_pretrained(tmp_path)  # no weights: refused first
    for model in (str(tmp_path), str(tmp_path / "config.json"), GPT2Config(n_layer=1, n_embd=32, n_head=2)):
        with pytest.raises(ValueError, match="unsupported model_type 'gpt2'; supported: \\['llama'"):
            LLM(model)


def test_bad_gguf_and_other_files_are_named(tmp_path) -> None:
    from radixkv import LLM

    (tmp_path / "bad.gguf").write_bytes(b"not a gguf")
    with pytest.raises(ValueError, match="is not a GGUF file"):
        LLM(str(tmp_path / "bad.gguf"))
    (tmp_path / "weights.bin").write_bytes(b"")
    with pytest.raises(ValueError, match="not a .gguf or config.json"):
        LLM(str(tmp_path / "weights.bin"))


def test_unsupported_gguf_architecture_is_refused_before_conversion(tmp_path, monkeypatch) -> None:
    gguf = pytest.importorskip("gguf", reason="gguf not installed: pip install gguf accelerate")
    import numpy as np

    from radixkv import LLM

    monkeypatch.setenv("RADIXKV_CACHE_DIR", str(tmp_path / "cache"))
    w = gguf.GGUFWriter(str(tmp_path / "tiny-gpt2.gguf"), "gpt2")
    for add, value in ((w.add_context_length, 64), (w.add_embedding_length, 32), (w.add_feed_forward_length, 64),
                       (w.add_block_count, 1), (w.add_head_count, 2), (w.add_layer_norm_eps, 1e-5)):
        add(value)
    w.add_tensor("token_embd.weight", np.zeros((16, 32), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ValueError, match="tiny-gpt2.gguf: unsupported model_type 'gpt2'; supported: \\['llama'"):
        LLM(str(tmp_path / "tiny-gpt2.gguf"))
    assert os.listdir(tmp_path / "cache" / "gguf") == []  # no half-written folder left behind


# ---------------------------------------------------------------- files that are not what they should be (issue 16)


def _saved_llama(path):
    hf_model(tiny_config("llama")).save_pretrained(path)
    return path


def test_corrupt_checkpoint_files_are_named(tmp_path) -> None:
    folder = _saved_llama(tmp_path / "m")
    weights, data = folder / "model.safetensors", (folder / "model.safetensors").read_bytes()
    weights.write_bytes(data[: len(data) // 3])
    with pytest.raises(ValueError, match=f"{weights}: not a readable safetensors file .*truncated or corrupt"):
        load_checkpoint(str(folder))
    weights.write_bytes(data)
    (folder / "model.safetensors.index.json").write_text('{"weight_map": {"x": "model-00002-of-00002.safetensors"}}')
    with pytest.raises(FileNotFoundError, match="index.json: lists 1 shard.*'model-00002-of-00002.safetensors'"):
        load_checkpoint(str(folder))
    (folder / "model.safetensors.index.json").unlink()
    (folder / "generation_config.json").write_text("{oops")
    with pytest.raises(ValueError, match="generation_config.json: "):
        load_checkpoint(str(folder))
    (folder / "generation_config.json").unlink()
    (folder / "config.json").write_text('{"model_type": "llama", ')
    with pytest.raises(ValueError, match=r"config.json: not valid JSON \(Expecting property name"):
        load_checkpoint(str(folder))
    (folder / "config.json").write_bytes(b'{"model_type": "caf\xe9"}')
    with pytest.raises(ValueError, match=r"config.json: not UTF-8 text \(byte 0xe9"):
        load_checkpoint(str(folder))


def test_legacy_bin_that_is_not_a_state_dict_is_named(tmp_path) -> None:
    legacy = tmp_path / "legacy"
    legacy.mkdir()
    tiny_config("llama").save_pretrained(legacy)
    (legacy / "pytorch_model.bin").write_bytes(b"garbage")
    with pytest.raises(ValueError, match="pytorch_model.bin: cannot read PyTorch weights"):
        load_checkpoint(str(legacy))
    torch.save([torch.zeros(2)], legacy / "pytorch_model.bin")
    with pytest.raises(ValueError, match="pytorch_model.bin: not a state dict"):
        load_checkpoint(str(legacy))


def test_weights_of_another_config_are_refused_with_file_and_tensor(tmp_path) -> None:
    from safetensors.torch import load_file, save_file

    folder = _saved_llama(tmp_path / "m")
    weights = folder / "model.safetensors"
    sd = load_file(weights)
    sd["model.layers.1.mlp.up_proj.weight"] = torch.zeros(128, 32)
    save_file(sd, weights)
    with pytest.raises(ValueError, match=r"model.safetensors: tensor 'model.layers.1.mlp.up_proj.weight' has shape "
                                         r"\[128, 32\], but config.json needs \[128, 64\]"):
        load_checkpoint(str(folder))
    del sd["model.layers.1.mlp.up_proj.weight"], sd["model.norm.weight"]
    save_file(sd, weights)
    with pytest.raises(ValueError, match=r"the weights lack 2 of the 20 tensors config.json needs, e.g. "
                                         r"\['model.norm.weight', 'model.layers.1.mlp.up_proj.weight'\]"):
        load_checkpoint(str(folder))


def test_broken_tokenizer_is_named(tmp_path) -> None:
    folder = _saved_llama(tmp_path / "m")
    (folder / "tokenizer.json").write_text("{broken")
    with pytest.raises(ValueError, match=f"{folder / 'tokenizer.json'}: "):
        load_checkpoint(str(folder))


def test_impossible_sizes_and_incomplete_rope_are_refused() -> None:
    import types

    base = tiny_config("llama").to_dict()
    for over, message in (({"num_attention_heads": 0}, "num_attention_heads must be a positive integer, got 0"),
                          ({"vocab_size": -5}, "vocab_size must be a positive integer, got -5"),
                          ({"hidden_size": 2.5}, "hidden_size must be a positive integer, got 2.5"),
                          ({"hidden_size": 4, "num_attention_heads": 4, "num_key_value_heads": 4, "head_dim": None},
                           "head_dim 1 .* must be even"),
                          ({"rope_parameters": {"rope_type": "linear", "rope_theta": 1e4}},
                           r"rope_type 'linear' needs \['factor'\]")):
        with pytest.raises(ValueError, match=message):
            ModelSpec.from_hf(types.SimpleNamespace(**{**base, **over}))


def test_truncated_gguf_is_named(tmp_path, monkeypatch) -> None:
    gguf = pytest.importorskip("gguf", reason="gguf not installed: pip install gguf accelerate")
    import numpy as np

    from radixkv import LLM

    monkeypatch.setenv("RADIXKV_CACHE_DIR", str(tmp_path / "cache"))
    path = tmp_path / "tiny.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.zeros((16, 32), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    path.write_bytes(path.read_bytes()[:40])
    with pytest.raises(ValueError, match=f"{path}: cannot read its metadata .*truncated or corrupt"):
        LLM(str(path))
    assert os.listdir(tmp_path / "cache" / "gguf") == []
