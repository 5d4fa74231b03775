"""Scripts written the way vLLM's offline examples are (basic/generate.py, basic/chat.py), with only the
import changed to radixkv (issue 32, item 5): EngineArgs on an argparse parser, LLM(**vars(args)),
get_default_sampling_params() then assigned fields, get_tokenizer(), chat; and the keyword arguments
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
    sampling = parser.add_argument_group("Sampling parameters")
    sampling.add_argument("--max-tokens", type=int)
    sampling.add_argument("--temperature", type=float)
    sampling.add_argument("--top-p", type=float)
    sampling.add_argument("--top-k", type=int)
    return parser


def generate_main(args: dict) -> list[tuple[str, str]]:
    """basic/generate.py's main, as vLLM writes it."""
    max_tokens = args.pop("max_tokens")
    temperature = args.pop("temperature")
    top_p = args.pop("top_p")
    top_k = args.pop("top_k")
    llm = LLM(**args)
    sampling_params = llm.get_default_sampling_params()
    if max_tokens is not None:
        sampling_params.max_tokens = max_tokens
    if temperature is not None:
        sampling_params.temperature = temperature
    if top_p is not None:
        sampling_params.top_p = top_p
    if top_k is not None:
        sampling_params.top_k = top_k
    prompts = ["Hello, my name is", "The president of the United States is", "The capital of France is"]
    outputs = llm.generate(prompts, sampling_params)
    return [(output.prompt, output.outputs[0].text) for output in outputs]


def test_generate_example(folder: str) -> None:
    args = vars(create_parser(folder).parse_args([*ENGINE_FLAGS, "--max-tokens", "6", "--temperature", "0"]))
    got = generate_main(dict(args))
    assert [p for p, _ in got] == ["Hello, my name is", "The president of the United States is",
                                   "The capital of France is"]
    assert all(isinstance(t, str) for _, t in got)
    again = generate_main(dict(args))
    assert again == got  # greedy, same seed: the same texts
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
