"""A tensor-parallel worker process (ranks 1..N-1, started by tp_workers.TensorParallel.launch).

It joins the process group, builds the runner class it is handed (never imported here: engine/runner.py
imports tp_workers.py, which starts this), then runs every step rank 0 sends (tp_frames.py) until told to
stop or until rank 0's end of the pipe closes. Any failure is reported up the pipe (tp_frames.Failed) before
the process exits.
"""
from __future__ import annotations

import os
import pickle
import signal
import sys
import time
import traceback
from datetime import timedelta
from multiprocessing import connection
from typing import Any

import torch
import torch.distributed as dist

from .parallel import CollectiveError, TPGroup
from .tp_frames import (
    Failed,
    Fault,
    Hello,
    InjectFault,
    StepReader,
    Stop,
    decode_step,
    is_step,
    line,
)

START_TIMEOUT_S = 600.0  # start-up (imports, weights, CUDA graphs) gets at least this long, whatever dist_timeout_s


def worker_main(rank: int, world: int, port: int, conn: connection.Connection, runner_cls: type, model: Any,
                ctor: dict[str, Any], timeout_s: float, device: str, env: dict[str, str]) -> None:
    """A worker rank: join the group, build the engine's shard, then run every step rank 0 sends.
    env: rank 0's environment at launch (a forkserver child inherits the server's, which may be older);
    applied before anything reads NCCL_* or CUDA_VISIBLE_DEVICES."""
    os.environ.clear()
    os.environ.update(env)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if device == "cpu":  # the CPU's cores are shared by every rank
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    try:
        conn.send_bytes(pickle.dumps(Hello(rank, os.getpid())))
        start_s = max(timeout_s, START_TIMEOUT_S)
        store = dist.TCPStore("127.0.0.1", port, world, is_master=False, timeout=timedelta(seconds=start_s))
        group = TPGroup.init(rank, world, torch.device(device), store, timeout_s, start_s)
        runner, _ = runner_cls.load(model, **ctor, tp_group=group)
        serve(runner, conn, rank)
    except BaseException as e:  # noqa: BLE001 - every failure is reported to rank 0, then the process ends
        report = Failed(rank, f"{type(e).__name__}: {line(e)}", traceback.format_exc(),
                        isinstance(e, CollectiveError))
        try:
            conn.send_bytes(pickle.dumps(report))
        except OSError:
            pass
        os._exit(1)
    TPGroup.close()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(0)  # the group is left and nothing is buffered: skip seconds of interpreter teardown


def serve(runner: Any, conn: connection.Connection, rank: int) -> None:
    """Run steps until Stop, or until rank 0's end of the pipe closes (it is gone)."""
    fault: Fault | None = None
    reader = StepReader()
    while True:
        try:
            buf = reader.recv(conn)
        except EOFError:
            return
        if not is_step(buf):
            msg = pickle.loads(buf)
            if isinstance(msg, Stop):
                return
            assert isinstance(msg, InjectFault), f"rank {rank}: unexpected message {msg!r}"
            fault = msg.kind
            continue
        step = decode_step(buf)
        if fault is Fault.RAISE:
            raise RuntimeError(f"fault injected into rank {rank} (test)")
        if fault is Fault.EXIT:
            os._exit(7)
        if fault is Fault.HANG:
            time.sleep(3600)
        with torch.inference_mode():
            runner.forward_local(step.batch, step.use_graphs)
