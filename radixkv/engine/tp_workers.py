"""TensorParallel: rank 0's handle on the worker ranks of a tensor-parallel LLM (start, steps, failure, close).

Processes. Rank 0 is the caller's process: scheduler, radix tree, sampler, and its own shard. Ranks
1..N-1 are started with torch.multiprocessing's "forkserver" context (CUDA-safe like "spawn"; the server
preloads torch and radixkv once, so later engines start in a fraction of the time; a script that builds
an LLM at import time needs the usual `if __name__ == "__main__":` guard). Each worker builds the same
runner class rank 0 does (engine/runner.py: model, KV store, graphs; no scheduler, tree or sampler state;
the class arrives as an argument, so no worker module imports runner.py), with the same config and its
TPGroup, so construction runs the same code on every rank and its collectives (agreeing on num_pages,
capturing CUDA graphs) pair up in order. On CUDA rank r uses GPU `index(device) + r`; NCCL_NVLS_ENABLE
defaults to 0 (NVLink multicast off).

Channels.
    store        TCPStore on 127.0.0.1 (port picked by the OS): the process group's rendezvous
    pipes        one duplex Pipe a worker (messages: tp_frames.py). Down: each step as one buffer of raw
                 arrays (a header, then the Batch's int arrays; its Request objects left behind; no
                 pickle), Stop, InjectFault (tests). Up: Hello at start-up, Failed(rank, traceback)
                 before a worker exits on an error (pickled, like Stop and InjectFault)
    collectives  torch.distributed (gloo on CPU, NCCL on CUDA), inside a step's forward and construction

Step. `run_step(batch, use_graphs, local)` sends the step to every worker, then runs `local` (rank 0's
forward); each worker (tp_worker_main.py) decodes the step's Batch over its receive buffer and runs
`runner.forward_local(batch, use_graphs)` over its shard. Only rank 0 samples.

Failure semantics (every case ends with all workers stopped and the process group left; the LLM then
raises TensorParallelError at every step, close() still works; the failed step went back to the
scheduler, so generate() withdraws its requests and re-raises):
    a worker raises         it sends its traceback and exits; rank 0's pending collective fails (gloo: at
                            once, the peer's connection closed) and rank 0 raises TensorParallelError
                            naming the rank, the step and the worker's error
    a worker dies silently  (killed, segfault): the same, naming its exit status or signal; found before
                            the next step is sent if it died while the engine was idle
    a worker hangs          rank 0's collective times out after dist_timeout_s: TensorParallelError
                            naming the ranks alive that never answered
    rank 0's forward raises for its own reasons (KeyboardInterrupt, out of memory): the workers are left
                            mid-step, out of step with rank 0, so they are stopped and the original
                            exception propagates
    rank 0 dies             idle workers read EOF on their pipe, busy ones see their collective fail:
                            they exit (daemonic, SIGINT ignored: Ctrl-C is rank 0's to handle)
On NCCL a dead peer does not fail a collective (it waits); a watchdog thread aborts the communicator
when a worker process exits, so rank 0 does not hang. (Not run here: no multi-GPU machine was lent.)
"""
from __future__ import annotations

import dataclasses
import multiprocessing.process
import os
import pickle
import signal
import sys
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from datetime import timedelta
from multiprocessing import connection
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import Tensor

from radixkv.batch import Batch

from .parallel import TensorParallelError, TPGroup, check_shardable
from .tp_frames import (
    Failed,
    Fault,
    Hello,
    InjectFault,
    PageTables,
    Stop,
    encode_step,
    line,
)
from .tp_worker_main import START_TIMEOUT_S, worker_main
from .model_config import ModelSpec

__all__ = ["Fault", "TensorParallel", "rank_devices"]

_STOP_GRACE_S = 10.0  # a worker asked to stop gets this long to exit before it is terminated
_REPORT_GRACE_S = 3.0  # after a failed collective, how long rank 0 waits for the workers' reports
_DIRECT_SEND_BYTES = 64 << 10  # a step this small fits a pipe's buffer: sent without a deadline thread


@dataclasses.dataclass
class _Worker:
    rank: int
    proc: Any  # multiprocessing Process (forkserver context)
    conn: connection.Connection
    report: Failed | None = None


