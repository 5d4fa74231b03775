"""The engine core in a process of its own: `core_main` (that process) and ProcessCore (the API side).

    API process                                        engine-core process
      HTTP, tokenising (InputProcessor),     Add / Abort / Finish / Call / Shutdown
      detokenising and stop strings       ------------------------------------->   CoreLoop: schedule,
      (OutputProcessor), SSE              <-------------------------------------   forward, sample
                                             Step (one a step, every request) /
                                             Result / Heartbeat

Transport: two ZeroMQ PUSH/PULL sockets over ipc:// in a private temporary folder, bound by the API
process; MessagePack frames typed by wire.py (no pickle on the step path). Start-up: the core process
loads the model, then sends its ModelLimits, EOS ids, tokenizer and clock origin once over a
multiprocessing pipe; ProcessCore waits for that (or for the error that stopped the load).

Faults. A frame that does not decode is logged and dropped on either side. The core process exits
when told to (Shutdown), when the API process is gone (its pipe closes), or on SIGTERM; it ignores
SIGINT (Ctrl-C is the API process's to handle, which then shuts it down). The API side watches the
process: when it exits, or sends nothing for `hang_timeout_s` while it has work, every open stream
ends with EngineDeadError naming why, and /health answers 503.
"""
from __future__ import annotations

import atexit
import gc
import logging
import multiprocessing as mp
import os
import signal
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import Any

import msgspec
import zmq

from radixkv.config import budget_given
from radixkv.engine.core import EngineCore, EngineStats
from radixkv.engine.inputs import InputProcessor, ModelLimits
from radixkv.engine.llm import engine_config
from radixkv.engine.outputs import OutputProcessor
from radixkv.engine.grammar import Grammars
from radixkv.engine.runner import ModelRunner
from radixkv.engine.warmup import prepare_engine, use_radixkv_triton_cache
from radixkv.engine.weights import model_source

from . import wire
from .core_loop import CoreLoop
from .streams import CoreEvents, EngineDeadError

log = logging.getLogger("radixkv.serve")

_HEARTBEAT_S = 1.0  # an idle core says it is alive this often
_START_TIMEOUT_S = 1800.0  # loading the weights and capturing graphs


@dataclass(frozen=True)
class CoreInfo:
    """What the core process tells the API process once, when it is ready."""

    limits: ModelLimits
    eos_token_ids: frozenset[int]
    tokenizer: Any
    seed: int
    t0: float  # the core's clock origin (time.monotonic, shared by the processes of one machine)


# ---------------------------------------------------------------------- the engine-core process

