"""AsyncLLM: the server's front end over an engine core; any coroutine or thread adds requests.

The core runs either in a process of its own (`AsyncLLM.start(model, **engine_kwargs)`, what
`radixkv serve` does: core_proc.py) or on a thread beside the caller (`AsyncLLM(llm)`: inproc.py).
Either way this side validates requests (InputProcessor), and turns each step's tokens into text
deltas and stop strings (OutputProcessor) before handing them to the requests' streams.

Lifecycle of a request:
1. `add(request)` (validated: `inputs.process(...)` or `add_request(prompt, params)`, which
   validates first and raises ValueError / TypeError naming the problem, queuing nothing) sends it
   to the core and returns its `RequestStream`.
2. Every step batches all running requests (continuous batching); the core sends one message a
   step with every request's new tokens.
3. Each request's new tokens and text go to its stream (`async for out in stream`: StreamOutputs,
   vLLM's shape); the last one has `finished=True`. All of a step's outputs for one event loop are
   handed over in one call.
4. `abort(request_id)` (or the consumer leaving the stream: a client disconnect) withdraws it in
   the core before its next step: its pages are released (full blocks stay cached).

A failed step fails its suspect requests (EngineStepError on their streams); the rest go on. A
core that stops (its process died or hung, or its thread raised) ends every open stream with
EngineDeadError, and `is_running` turns False (/health: 503). A caller whose event loop closed
cannot be told anything: its request is withdrawn.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from radixkv.engine.core import EngineStats
from radixkv.engine.inputs import Prompt
from radixkv.engine.llm import LLM
from radixkv.engine.outputs import RequestState
from radixkv.request import FinishReason, Request
from radixkv.sampling_params import SamplingParams

from . import wire
from .core_proc import ProcessCore
from .inproc import InprocCore
from .loglines import LogWindow
from .streams import EngineDeadError, EngineStepError, RequestStream, StreamOutput, StreamStats

__all__ = ["AsyncLLM", "EngineDeadError", "EngineStepError", "RequestStream", "StreamOutput", "StreamStats"]

log = logging.getLogger("radixkv.serve")


@dataclass(eq=False)
class _Pending:
    """One request's stream: how to reach its consumer and what it was sent."""

    request_id: str
    state: RequestState
    loop: asyncio.AbstractEventLoop
    outbox: asyncio.Queue
    stats: StreamStats
    prompt_ids: list[int]
    sent_tokens: int = 0
    done: bool = False