def rank_devices(device: torch.device, world: int) -> list[torch.device]:
    """The device of each rank: the CPU for all, or consecutive GPUs from `device`'s index."""
    if device.type != "cuda":
        return [device] * world
    base = device.index if device.index is not None else torch.cuda.current_device()
    if base + world > torch.cuda.device_count():
        raise ValueError(f"tensor_parallel_size {world} from {device} needs GPUs {base}..{base + world - 1}, "
                         f"but {torch.cuda.device_count()} are visible")
    return [torch.device("cuda", base + r) for r in range(world)]


class TensorParallel:
    """Rank 0's side of a tensor-parallel engine: the worker processes, their pipes, rank 0's TPGroup."""

    def __init__(self, workers: list[_Worker], store: dist.Store, timeout_s: float) -> None:
        self.workers, self._store, self.timeout_s = workers, store, timeout_s
        self.group: TPGroup | None = None
        self.steps = 0
        self._tables = PageTables()  # the rows' page ids as int32, converted once a request (tp_frames.py)
        self._error: TensorParallelError | None = None
        self._closing = threading.Event()
        # stops the workers on close(), when this object is collected, or at interpreter exit
        self._finalizer = weakref.finalize(self, _shut_down, workers, self._closing)

    @classmethod
    def launch(cls, runner_cls: type, model: Any, ctor: dict[str, Any], spec: ModelSpec, world: int,
               device: torch.device, timeout_s: float) -> TensorParallel:
        """Start ranks 1..world-1 (each builds `runner_cls.load(model, **ctor, tp_group=...)`, ctor["cfg"] moved to
        its device), then join the process group as rank 0. ValueError before anything starts when the model cannot be split."""
        check_shardable(spec, world)
        unimportable = _main_not_importable()
        if unimportable:  # every rank would die at start: say why before starting any
            raise TensorParallelError(f"tensor parallelism cannot start from {unimportable}: {MAIN_GUARD_HINT}")
        devices = rank_devices(device, world)
        if dist.is_initialized():
            raise RuntimeError("torch.distributed is already initialised in this process; a tensor-parallel "
                               "LLM starts its own process group (one such LLM a process)")
        os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
        start_s = max(timeout_s, START_TIMEOUT_S)
        store = dist.TCPStore("127.0.0.1", 0, world, is_master=True, timeout=timedelta(seconds=start_s),
                              wait_for_workers=False)
        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload(["radixkv.engine.runner"])
        workers: list[_Worker] = []
        tp = cls(workers, store, timeout_s)
        try:
            for r in range(1, world):
                ours, theirs = ctx.Pipe(duplex=True)
                cfg = dataclasses.replace(ctor["cfg"], device=str(devices[r]))
                args = (r, world, store.port, theirs, runner_cls, model, {**ctor, "cfg": cfg},
                        timeout_s, str(devices[r]), dict(os.environ))
                proc = ctx.Process(target=worker_main, args=args, name=f"radixkv-tp-rank{r}", daemon=True)
                proc.start()
                theirs.close()
                workers.append(_Worker(r, proc, ours))
            tp._await_hello()
            tp.group = TPGroup.init(0, world, devices[0], store, timeout_s, start_s)
        except BaseException:
            tp.close()
            raise
        tp.group.on_error = tp._failure
        if devices[0].type == "cuda":
            threading.Thread(target=_watch, args=([w.proc.sentinel for w in workers], tp._closing),
                             name="radixkv-tp-watchdog", daemon=True).start()
        return tp

    @property
    def world(self) -> int:
        return len(self.workers) + 1

    @property
    def worker_pids(self) -> list[int]:
        return [w.proc.pid for w in self.workers]

    # ------------------------------------------------------------------ steps

    def run_step(self, batch: Batch, use_graphs: bool, local: Callable[[Batch, bool], Tensor]) -> Tensor:
        """Send the step to every worker, then return `local(batch, use_graphs)` (rank 0's forward)."""
        self._check()
        payload = encode_step(self.steps + 1, use_graphs, batch, self._tables)  # raises before anything is sent
        self.steps += 1
        try:
            # from the first byte sent on, the workers may be in the step: anything that stops rank 0 before its
            # forward is done (a Ctrl-C in the send, an error in its forward) leaves them out of step with it,
            # and a later step's collectives would pair with theirs silently, so the engine is shut down
            for w in self.workers:
                self._send(w, payload)
            return local(batch, use_graphs)
        except TensorParallelError:
            raise
        except BaseException as e:
            self._fail(TensorParallelError(
                f"tensor parallel: rank 0 stopped in step {self.steps} ({type(e).__name__}), leaving the workers "
                f"mid-step; they were shut down, build a new LLM", rank=0))
            raise

    def _send(self, w: _Worker, payload: bytes | bytearray) -> None:
        """Hand a step to worker w within dist_timeout_s. A payload larger than the pipe's buffer blocks until
        the worker reads it, so a worker stuck outside a collective (stopped, swapped out) would hang rank 0:
        such a send runs on a thread that rank 0 waits for with the deadline."""
        if len(payload) <= _DIRECT_SEND_BYTES:
            try:
                w.conn.send_bytes(payload)
            except OSError as e:  # its end closed: it exited
                raise self._failure(e) from e
            return
        errors: list[BaseException] = []

        def send() -> None:
            try:
                w.conn.send_bytes(payload)
            except BaseException as e:  # noqa: BLE001 - handed to rank 0's caller below
                errors.append(e)

        sender = threading.Thread(target=send, name=f"radixkv-tp-send-{w.rank}", daemon=True)
        sender.start()
        sender.join(self.timeout_s)
        if sender.is_alive():  # the worker does not read: blamed as a rank that did not answer
            raise self._failure(TimeoutError(f"rank {w.rank} did not take step {self.steps} within "
                                             f"{self.timeout_s:g}s"))
        if errors:
            if isinstance(errors[0], OSError):
                raise self._failure(errors[0]) from errors[0]
            raise errors[0]

    def _await_hello(self) -> None:
        """Wait until every worker is up (imports done, about to join the group) or one of them failed."""
        deadline = time.monotonic() + max(self.timeout_s, START_TIMEOUT_S)
        waiting = list(self.workers)
        while waiting:
            left = deadline - time.monotonic()
            if left <= 0:
                raise self._failure(None)
            ready = connection.wait([x for w in waiting for x in (w.conn, w.proc.sentinel)], timeout=left)
            for w in [w for w in waiting if w.conn in ready or w.proc.sentinel in ready]:
                try:
                    msg = pickle.loads(w.conn.recv_bytes()) if w.conn.poll() else None
                except (EOFError, OSError):
                    msg = None
                if not isinstance(msg, Hello):
                    w.report = msg if isinstance(msg, Failed) else None
                    raise self._failure(None)
                waiting.remove(w)

    def inject_fault(self, rank: int, kind: Fault) -> None:
        """Tests: make worker `rank` act out `kind` at its next step."""
        self.workers[rank - 1].conn.send_bytes(pickle.dumps(InjectFault(kind)))

    @property
    def failed(self) -> bool:
        """The ranks were shut down after a failure: this engine serves nothing more."""
        return self._error is not None

    def _check(self) -> None:
        """Raise the engine's failure, or find a worker that died or reported while idle."""
        if self._error is not None:
            raise TensorParallelError(f"this LLM's tensor-parallel ranks were shut down after a failure: "
                                      f"{self._error}", self._error.rank)
        if self._closing.is_set():
            raise TensorParallelError("tensor parallel: this LLM was closed")
        if any(w.proc.exitcode is not None or w.conn.poll() for w in self.workers):
            raise self._failure(None)

    # ------------------------------------------------------------------ failure

    def _failure(self, cause: BaseException | None) -> TensorParallelError:
        """The engine's TensorParallelError (built once): which rank failed and how, from the workers'
        reports and exit statuses; every worker is stopped before it returns."""
        if self._error is not None:
            return self._error
        deadline = time.monotonic() + min(_REPORT_GRACE_S, self.timeout_s)
        pending = list(self.workers)
        while pending and time.monotonic() < deadline:  # until each has reported or exited
            ready = connection.wait([x for w in pending for x in (w.conn, w.proc.sentinel)],
                                    timeout=max(0.0, deadline - time.monotonic()))
            for w in list(pending):
                if w.conn in ready or w.proc.sentinel in ready:
                    _read_report(w)
                    if w.report is not None or w.proc.exitcode is not None:
                        pending.remove(w)
        error = _blame(self.workers, self.steps, self.timeout_s, cause)
        self._fail(error)
        return error

    def _fail(self, error: TensorParallelError) -> None:
        """Record the engine's failure and stop the workers at once (they are broken or out of step)."""
        self._error = error
        self._closing.set()
        _terminate(self.workers)
        self.close()

    def close(self) -> None:
        """Stop every worker (asked first, then terminated) and leave the process group; idempotent."""
        self._finalizer()


