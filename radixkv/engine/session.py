"""Session: a multi-turn chat that keeps its whole history in the prefix cache.

The session keeps the exact token ids of the conversation so far (every prompt and every
generated reply, as generated), and each `send` appends only the tokens of the new turn.
A system prompt given as token ids is the first part of that history.
The radix tree then matches the previous request's prompt + output, so turn k recomputes
only its new message (plus the partial last page of the previous exchange).

With a chat template (the tokenizer's), the new turn's tokens are the text the template
adds after the previous reply; if the template re-renders history differently (e.g. strips
whitespace), the session falls back to tokenising the full rendering (fewer cache hits,
same output). Without a template a plain "User:/Assistant:" transcript is used. A model
without a tokenizer chats in token ids: `send` takes and returns lists of ids.
"""
from __future__ import annotations

import copy
import dataclasses
from typing import Any, Protocol, Sequence

from radixkv.request import RequestOutput

from radixkv.sampling_params import SamplingParams


class ChatEngine(Protocol):
    """What a session needs of its engine (radixkv.LLM provides it)."""

    tokenizer: Any  # transformers tokenizer, or None

    def encode(self, prompt: str | Sequence[int], index: int = 0) -> list[int]: ...

    def generate(self, prompts: Any, sampling_params: Any = None) -> list[RequestOutput]: ...


class Session:
    """Multi-turn chat over one LLM. `history` holds the token ids of every turn so far."""

    def __init__(self, llm: ChatEngine, system: str | Sequence[int] | None, params: SamplingParams,
                 cache_salt: str | None = None) -> None:
        """system: text (needs a tokenizer), or token ids that every prompt of the chat starts with.
        cache_salt: the prefix-cache namespace of every turn (SamplingParams.cache_salt)."""
        self.llm = llm
        if cache_salt is not None:
            params = dataclasses.replace(params, cache_salt=cache_salt)  # validated there
        self.cache_salt = cache_salt if cache_salt is not None else params.cache_salt
        self.params = params
        self.history: list[int] = []  # prompt + reply ids of all completed turns, as the engine saw them
        if system is not None and not isinstance(system, str):
            self.history = llm.encode(system)  # validated ids: a raw prefix, never rendered as text
            system = None
        elif system is not None and llm.tokenizer is None:
            raise ValueError("the system prompt is text but the model has no tokenizer; pass token ids")
        self.messages: list[dict[str, str]] = [] if system is None else [{"role": "system", "content": system}]
        self._rendered = ""  # chat-template text that `history` corresponds to
        self.outputs: list[RequestOutput] = []  # one per send, for cached_tokens and finish reasons
        tok = llm.tokenizer
        self._template = tok is not None and getattr(tok, "chat_template", None) is not None
        self._system = system

    def fork(self) -> "Session":
        """A branch of this chat: the same history (so its next turn hits every page the history
        already has in the prefix cache), continuing independently of this one."""
        child = copy.copy(self)
        child.history = list(self.history)
        child.messages = [dict(m) for m in self.messages]
        child.outputs = list(self.outputs)
        return child

    @property
    def last(self) -> RequestOutput:
        if not self.outputs:
            raise RuntimeError("no turn has been sent yet")
        return self.outputs[-1]

    def send(self, message: str | Sequence[int], params: SamplingParams | None = None) -> Any:
        """Add a user turn, generate the reply, return it (text, or ids for a model without tokenizer)."""
        params = params or self.params
        if self.cache_salt is not None and params.cache_salt != self.cache_salt:
            params = dataclasses.replace(params, cache_salt=self.cache_salt)
        if isinstance(message, str):
            if not message:
                raise ValueError("empty message")
            if self.llm.tokenizer is None:
                raise ValueError("this model has no tokenizer: send token ids (a list of ints)")
            prompt, rendered = self._text_turn(message)
        else:
            new = self.llm.encode(message)
            prompt, rendered = self.history + new, ""
        out = self.llm.generate([prompt], params)[0]
        reply_ids = out.token_ids
        self.history = prompt + reply_ids
        self.outputs.append(out)
        if isinstance(message, str):
            reply = out.text or ""
            self.messages.append({"role": "user", "content": message})
            self.messages.append({"role": "assistant", "content": reply})
            self._rendered = rendered + self._decode(reply_ids)
            return reply
        return list(reply_ids)

    def _decode(self, ids: list[int]) -> str:
        # the reply as text, with the stop token that ended it (templates render that marker)
        return self.llm.tokenizer.decode(ids, skip_special_tokens=False) if ids else ""

    def _text_turn(self, message: str) -> tuple[list[int], str]:
        """(prompt ids, rendered text of the prompt) for a new user message."""
        tok = self.llm.tokenizer
        if self._template:
            msgs = self.messages + [{"role": "user", "content": message}]
            full = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
        else:
            head = "" if self.history or self._system is None else f"{self._system}\n"
            turn = f"{head}{chr(10) if self.history else ''}User: {message}\nAssistant:"
            full = self._rendered + turn
        if self.history and full.startswith(self._rendered):
            delta = full[len(self._rendered):]
            return self.history + list(tok(delta, add_special_tokens=False).input_ids), full
        # first turn, or the template re-rendered history differently: tokenise it all
        ids = list(tok(full, add_special_tokens=not self._template).input_ids)
        return ids, full
