"""Calls written the way vLLM's offline examples make them (basic/generate.py runs as a program in
test_offline_api.py; basic/chat.py here), only the import changed (issue 32, item 5): EngineArgs from an
argparse namespace, get_default_sampling_params() then assigned fields, get_tokenizer(), chat; and the keyword arguments
a ported script passes (tokenizer, trust_remote_code, quantization, seed) honoured or refused by name."""
from __future__ import annotations

import argparse
import dataclasses

import pytest

from radixkv import LLM, EngineArgs, SamplingParams  # vLLM's: from vllm import LLM, EngineArgs, SamplingParams

from .conftest import CHATML, char_tokenizer
from .tiny_models import hf_model, tiny_config

ENGINE_FLAGS = ["--dtype", "float32", "--device", "cpu", "--num-gpu-blocks-override", "64", "--seed", "0"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("vllm-example-model")
    config = tiny_config("llama")
    config.eos_token_id = 4  # <|im_end|>
    hf_model(config).save_pretrained(path)
    char_tokenizer(CHATML).save_pretrained(path)
    return str(path)


def create_parser(model: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    EngineArgs.add_cli_args(parser)
    parser.set_defaults(model=model)
    return parser


def test_generate_example(folder: str, tmp_path) -> None:
    """basic/generate.py itself runs as a program in test_offline_api.py; here: run twice, the same texts, and
    the parsed flags as an EngineArgs, in both of the examples' spellings."""
    from .test_offline_api import PROMPTS, _run_script

    argv = ["--model", folder, *ENGINE_FLAGS, "--max-tokens", "6", "--temperature", "0"]
    got = _run_script(tmp_path, *argv)
    assert [p for p, _ in got] == PROMPTS and all(isinstance(t, str) for _, t in got)
    assert _run_script(tmp_path, *argv) == got  # greedy, same seed: the same texts
    ns = create_parser(folder).parse_args(ENGINE_FLAGS)
    engine = EngineArgs.from_cli_args(ns)
    assert (engine.model, engine.dtype, engine.num_gpu_blocks_override, engine.max_num_seqs) == (
        folder, "float32", 64, None)
    llm = LLM(**dataclasses.asdict(engine))  # the other spelling of the examples
    assert llm.num_pages == 64 and llm.get_tokenizer() is not None


def test_chat_example(folder: str) -> None:
    llm = LLM(model=folder, dtype="float32", device="cpu", num_gpu_blocks_override=64)
    sampling_params = llm.get_default_sampling_params()
    sampling_params.max_tokens = 5
    sampling_params.temperature = 0.0
    conversation = [{"role": "system", "content": "You are a helpful assistant"},
                    {"role": "user", "content": "Hello"},
                    {"role": "assistant", "content": "Hello! How can I assist you today?"},
                    {"role": "user", "content": "Write an essay about the importance of higher education."}]
    [one] = llm.chat(conversation, sampling_params, use_tqdm=False)
    batch = llm.chat([conversation] * 3, sampling_params, use_tqdm=False)
    assert [o.outputs[0].text for o in batch] == [one.outputs[0].text] * 3
    tok = llm.get_tokenizer()
    prompt = tok.apply_chat_template(conversation, tokenize=False, add_generation_prompt=True)
    assert llm.generate(prompt, sampling_params)[0].outputs[0].text == one.outputs[0].text


def test_ported_keywords_are_honoured_or_refused_by_name(folder: str, tmp_path) -> None:
    with pytest.raises(ValueError, match="trust_remote_code"):
        LLM(folder, device="cpu", trust_remote_code=True)
    with pytest.raises(ValueError, match="quantization"):
        LLM(folder, device="cpu", quantization="awq")
    with pytest.raises(ValueError, match="tokenizer"):
        LLM(folder, device="cpu", num_pages=16, tokenizer=str(tmp_path))  # an empty folder
    llm = LLM(folder, device="cpu", num_pages=16, trust_remote_code=False, quantization=None, tokenizer=folder,
              seed=3, max_num_seqs=None)
    assert llm.get_tokenizer() is not None and llm.config.seed == 3
    other = tmp_path / "tok"
    char_tokenizer(None).save_pretrained(other)  # the same vocabulary, no chat template
    swapped = LLM(folder, device="cpu", num_pages=16, tokenizer=str(other))
    assert getattr(swapped.get_tokenizer(), "chat_template", None) is None
    assert swapped.generate("hi", SamplingParams(max_tokens=2, temperature=0.0))[0].text is not None
