"""CoreLoop: what the engine-core side of the server does with messages and steps.

The same loop runs in the engine-core process (core_proc.py, messages over ZeroMQ) and on the
in-process engine thread (inproc.py, messages as objects). Each turn: apply every message that
arrived (adds, aborts, stop-string finishes, utility calls), run one step, send one Step message
with every request's new tokens.

A failed step (StepFailed) was undone by the core; the loop withdraws its suspects (pages
released) and reports them in the Step's `failed`, so those requests end with an error and the
rest go on. Consecutive failures back off (up to a second); each distinct error is logged once.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable

from radixkv.engine.core import EngineCore, StepFailed

from . import wire

log = logging.getLogger("radixkv.serve")


class CoreLoop:
    """Applies ToCore messages to `core` and steps it; `send` takes every FromCore message."""

    def __init__(self, core: EngineCore, send: Callable[[wire.FromCore], None]) -> None:
        self.core, self.send = core, send
        self.stopping = False
        self.failures = 0  # consecutive failed steps
        self._last_error: str | None = None

    def handle(self, msg: wire.ToCore) -> None:
        core = self.core
        if isinstance(msg, wire.Add):
            try:
                core.add(msg.requests)
            except Exception as err:  # noqa: BLE001 - a duplicate id: refuse these, serve on
                self.send(wire.Step([], core.stats(), [wire.Failed([r.rid for r in msg.requests], repr(err))]))
        elif isinstance(msg, (wire.Abort, wire.Finish)):
            end = core.abort if isinstance(msg, wire.Abort) else core.finish
            for rid in msg.rids:
                end(rid)
        elif isinstance(msg, wire.Call):
            self._call(msg)
        elif isinstance(msg, wire.Shutdown):
            self.stopping = True

    def _call(self, msg: wire.Call) -> None:
        calls = {"reset_prefix_cache": self.core.reset_prefix_cache}
        fn = calls.get(msg.name)
        if fn is None:
            self.send(wire.Result(msg.call_id, error=f"unknown call {msg.name!r}"))
            return
        try:
            self.send(wire.Result(msg.call_id, fn()))
        except Exception as err:  # noqa: BLE001 - handed to the caller
            self.send(wire.Result(msg.call_id, error=repr(err)))
        self.send(wire.Heartbeat(self.core.stats()))  # what the call changed

    def step(self) -> None:
        """One engine step, its Step message sent. Raises only when the engine can serve nothing more."""
        core = self.core
        try:
            deltas = core.step()
        except StepFailed as err:
            if core.runner.dead:  # a tensor-parallel rank failed: nothing more can run
                raise
            for rid in err.suspects:
                core.abort(rid)
            self._report(err)
            self.send(wire.Step([], core.stats(), [wire.Failed(err.suspects, f"the engine step failed: {err.cause!r}")]))
            self.failures += 1
            if self.failures > 1 or not err.suspects:  # failing again: do not spin
                time.sleep(min(1.0, 0.001 * 2 ** min(self.failures, 10)))
            return
        self.failures = 0
        self.send(wire.Step(deltas, core.stats()))

    def _report(self, err: StepFailed) -> None:
        key = repr(err.cause)
        if key != self._last_error:
            self._last_error = key
            log.error("step failed in %s (%s); failing request(s) %s", err.stage, key, err.suspects,
                      exc_info=err.cause)
