"""Fixtures: tiny random model folders (saved with save_pretrained) and a tiny tokenizer."""
from __future__ import annotations

import string

import pytest

from .tiny_models import hf_model, tiny_config

CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def char_tokenizer(chat_template: str | None):
    """A character-level fast tokenizer (printable ASCII + ChatML markers), built offline."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"]
    chars = sorted(set(string.printable) - set("\x0b\x0c\r"))
    vocab = {t: i for i, t in enumerate(specials + chars)}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tk.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="<unk>", bos_token="<s>", eos_token="</s>",
                                  additional_special_tokens=["<|im_start|>", "<|im_end|>"])
    if chat_template is not None:
        tok.chat_template = chat_template
    return tok


@pytest.fixture(scope="session")
def model_folder(tmp_path_factory: pytest.TempPathFactory):
    """make(arch, tokenizer=False|'plain'|'chatml') -> path of a saved tiny random model (cached)."""
    made: dict[tuple, str] = {}

    def make(arch: str, tokenizer: str | bool = False, **over) -> str:
        key = (arch, tokenizer, tuple(sorted(over.items())))
        if key not in made:
            path = tmp_path_factory.mktemp(f"{arch}-{tokenizer}")
            config = tiny_config(arch, **over)
            if tokenizer:
                config.eos_token_id = 4 if tokenizer == "chatml" else 2  # <|im_end|> ends a chat turn
            hf_model(config, seed=0).save_pretrained(path)
            if tokenizer:
                char_tokenizer(CHATML if tokenizer == "chatml" else None).save_pretrained(path)
            made[key] = str(path)
        return made[key]

    return make
