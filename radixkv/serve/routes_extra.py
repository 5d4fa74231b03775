"""vLLM's tokenizer endpoints and version: POST /tokenize, POST /detokenize, GET /version.

Shapes as vLLM serves them:

- POST /tokenize {"prompt": text, "add_special_tokens": true} or {"messages": [...],
  "add_generation_prompt": true, "continue_final_message": false, "add_special_tokens": false,
  "chat_template", "chat_template_kwargs"}; either may add "model" and "return_token_strs".
  -> {"count", "max_model_len", "tokens", "token_strs" (only when asked)}.
- POST /detokenize {"tokens": [ids], "model"?} -> {"prompt": text} (special tokens kept).
- GET /version -> {"version": radixkv.__version__}.

Bodies are strict: an unknown field, a bad value or a body over the size limit is a 400 in
OpenAI's error shape naming the field; a model without a tokenizer is a 400 saying so; an
unknown `model` is a 404. Tokenising runs on a worker thread (a large prompt never stalls the
event loop). /tokenize and /detokenize need the API key when the server has one (as /v1/* do);
/version stays open, like /health.

Also here, shared with POST /v1/chat/completions: `check_request_template` (a request's own
`chat_template` only when the operator trusts them: `--trust-request-chat-template`, as vLLM) and
`render_chat` (the template over the messages, on a worker thread; a request's own template is stopped
after TEMPLATE_TIME_LIMIT_S of Python work or once it writes more than the size bound, and a rendered
prompt over the size bound is refused before it is tokenised).
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import sys
import time
from collections.abc import Iterator
from typing import Any

from fastapi import FastAPI, Request
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from .api_errors import APIError, validation_error
from .async_engine import AsyncLLM
from .protocol import (PROMPT_CHARS_PER_TOKEN, ChatMessage, UnsupportedField, check_template_kwargs,
                       lone_surrogate, prompt_bound, template_messages)

MAX_TEXT_CHARS = 4 * 2**20  # /tokenize: characters of prompt + messages at most (and 16 x max_model_len)
MAX_DETOKENIZE_TOKENS = 2**20  # /detokenize: token ids at most
MAX_BODY_BYTES = 32 * 2**20  # either endpoint: the raw body at most
MAX_TEMPLATE_CHARS = 256 * 2**10  # a request's own chat template: characters at most
TEMPLATE_TIME_LIMIT_S = 5.0  # a request's own chat template: seconds of rendering at most
YIELD_EVERY_S = 0.0005  # while it renders, the GIL is handed over this often


class TokenizeCompletionRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model: str | None = None
    prompt: str
    add_special_tokens: bool = True
    return_token_strs: bool = False


class TokenizeChatRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model: str | None = None
    messages: list[ChatMessage] = Field(min_length=1)
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    add_special_tokens: bool = False
    return_token_strs: bool = False
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _prompt_flags(self) -> "TokenizeChatRequest":
        if self.continue_final_message and self.add_generation_prompt:
            raise UnsupportedField("continue_final_message",
                                   "continue_final_message needs add_generation_prompt false")
        check_template_kwargs(self.chat_template_kwargs)
        return self

    def template_messages(self) -> list[dict[str, Any]]:
        return template_messages(self.messages)


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model: str | None = None
    tokens: list[int]


def add_extra_routes(app: FastAPI, engine: AsyncLLM, names: list[str], api_key: str | None,
                     trust_request_chat_template: bool = False) -> None:
    """Register /tokenize, /detokenize and /version on `app` (create_app calls this)."""
    routes = _TokenizerRoutes(engine, names, api_key, trust_request_chat_template)

    @app.post("/tokenize")
    async def tokenize(raw: Request) -> dict[str, Any]:
        return await routes.tokenize(raw)

    @app.post("/detokenize")
    async def detokenize(raw: Request) -> dict[str, Any]:
        return await routes.detokenize(raw)

    @app.get("/version")
    async def version() -> dict[str, str]:
        from radixkv import __version__

        return {"version": __version__}


class _TokenizerRoutes:
    def __init__(self, engine: AsyncLLM, names: list[str], api_key: str | None,
                 trust_request_chat_template: bool = False) -> None:
        self.engine, self.names, self.api_key = engine, names, api_key
        self.trust_request_chat_template = trust_request_chat_template

    # ---- shared checks -----------------------------------------------------------------------
    def _authorize(self, raw: Request) -> None:
        if self.api_key is None:
            return
        auth = raw.headers.get("authorization", "")
        given = auth[7:] if auth.lower().startswith("bearer ") else ""
        if not secrets.compare_digest(given.encode(), self.api_key.encode()):
            raise APIError(401, "invalid or missing API key (Authorization: Bearer ...)", "AuthenticationError")

    async def _body(self, raw: Request) -> dict[str, Any]:
        data = await raw.body()
        if len(data) > MAX_BODY_BYTES:
            raise APIError(400, f"the request body is {len(data)} bytes; at most {MAX_BODY_BYTES}", param="body")
        try:
            body = json.loads(data)
        except ValueError as err:
            raise APIError(400, f"the request body is not valid JSON: {err}", param="body") from None
        if not isinstance(body, dict):
            raise APIError(400, "the request body must be a JSON object", param="body")
        return body

    def _check_model(self, model: str | None) -> None:
        if model is not None and model not in self.names:
            raise APIError(404, f"The model `{model}` does not exist.", "NotFoundError", "model")

    def _tokenizer(self, param: str) -> Any:
        tok = self.engine.tokenizer
        if tok is None:
            raise APIError(400, "this model has no tokenizer, so it cannot tokenize or detokenize text",
                           param=param)
        return tok

    # ---- endpoints ---------------------------------------------------------------------------
    async def tokenize(self, raw: Request) -> dict[str, Any]:
        self._authorize(raw)
        body = await self._body(raw)
        chat = "messages" in body
        try:
            req: Any = (TokenizeChatRequest if chat else TokenizeCompletionRequest).model_validate(body)
        except ValidationError as err:
            raise validation_error(err.errors()) from None
        self._check_model(req.model)
        param = "messages" if chat else "prompt"
        tok = self._tokenizer(param)
        if chat:
            check_request_template(req.chat_template, self.trust_request_chat_template)
        size = sum(len(m.text()) for m in req.messages) if chat else len(req.prompt)
        bound = min(MAX_TEXT_CHARS, prompt_bound(self.engine.inputs.limits.max_model_len))
        if size > bound:
            raise APIError(400, f"the text to tokenize has {size} characters; at most {bound}", param=param)
        if not chat and lone_surrogate(req.prompt) is not None:
            raise APIError(400, "prompt: the text holds a lone surrogate, which is not valid Unicode", param=param)
        work = (lambda: _render_chat(tok, req, bound)) if chat else (lambda: _encode(tok, req.prompt, req.add_special_tokens))
        ids, strs = await asyncio.to_thread(lambda: _with_strs(tok, work(), req.return_token_strs))
        out: dict[str, Any] = {"count": len(ids), "max_model_len": self.engine.inputs.limits.max_model_len,
                               "tokens": ids}
        if req.return_token_strs:
            out["token_strs"] = strs
        return out

    async def detokenize(self, raw: Request) -> dict[str, Any]:
        self._authorize(raw)
        body = await self._body(raw)
        try:
            req = DetokenizeRequest.model_validate(body)
        except ValidationError as err:
            raise validation_error(err.errors()) from None
        self._check_model(req.model)
        tok = self._tokenizer("tokens")
        if len(req.tokens) > MAX_DETOKENIZE_TOKENS:
            raise APIError(400, f"{len(req.tokens)} tokens to detokenize; at most {MAX_DETOKENIZE_TOKENS}",
                           param="tokens")
        vocab = self.engine.inputs.limits.vocab_size
        bad = [t for t in req.tokens if not 0 <= t < vocab]
        if bad:
            raise APIError(400, f"token id {bad[0]} is outside the vocabulary [0, {vocab})", param="tokens")
        text = await asyncio.to_thread(tok.decode, req.tokens, skip_special_tokens=False)
        return {"prompt": text}


def _encode(tok: Any, text: str, add_special_tokens: bool) -> list[int]:
    return list(tok(text, add_special_tokens=add_special_tokens).input_ids)


def _render_chat(tok: Any, req: TokenizeChatRequest, bound: int) -> list[int]:
    """The messages through the chat template (the request's, else the tokenizer's), tokenised."""
    text = render_chat(tok, req.template_messages(), req.chat_template, req.chat_template_kwargs or {}, bound,
                       add_generation_prompt=req.add_generation_prompt,
                       continue_final_message=req.continue_final_message)
    try:
        return _encode(tok, text, req.add_special_tokens)
    except (TypeError, ValueError) as err:
        raise APIError(400, f"the rendered chat prompt cannot be tokenised: {err}", param="messages") from None


# ---- chat rendering, shared with POST /v1/chat/completions ---------------------------------------
def check_request_template(template: str | None, trusted: bool) -> None:
    """400 naming `chat_template` for a request's own template unless the operator trusts them (vLLM's
    --trust-request-chat-template: a template is code the server runs), or one too long to be a template."""
    if template is None:
        return
    if not trusted:
        raise APIError(400, "chat_template: a request's own chat template is refused unless the server runs with "
                            "--trust-request-chat-template (a template is code the server runs); the server's "
                            "template is used when the field is left out", param="chat_template")
    if len(template) > MAX_TEMPLATE_CHARS:
        raise APIError(400, f"chat_template has {len(template)} characters; at most {MAX_TEMPLATE_CHARS}",
                       param="chat_template")


class TemplateLimit(Exception):
    """A request's chat template ran past its time limit or wrote past the size bound (raised inside the
    template's own frames)."""