MAIN_GUARD_HINT = ("ranks 1..N-1 start with multiprocessing's forkserver method, which re-imports the main module "
                   "in each of them (as the spawn method does), so the code that builds the LLM must be in a "
                   "script file, under `if __name__ == \"__main__\":` (a script read from stdin or a notebook "
                   "cell cannot be re-imported; a script without the guard builds the LLM again in every rank)")


def _main_not_importable() -> str | None:
    """What the main module is when a rank cannot re-import it (multiprocessing.spawn's preparation: a main
    module with no import name is re-run from its __file__, and a script read from stdin has the file
    '<stdin>'), else None. A main module with no __file__ (python -c, an interactive prompt) is not
    re-imported at all and passes."""
    main = sys.modules.get("__main__")
    if main is None or getattr(getattr(main, "__spec__", None), "name", None) is not None:
        return None
    path = getattr(main, "__file__", None)
    if path is None:
        return None
    full = path if os.path.isabs(path) else os.path.join(multiprocessing.process.ORIGINAL_DIR or os.getcwd(), path)
    if os.path.isfile(full):
        return None
    return "a script read from stdin" if path == "<stdin>" else f"a main module whose file {path!r} does not exist"


def _read_report(w: _Worker) -> None:
    try:
        while w.report is None and w.conn.poll():
            msg = pickle.loads(w.conn.recv_bytes())
            if isinstance(msg, Failed):
                w.report = msg
    except (EOFError, OSError):
        pass


