"""Incremental detokenisation and stop strings for one streamed request.

Text is released in deltas that never split a multi-byte character (a decode ending in the
replacement character U+FFFD waits for the next token) and never show the beginning of a stop
string that may still complete: the last `len(longest stop) - 1` characters are held back until
the request finishes. When a stop string appears, the text ends before it (or after it, with
`include_stop_str_in_output`) and `stopped` tells the engine to end the request. With `min_tokens`, stop strings are looked for
only once the output has that many tokens (as `LLM` does).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any


class TextStream:
    """Turns a request's growing token list into text deltas.

    tokenizer: a transformers tokenizer, or None (a model without one streams token ids only).
    """

    def __init__(self, tokenizer: Any, stop: Sequence[str] = (), include_stop_str_in_output: bool = False,
                 skip_special_tokens: bool = True, min_tokens: int = 0) -> None:
        self.tokenizer = tokenizer
        self.min_tokens = min_tokens
        self.stop = tuple(s for s in stop if s)
        self.include_stop = include_stop_str_in_output
        self.skip_special = skip_special_tokens
        self.text = ""  # everything decoded so far (stop string cut applied once stopped)
        self.sent = 0  # characters of `text` already released
        self.stopped = False  # a stop string was found
        self.stop_str: str | None = None  # the one found
        self._hold = max((len(s) for s in self.stop), default=1) - 1
        self._prefix = 0  # output tokens before the decode window
        self._read = 0  # output tokens whose text is in `text`

    def update(self, token_ids: Sequence[int], finished: bool) -> str:
        """The new text to release for the request's output `token_ids` (all of them so far).

        Decodes only a window: the tokens since the last release plus a few before them, so that
        tokenizers whose decode depends on the left context (SentencePiece's leading spaces) give
        the same text as decoding everything, at a cost independent of the output's length."""
        if self.tokenizer is None or self.stopped:
            return ""
        ids = list(token_ids[self._prefix:])
        if not ids:
            return self._release(finished)
        before = self._decode(ids[: self._read - self._prefix])
        text = self._decode(ids)
        if text.endswith("\ufffd") and not finished:
            return ""  # half a character: wait for the rest of its bytes
        new = text[len(before):]
        if not new and not finished:
            return ""
        searched_from = max(0, len(self.text) - self._hold)
        self.text += new
        self._prefix, self._read = self._read, len(token_ids)
        if self.stop and len(token_ids) >= self.min_tokens:
            hit = self._find_stop(searched_from)
            if hit is not None:
                self.text, self.stopped, finished = hit, True, True
        return self._release(finished)

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special) if ids else ""

    def _release(self, finished: bool) -> str:
        end = len(self.text) if finished else max(self.sent, len(self.text) - self._hold)
        delta = self.text[self.sent:end]
        self.sent = end
        return delta

    def _find_stop(self, start: int) -> str | None:
        """The text up to (or through) the earliest stop string found at or after `start`."""
        best: tuple[int, str] | None = None
        for s in self.stop:
            i = self.text.find(s, start)
            if i >= 0 and (best is None or i < best[0]):
                best = (i, s)
        if best is None:
            return None
        i, s = best
        self.stop_str = s
        return self.text[: i + len(s)] if self.include_stop else self.text[:i]