_CO_GENERATOR = 0x20  # inspect.CO_GENERATOR


@contextlib.contextmanager
def _template_limits(seconds: float, bound: int) -> Iterator[None]:
    """Bound the Python code run inside (a request template's rendering) with a trace function on this
    thread: TemplateLimit at the first line past `seconds`, or once the template's frames have yielded more
    than `bound` characters (before jinja joins them: a loop of one-character writes cannot pile up
    billions of pieces). It hands the GIL over every YIELD_EVERY_S (time.sleep(0)), so the event loop waits
    that long for it at most, not the interpreter's 5 ms switch interval each time it wakes. The thread's
    tracer is restored."""
    deadline = time.monotonic() + seconds
    state = {"handed": time.monotonic(), "written": 0}

    def trace(frame: Any, event: str, arg: Any) -> Any:
        if event == "return" and type(arg) is str and frame.f_code.co_filename == "<template>" \
                and frame.f_code.co_flags & _CO_GENERATOR:
            state["written"] += len(arg)
            if state["written"] > bound:
                raise TemplateLimit(f"the request's chat template wrote more than {bound} characters "
                                    f"({PROMPT_CHARS_PER_TOKEN} x max_model_len)")
        now = time.monotonic()
        if now > deadline:
            raise TemplateLimit(f"the request's chat template ran for more than {seconds:g} s")
        if now - state["handed"] > YIELD_EVERY_S:
            time.sleep(0)
            state["handed"] = time.monotonic()
        return trace

    old = sys.gettrace()
    sys.settrace(trace)
    try:
        yield
    finally:
        sys.settrace(old)