def _blame(workers: Sequence[_Worker], step: int, timeout_s: float, cause: BaseException | None) -> TensorParallelError:
    """The report: a worker's own error first, then one that died without a word, then one alive that never
    answered (a hang), then one whose collective failed; rank 0's own collective error at the end."""
    where = f"in step {step}" if step else "while starting"
    tail = f" (rank 0: {type(cause).__name__}: {line(cause)})" if cause is not None else ""
    for w in workers:
        if w.report is not None and not w.report.collective:
            return TensorParallelError(f"tensor-parallel rank {w.rank} failed {where}: {w.report.error}\n"
                                       f"{w.report.traceback}{tail}", w.rank)
    for w in workers:
        if w.report is None and w.proc.exitcode is not None:
            code = w.proc.exitcode
            how = f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited with status {code}"
            # dying at start with no word (worker_main reports its own errors) is the main module's re-import
            # failing, as a rank runs it before worker_main: an unguarded script, a notebook
            why = f" (likely: {MAIN_GUARD_HINT})" if not step and code > 0 else ""
            return TensorParallelError(f"tensor-parallel rank {w.rank} {how} {where}{why}{tail}", w.rank)
    silent = [w.rank for w in workers if w.report is None]
    if silent:
        return TensorParallelError(f"tensor-parallel rank(s) {silent} did not answer {where} within "
                                   f"dist_timeout_s={timeout_s:g}s (alive but unresponsive: hung?){tail}", silent[0])
    w = workers[0]
    assert w.report is not None
    return TensorParallelError(f"tensor-parallel rank {w.rank} failed {where}: {w.report.error}{tail}", w.rank)


def _shut_down(workers: list[_Worker], closing: threading.Event) -> None:
    """Ask each live worker to stop, wait, then terminate and kill what is left; leave the process group."""
    closing.set()
    stop = pickle.dumps(Stop())
    for w in workers:
        if w.proc.exitcode is None:
            try:
                w.conn.send_bytes(stop)
            except OSError:
                pass
    deadline = time.monotonic() + _STOP_GRACE_S
    for w in workers:
        w.proc.join(max(0.0, deadline - time.monotonic()))
    _terminate(workers)
    for w in workers:
        w.conn.close()
    TPGroup.close()


def _terminate(workers: list[_Worker]) -> None:
    """SIGTERM each live worker, then SIGKILL what is still alive after 2 s; reap them all."""
    for w in workers:
        if w.proc.exitcode is None:
            w.proc.terminate()
    for w in workers:
        w.proc.join(2.0)
        if w.proc.exitcode is None:
            w.proc.kill()
            w.proc.join()


def _watch(sentinels: list[int], closing: threading.Event) -> None:
    """NCCL only: when a worker process exits before close(), abort the communicator so that rank 0's
    pending collectives return instead of waiting for a peer that is gone."""
    connection.wait(sentinels)
    if closing.is_set():
        return
    abort = getattr(dist.distributed_c10d, "_abort_process_group", None)
    if abort is not None and dist.is_initialized():
        try:
            abort()
        except Exception:  # noqa: BLE001, S110 - best effort: the step still fails at the next check
            pass
