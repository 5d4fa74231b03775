"""Tensor parallelism on the CPU: 2 ranks over gloo (issue 19 item 2).

TP=2 greedy output equals TP=1 token for token on tiny random fp32 models; close() leaves no worker
process; a worker's failure (an error, a kill, a hang) reaches the rank-0 caller as a
TensorParallelError naming the rank, promptly, and the engine refuses work afterwards.
Each test starts one 2-rank engine (a forkserver worker: the first costs the imports, later ones less);
the shard arithmetic of every architecture is tested in process, without workers, in test_tp_shards.py.
"""
from __future__ import annotations

import os
import signal
import time

import pytest

from radixkv import LLM, SamplingParams
from radixkv.engine.parallel import TensorParallelError
from radixkv.engine.tp_workers import Fault

from .tiny_models import tiny_config

GREEDY = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
SHARED = list(range(5, 22))  # 17 tokens: 4 full pages of 4, shared by the first two prompts
PROMPTS = [SHARED + [30, 31], SHARED + [40], [50, 51, 52], list(range(60, 90))]


def _llm(config, tp: int, **more) -> LLM:
    return LLM(config, dtype="float32", device="cpu", page_size=4, num_pages=96, tensor_parallel_size=tp,
               max_num_batched_tokens=24, **more)  # 24 tokens a step: the 30-token prompt is chunked


def _gone(pid: int) -> bool:
    return not os.path.exists(f"/proc/{pid}")


def test_tp2_greedy_equals_tp1_and_close_leaves_no_process() -> None:
    # q/k/v/o biases (o's added by rank 0 only), an LM head padded per rank; every architecture's shards
    # are checked in process by test_tp_shards.py
    config = tiny_config("llama", attention_bias=True, vocab_size=161)
    one = _llm(config, 1)
    want = one.generate(PROMPTS, GREEDY)
    again = one.generate(PROMPTS[:2], GREEDY)  # hits the cached prefixes
    with _llm(config, 2) as two:
        pids = two.runner.tp.worker_pids
        assert len(pids) == 1 and not _gone(pids[0])
        got = two.generate(PROMPTS, GREEDY)
        got_again = two.generate(PROMPTS[:2], GREEDY)
        assert two.runner.kv.num_kv_heads == one.runner.kv.num_kv_heads // 2
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    assert [o.token_ids for o in got_again] == [o.token_ids for o in again]
    assert [o.cached_tokens for o in got_again] == [o.cached_tokens for o in again] and again[0].cached_tokens > 0
    assert all(_gone(p) for p in pids), "a worker outlived close()"
    with pytest.raises(TensorParallelError, match="closed"):
        two.generate(PROMPTS[:1], GREEDY)


def test_tp2_cascade_steps_reach_the_workers() -> None:
    """Decode rows sharing cached pages as cascade groups (Batch.cascade, sent as a frame): the workers
    plan the same groups over their heads; greedy output equals TP=1 plain decode."""
    from radixkv.scheduler.cascade_groups import RULE_ALWAYS

    prompts = [SHARED + [30 + i] * (1 + i) for i in range(4)] + [[50, 51, 52]]
    want = _llm(tiny_config("llama"), 1).generate(prompts, GREEDY)
    with _llm(tiny_config("llama"), 2, cascade=True) as two:
        two.core.scheduler.cascade_rule = RULE_ALWAYS  # any shared page of any 2 rows: the tiny batch groups
        two.generate([SHARED], SamplingParams(temperature=0.0, max_tokens=1))  # the shared pages enter the tree
        got = two.generate(prompts, GREEDY)
        assert two.runner.attention.cascade_steps >= GREEDY.max_tokens - 1
    assert [o.token_ids for o in got] == [o.token_ids for o in want]


def _fails_fast(llm: LLM, match: str, within_s: float) -> TensorParallelError:
    t0 = time.monotonic()
    with pytest.raises(TensorParallelError, match=match) as info:
        llm.generate([[1, 2, 3]], GREEDY)
    assert time.monotonic() - t0 < within_s
    assert info.value.rank == 1
    assert not llm.core.scheduler.has_work()  # generate withdrew its request
    return info.value