def _products_at_render_time() -> None:
    """Jinja folds constant expressions while it compiles: a request template's {{ 'ab' * 2500000 }} became
    a 5 MB literal that repr() and compile() hold the GIL over, ~0.1 s in two C calls that _template_limits
    cannot interrupt (the event loop, /health included, waited that long). With * and ** intercepted
    (jinja's sandbox hook for them, same results) they run when the template renders, where what they write
    is bounded. Set on the sandbox class transformers compiles chat templates with."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    ImmutableSandboxedEnvironment.intercepted_binops = ImmutableSandboxedEnvironment.intercepted_binops | {"*", "**"}


def render_chat(tok: Any, messages: list[dict[str, Any]], template: str | None, kwargs: dict[str, Any], bound: int,
                *, add_generation_prompt: bool, continue_final_message: bool) -> str:
    """The chat prompt's text (run it on a worker thread): `template` (the request's own, already allowed
    by check_request_template) else the tokenizer's, over messages and kwargs. A request's own template
    is stopped after TEMPLATE_TIME_LIMIT_S; text over `bound` characters is refused. 400s name the field."""
    param = "chat_template" if template is not None else "messages"
    if template is None and getattr(tok, "chat_template", None) is None:
        raise APIError(400, "the model's tokenizer has no chat template; pass `chat_template`", param="chat_template")
    limits = _template_limits(TEMPLATE_TIME_LIMIT_S, bound) if template is not None else contextlib.nullcontext()
    if template is not None:
        _products_at_render_time()
    try:
        with limits:
            text = tok.apply_chat_template(messages, tokenize=False, chat_template=template,
                                           add_generation_prompt=add_generation_prompt,
                                           continue_final_message=continue_final_message, **kwargs)
    except TemplateLimit as err:
        raise APIError(400, str(err), param="chat_template") from None
    except MemoryError:
        raise APIError(400, "the chat template needs more memory than the server has", param=param) from None
    except Exception as err:  # noqa: BLE001 - a template error is the body's fault
        raise APIError(400, f"the chat template failed on these messages: {err}", param=param) from None
    if not isinstance(text, str):
        raise APIError(400, "the chat template did not render text", param=param)
    if len(text) > bound:
        raise APIError(400, f"the rendered chat prompt has {len(text)} characters; at most {bound} "
                            f"({PROMPT_CHARS_PER_TOKEN} x max_model_len)", param=param)
    if lone_surrogate(text) is not None:
        raise APIError(400, "the rendered chat prompt holds a lone surrogate, which is not valid Unicode",
                       param="messages")
    return text


def _with_strs(tok: Any, ids: list[int], want: bool) -> tuple[list[int], list[str] | None]:
    return ids, (list(tok.convert_ids_to_tokens(ids)) if want else None)
