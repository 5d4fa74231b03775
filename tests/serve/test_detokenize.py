"""TextStream: deltas concatenate to the full decode, never split a character, hold back a stop
string's start and cut the text at it."""
from __future__ import annotations

import os

import pytest

from radixkv.engine.outputs import TextStream

TEXT = "Héllo wörld! 日本語のテキスト 🎉 emoji and  double  spaces\n\nnew lines, café."


def _tokenizers():
    from e2e.conftest import char_tokenizer

    yield "char", char_tokenizer(None), "Hello world! Some text and  spaces\n\nnew lines."
    from radixkv.engine.gguf import cache_folder_for, smollm2_gguf_path

    path = smollm2_gguf_path()
    if path is not None and os.path.isdir(cache_folder_for(path)):  # converted by an earlier test
        from transformers import AutoTokenizer

        yield "smollm2", AutoTokenizer.from_pretrained(cache_folder_for(path)), TEXT


@pytest.mark.parametrize("stop", [[], ["world"], ["wörld"], ["🎉", "zzz"], ["\n\n"]])
def test_deltas_equal_full_decode(stop) -> None:
    for name, tok, text in _tokenizers():
        ids = tok(text, add_special_tokens=False).input_ids + [tok.eos_token_id]
        ts = TextStream(tok, stop)
        deltas = []
        for i in range(1, len(ids) + 1):
            deltas.append(ts.update(ids[:i], i == len(ids)))
            assert "\ufffd" not in deltas[-1], name
            if ts.stopped:
                break
        full = tok.decode(ids, skip_special_tokens=True)
        cuts = [full.index(s) for s in stop if s in full]
        want = full[: min(cuts)] if cuts else full
        assert "".join(deltas) == ts.text == want, name
        assert ts.stopped == bool(cuts)
        for s in stop:  # no delta shows the start of a stop string that then completes
            assert s not in "".join(deltas)


def test_include_stop_and_no_tokenizer() -> None:
    from e2e.conftest import char_tokenizer

    tok = char_tokenizer(None)
    ids = tok("abc STOP def", add_special_tokens=False).input_ids
    ts = TextStream(tok, ["STOP"], include_stop_str_in_output=True)
    out = "".join(ts.update(ids[:i], False) for i in range(1, len(ids) + 1))
    assert out == "abc STOP" and ts.stopped
    assert TextStream(None).update([1, 2, 3], True) == ""