@pytest.mark.alone  # dist_timeout_s=2 and a 5-second bound: no other test loading the cores
@pytest.mark.parametrize("fault", ["raise", "kill", "hang"])
def test_a_failing_worker_is_reported_not_a_hang(fault) -> None:
    llm = _llm(tiny_config("llama"), 2, dist_timeout_s=2.0)
    pid = llm.runner.tp.worker_pids[0]
    assert len(llm.generate([[1, 2, 3]], GREEDY)[0].token_ids) == 8
    if fault == "kill":
        os.kill(pid, signal.SIGKILL)
        err = _fails_fast(llm, "rank 1 was killed by SIGKILL", 5)
    elif fault == "raise":
        llm.runner.tp.inject_fault(1, Fault.RAISE)
        err = _fails_fast(llm, "rank 1 failed in step 9: RuntimeError: fault injected into rank 1", 5)
        assert "Traceback" in str(err)  # the worker's own traceback
    else:
        llm.runner.tp.inject_fault(1, Fault.HANG)
        _fails_fast(llm, r"rank\(s\) \[1\] did not answer in step 9 within dist_timeout_s=2s", 12)
    assert _gone(pid), "the failed engine's worker is still running"
    assert llm.dead  # a server ends its loop on this (serve/async_engine.py)
    with pytest.raises(TensorParallelError, match="shut down after a failure"):  # at once, every later call
        llm.generate([[1, 2, 3]], GREEDY)
    llm.close()


def test_an_interrupt_after_the_step_was_sent_shuts_the_ranks_down() -> None:
    """A Ctrl-C in rank 0 once a worker has the step (here: raised by the send itself) must not leave the
    worker a step ahead: later collectives would pair silently with the wrong step. The engine is shut down."""
    llm = _llm(tiny_config("llama"), 2)
    pid = llm.runner.tp.worker_pids[0]
    conn = llm.runner.tp.workers[0].conn
    real = conn.send_bytes

    def send_then_interrupt(data):
        real(data)
        raise KeyboardInterrupt

    llm.add_requests([[1, 2, 3]], GREEDY)
    conn.send_bytes = send_then_interrupt
    with pytest.raises(KeyboardInterrupt):
        llm.step()
    assert llm.dead and _gone(pid)
    with pytest.raises(TensorParallelError, match="shut down after a failure"):
        llm.step()
    llm.close()


@pytest.mark.alone  # dist_timeout_s=2
def test_a_worker_that_stops_reading_is_reported_not_a_hang() -> None:
    """A step too large for the pipe's buffer, to a worker stopped outside any collective (SIGSTOP): the send
    itself would block forever; it is bounded by dist_timeout_s and blamed on that rank."""
    llm = LLM(tiny_config("llama"), dtype="float32", device="cpu", page_size=16, num_pages=4200,
              tensor_parallel_size=2, max_num_batched_tokens=65536, dist_timeout_s=2.0)
    pid = llm.runner.tp.worker_pids[0]
    llm.add_requests([[3 + i % 100] * 480 for i in range(128)], GREEDY)  # ~61k prefill tokens in one step
    os.kill(pid, signal.SIGSTOP)
    t = time.monotonic()
    with pytest.raises(TensorParallelError, match=r"rank\(s\) \[1\] did not answer"):
        llm.step()
    assert time.monotonic() - t < 10 and llm.dead and _gone(pid)
    llm.close()


def test_heads_that_do_not_split_are_refused_before_any_process_starts() -> None:
    with pytest.raises(ValueError, match=r"tensor_parallel_size 4 must divide the model's num_key_value_heads \(2\)"):
        _llm(tiny_config("llama"), 4)
    with pytest.raises(ValueError, match="tensor_parallel_size must be an int >= 1"):
        _llm(tiny_config("llama"), 0)


def test_serve_passes_tensor_parallel_size() -> None:
    import argparse

    from radixkv.serve.cli_serve import add_serve_parser, llm_kwargs, resolve_options

    p = argparse.ArgumentParser()
    add_serve_parser(p.add_subparsers(dest="command"))
    assert llm_kwargs(resolve_options(p.parse_args(["serve", "m", "--tensor-parallel-size", "2"])))[
        "tensor_parallel_size"] == 2
    assert llm_kwargs(resolve_options(p.parse_args(["serve", "m"])))["tensor_parallel_size"] == 1
