"""The OpenAI-compatible HTTP app (FastAPI) over one AsyncLLM.

Routes: POST /v1/completions, POST /v1/chat/completions (`stream: true` -> server-sent events,
`data: {...}` chunks then `data: [DONE]`), GET /v1/models, GET /health, GET /metrics (Prometheus),
POST /reset_prefix_cache (only with enable_reset_prefix_cache: `--enable-reset-prefix-cache`; 404 otherwise).

- usage.prompt_tokens_details.cached_tokens: prompt tokens served from the prefix cache (per
  prompt: its first choice's hit; summed over prompts).
- Tenants: `cache_salt` in the body is the request's prefix-cache namespace; requests with
  different salts (or one with and one without) never share KV pages. Requests without a salt
  share one namespace.
- `api_key`: every /v1/* route and /reset_prefix_cache need `Authorization: Bearer KEY` (401
  otherwise); /health stays open for probes, and /metrics for scrapers unless metrics_require_key.
- Request work off the event loop: tokenising, bad words and chat templates run on worker threads; a
  prompt (or the messages together) over 16 x max_model_len characters is refused before any of it; a
  request's own `chat_template` only with trust_request_chat_template (`--trust-request-chat-template`).
- Errors are OpenAI's object {"error": {"message", "type", "param", "code"}}: 400 for a bad body
  (param names the field) or a refused request (too long for the context or the pool), 401, 404
  for an unknown model, 500 when the engine step running the request failed (other requests go
  on), 503 when the engine loop is down. A client that disconnects aborts its requests.
"""
from __future__ import annotations

import asyncio
import contextlib
import gc
import secrets
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response

from radixkv.engine.llm import LLM

from .api_errors import APIError, validation_error
from .async_engine import AsyncLLM, EngineDeadError, EngineStepError
from .metrics import ServeMetrics
from .handlers import Handlers
from .protocol import ChatCompletionRequest, CompletionRequest
from .routes_extra import add_extra_routes
from .tool_calls import PARSERS