class AsyncLLM:
    """Serves one engine core to many concurrent callers (see the module docstring).

    core: an LLM (its core then runs on a thread here) or a started core client (ProcessCore).
    stats: optional listener (serve.metrics.ServeMetrics) told about steps and finished requests.
    log_interval_s: period of the throughput log line (None: no log line).
    """

    def __init__(self, core: LLM | InprocCore | ProcessCore, *, stats: Any = None,
                 log_interval_s: float | None = 10.0) -> None:
        self.core = InprocCore(core) if isinstance(core, LLM) else core
        self.inputs, self.tokenizer = self.core.inputs, self.core.tokenizer
        self.stats, self.log_interval_s = stats, log_interval_s
        self._live: dict[int, _Pending] = {}  # core rid -> stream
        self._ids: dict[str, int] = {}  # request_id -> core rid
        self._lock = threading.Lock()
        self._calls: dict[int, concurrent.futures.Future] = {}
        self._call_ids = itertools.count()
        self._auto_ids = itertools.count()
        self._dead: str | None = None
        self._window = LogWindow(time.monotonic())
        self._prompt_tokens = 0  # the core's prompt-token count at the last step (the log line's window)
        self.core.start(self)

    @classmethod
    def start(cls, model: Any, *, stats: Any = None, log_interval_s: float | None = 10.0,
              hang_timeout_s: float = 120.0, log_level: str = "info", **engine_kwargs: Any) -> AsyncLLM:
        """Start an engine-core process for `model` (LLM(...)'s sources and keyword arguments) and serve it."""
        client = ProcessCore(model, engine_kwargs, hang_timeout_s=hang_timeout_s, log_level=log_level)
        return cls(client, stats=stats, log_interval_s=log_interval_s)

    @property
    def llm(self) -> LLM:
        """The in-process LLM (AsyncLLM(llm) only)."""
        if not isinstance(self.core, InprocCore):
            raise AttributeError("this AsyncLLM's core runs in another process: it has no LLM here")
        return self.core.llm

    @property
    def is_running(self) -> bool:
        return self._dead is None and self.core.is_running

    @property
    def engine_stats(self) -> EngineStats:
        """The core's counters after its latest step."""
        return self.core.stats()

    def now(self) -> float:
        """Seconds on the core's clock (arrival times)."""
        return self.core.now()

    def _check_alive(self) -> None:
        if not self.is_running:
            raise EngineDeadError(f"the engine is not running{f': {self._dead}' if self._dead else ''}")

    # ------------------------------------------------------------------ callers (the event loop)

    async def add_request(self, prompt: Prompt, params: SamplingParams, request_id: str | None = None) -> RequestStream:
        """Validate one prompt and queue it; ValueError / TypeError (nothing queued) when it is refused."""
        if params.n != 1:
            raise ValueError(f"AsyncLLM streams one completion per request, got n={params.n}: add n requests "
                             f"(with a seed, seed + j for the j-th) and read each stream")
        (req,) = self.inputs.process([prompt], [params], self.now())
        return self.add(req, request_id)

    def add(self, req: Request, request_id: str | None = None) -> RequestStream:
        """Queue a validated request (inputs.process / inputs.request); its stream. Must run on the
        event loop that will read the stream."""
        self._check_alive()
        loop = asyncio.get_running_loop()
        rid = request_id if request_id is not None else f"req-{next(self._auto_ids)}"
        with self._lock:
            if rid in self._ids:
                raise ValueError(f"request id {rid!r} is already running")
            state = self.core.outputs.add(req, rid, stream=True)
            p = _Pending(rid, state, loop, asyncio.Queue(), StreamStats(time.monotonic()), list(req.prompt))
            self._live[req.rid], self._ids[rid] = p, req.rid
        try:
            self.core.send(wire.Add([req]))
        except BaseException:
            self._forget(p)
            raise
        return RequestStream(self, p)

    async def generate(self, prompt: Prompt, params: SamplingParams, request_id: str | None = None
                       ) -> AsyncIterator[StreamOutput]:
        """vLLM's shape: an async generator of one request's outputs."""
        stream = await self.add_request(prompt, params, request_id)
        async for out in stream:
            yield out

    def abort(self, request_id: str) -> None:
        """Withdraw a request (thread-safe, returns at once); the core releases its pages before its
        next step and the stream ends with finish_reason "abort". Unknown or finished ids are ignored."""
        with self._lock:
            rid = self._ids.get(request_id)
            p = self._live.get(rid) if rid is not None else None
        if p is None or p.done:
            return
        try:
            self.core.send(wire.Abort([rid]))
        except EngineDeadError:
            return  # the core is gone: on_dead ends every stream
        self.core.outputs.end(rid, FinishReason.ABORT)
        self._publish([p], FinishReason.ABORT.value)

    def call(self, fn: Callable[[LLM], Any]) -> concurrent.futures.Future:
        """Run fn(llm) on the engine thread between steps (AsyncLLM(llm) only); a Future of its result."""
        if not isinstance(self.core, InprocCore):
            raise RuntimeError("call(fn) needs the in-process core (AsyncLLM(llm))")
        self._check_alive()
        return self.core.call(fn)

    async def reset_prefix_cache(self) -> bool:
        fut: concurrent.futures.Future = concurrent.futures.Future()
        call_id = next(self._call_ids)
        self._calls[call_id] = fut
        self.core.send(wire.Call(call_id, "reset_prefix_cache"))
        return bool(await asyncio.wrap_future(fut))

    def shutdown(self, timeout: float = 10.0) -> None:
        """Stop the core: unfinished requests end with EngineDeadError on their streams."""
        self.core.shutdown(timeout)

    # ------------------------------------------------------------------ the core client's thread

    def on_step(self, states: Sequence[RequestState] | None, failed: Sequence[wire.Failed],
                stats: EngineStats) -> None:
        with self._lock:
            pending = (list(self._live.values()) if states is None
                       else [p for p in map(self._live.get, (s.rid for s in states)) if p is not None])
            victims = [(self._live[rid], f.error) for f in failed for rid in f.rids if rid in self._live]
        generated = self._publish(pending)
        for p, error in victims:
            self.core.outputs.end(p.state.rid, FinishReason.ABORT)
            self._end(p, EngineStepError(f"the engine step running request {p.request_id!r} failed: {error}"))
        self._window.add(stats.prompt_tokens - self._prompt_tokens, generated)
        self._prompt_tokens = stats.prompt_tokens
        if self.stats is not None:
            self.stats.on_step(stats, generated)
        self._maybe_log(stats)

    def on_idle(self, stats: EngineStats) -> None:
        self._maybe_log(stats)

    def on_result(self, result: wire.Result) -> None:
        fut = self._calls.pop(result.call_id, None)
        if fut is not None:
            if result.error is None:
                fut.set_result(result.value)
            else:
                fut.set_exception(RuntimeError(result.error))

    def on_dead(self, reason: str) -> None:
        self._dead = reason
        with self._lock:
            pending = list(self._live.values())
        for p in pending:
            self._end(p, EngineDeadError(f"the engine core stopped: {reason}"))
        for fut in self._calls.values():
            fut.set_exception(EngineDeadError(reason))
        self._calls.clear()

    def _publish(self, pending: Sequence[_Pending], force_reason: str | None = None) -> int:
        """Hand each request's news to its stream, one call per event loop; the tokens handed over."""
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Queue, StreamOutput]]] = {}
        ended: list[_Pending] = []
        generated = 0
        now = time.monotonic()
        for p in pending:
            s = p.state
            new = s.output[p.sent_tokens:]
            reason = force_reason or s.finish_reason
            if p.done or (not new and reason is None and not s.unsent):
                continue
            generated += len(new)
            if p.stats.first_token is None and s.output:
                p.stats.first_token = now
            p.sent_tokens = len(s.output)
            lps = None if s.logprobs is None else list(s.logprobs[: len(s.output)])
            out = StreamOutput(p.request_id, s.take_text(), list(new), s.text.text if s.text else "",
                               list(s.output), p.prompt_ids, s.cached_tokens, reason is not None, reason,
                               s.stop_reason if reason == FinishReason.STOP.value else None, lps,
                               s.prompt_logprobs)
            by_loop.setdefault(p.loop, []).append((p.outbox, out))
            if reason is not None:
                ended.append(p)
        for loop, items in by_loop.items():
            try:
                loop.call_soon_threadsafe(_deliver, items)
            except RuntimeError:  # 'Event loop is closed': its callers are gone
                for p in pending:
                    if p.loop is loop and not p.done:
                        self._abandon(p)
        for p in ended:
            self._done(p, p.state.finish_reason or FinishReason.ABORT.value)
        return generated

    def _end(self, p: _Pending, err: BaseException) -> None:
        try:
            p.loop.call_soon_threadsafe(_deliver, [(p.outbox, err)])
        except RuntimeError:
            pass
        self._done(p, "error")

    def _abandon(self, p: _Pending) -> None:
        log.debug("request %s abandoned: its event loop is closed", p.request_id)
        try:
            self.core.send(wire.Abort([p.state.rid]))
        except EngineDeadError:
            pass
        self.core.outputs.end(p.state.rid, FinishReason.ABORT)
        self._done(p, FinishReason.ABORT.value)

    def _done(self, p: _Pending, reason: str) -> None:
        if p.done:
            return
        p.done = True
        p.stats.finished = time.monotonic()
        self._forget(p)
        if self.stats is not None:
            self.stats.on_finish(p.stats, reason, len(p.state.output))

    def _forget(self, p: _Pending) -> None:
        with self._lock:
            self._live.pop(p.state.rid, None)
            self._ids.pop(p.request_id, None)

    def _maybe_log(self, stats: EngineStats) -> None:
        if self.log_interval_s is None:
            return
        line = self._window.roll(time.monotonic(), self.log_interval_s, stats)
        if line:
            log.info(line)


def _deliver(items: list[tuple[asyncio.Queue, StreamOutput | BaseException]]) -> None:
    for q, out in items:
        q.put_nowait(out)
