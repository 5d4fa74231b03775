"""The OpenAI response pieces: envelopes, SSE events, usage, error chunks and logprobs."""
from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi.responses import StreamingResponse

from radixkv.prompt_logprobs import LogprobsBlock
from radixkv.request import PositionLogprobs

from .protocol import error_body
from .token_bytes import token_name
from .streams import EngineDeadError, EngineStepError, StreamOutput


class _Shape:
    """The envelope of one response: object names, id, model, created."""

    def __init__(self, obj: str, rid: str, model: str, chat: bool) -> None:
        self.obj, self.rid, self.model, self.chat = obj, rid, model, chat
        self.created = int(time.time())

    def head(self, chunk: bool = False) -> dict[str, Any]:
        obj = self.obj + (".chunk" if chunk and self.chat else "")
        return {"id": self.rid, "object": obj, "created": self.created, "model": self.model}

    def chunk(self, index: int, delta: Any, finish_reason: str | None, **extra: Any) -> dict[str, Any]:
        key = "delta" if self.chat else "text"
        choice = {"index": index, key: delta, "logprobs": None, "finish_reason": finish_reason, **extra}
        return {**self.head(chunk=True), "choices": [choice]}


def _event(obj: dict[str, Any]) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False, separators=(',', ':'))}\n\n"


def _stream_error(err: BaseException) -> dict[str, Any]:
    if isinstance(err, EngineStepError):
        return error_body(str(err), type="InternalServerError", code=500)
    if isinstance(err, EngineDeadError):
        return error_body(str(err), type="ServiceUnavailableError", code=503)
    return error_body(f"internal error: {err!r}", type="InternalServerError", code=500)


def _usage(finals: list[StreamOutput], n: int) -> dict[str, Any]:
    firsts = finals[::n]  # one per prompt
    prompt = sum(len(f.prompt_token_ids) for f in firsts)
    completion = sum(len(f.token_ids) for f in finals)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": sum(f.num_cached_tokens for f in firsts)}}


def _sse(gen: AsyncIterator[str]) -> StreamingResponse:
    return StreamingResponse(gen, media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


class LogprobsFormat:
    """OpenAI's logprobs of one choice, built as its tokens arrive.

    Completions: {tokens, token_logprobs, top_logprobs, text_offset} (top_logprobs: the token and
    the `top` most likely, by token text); an echoed prompt's tokens come first (`add_prompt`), the
    first with null logprob and top_logprobs, as OpenAI and vLLM send them. Chat: {content: [{token,
    logprob, bytes, top_logprobs: [{token, logprob, bytes}] (the `top` most likely)}]}. `bytes` are the
    token's own bytes; a token that is only part of a character is named "bytes:\\xNN..." (vLLM's name;
    serve/token_bytes.py); a model without a tokenizer names tokens "token_id:N", as vLLM does.
    """

    def __init__(self, tokenizer: Any, chat: bool, top: int, offset: int = 0) -> None:
        self.tok, self.chat, self.top, self.offset = tokenizer, chat, top, offset
        self._held: list[tuple[int, PositionLogprobs | None]] = []

    def add(self, out: StreamOutput, whole: bool = False) -> None:
        """Hold out's new tokens' logprobs (whole: all of its tokens', for a final output)."""
        if out.logprobs is not None:
            ids = out.token_ids if whole else out.delta_token_ids
            start = len(out.token_ids) - len(ids)
            self._held.extend(zip(ids, out.logprobs[start:]))

    def add_prompt(self, prompt_ids: list[int], scored: LogprobsBlock | None) -> None:
        """Hold an echoed prompt's tokens: the first unscored, then each with its logprobs."""
        self._held.append((prompt_ids[0], None))
        self._held.extend(zip(prompt_ids[1:], scored.positions() if scored is not None else ()))

    def _text(self, t: int) -> str:
        return token_name(self.tok, t)[0]

    def take(self) -> dict[str, Any]:
        """The logprobs of the tokens added since the last take."""
        held, self._held = self._held, []
        if self.chat:
            return {"content": [{**self._entry(t, p.logprob), "top_logprobs": [
                self._entry(i, v) for i, v in zip(p.top_ids[: self.top], p.top_logprobs)]} for t, p in held if p]}
        out: dict[str, Any] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        for t, p in held:
            text = self._text(t)
            out["tokens"].append(text)
            out["token_logprobs"].append(None if p is None else _finite(p.logprob))
            top = None
            if p is not None:
                top = {self._text(p.token): _finite(p.logprob)}
                for i, v in zip(p.top_ids[: self.top], p.top_logprobs):
                    top.setdefault(self._text(i), _finite(v))
            out["top_logprobs"].append(top)
            out["text_offset"].append(self.offset)
            self.offset += len(text)
        return out

    def _entry(self, t: int, lp: float) -> dict[str, Any]:
        name, raw = token_name(self.tok, t)
        return {"token": name, "logprob": _finite(lp), "bytes": list(raw)}


def prompt_logprobs_json(tokenizer: Any, scored: LogprobsBlock | None) -> list[dict[str, dict[str, Any]] | None]:
    """vLLM's `prompt_logprobs` of a choice: None for the first prompt token, then per token
    {token id (a string): {logprob, rank, decoded_token}} of the token and the most likely ones."""
    def entry(t: int, lp: float, rank: int) -> dict[str, Any]:
        return {"logprob": _finite(lp), "rank": rank,
                "decoded_token": f"token_id:{t}" if tokenizer is None else tokenizer.decode([t])}

    out: list[dict[str, dict[str, Any]] | None] = [None]
    for p in scored.positions() if scored is not None else ():
        d = {str(p.token): entry(p.token, p.logprob, p.rank)}
        for rank, (t, v) in enumerate(zip(p.top_ids, p.top_logprobs), 1):
            d.setdefault(str(t), entry(t, v, rank))
        out.append(d)
    return out


def _finite(x: float) -> float:
    """JSON has no -inf: OpenAI's clients read -9999.0 as 'impossible'."""
    return max(-9999.0, x)
