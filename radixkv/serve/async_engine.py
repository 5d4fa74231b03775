"""AsyncLLM: one background thread owns an LLM and steps it; any thread or coroutine adds requests.

Lifecycle of a request:
1. `await add_request(prompt, params, ...)` puts it in the inbox; the loop thread takes it
   between two steps and queues it in the scheduler (`LLM.add_requests` validates it: a bad
   prompt or one that cannot fit the context or the pool raises here, in the caller, and nothing
   is queued). It returns a `RequestStream`.
2. Every step batches all running requests (continuous batching: a request that arrives joins the
   next step, so concurrent chats share steps and hit each other's prefixes).
3. After each step the loop pushes each request's new tokens and text to its stream (`async for
   out in stream`: `StreamOutput`s, vLLM's shape); the last one has `finished=True`.
4. `abort(request_id)` (or the consumer leaving the stream: a client disconnect) withdraws the
   request before the next step: its pages are released at once (full blocks stay cached).

A step that raises (a kernel, an out-of-memory) is failure-atomic in the LLM. The loop fails, with
`EngineStepError` on their streams: the requests admitted in that step when there were any (a
new request is the likely cause); else, when admission itself raised (it rolls back to waiting),
the head of the waiting queue, one per failed step, so running requests go on; else every running
request. Consecutive failures back off (up to a second); each distinct error is logged once.

A caller whose event loop closed (a worker thread's `asyncio.run` that returned with its stream
unread) cannot be told anything: its request is abandoned (withdrawn, pages released).

Thread model: only the loop thread touches the LLM; `call(fn)` runs `fn(llm)` there between
steps (reset_prefix_cache, a consistent look at the pool in tests).
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import itertools
import logging
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from radixkv.request import FinishReason, Request
from radixkv.scheduler.scheduler import Scheduler

from .detokenize import TextStream
from .loglines import LogWindow
from .streams import EngineDeadError, EngineStepError, RequestStream, StreamOutput, StreamStats

__all__ = ["AsyncLLM", "EngineDeadError", "EngineStepError", "RequestStream", "StreamOutput", "StreamStats"]

log = logging.getLogger("radixkv.serve")


@dataclass(eq=False)
class _Pending:
    """What the loop needs to serve one request, and how to reach its consumer."""

    request_id: str
    prompt: Any
    params: Any
    namespace: str | None
    text: TextStream
    loop: asyncio.AbstractEventLoop
    outbox: asyncio.Queue
    accepted: asyncio.Future
    stats: StreamStats
    req: Request | None = None
    prompt_ids: list[int] = field(default_factory=list)  # one copy, shared by every output
    sent_tokens: int = 0
    done: bool = False
    aborted: bool = False


class AsyncLLM:
    """Serves one `radixkv.LLM` to many concurrent callers (see the module docstring).

    stats: optional listener (serve.metrics.ServeMetrics) told about steps and finished requests.
    log_interval_s: period of the throughput log line (None: no log line).
    """

    def __init__(self, llm: Any, *, stats: Any = None, log_interval_s: float | None = 10.0) -> None:
        self.llm = llm
        self.stats = stats
        self.log_interval_s = log_interval_s
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._wake = threading.Event()
        self._live: dict[str, _Pending] = {}  # request_id -> pending/running (loop thread only)
        self._ids = itertools.count()
        self._stop = False
        self._dead: BaseException | None = None
        self._last_ok: set[str] = set()  # requests running after the last successful step
        self._lock = threading.Lock()  # _post vs the loop's last drain
        self._closed = False  # the loop drained for the last time: nothing posted is read now
        self._failures = 0  # consecutive failed steps (back-off)
        self._last_error: str | None = None  # the last failure logged
        self._window = LogWindow(time.monotonic())
        self._thread = threading.Thread(target=self._run, name="radixkv-engine", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ callers (any thread)

    @property
    def is_running(self) -> bool:
        return self._thread.is_alive() and not self._stop

    def _check_alive(self) -> None:
        if not self.is_running:
            raise EngineDeadError(f"the engine loop is not running{f': {self._dead!r}' if self._dead else ''}")

    async def add_request(self, prompt: Any, params: Any, request_id: str | None = None,
                          namespace: str | None = None, stop: Sequence[str] = (),
                          include_stop_str_in_output: bool = False,
                          skip_special_tokens: bool = True) -> RequestStream:
        """Queue one request; returns its stream once the engine took it. Raises ValueError /
        TypeError (from LLM.add_requests) when the request is refused; nothing is queued then.

        prompt: text, token ids, or a {"prompt": ...} / {"prompt_token_ids": ...} dict.
        namespace: the prefix-cache namespace (a tenant's cache_salt): requests in different
        namespaces never share pages. stop: stop strings (the text ends before the first one)."""
        self._check_alive()
        n = getattr(params, "n", 1)
        if n != 1:  # LLM.add_requests would queue n requests behind one stream
            raise ValueError(f"AsyncLLM streams one completion per request, got n={n}: add n requests "
                             f"(with a seed, seed + j for the j-th) and read each stream")
        loop = asyncio.get_running_loop()
        rid = request_id if request_id is not None else f"req-{next(self._ids)}"
        # the params' stop strings end the request in the LLM; the text stream cuts them too
        stops = [*stop, *(getattr(params, "stop", None) or ())]
        text = TextStream(self.llm.tokenizer, stops,
                          include_stop_str_in_output or getattr(params, "include_stop_str_in_output", False),
                          skip_special_tokens and getattr(params, "skip_special_tokens", True),
                          getattr(params, "min_tokens", 0))
        p = _Pending(rid, prompt, params, namespace, text, loop, asyncio.Queue(), loop.create_future(),
                     StreamStats(time.monotonic()))
        self._post(("add", p))
        try:
            await p.accepted  # raises the refusal
        except asyncio.CancelledError:  # the caller left before the engine took it
            self.abort(rid)
            raise
        return RequestStream(self, p)

    async def generate(self, prompt: Any, params: Any, request_id: str | None = None,
                       **options: Any) -> AsyncIterator[StreamOutput]:
        """vLLM's shape: an async generator of one request's outputs (options: add_request's)."""
        stream = await self.add_request(prompt, params, request_id, **options)
        async for out in stream:
            yield out

    def abort(self, request_id: str) -> None:
        """Withdraw a request (thread-safe, returns at once); the loop releases its pages before
        its next step. Unknown or finished ids are ignored."""
        if self.is_running:
            try:
                self._post(("abort", request_id))
            except EngineDeadError:
                pass  # the loop ended: every request it held ended with it

    def call(self, fn: Callable[[Any], Any]) -> concurrent.futures.Future:
        """Run fn(llm) on the loop thread between steps; a Future of its result."""
        fut: concurrent.futures.Future = concurrent.futures.Future()
        self._check_alive()
        self._post(("call", fn, fut))
        return fut

    async def run(self, fn: Callable[[Any], Any]) -> Any:
        """`call` for coroutines: await fn(llm)'s result."""
        return await asyncio.wrap_future(self.call(fn))

    async def reset_prefix_cache(self) -> bool:
        return await self.run(lambda llm: llm.reset_prefix_cache())

    def shutdown(self, timeout: float = 10.0) -> None:
        """Stop the loop: unfinished requests end with EngineDeadError on their streams."""
        self._stop = True
        self._wake.set()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout)

    def _post(self, item: tuple) -> None:
        """Hand item to the loop; EngineDeadError once the loop drained for the last time (so
        nothing posted is left unread: a caller racing `shutdown` never waits forever)."""
        with self._lock:
            if self._closed:
                raise EngineDeadError(f"the engine loop is not running{f': {self._dead!r}' if self._dead else ''}")
            self._inbox.put(item)
        self._wake.set()

    # ------------------------------------------------------------------ the loop thread

    def _run(self) -> None:
        try:
            while not self._stop:
                self._drain()
                if self._stop:
                    break
                if not self.llm.has_work():
                    self._maybe_log()
                    self._wake.wait(timeout=self.log_interval_s or 1.0)
                    self._wake.clear()
                    continue
                self._step()
                self._maybe_log()
        except BaseException as err:  # noqa: BLE001 - the loop must report, not vanish
            self._dead = err
            log.exception("engine loop stopped")
        finally:
            self._stop = True
            with self._lock:
                self._closed = True
            self._drain()
            for p in list(self._live.values()):
                self._fail(p, EngineDeadError("the engine loop stopped"), withdraw=False)

    def _drain(self) -> None:
        """Apply everything callers posted: new requests, aborts, calls."""
        while True:
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return
            kind = item[0]
            if kind == "add":
                self._add(item[1])
            elif kind == "abort":
                p = self._live.get(item[1])
                if p is not None:
                    self._withdraw(p)
                    self._finish(p, FinishReason.ABORT.value)
            else:
                fn, fut = item[1], item[2]
                if fut.set_running_or_notify_cancel():
                    try:
                        fut.set_result(fn(self.llm))
                    except BaseException as err:  # noqa: BLE001 - handed to the caller
                        fut.set_exception(err)

    def _add(self, p: _Pending) -> None:
        if self._stop:
            self._send(p, _settle, p.accepted, EngineDeadError("the engine is shutting down"))
            return
        if p.request_id in self._live:
            self._send(p, _settle, p.accepted, ValueError(f"request id {p.request_id!r} is already running"))
            return
        try:
            params = p.params
            if p.namespace is not None:  # SamplingParams.cache_salt: the request's prefix-cache namespace
                params = dataclasses.replace(params, cache_salt=p.namespace)
            reqs = self.llm.add_requests([p.prompt], [params])
        except Exception as err:  # noqa: BLE001 - a refusal goes back to its caller
            self._send(p, _settle, p.accepted, err)
            return
        p.req = reqs[0]
        p.prompt_ids = list(p.req.prompt)
        self._live[p.request_id] = p
        for extra in reqs[1:]:  # cannot happen (add_request refuses n != 1): never leave one unobserved
            self.llm.scheduler.abort(extra.rid)
        self._send(p, _settle, p.accepted, None)

    def _send(self, p: _Pending, fn: Callable[..., Any], *args: Any) -> bool:
        """Run fn(*args) on p's event loop. A closed loop (its caller is gone) abandons p:
        withdrawn, pages released. False then."""
        try:
            p.loop.call_soon_threadsafe(fn, *args)
            return True
        except RuntimeError:  # 'Event loop is closed'
            if not p.done:
                log.debug("request %s abandoned: its event loop is closed", p.request_id)
                self._withdraw(p)
                self._done(p, FinishReason.ABORT.value)
            return False

    def _step(self) -> None:
        llm = self.llm
        before = (llm.scheduler.metrics.prompt_tokens, llm.scheduler.metrics.hit_tokens,
                  llm.scheduler.metrics.preemptions)
        try:
            llm.step()
        except Exception as err:  # noqa: BLE001 - the step was undone; fail its suspects
            if getattr(llm, "dead", False):  # nothing more can run (a tensor-parallel rank failed): end the loop, /health says so
                raise
            self._step_failed(err)
            return
        self._failures = 0
        self._last_ok = {p.request_id for p in self._live.values()
                         if p.req is not None and p.req.status.value == "running"}
        generated = 0
        for p in list(self._live.values()):
            generated += self._publish(p)
        m = llm.scheduler.metrics
        self._window.add(m.prompt_tokens - before[0], generated)
        if self.stats is not None:
            self.stats.on_step(llm, prompt_tokens=m.prompt_tokens - before[0], hit_tokens=m.hit_tokens - before[1],
                               generation_tokens=generated, preemptions=m.preemptions - before[2])

    def _step_failed(self, err: Exception) -> None:
        """Fail the failed step's suspects (the module docstring says which), back off."""
        running = [p for p in self._live.values() if p.req is not None and p.req.status.value == "running"]
        new = [p for p in running if p.request_id not in self._last_ok]
        if new:
            victims = new
        elif _raised_in_admission(err):
            by_rid = {p.req.rid: p for p in self._live.values() if p.req is not None}
            heads = [by_rid[e.req.rid] for e in self.llm.scheduler.waiting if e.req.rid in by_rid]
            victims = heads[:1]
        else:
            victims = running
        key = repr(err)
        if key != self._last_error:
            self._last_error = key
            log.error("step failed (%s); failing %d request(s): %s", key, len(victims),
                      ", ".join(p.request_id for p in victims), exc_info=err)
        for p in victims:
            self._fail(p, EngineStepError(f"the engine step running request {p.request_id!r} failed: {err!r}"))
        if self.stats is not None:
            self.stats.on_step(self.llm, prompt_tokens=0, hit_tokens=0, generation_tokens=0, preemptions=0)
        self._failures += 1
        if self._failures > 1 or not victims:  # failing again: do not spin (an abort or add wakes it)
            self._wake.wait(min(1.0, 0.001 * 2 ** min(self._failures, 10)))
            self._wake.clear()

    def _publish(self, p: _Pending) -> int:
        """Push p's new tokens/text to its consumer; returns how many tokens were new."""
        req = p.req
        new = req.output[p.sent_tokens:]
        if not new and not req.finished:
            return 0
        now = time.monotonic()
        if p.stats.first_token is None and req.output:
            p.stats.first_token = now
        p.sent_tokens = len(req.output)
        delta = p.text.update(req.output, req.finished)
        reason = req.finish_reason.value if req.finished else None
        if p.text.stopped:  # a stop string: end it here (pages released now)
            self._withdraw(p)
            reason = FinishReason.STOP.value
        self._emit(p, delta, list(new), reason)
        return len(new)

    def _emit(self, p: _Pending, delta: str, new: list[int], reason: str | None) -> None:
        req = p.req
        all_lps = getattr(req.sampling, "logprobs", None)
        lps = None if all_lps is None else list(all_lps[: len(req.output)])
        out = StreamOutput(p.request_id, delta, new, p.text.text, list(req.output), p.prompt_ids,
                           req.cached_tokens, reason is not None, reason, self._stop_reason(p, reason), lps)
        if self._send(p, p.outbox.put_nowait, out) and reason is not None:
            self._done(p, reason)

    def _stop_reason(self, p: _Pending, reason: str | None) -> int | str | None:
        """The stop string or stop token id that ended p (vLLM's stop_reason; None for EOS)."""
        if reason != FinishReason.STOP.value:
            return None
        if p.text.stop_str is not None:
            return p.text.stop_str
        out = p.req.output
        return out[-1] if out and out[-1] in getattr(p.params, "stop_token_ids", ()) else None

    def _finish(self, p: _Pending, reason: str) -> None:
        """End p now with `reason`, releasing whatever text was held back."""
        delta = p.text.update(p.req.output, True) if p.req is not None else ""
        self._emit(p, delta, p.req.output[p.sent_tokens:], reason)

    def _withdraw(self, p: _Pending) -> None:
        """Take p's request out of the scheduler (pages released now)."""
        if p.req is not None and not p.req.finished:
            self.llm.scheduler.abort(p.req.rid)
        p.aborted = True

    def _fail(self, p: _Pending, err: BaseException, withdraw: bool = True) -> None:
        if withdraw:
            self._withdraw(p)
        if self._send(p, p.outbox.put_nowait, err):
            self._done(p, "error")

    def _done(self, p: _Pending, reason: str) -> None:
        p.done = True
        p.stats.finished = time.monotonic()
        self._live.pop(p.request_id, None)
        if self.stats is not None and p.req is not None:
            self.stats.on_finish(p.stats, reason, len(p.req.output))

    def _maybe_log(self) -> None:
        if self.log_interval_s is None:
            return
        now = time.monotonic()
        line = self._window.roll(now, self.log_interval_s, self.llm)
        if line:
            log.info(line)


def _raised_in_admission(err: BaseException) -> bool:
    """Did err come out of the scheduler's admission (which puts its requests back to waiting)?"""
    tb = err.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code is _ADMIT_CODE:
            return True
        tb = tb.tb_next
    return False


_ADMIT_CODE = Scheduler._admit.__code__


def _settle(fut: asyncio.Future, err: BaseException | None) -> None:
    if fut.done():
        return
    if err is None:
        fut.set_result(None)
    else:
        fut.set_exception(err)
