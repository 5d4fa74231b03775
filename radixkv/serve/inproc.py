"""InprocCore: the engine core on a thread of the caller's process (an LLM built in Python).

`AsyncLLM(llm)` uses it: tests, notebooks, and programs that build their own LLM. One background
thread owns the LLM: it applies the messages callers posted (the same wire messages the core
process takes, as objects), steps the core (core_loop.CoreLoop), applies the step's outputs
through the LLM's OutputProcessor (stop strings end their requests at once) and hands the
updated requests to the AsyncLLM. `radixkv serve` runs the core in a process of its own instead
(core_proc.py): the API process's event loop then shares no interpreter lock with the model.

`call(fn)` runs fn(llm) on the thread between steps (reset, a consistent look at the pool in tests).
"""
from __future__ import annotations

import concurrent.futures
import logging
import queue
import threading
from collections.abc import Callable
from typing import Any

from radixkv.config import ENGINE_STEP_BUDGET
from radixkv.engine.core import EngineStats
from radixkv.engine.llm import LLM

from . import wire
from .core_loop import CoreLoop
from .streams import CoreEvents, EngineDeadError

log = logging.getLogger("radixkv.serve")


class InprocCore:
    """The core of `llm` driven by a background thread (see the module docstring)."""

    def __init__(self, llm: LLM) -> None:
        cfg = llm.config
        if cfg.auto_budget and cfg.usage == "offline" and cfg.scheduler.max_batch_tokens > ENGINE_STEP_BUDGET:
            log.warning("serving an LLM built for offline throughput: %d tokens a step lets a long prompt stall "
                        "every decode row; LLM(..., usage=\"serve\") takes the server's %d (config.engine_step_budget)",
                        cfg.scheduler.max_batch_tokens, ENGINE_STEP_BUDGET)
        self.llm = llm
        self.inputs, self.outputs, self.tokenizer = llm.inputs, llm.outputs, llm.tokenizer
        self.error: str | None = None
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._wake = threading.Event()
        self._lock = threading.Lock()  # send() vs the loop's last drain
        self._closed = False
        self._events: CoreEvents | None = None
        self._loop = CoreLoop(llm.core, self._deliver)
        self._thread = threading.Thread(target=self._run, name="radixkv-engine", daemon=True)

    def now(self) -> float:
        return self.llm.core.now()

    def stats(self) -> EngineStats:
        return self.llm.core.stats()

    def start(self, events: CoreEvents) -> None:
        self._events = events
        self._thread.start()

    @property
    def is_running(self) -> bool:
        return self._thread.is_alive() and not self._loop.stopping

    def send(self, msg: wire.ToCore | tuple[Callable[[Any], Any], concurrent.futures.Future]) -> None:
        """Hand a message to the thread; EngineDeadError once it drained for the last time."""
        with self._lock:
            if self._closed:
                raise EngineDeadError(f"the engine loop is not running{f': {self.error}' if self.error else ''}")
            self._inbox.put(msg)
        self._wake.set()

    def call(self, fn: Callable[[LLM], Any]) -> concurrent.futures.Future:
        """Run fn(llm) on the engine thread between steps; a Future of its result."""
        fut: concurrent.futures.Future = concurrent.futures.Future()
        self.send((fn, fut))
        return fut

    def shutdown(self, timeout: float = 10.0) -> None:
        self._loop.stopping = True
        self._wake.set()
        if threading.current_thread() is not self._thread and self._thread.is_alive():
            self._thread.join(timeout)

    # ------------------------------------------------------------------ the engine thread

    def _deliver(self, msg: wire.FromCore) -> None:
        """A FromCore message from the loop: outputs applied here, updated requests to the AsyncLLM."""
        assert self._events is not None
        if isinstance(msg, wire.Step):
            updates = self.llm.process_outputs(msg.deltas)
            self._events.on_step([u.state for u in updates], msg.failed, msg.stats)
        elif isinstance(msg, wire.Result):
            self._events.on_result(msg)
        else:
            self._events.on_idle(msg.stats)

    def _run(self) -> None:
        core = self.llm.core
        try:
            with self.llm.owned_by_this_thread():  # another thread's generate() is refused, the loop goes on
                while not self._loop.stopping:
                    self._drain()
                    if self._loop.stopping:
                        break
                    if not core.has_work():
                        self._wake.wait(timeout=1.0)
                        self._wake.clear()
                        self._events.on_idle(core.stats())
                        continue
                    self._loop.step()
        except BaseException as err:  # noqa: BLE001 - the loop must report, not vanish
            self.error = repr(err)
            log.exception("engine loop stopped")
        finally:
            self._loop.stopping = True
            with self._lock:
                self._closed = True
            self._drain()
            self._events.on_dead(self.error or "the engine loop stopped")

    def _drain(self) -> None:
        while True:
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return
            if isinstance(item, tuple):
                fn, fut = item
                if fut.set_running_or_notify_cancel():
                    try:
                        fut.set_result(fn(self.llm))
                    except BaseException as err:  # noqa: BLE001 - handed to the caller
                        fut.set_exception(err)
                self._events.on_step(None, [], self.llm.core.stats())  # fn may have stepped the core
            elif self._loop.stopping and isinstance(item, wire.Add):
                continue  # the AsyncLLM ends every live request when told the loop is dead
            else:
                self._loop.handle(item)
