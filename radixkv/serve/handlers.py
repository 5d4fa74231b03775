"""The two generation endpoints (POST /v1/completions, /v1/chat/completions) behind the app (app.py):
validate and tokenise off the event loop, build each choice's SamplingParams (structured outputs and tools:
structured_fields.py), queue prompt x n requests in the AsyncLLM all or none, and answer in full or as
server-sent events (echo, logprobs, prompt logprobs, tool calls)."""
from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from .api_errors import APIError
from .async_engine import AsyncLLM, EngineDeadError, EngineStepError, RequestStream, StreamOutput
from .metrics import ServeMetrics
from .protocol import (PROMPT_CHARS_PER_TOKEN, ChatCompletionRequest, CompletionRequest, lone_surrogate,
                       prompt_bound)
from .responses import LogprobsFormat, _event, _Shape, _sse, _stream_error, _usage, prompt_logprobs_json
from .routes_extra import check_request_template, render_chat
from .streams import merge_streams
from .structured_fields import Structured, ToolPlan, structured_request, tool_message, tool_plan
from .tool_call_stream import StreamDelta, call_id
from .tool_calls import template_tools_messages

log = logging.getLogger("radixkv.serve")


class Handlers:
    """The two generation endpoints: build the engine requests, answer in full or as SSE."""

    def __init__(self, engine: AsyncLLM, names: list[str], metrics: ServeMetrics, log_requests: bool = False,
                 trust_request_chat_template: bool = False, tool_call_parser: str = "hermes") -> None:
        self.engine, self.names, self.metrics, self.log_requests = engine, names, metrics, log_requests
        self.tool_call_parser = tool_call_parser
        self.inputs = engine.inputs
        self.trust_request_chat_template = trust_request_chat_template

    # ---- request building --------------------------------------------------------------------
    def check_model(self, model: str | None) -> str:
        if model is not None and model not in self.names:
            raise APIError(404, f"The model `{model}` does not exist.", "NotFoundError", "model")
        return model or self.names[0]

    @property
    def bound(self) -> int:
        """Characters of a prompt (or of a chat's messages together), or ids of a token-id prompt, at most."""
        return prompt_bound(self.inputs.limits.max_model_len)

    def _encode(self, prompt: Any, param: str) -> list[int]:
        try:
            return self.inputs.encode(prompt)
        except (TypeError, ValueError) as err:
            raise APIError(400, str(err), param=param) from None

    def _check_prompt_sizes(self, body: CompletionRequest) -> None:
        """400 naming `prompt` before any work for a prompt over the bound or one that is not valid Unicode."""
        for i, p in enumerate(body.prompts()):
            if len(p) > self.bound:
                what = "characters" if isinstance(p, str) else "token ids"
                raise APIError(400, f"prompt {i} has {len(p)} {what}; at most {self.bound} "
                                    f"({PROMPT_CHARS_PER_TOKEN} x max_model_len {self.inputs.limits.max_model_len})", param="prompt")
            if isinstance(p, str) and lone_surrogate(p) is not None:
                raise APIError(400, f"prompt {i} holds a lone surrogate, which is not valid Unicode", param="prompt")

    def _prompt_ids(self, body: CompletionRequest) -> list[list[int]]:
        """Every prompt's token ids, truncated as asked (run on a worker thread)."""
        tok = self.engine.tokenizer
        plain = body.add_special_tokens is False and tok is not None  # vLLM's default: True
        try:
            return [self._truncate(self._encode(list(tok(p, add_special_tokens=False).input_ids)
                                                if plain and isinstance(p, str) and p else p, "prompt"), body)
                    for p in body.prompts()]
        except (TypeError, ValueError) as err:  # the tokenizer's own refusal of a text
            raise APIError(400, f"the prompt cannot be tokenised: {err}", param="prompt") from None

    def _params(self, body: Any, prompt_len: int, max_tokens: int | None, index: int,
                structured: Structured | None = None) -> Any:
        from radixkv.sampling_params import SamplingParams

        if max_tokens is None:  # the rest of the context
            max_tokens = self.inputs.limits.max_tokens_room - prompt_len
            if max_tokens < 1:
                raise APIError(400, f"the prompt's {prompt_len} tokens leave no room to generate in the "
                                    f"context of {self.inputs.limits.max_model_len} tokens", param="max_tokens")
        seed = None if body.seed is None else body.seed + index
        try:
            params = SamplingParams(temperature=1.0 if body.temperature is None else body.temperature,
                                  top_p=1.0 if body.top_p is None else body.top_p, top_k=body.top_k,
                                  min_p=body.min_p or 0.0, max_tokens=max_tokens,
                                  stop_token_ids=tuple(body.stop_token_ids or ()), ignore_eos=body.ignore_eos,
                                  seed=seed, cache_salt=body.cache_salt, stop=body.stop_strings,
                                  include_stop_str_in_output=body.include_stop_str_in_output,
                                  skip_special_tokens=body.skip_special_tokens,
                                  presence_penalty=body.presence_penalty or 0.0,
                                  frequency_penalty=body.frequency_penalty or 0.0,
                                  repetition_penalty=1.0 if body.repetition_penalty is None else body.repetition_penalty,
                                  min_tokens=body.min_tokens or 0, logprobs=body.sampling_logprobs,
                                  prompt_logprobs=body.scored_prompt, logit_bias=body.logit_bias, allowed_token_ids=body.allowed_token_ids,
                                  bad_words=tuple(body.bad_words or ()),
                                  structured_outputs=None if structured is None else structured.params)
            return self.inputs.prepare(params)
        except ValueError as err:
            name = str(err).split(" ", 1)[0]
            if structured is not None and name.startswith("structured_outputs."):  # the spec does not compile
                raise APIError(400, f"{structured.field}: {err}", param=structured.field) from None
            raise APIError(400, str(err), param=name if name in type(body).model_fields else None) from None

    async def _submit(self, body: Any, prompts: list[list[int]], max_tokens: int | None, param: str,
                      base_id: str, structured: Structured | None = None) -> list[RequestStream]:
        """Queue prompt x n requests (all or none): choice index = prompt index * n + sample."""
        streams: list[RequestStream] = []
        try:
            # SamplingParams of every choice (bad words tokenised) on a worker thread, before any is queued
            every = await asyncio.to_thread(lambda: [[self._params(body, len(ids), max_tokens, j, structured)
                                                      for j in range(body.n)] for ids in prompts])
            for i, ids in enumerate(prompts):
                for j in range(body.n):
                    params = every[i][j]
                    self.inputs.check_fits(ids, params)
                    req = self.inputs.request(ids, params, self.engine.now())
                    streams.append(self.engine.add(req, f"{base_id}-{i * body.n + j}"))
                    if self.log_requests:
                        log.info("request %s-%d: %d prompt tokens, %s", base_id, i * body.n + j, len(ids), params)
        except BaseException as err:
            for s in streams:
                self.engine.abort(s.request_id)
            if isinstance(err, (ValueError, TypeError)):
                raise APIError(400, str(err), param=param) from None
            if isinstance(err, EngineDeadError):
                raise APIError(503, str(err), "ServiceUnavailableError") from None
            raise
        return streams

    # ---- endpoints ---------------------------------------------------------------------------
    async def completions(self, body: CompletionRequest, raw: Request) -> Response:
        model = self.check_model(body.model)
        tok = self.engine.tokenizer
        self._check_prompt_sizes(body)
        prompts = await asyncio.to_thread(self._prompt_ids, body)
        rid = f"cmpl-{uuid.uuid4().hex}"
        echo_only = body.max_tokens == 0  # the prompt alone: one token is computed and not returned
        structured = structured_request(body)
        streams = await self._submit(body, prompts, 1 if echo_only else body.max_tokens, "prompt", rid, structured)
        echo = [self._echo_text(ids) if body.echo else "" for ids in prompts]
        shape = _Shape("text_completion", rid, model, chat=False)
        if body.stream:
            return _sse(self._stream(body, streams, shape, echo, prompts))
        finals = await _collect(streams, raw, self.engine)
        if echo_only:
            finals = [replace(f, text="", token_ids=[], logprobs=None if f.logprobs is None else [])
                      for f in finals]
        choices = []
        for k, f in enumerate(finals):
            ids = prompts[k // body.n]
            choice = {"index": k, "text": echo[k // body.n] + f.text,
                      "logprobs": self._logprobs(body, f, ids if body.echo else None),
                      "finish_reason": f.finish_reason, "stop_reason": f.stop_reason}
            if body.prompt_logprobs is not None:
                choice["prompt_logprobs"] = prompt_logprobs_json(tok, f.prompt_logprobs)
            if body.return_token_ids:
                choice.update(token_ids=f.token_ids, prompt_token_ids=f.prompt_token_ids)
            choices.append(choice)
        return JSONResponse({**shape.head(), "choices": choices, "usage": _usage(finals, body.n)})

    async def chat(self, body: ChatCompletionRequest, raw: Request) -> Response:
        model = self.check_model(body.model)
        if self.engine.tokenizer is None:
            raise APIError(400, "this model has no tokenizer, so it cannot chat; use /v1/completions with "
                                "token ids", param="messages")
        check_request_template(body.chat_template, self.trust_request_chat_template)
        size = sum(len(m.text()) for m in body.messages)
        if size > self.bound:
            raise APIError(400, f"the messages hold {size} characters; at most {self.bound} "
                                f"({PROMPT_CHARS_PER_TOKEN} x max_model_len {self.inputs.limits.max_model_len})", param="messages")
        plan = tool_plan(body)
        structured = structured_request(body)
        forced = plan.constraint() if plan is not None else None
        if forced is not None and structured is not None:
            raise APIError(400, f"tool_choice {plan.mode} constrains the output already; drop {structured.field}",
                           param=structured.field)
        ids = await asyncio.to_thread(self._render, body, plan)
        rid = f"chatcmpl-{uuid.uuid4().hex}"
        streams = await self._submit(body, [ids], body.max_new_tokens, "messages", rid, forced or structured)
        shape = _Shape("chat.completion", rid, model, chat=True)
        # vLLM's chat echo: the last message's content first, when it is the assistant's (being continued)
        last = body.messages[-1]
        echo = last.text() if body.echo and last.role == "assistant" else ""
        if body.stream:
            return _sse(self._stream(body, streams, shape, [echo], [ids], plan))
        finals = await _collect(streams, raw, self.engine)
        choices = []
        for k, f in enumerate(finals):
            message, called = tool_message(plan, echo + f.text, self.tool_call_parser)
            choice = {"index": k, "message": message, "logprobs": self._logprobs(body, f),
                      "finish_reason": _tool_finish(plan, called, f.finish_reason), "stop_reason": f.stop_reason}
            if body.prompt_logprobs is not None:
                choice["prompt_logprobs"] = prompt_logprobs_json(self.engine.tokenizer, f.prompt_logprobs)
            if body.return_token_ids:
                choice["token_ids"] = f.token_ids
            choices.append(choice)
        out = {**shape.head(), "choices": choices, "usage": _usage(finals, body.n)}
        if body.return_token_ids:
            out["prompt_token_ids"] = ids
        return JSONResponse(out)

    def _render(self, body: ChatCompletionRequest, plan: ToolPlan | None = None) -> list[int]:
        """The chat prompt's token ids (run on a worker thread; the request template already allowed)."""
        tok = self.engine.tokenizer
        extra = {k: v for k, v in (("documents", body.documents), ("reasoning_effort", body.reasoning_effort),
                                   ("tools", body.tools if plan is not None else None))
                 if v is not None}  # handed to the template, as vLLM does
        text = render_chat(tok, template_tools_messages(body.template_messages()), body.chat_template,
                           {**extra, **(body.chat_template_kwargs or {})}, self.bound,
                           add_generation_prompt=body.add_generation_prompt,
                           continue_final_message=body.continue_final_message)
        try:
            ids = list(tok(text, add_special_tokens=bool(body.add_special_tokens)).input_ids)  # vLLM's default: False
        except (TypeError, ValueError) as err:
            raise APIError(400, f"the rendered chat prompt cannot be tokenised: {err}", param="messages") from None
        if not ids:
            raise APIError(400, "the rendered chat prompt is empty", param="messages")
        return self._encode(ids, "messages")

    def _logformat(self, body: Any) -> LogprobsFormat | None:
        if body.sampling_logprobs is None:
            return None
        chat = isinstance(body, ChatCompletionRequest)
        return LogprobsFormat(self.engine.tokenizer, chat, body.sampling_logprobs)

    def _logprobs(self, body: Any, final: StreamOutput, echoed: list[int] | None = None) -> dict[str, Any] | None:
        """A finished choice's logprobs in OpenAI's shape (None unless asked); echoed: the prompt's ids,
        whose tokens (and logprobs) come first."""
        fmt = self._logformat(body)
        if fmt is None:
            return None
        if echoed is not None:
            fmt.add_prompt(echoed, final.prompt_logprobs)
        fmt.add(final, whole=True)
        return fmt.take()

    def _truncate(self, ids: list[int], body: Any) -> list[int]:
        """vLLM's truncate_prompt_tokens: the prompt's last k tokens (-1: what the context leaves room for)."""
        k = body.truncate_prompt_tokens
        if k is None:
            return ids
        room = self.inputs.limits.max_model_len - (body.max_tokens or 0)
        return self.inputs.truncate(ids, k, room)

    def _echo_text(self, ids: list[int]) -> str:
        tok = self.engine.tokenizer
        return "" if tok is None else tok.decode(ids, skip_special_tokens=False)

    async def _stream(self, body: Any, streams: list[RequestStream], shape: "_Shape",
                      echo: list[str], prompts: list[list[int]], plan: ToolPlan | None = None) -> AsyncIterator[str]:
        """SSE lines of every choice as its deltas arrive, then usage (if asked), then [DONE]. An echo
        with logprobs is sent with the first delta, which brings the prompt's logprobs. With tools (other
        than tool_choice none) each choice's text goes through its incremental tool-call parser: content
        deltas, then tool_calls deltas in OpenAI's shape (_tool_delta)."""
        parsers = [plan.stream(self.tool_call_parser) if plan is not None else None for _ in streams]
        ids: list[list[str]] = [[] for _ in streams]  # each choice's call ids, by index
        items, tasks = merge_streams(streams)
        finals: dict[int, StreamOutput] = {}
        lps = [self._logformat(body) for _ in streams]
        echo_only = not shape.chat and body.max_tokens == 0
        held_echo = [bool(echo[k // body.n]) and lps[k] is not None and not shape.chat for k in range(len(streams))]
        try:
            for k in range(len(streams)):
                if shape.chat and parsers[k] is not None:  # the echo goes through the parser as well
                    yield _event(shape.chunk(k, {"role": "assistant", "content": "",
                                                 **_tool_delta([parsers[k].feed(echo[0])], ids[k])}, None))
                elif shape.chat:
                    yield _event(shape.chunk(k, {"role": "assistant", "content": echo[0]}, None))
                elif echo[k // body.n] and not held_echo[k]:
                    yield _event(shape.chunk(k, echo[k // body.n], None))
            async for k, out in items:
                if isinstance(out, BaseException):
                    yield _event(_stream_error(out))
                    continue
                if held_echo[k]:  # the prompt's logprobs came with this first delta
                    held_echo[k] = False
                    lps[k].add_prompt(prompts[k // body.n], out.prompt_logprobs)
                    yield _event(shape.chunk(k, echo[k // body.n], None, logprobs=lps[k].take()))
                if echo_only:
                    out = replace(out, delta_text="", delta_token_ids=[], text="", token_ids=[],
                                  logprobs=None if out.logprobs is None else [])
                    if not out.finished:
                        continue
                if out.finished:
                    finals[k] = out
                if lps[k] is not None:
                    lps[k].add(out)  # held until a chunk carries text (or the end)
                reason = out.finish_reason
                parser = parsers[k]
                if parser is not None:
                    pieces = [parser.feed(out.delta_text)] + ([parser.finish()] if out.finished else [])
                    delta: Any = _tool_delta(pieces, ids[k])
                    if out.finished:  # "tool_calls" only for calls read whole and valid
                        reason = _tool_finish(plan, parser.called and parser.complete, reason)
                    elif not (delta or body.return_token_ids):
                        continue
                else:
                    if not (out.delta_text or out.finished or body.return_token_ids or self.engine.tokenizer is None):
                        continue
                    delta = {"content": out.delta_text} if shape.chat else out.delta_text
                    if shape.chat and out.finished and not out.delta_text:
                        delta = {}
                extra: dict[str, Any] = {"token_ids": out.delta_token_ids} if body.return_token_ids else {}
                if lps[k] is not None:
                    extra["logprobs"] = lps[k].take()
                if out.finished:
                    extra["stop_reason"] = out.stop_reason
                yield _event(shape.chunk(k, delta, reason, **extra))
            if body.include_usage and finals:
                yield _event({**shape.head(chunk=True), "choices": [],
                              "usage": _usage([finals[k] for k in sorted(finals)], body.n)})
            yield "data: [DONE]\n\n"
        finally:
            for t in tasks:
                t.cancel()
            await items.aclose()  # a single stream left early: its request is aborted


def _tool_delta(pieces: list[StreamDelta], ids: list[str]) -> dict[str, Any]:
    """A chat delta of a tool-call parser's output: its content, and its call pieces as OpenAI streams them
    (a call's first piece with index, id, type and function.name; later ones index and function.arguments).
    ids: the choice's call ids so far, added to as calls begin."""
    delta: dict[str, Any] = {}
    content = "".join(p.content for p in pieces)
    if content:
        delta["content"] = content
    calls: list[dict[str, Any]] = []
    for piece in (c for p in pieces for c in p.calls):
        if calls and calls[-1]["index"] == piece.index:
            calls[-1]["function"]["arguments"] += piece.arguments
            continue
        call: dict[str, Any] = {"index": piece.index, "function": {"arguments": piece.arguments}}
        if piece.name is not None:
            ids.append(call_id())
            call.update(id=ids[piece.index], type="function")
            call["function"] = {"name": piece.name, "arguments": piece.arguments}
        calls.append(call)
    if calls:
        delta["tool_calls"] = calls
    return delta


def _tool_finish(plan: ToolPlan | None, called: bool, reason: str | None) -> str | None:
    """OpenAI's finish_reason: "tool_calls" when the model chose to call (auto, required); a forced named
    function, a cut-short output and plain content keep theirs."""
    return "tool_calls" if called and plan is not None and plan.mode != "named" and reason == "stop" else reason


async def _collect(streams: list[RequestStream], raw: Request, engine: AsyncLLM) -> list[StreamOutput]:
    """Every stream's final output; a client that disconnects first aborts them all."""
    task = asyncio.ensure_future(asyncio.gather(*(s.final() for s in streams)))
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=0.25)
            if done:
                break
            if await raw.is_disconnected():
                task.cancel()
                raise APIError(499, "client disconnected", "ClientDisconnected")
        return task.result()
    except EngineStepError as err:
        raise APIError(500, str(err), "InternalServerError") from None
    except EngineDeadError as err:
        raise APIError(503, str(err), "ServiceUnavailableError") from None
    finally:
        if not task.done():
            task.cancel()
        for s in streams:
            engine.abort(s.request_id)  # no-op for finished ones; frees the others at once