def create_app(llm: LLM | None, *, served_model_name: str | list[str] | None = None, api_key: str | None = None,
               log_interval_s: float | None = 10.0, engine: AsyncLLM | None = None,
               metrics: ServeMetrics | None = None, log_requests: bool = False,
               trust_request_chat_template: bool = False, metrics_require_key: bool = False,
               enable_reset_prefix_cache: bool = False, tool_call_parser: str = "hermes") -> FastAPI:
    """The app serving `engine` (an AsyncLLM, whose core may run in another process: `radixkv serve`),
    or `llm` through an in-process AsyncLLM it starts. An engine it started, or one given with its
    `metrics`, is shut down when the app's lifespan ends. app.state: engine, metrics, model_names, log_requests.
    log_requests: one info line a generation request (its id, prompt length and sampling params;
    vLLM's --enable-log-requests), off by default. trust_request_chat_template: accept a request's own
    `chat_template` (a template is code the server runs; vLLM's --trust-request-chat-template), refused by
    default. metrics_require_key: /metrics needs the API key too (default: open). enable_reset_prefix_cache:
    serve POST /reset_prefix_cache (any client could flush every tenant's cache; vLLM serves it only in its
    dev mode), off by default: 404. tool_call_parser: how tool_choice "auto" reads calls in the output
    (serve/tool_calls.py PARSERS; vLLM's --tool-call-parser)."""
    if tool_call_parser not in PARSERS:
        raise ValueError(f"tool_call_parser {tool_call_parser!r} is not one of {', '.join(PARSERS)}")
    names = ([served_model_name] if isinstance(served_model_name, str) else list(served_model_name or [])) \
        or ["radixkv"]
    own = engine is None or metrics is not None
    metrics = metrics if metrics is not None else ServeMetrics(names[0])
    if engine is None:
        if llm is None:
            raise ValueError("create_app needs an LLM or an AsyncLLM (engine=...)")
        engine = AsyncLLM(llm, stats=metrics, log_interval_s=log_interval_s)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # what start-up built (model, tokenizer, engine) leaves the collector's full passes: one over it took
        # 0.3-0.45 s on 2 cores, while the event loop (/health, every stream) waited (vLLM freezes it too)
        gc.collect()
        gc.freeze()
        yield
        gc.unfreeze()
        if own:
            await asyncio.get_running_loop().run_in_executor(None, engine.shutdown)

    app = FastAPI(title="radixkv", lifespan=lifespan)
    app.state.engine, app.state.metrics, app.state.model_names = engine, metrics, names
    app.state.log_requests = log_requests
    app.add_middleware(_Guard, api_key=api_key, metrics=metrics, metrics_require_key=metrics_require_key)
    api = Handlers(engine, names, metrics, log_requests, trust_request_chat_template, tool_call_parser)
    add_extra_routes(app, engine, names, api_key, trust_request_chat_template)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        return validation_error(exc.errors()).response()

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(EngineDeadError)
    async def _dead(request: Request, exc: EngineDeadError) -> JSONResponse:
        return APIError(503, str(exc), "ServiceUnavailableError").response()

    @app.exception_handler(EngineStepError)
    async def _step_error(request: Request, exc: EngineStepError) -> JSONResponse:
        return APIError(500, str(exc), "InternalServerError").response()

    @app.get("/health")
    async def health() -> Response:
        if not engine.is_running:
            return APIError(503, "the engine loop is not running", "ServiceUnavailableError").response()
        return Response(status_code=200)

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(metrics.render(), media_type=metrics.content_type)

    def card(name: str, created: int) -> dict[str, Any]:
        return {"id": name, "object": "model", "created": created, "owned_by": "radixkv", "root": names[0],
                "max_model_len": engine.inputs.limits.max_model_len}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        created = int(time.time())
        return {"object": "list", "data": [card(n, created) for n in names]}

    @app.get("/v1/models/{model:path}")
    async def model_card(model: str) -> dict[str, Any]:
        """OpenAI's retrieve-model: any served name (names may hold slashes, as hub ids do)."""
        return card(api.check_model(model), int(time.time()))

    if enable_reset_prefix_cache:
        @app.post("/reset_prefix_cache")
        async def reset_prefix_cache() -> dict[str, Any]:
            return {"success": await engine.reset_prefix_cache()}

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, raw: Request) -> Response:
        return await api.completions(body, raw)

    @app.post("/v1/chat/completions")
    async def chat(body: ChatCompletionRequest, raw: Request) -> Response:
        return await api.chat(body, raw)

    return app


class _Guard:
    """ASGI middleware: bearer-key check (/v1/*, /reset_prefix_cache; /metrics too with metrics_require_key)
    and HTTP request counts."""

    def __init__(self, app: Any, api_key: str | None, metrics: ServeMetrics, metrics_require_key: bool = False) -> None:
        self.app, self.api_key, self.metrics = app, api_key, metrics
        self.keyed = ("/reset_prefix_cache", "/metrics") if metrics_require_key else ("/reset_prefix_cache",)

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope.get("path", "")
        status = [500]

        async def counted_send(message: dict) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            if self.api_key is not None and (path.startswith("/v1/") or path in self.keyed):
                headers = dict(scope.get("headers") or [])
                auth = headers.get(b"authorization", b"").decode("latin-1")
                given = auth[7:] if auth.lower().startswith("bearer ") else ""
                if not secrets.compare_digest(given.encode(), self.api_key.encode()):
                    resp = APIError(401, "invalid or missing API key (Authorization: Bearer ...)",
                                    "AuthenticationError").response()
                    return await resp(scope, receive, counted_send)
            await self.app(scope, receive, counted_send)
        finally:
            known = path in ("/v1/completions", "/v1/chat/completions", "/v1/models", "/health", "/metrics",
                             "/reset_prefix_cache")
            self.metrics.count_http(path if known else "other", status[0])
