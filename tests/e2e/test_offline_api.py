"""The offline API as vLLM's (issue 32, item 5): LLM.get_tokenizer(), LLM.get_default_sampling_params()
(generation_config.json read as vLLM reads it), radixkv.__version__, and a script written like
vLLM's examples/offline_inference/basic/generate.py with only the import changed, run as a program."""
from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from radixkv import LLM, SamplingParams

from .tiny_models import tiny_config

# Our own equivalent of vLLM's basic/generate.py: the engine's flags on a parser (EngineArgs.add_cli_args), the
# model's default sampling params with the flags given laid over them, four prompts, each output printed; vLLM's
# reads `from vllm import LLM, EngineArgs`, so the import is its only change.
GENERATE_PY = '''
import argparse

from radixkv import LLM, EngineArgs


def create_parser():
    parser = argparse.ArgumentParser()
    EngineArgs.add_cli_args(parser)
    sampling_group = parser.add_argument_group("Sampling parameters")
    sampling_group.add_argument("--max-tokens", type=int)
    sampling_group.add_argument("--temperature", type=float)
    sampling_group.add_argument("--top-p", type=float)
    sampling_group.add_argument("--top-k", type=int)
    return parser


def main(args: dict):
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

    prompts = [
        "Hello, my name is",
        "The president of the United States is",
        "The capital of France is",
        "The future of AI is",
    ]
    outputs = llm.generate(prompts, sampling_params)
    print("-" * 50)
    for output in outputs:
        prompt = output.prompt
        generated_text = output.outputs[0].text
        print(f"Prompt: {prompt!r}\\nGenerated text: {generated_text!r}")
        print("-" * 50)


if __name__ == "__main__":
    parser = create_parser()
    args: dict = vars(parser.parse_args())
    main(args)
'''
PROMPTS = ["Hello, my name is", "The president of the United States is", "The capital of France is",
           "The future of AI is"]
ENGINE_FLAGS = ["--dtype", "float32", "--device", "cpu", "--num-gpu-blocks-override", "64"]


def _folder_with_generation_config(model_folder, tmp_path, gen: dict) -> str:
    path = tmp_path / "with-gen-config"
    shutil.copytree(model_folder("llama", "chatml"), path)
    (path / "generation_config.json").write_text(json.dumps(gen))
    return str(path)


def _run_script(tmp_path, *argv: str) -> list[tuple[str, str]]:
    script = tmp_path / "generate.py"
    script.write_text(GENERATE_PY)
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([repo, os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, str(script), *argv], capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    pairs = re.findall(r"Prompt: (.*)\nGenerated text: (.*)\n", done.stdout)
    return [(eval(p), eval(g)) for p, g in pairs]  # noqa: S307 - the script prints repr()s


# ------------------------------------------------------------------ get_tokenizer

def test_get_tokenizer_is_the_models_tokenizer(model_folder) -> None:
    llm = LLM(model_folder("llama", "chatml"), dtype="float32", device="cpu", num_pages=32)
    tok = llm.get_tokenizer()
    assert tok is llm.tokenizer and list(tok("Hi there").input_ids) == llm.encode("Hi there")
    assert tok.decode(llm.encode("Hi there")) == "Hi there" and tok.chat_template


def test_get_tokenizer_without_one_says_so() -> None:
    llm = LLM(tiny_config("llama"), dtype="float32", device="cpu", num_pages=16)
    with pytest.raises(ValueError, match="no tokenizer"):
        llm.get_tokenizer()


# ------------------------------------------------------------------ get_default_sampling_params

def test_default_sampling_params_without_sampling_defaults_are_vllms_defaults(model_folder) -> None:
    built = LLM(tiny_config("llama"), dtype="float32", device="cpu", num_pages=16)  # from a config: no folder
    assert built.get_default_sampling_params() == SamplingParams()
    folder = model_folder("llama", "chatml")  # save_pretrained wrote generation_config.json: ids only
    assert LLM(folder, dtype="float32", device="cpu", num_pages=16).get_default_sampling_params() == SamplingParams()


def test_default_sampling_params_come_from_generation_config(model_folder, tmp_path) -> None:
    gen = {"bos_token_id": 1, "eos_token_id": 4, "do_sample": True, "temperature": 0.6, "top_p": 0.9,
           "top_k": 20, "min_p": 0.05, "repetition_penalty": 1.1, "max_new_tokens": 7, "num_beams": 1}
    llm = LLM(_folder_with_generation_config(model_folder, tmp_path, gen), dtype="float32", device="cpu",
              num_pages=32)
    p = llm.get_default_sampling_params()
    assert p == SamplingParams(temperature=0.6, top_p=0.9, top_k=20, min_p=0.05, repetition_penalty=1.1,
                               max_tokens=7)
    [out] = llm.generate(["Hi"], p)
    assert len(out.outputs[0].token_ids) <= 7


# ------------------------------------------------------------------ __version__

def test_version_is_exported() -> None:
    import radixkv

    assert "__version__" in radixkv.__all__ and re.fullmatch(r"\d+\.\d+\.\d+.*", radixkv.__version__)


# ------------------------------------------------------------------ vLLM's generate.py, the import changed

def test_vllm_style_generate_script_runs_unchanged(model_folder, tmp_path) -> None:
    folder = model_folder("llama", "chatml")
    printed = _run_script(tmp_path, "--model", folder, *ENGINE_FLAGS)
    assert [p for p, _ in printed] == PROMPTS
    llm = LLM(folder, dtype="float32", device="cpu", num_gpu_blocks_override=64)
    expected = llm.generate(PROMPTS, llm.get_default_sampling_params())
    assert [g for _, g in printed] == [o.outputs[0].text for o in expected]  # the same engine, the same seed


def test_vllm_style_generate_script_with_sampling_flags(model_folder, tmp_path) -> None:
    folder = model_folder("llama", "chatml")
    printed = _run_script(tmp_path, "--model", folder, *ENGINE_FLAGS, "--max-tokens", "5", "--temperature", "0")
    llm = LLM(folder, dtype="float32", device="cpu", num_gpu_blocks_override=64)
    greedy = dataclasses.replace(llm.get_default_sampling_params(), max_tokens=5, temperature=0.0)
    assert [g for _, g in printed] == [o.outputs[0].text for o in llm.generate(PROMPTS, greedy)]
