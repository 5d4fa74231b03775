"""The OpenAI response pieces: envelopes, SSE events, usage, error chunks and logprobs."""
from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi.responses import StreamingResponse

from .protocol import error_body
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

    Completions: {tokens, token_logprobs, top_logprobs, text_offset} (top_logprobs: the sampled
    token and the `top` most likely, by token text). Chat: {content: [{token, logprob, bytes,
    top_logprobs: [{token, logprob, bytes}] (the `top` most likely)}]}. A model without a
    tokenizer names tokens "token_id:N", as vLLM does.
    """

    def __init__(self, tokenizer: Any, chat: bool, top: int, offset: int = 0) -> None:
        self.tok, self.chat, self.top, self.offset = tokenizer, chat, top, offset
        self._held: list[tuple[int, dict[int, float]]] = []

    def add(self, out: StreamOutput, whole: bool = False) -> None:
        """Hold out's new tokens' logprobs (whole: all of its tokens', for a final output)."""
        if out.logprobs is not None:
            ids = out.token_ids if whole else out.delta_token_ids
            start = len(out.token_ids) - len(ids)
            self._held.extend(zip(ids, out.logprobs[start:]))

    def _text(self, t: int) -> str:
        return f"token_id:{t}" if self.tok is None else self.tok.decode([t])

    def take(self) -> dict[str, Any]:
        """The logprobs of the tokens added since the last take."""
        held, self._held = self._held, []
        if self.chat:
            content = []
            for t, d in held:
                best = sorted(d.items(), key=lambda kv: -kv[1])[: self.top]
                content.append({**self._entry(t, d.get(t, float("-inf"))),
                                "top_logprobs": [self._entry(k, v) for k, v in best]})
            return {"content": content}
        out: dict[str, Any] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        for t, d in held:
            text = self._text(t)
            out["tokens"].append(text)
            out["token_logprobs"].append(_finite(d.get(t, float("-inf"))))
            out["top_logprobs"].append({self._text(k): _finite(v) for k, v in d.items()})
            out["text_offset"].append(self.offset)
            self.offset += len(text)
        return out

    def _entry(self, t: int, lp: float) -> dict[str, Any]:
        text = self._text(t)
        return {"token": text, "logprob": _finite(lp), "bytes": list(text.encode("utf-8"))}


def _finite(x: float) -> float:
    """JSON has no -inf: OpenAI's clients read -9999.0 as 'impossible'."""
    return max(-9999.0, x)
