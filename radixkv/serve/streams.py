"""What an AsyncLLM caller holds: a request's stream of StreamOutputs, and the engine's errors."""
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from radixkv.engine.core import EngineStats
from radixkv.engine.outputs import RequestState
from radixkv.prompt_logprobs import LogprobsBlock
from radixkv.request import PositionLogprobs

from . import wire


class EngineStepError(RuntimeError):
    """The step that ran this request raised; the request was withdrawn (its pages released)."""


class EngineDeadError(RuntimeError):
    """The engine loop is not running (shut down, or stopped by an unrecoverable error)."""


class CoreEvents(Protocol):
    """What a core client (inproc.InprocCore, core_proc.ProcessCore) tells its AsyncLLM, from its thread."""

    def on_step(self, states: Sequence[RequestState] | None, failed: Sequence[wire.Failed],
                stats: EngineStats) -> None:
        """A step's updated requests (None: any live request may have changed) and the ones it failed."""

    def on_result(self, result: wire.Result) -> None: ...

    def on_idle(self, stats: EngineStats) -> None: ...

    def on_dead(self, reason: str) -> None:
        """The core stopped for good: every open stream ends with EngineDeadError naming `reason`."""


@dataclass(frozen=True)
class StreamOutput:
    """One update of a request: the delta since the previous update and the totals so far.

    finish_reason: None while running, else "stop" (a stop token or stop string), "length" or
    "abort". num_cached_tokens: prompt tokens served from the prefix cache (known from the
    first token on). stop_reason: the stop string or stop token id that ended it (None for EOS,
    length, abort). logprobs: with SamplingParams.logprobs, one PositionLogprobs per token of
    token_ids (all so far; else None). prompt_logprobs: with SamplingParams.prompt_logprobs, the scores
    of every prompt token after the first (from the first token on; else None).
    """

    request_id: str
    delta_text: str
    delta_token_ids: list[int]
    text: str
    token_ids: list[int]
    prompt_token_ids: list[int]
    num_cached_tokens: int
    finished: bool
    finish_reason: str | None
    stop_reason: int | str | None = None
    logprobs: list[PositionLogprobs] | None = None
    prompt_logprobs: LogprobsBlock | None = None


@dataclass
class StreamStats:
    """Timestamps of one request (time.monotonic seconds), for latency metrics."""

    arrival: float
    first_token: float | None = None
    finished: float | None = None


class RequestStream:
    """The async stream of one request's StreamOutputs. Leaving it early (break, cancellation,
    a client disconnect) aborts the request."""

    def __init__(self, engine: Any, pending: Any) -> None:
        self._engine = engine
        self._p = pending
        self.request_id = pending.request_id
        self.prompt_token_ids: list[int] = pending.prompt_ids

    def __aiter__(self) -> AsyncIterator[StreamOutput]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[StreamOutput]:
        finished = False
        try:
            while True:
                item = await self._p.outbox.get()
                if isinstance(item, BaseException):
                    finished = True
                    raise item
                finished = item.finished
                yield item
                if finished:
                    return
        finally:
            if not finished:
                self._engine.abort(self.request_id)

    async def final(self) -> StreamOutput:
        """Wait for the request to finish; its last output (the whole text and token ids)."""
        last = None
        async for out in self:
            last = out
        assert last is not None
        return last


def merge_streams(streams: list[RequestStream]) -> tuple[AsyncIterator[tuple[int, Any]], list[asyncio.Task]]:
    """(choice index, StreamOutput or the error that ended it) of every stream as they arrive, until
    each has ended; and the tasks feeding it (none for one stream, read directly: the common case)."""

    async def one(s: RequestStream) -> AsyncIterator[tuple[int, Any]]:
        try:
            async for out in s:
                yield 0, out
        except Exception as err:  # noqa: BLE001 - reported in the stream
            yield 0, err

    if len(streams) == 1:
        return one(streams[0]), []
    merged: asyncio.Queue = asyncio.Queue()

    async def pump(k: int, s: RequestStream) -> None:
        try:
            async for out in s:
                await merged.put((k, out))
        except BaseException as err:  # noqa: BLE001 - reported in the stream
            await merged.put((k, err))
            if isinstance(err, asyncio.CancelledError):
                raise

    async def drain() -> AsyncIterator[tuple[int, Any]]:
        pending = len(streams)
        while pending:
            k, out = await merged.get()
            pending -= isinstance(out, BaseException) or out.finished
            yield k, out

    return drain(), [asyncio.create_task(pump(k, s)) for k, s in enumerate(streams)]
