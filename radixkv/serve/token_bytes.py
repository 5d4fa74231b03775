"""A token's own bytes and its name in OpenAI's logprobs (issue 33 item 6).

Byte-level BPE tokenizers (GPT-2, Llama 3, SmolLM2, Qwen) split a rare character into tokens that are each
part of its UTF-8 bytes; decoding one alone gives U+FFFD. Their vocabulary spells bytes as printable
characters (the printable Latin-1 bytes as themselves, the others shifted past U+0100); inverting that gives
each token's real bytes, so the `bytes` of a chat logprob join into the text. SentencePiece's byte fallback
spells a byte as "<0xNN>" and a space as U+2581. A token whose bytes are not whole UTF-8 is named
"bytes:\\xNN..." (vLLM's name), so alternatives that would all decode to U+FFFD keep distinct keys.
"""
from __future__ import annotations

from functools import lru_cache
from typing import Any


@lru_cache(maxsize=1)
def _byte_level_decoder() -> dict[str, int]:
    """Byte-level BPE's character -> byte: printable Latin-1 bytes stand for themselves, the other 68 bytes
    take the code points from U+0100 on, in byte order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    chars = {b: chr(b) for b in printable}
    shift = 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(0x100 + shift)
            shift += 1
    return {c: b for b, c in chars.items()}


def _is_byte_level(tokenizer: Any) -> bool:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    return backend is not None and type(backend.decoder).__name__ == "ByteLevel"


def token_bytes(tokenizer: Any, token: int) -> bytes:
    """The bytes token stands for (its decoded text's UTF-8 when the vocabulary spells no bytes)."""
    piece = tokenizer.convert_ids_to_tokens(token)
    if isinstance(piece, str):
        if _is_byte_level(tokenizer):
            table = _byte_level_decoder()
            if all(c in table for c in piece):
                return bytes(table[c] for c in piece)
        if len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
            try:
                return bytes([int(piece[3:5], 16)])
            except ValueError:
                pass
    return tokenizer.decode([token]).encode("utf-8", "surrogatepass")


def token_name(tokenizer: Any, token: int) -> tuple[str, bytes]:
    """(the token's name in logprobs, its bytes): its text, or "bytes:\\xNN..." when its bytes are not
    whole UTF-8 characters; a model without a tokenizer names it "token_id:N", as vLLM does."""
    if tokenizer is None:
        name = f"token_id:{token}"
        return name, name.encode()
    text = tokenizer.decode([token])
    if "\ufffd" not in text:
        return text, text.encode("utf-8", "surrogatepass")
    raw = token_bytes(tokenizer, token)
    try:
        return raw.decode("utf-8"), raw
    except UnicodeDecodeError:
        return "bytes:" + "".join(f"\\x{b:02x}" for b in raw), raw