def core_main(model: Any, engine_kwargs: dict[str, Any], to_core: str, from_core: str, conn: Any,
              log_level: str) -> None:
    """Entry point of the engine-core process: load, report ready, then serve messages until told to stop."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logging.basicConfig(level=log_level.upper(), format="%(levelname)s %(asctime)s %(name)s[core]: %(message)s")
    try:
        engine_kwargs.setdefault("usage", "serve")  # serving defaults (config.engine_step_budget)
        cfg = engine_config(engine_kwargs.pop("dtype", "auto"), engine_kwargs.pop("kv_dtype", "auto"),
                            engine_kwargs.pop("page_size", 16), engine_kwargs.pop("device", None), engine_kwargs)
        use_radixkv_triton_cache()  # compiled kernels persist across restarts
        runner, loaded = ModelRunner.load(model_source(model, cfg.load_format), cfg)
        cfg = runner.config  # with the defaults the engine decided once the pool was sized
        core = EngineCore(runner, cfg)
        core.grammars = Grammars(loaded.tokenizer, runner.limits.vocab_size)  # structured outputs' matchers
        prepare_engine(core, budget_given=budget_given(engine_kwargs))  # warm before reporting ready
        gc.collect()
        gc.freeze()  # what loading built leaves the collector's full passes, which would stall a step (app.py)
    except BaseException as err:  # noqa: BLE001 - the API process reports it and exits
        conn.send(f"{type(err).__name__}: {err}")
        return
    ctx = zmq.Context()
    pull, push = ctx.socket(zmq.PULL), ctx.socket(zmq.PUSH)
    pull.connect(to_core)
    push.connect(from_core)
    conn.send(CoreInfo(runner.limits, loaded.eos_token_ids, loaded.tokenizer, cfg.seed, core.t0))
    try:
        _serve(core, pull, push, conn)
    finally:
        runner.close()
        ctx.destroy(linger=0)


def _serve(core: EngineCore, pull: zmq.Socket, push: zmq.Socket, conn: Any) -> None:
    loop = CoreLoop(core, lambda msg: push.send(wire.encoder.encode(msg), copy=False))
    last_sent = time.monotonic()
    while not loop.stopping:
        busy = core.has_work()
        if pull.poll(0 if busy else int(_HEARTBEAT_S * 1000)):
            while True:
                try:
                    frame = pull.recv(zmq.NOBLOCK)
                except zmq.Again:
                    break
                try:
                    loop.handle(wire.to_core.decode(frame))
                except msgspec.MsgspecError as err:
                    log.error("dropped a malformed message from the API process: %s", err)
        if conn.poll():  # the API process closed its end: it is gone
            return
        if core.has_work():
            loop.step()
            last_sent = time.monotonic()
        elif time.monotonic() - last_sent >= _HEARTBEAT_S:
            push.send(wire.encoder.encode(wire.Heartbeat(core.stats())))
            last_sent = time.monotonic()


# ---------------------------------------------------------------------- the API process's side

class ProcessCore:
    """Starts the engine-core process and talks to it (the AsyncLLM's core client in `radixkv serve`).

    engine_kwargs: LLM(...) keyword arguments (vLLM's names accepted). hang_timeout_s: a core with work
    that sends nothing for this long is reported dead."""

    def __init__(self, model: Any, engine_kwargs: dict[str, Any], *, hang_timeout_s: float = 120.0,
                 log_level: str = "info") -> None:
        self.error: str | None = None
        self.hang_timeout_s = hang_timeout_s
        self._dir = tempfile.TemporaryDirectory(prefix="radixkv-core-")
        to_core, from_core = (f"ipc://{os.path.join(self._dir.name, n)}" for n in ("in", "out"))
        self._ctx = zmq.Context()
        self._push, self._pull = self._ctx.socket(zmq.PUSH), self._ctx.socket(zmq.PULL)
        self._push.bind(to_core)
        self._pull.bind(from_core)
        self._send_lock = threading.Lock()  # zmq sockets are not thread-safe
        ours, theirs = mp.get_context("spawn").Pipe(duplex=True)
        self._conn = ours
        self.proc = mp.get_context("spawn").Process(
            target=core_main, args=(model, dict(engine_kwargs), to_core, from_core, theirs, log_level),
            name="radixkv-core")  # not daemonic: a tensor-parallel core starts worker processes of its own
        self.proc.start()
        theirs.close()
        self._stopping = False
        info = self._await_ready()
        atexit.register(self.shutdown)  # runs before multiprocessing's exit handler joins the process
        self.limits, self.tokenizer, self.t0 = info.limits, info.tokenizer, info.t0
        self.inputs = InputProcessor(info.tokenizer, info.limits, info.eos_token_ids, info.seed)
        self.outputs = OutputProcessor(info.tokenizer)
        self._stats = EngineStats(0, 0, info.limits.num_pages, 0, 0, 0, 0, 0, 0)
        self._events: CoreEvents | None = None
        self._last_heard = time.monotonic()
        self._thread = threading.Thread(target=self._receive, name="radixkv-core-client", daemon=True)

    def _await_ready(self) -> CoreInfo:
        deadline = time.monotonic() + _START_TIMEOUT_S
        while not self._conn.poll(0.2):
            if not self.proc.is_alive():
                self._close_transport()
                raise RuntimeError(f"the engine-core process exited during start-up (exit code {self.proc.exitcode})")
            if time.monotonic() > deadline:
                self.proc.kill()
                self._close_transport()
                raise RuntimeError(f"the engine-core process did not start within {_START_TIMEOUT_S:g}s")
        msg = self._conn.recv()
        if isinstance(msg, str):  # the load failed: the message names why
            self.proc.join(10)
            self._close_transport()
            raise ValueError(msg)
        return msg

    def now(self) -> float:
        return time.monotonic() - self.t0

    def stats(self) -> EngineStats:
        return self._stats

    @property
    def is_running(self) -> bool:
        return self.error is None and not self._stopping and self.proc.is_alive()

    def start(self, events: CoreEvents) -> None:
        self._events = events
        self._thread.start()

    def send(self, msg: wire.ToCore) -> None:
        if not self.is_running:
            raise EngineDeadError(f"the engine core is not running{f': {self.error}' if self.error else ''}")
        with self._send_lock:
            self._push.send(wire.encoder.encode(msg), copy=False)

    def shutdown(self, timeout: float = 10.0) -> None:
        """Stop the core process (Shutdown, then SIGTERM, then SIGKILL) and the receiver thread."""
        if self._stopping:
            return
        self._stopping = True
        atexit.unregister(self.shutdown)
        if self.proc.is_alive():
            with self._send_lock:
                self._push.send(wire.encoder.encode(wire.Shutdown()))
            self.proc.join(timeout)
        if self.proc.is_alive():
            self.proc.terminate()
            self.proc.join(5)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(5)
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout)
        self._close_transport()

    def _close_transport(self) -> None:
        self._conn.close()
        self._ctx.destroy(linger=0)
        self._dir.cleanup()

    # ------------------------------------------------------------------ the receiver thread

    def _receive(self) -> None:
        assert self._events is not None
        events, poller = self._events, zmq.Poller()
        poller.register(self._pull, zmq.POLLIN)
        reason = "the engine core was shut down"
        try:
            while not self._stopping:
                if not poller.poll(200):
                    reason = self._check_alive()
                    if reason is not None:
                        break
                    continue
                self._last_heard = time.monotonic()
                try:
                    msg = wire.from_core.decode(self._pull.recv())
                except msgspec.MsgspecError as err:
                    log.error("dropped a malformed message from the engine core: %s", err)
                    continue
                if isinstance(msg, wire.Step):
                    self._stats = msg.stats
                    updates, stopped = self.outputs.process(msg.deltas)
                    if stopped:
                        self.send(wire.Finish(stopped))
                    events.on_step([u.state for u in updates], msg.failed, msg.stats)
                elif isinstance(msg, wire.Result):
                    events.on_result(msg)
                else:
                    self._stats = msg.stats
                    events.on_idle(msg.stats)
        except BaseException as err:  # noqa: BLE001 - reported to every stream below
            reason = f"the engine core client failed: {err!r}"
            log.exception("engine core client stopped")
        if not self._stopping:
            self.error = reason
            log.error("%s", reason)
        events.on_dead(reason)

    def _check_alive(self) -> str | None:
        """Why the core is to be taken for dead, or None while it is alive and answering."""
        if not self.proc.is_alive():
            return f"the engine-core process exited (exit code {self.proc.exitcode})"
        busy = self._stats.num_running or self._stats.num_waiting or self.outputs.states
        if busy and time.monotonic() - self._last_heard > self.hang_timeout_s:
            self.proc.kill()
            return f"the engine-core process sent nothing for {self.hang_timeout_s:g}s with work queued (hung); killed"
        return None
