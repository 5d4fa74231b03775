"""Async scheduling on the CPU (the same loop as on CUDA, where it is the default): step N+1 is scheduled
and launched before step N's tokens are read. Outputs equal the synchronous loop's for greedy, seeded,
stop-token, stop-string, n > 1 and aborted requests; rows that finish keep the overlap going; a failure
anywhere in a step leaves the engine able to go on."""
from __future__ import annotations

import pytest
import torch

from radixkv import LLM, SamplingParams

from .tiny_models import tiny_config


def _prompts(n: int, seed: int = 3) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 160, (5 + 7 * (i % 4),), generator=g).tolist() for i in range(n)]


def _llm(overlap: bool, **more) -> LLM:
    return LLM(tiny_config("llama"), dtype="float32", device="cpu", page_size=4, num_pages=96,
               async_scheduling=overlap, **more)


def _whole(llm: LLM) -> None:
    llm.core.cache.check_invariants()
    llm.reset_prefix_cache()
    assert llm.core.pool.num_free == llm.core.pool.num_pages


def _outputs(outs):
    return [[(c.token_ids, c.finish_reason, c.stop_reason) for c in o.outputs] for o in outs]


def test_async_equals_sync_for_every_kind_of_request() -> None:
    prompts = _prompts(6)
    ref = _llm(False).generate(prompts[:1], SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True))
    stop = ref[0].token_ids[4]
    params = [SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True),
              SamplingParams(temperature=0.0, max_tokens=12, stop_token_ids=[stop]),
              SamplingParams(temperature=0.9, top_p=0.8, seed=5, max_tokens=9, ignore_eos=True, n=2),
              SamplingParams(temperature=1.0, top_k=7, seed=1, max_tokens=1, ignore_eos=True),
              SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True),
              SamplingParams(temperature=0.7, min_p=0.1, seed=2, max_tokens=15, ignore_eos=True)]
    prompts[1] = prompts[0]  # the stop token fires at its fifth token
    want = _outputs(_llm(False).generate(prompts, params))
    llm = _llm(True)
    assert _outputs(llm.generate(prompts, params)) == want
    assert want[1][0][1] == "stop" and llm.core.steps_ahead > 5
    _whole(llm)


def test_prompt_chunks_and_admissions_run_ahead_with_the_same_outputs() -> None:
    """A small step budget and few rows: prompts arrive in chunks and requests are admitted while others
    decode; those mixed steps are scheduled ahead too (Scheduler.schedule_ahead), with penalties (their
    sampler deferred) and prompt logprobs (scored on the step ahead's ids), and outputs equal the sync loop's."""
    prompts = [p * 3 for p in _prompts(7, seed=11)]  # 15-78 tokens: several chunks of 16
    params = [SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True),
              SamplingParams(temperature=0.8, seed=4, max_tokens=12, ignore_eos=True, n=2),
              SamplingParams(temperature=0.0, max_tokens=9, ignore_eos=True, repetition_penalty=1.3),
              SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True, prompt_logprobs=2),
              SamplingParams(temperature=0.0, max_tokens=11, ignore_eos=True),
              SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, presence_penalty=0.5),
              SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)]

    def run(overlap: bool):
        llm = _llm(overlap, max_num_batched_tokens=16, max_num_seqs=3)
        mixed = []
        real = llm.core.scheduler.schedule_ahead

        def ahead(now):
            batch = real(now)
            mixed.append(batch is not None and not batch.is_decode_only)
            return batch
        llm.core.scheduler.schedule_ahead = ahead
        outs = llm.generate(prompts, params)
        scores = [[sorted((t, round(lp.logprob, 4)) for t, lp in d.items()) for d in o.prompt_logprobs[1:]]
                  if o.prompt_logprobs else None for o in outs]
        got = (_outputs(outs), scores)
        _whole(llm)
        return got, sum(mixed)

    want, _ = run(False)
    got, mixed_ahead = run(True)
    assert got == want and mixed_ahead >= 5, mixed_ahead


def test_logits_controls_that_read_no_output_keep_the_overlap() -> None:
    """logit_bias, allowed_token_ids and one-token bad words do not wait for the host's tokens (issue 32,
    item 3); a bad word of several tokens, penalties and min_tokens do (their rows read the output)."""
    prompts = _prompts(4, seed=6)
    free = [SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True, logit_bias={7: 3.0, 9: -100}),
            SamplingParams(temperature=0.8, seed=3, max_tokens=10, ignore_eos=True, allowed_token_ids=[5, 6, 7, 8]),
            SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True, bad_words_token_ids=[[11], [12]]),
            SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)]
    assert not any(p.reads_output for p in free)
    want = _outputs(_llm(False).generate(prompts, free))
    llm = _llm(True)
    assert _outputs(llm.generate(prompts, free)) == want
    assert llm.core.steps_ahead >= 7, llm.core.steps_ahead
    assert set(want[1][0][0]) <= {5, 6, 7, 8} and not {11, 12} & set(want[2][0][0])
    waiting = [SamplingParams(bad_words_token_ids=[[11, 12]]), SamplingParams(presence_penalty=0.5),
               SamplingParams(min_tokens=2)]
    assert all(p.reads_output for p in waiting)


def test_rows_that_read_their_output_run_ahead_in_two_halves() -> None:
    """Penalties, min_tokens and bad words of several tokens read each row's latest token on the host: the
    step ahead queues their forward, and their sampler once the update has applied the tokens. Outputs equal
    the synchronous loop's; the decode steps still run ahead."""
    prompts = _prompts(4, seed=10)
    greedy = [o.token_ids for o in _llm(False).generate(prompts, SamplingParams(temperature=0.0, max_tokens=12,
                                                                                 ignore_eos=True))]
    params = [SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, presence_penalty=1.5,
                             frequency_penalty=0.5),
              SamplingParams(temperature=0.0, max_tokens=12, min_tokens=6, stop_token_ids=[greedy[1][2]]),
              SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, bad_words_token_ids=[greedy[2][3:5]]),
              SamplingParams(temperature=0.9, seed=4, max_tokens=12, ignore_eos=True, repetition_penalty=1.3)]
    assert all(p.reads_output for p in params)
    want = _outputs(_llm(False).generate(prompts, params))
    llm = _llm(True)
    assert _outputs(llm.generate(prompts, params)) == want
    assert llm.core.steps_ahead >= 8, llm.core.steps_ahead
    assert len(want[1][0][0]) >= 6  # min_tokens held the stop token back
    _whole(llm)


def test_stop_strings_end_rows_of_the_step_ahead_without_harm() -> None:
    class Tok:  # one "word" a token: stop strings are token ids in angle brackets
        def decode(self, ids, skip_special_tokens=True):
            return "".join(f"<{i}>" for i in ids)

    prompts = _prompts(3, seed=8)
    outs = {}
    for overlap in (False, True):
        llm = _llm(overlap)
        llm.tokenizer = llm.inputs.tokenizer = llm.outputs.tokenizer = Tok()
        first = llm.generate(prompts[:1], SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True))
        params = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True, stop=[f"<{first[0].token_ids[2]}>"])
        outs[overlap] = [(o.token_ids, o.outputs[0].finish_reason, o.outputs[0].stop_reason)
                         for o in llm.generate(prompts, params)]
        _whole(llm)
    assert outs[True] == outs[False] and outs[True][0][1] == "stop" and len(outs[True][0][0]) == 3


def test_rows_finishing_every_step_keep_the_overlap() -> None:
    """Rows that end on a stop token are dropped from the step ahead; the next step is still planned ahead."""
    prompts = _prompts(8, seed=4)
    greedy = SamplingParams(temperature=0.0, max_tokens=14, ignore_eos=True)
    full = [o.token_ids for o in _llm(False).generate(prompts, greedy)]
    params = [SamplingParams(temperature=0.0, max_tokens=14, stop_token_ids=[t[2 + i]]) for i, t in enumerate(full)]
    llm = _llm(True)
    outs = [o.token_ids for o in llm.generate(prompts, params)]
    assert outs == [t[: t.index(t[2 + i]) + 1] for i, t in enumerate(full)]
    decode_steps = llm.core.num_steps - 1  # the first step prefills every prompt
    assert llm.core.steps_ahead >= decode_steps - 2, (llm.core.steps_ahead, llm.core.num_steps)


def test_abort_between_steps_drops_the_row_of_the_step_ahead() -> None:
    prompts = _prompts(3, seed=9)
    params = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
    want = [o.token_ids for o in _llm(False).generate(prompts, params)]
    llm = _llm(True)
    reqs = llm.add_requests(prompts, params)
    for _ in range(3):
        llm.step()
    assert llm.core.scheduler.in_flight is not None and llm.core.scheduler.in_flight.follows is not None
    assert llm.core.scheduler.abort(reqs[1].rid) is reqs[1]
    while llm.has_work():
        llm.step()
    assert reqs[1].output == want[1][: len(reqs[1].output)] and len(reqs[1].output) < 10
    assert [reqs[0].output, reqs[2].output] == [want[0], want[2]]
    _whole(llm)


class _FailsOnce:
    """A KV-event publisher that raises once when armed (a router's sink going down mid-update)."""

    armed = False

    def emit(self, event) -> None:
        if self.armed:
            self.armed = False
            raise ConnectionError("injected: event sink down")


@pytest.mark.parametrize("overlap", [False, True])
def test_a_failing_event_publisher_loses_its_event_not_the_step(overlap) -> None:
    sink = _FailsOnce()
    llm = _llm(overlap, kv_events=sink)
    params = [SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True),
              SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)]
    want = [o.token_ids for o in _llm(overlap).generate(_prompts(2, seed=6), params)]
    a, b = llm.add_requests(_prompts(2, seed=6), params)
    while len(a.output) < 2:
        llm.step()
    sink.armed = True  # a's last token: its blocks go into the tree, whose event raises
    while llm.has_work():
        llm.step()
    assert [a.output, b.output] == want and llm.core.cache._chains.dropped == 1
    _whole(llm)


@pytest.mark.parametrize("stage", ["schedule_ahead", "update"])
def test_a_step_failing_midway_leaves_the_engine_able_to_go_on(monkeypatch, stage) -> None:
    """An exception inside schedule_ahead or update (the step ahead already in flight) abandons every batch
    not yet updated; stepping on serves the same tokens."""
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    want = [o.token_ids for o in _llm(False).generate(_prompts(3, seed=7), params)]
    llm = _llm(True)
    reqs = llm.add_requests(_prompts(3, seed=7), params)
    for _ in range(3):
        llm.step()
    real = getattr(llm.core.scheduler, stage)

    def fails(*args, **kwargs):
        if stage == "update":
            real(*args, **kwargs)  # applied, then the caller is interrupted
        raise KeyboardInterrupt

    monkeypatch.setattr(llm.core.scheduler, stage, fails)
    with pytest.raises(KeyboardInterrupt):
        llm.step()
    monkeypatch.undo()
    assert llm.core.scheduler.in_flight is None and llm.core._ahead is None
    while llm.has_work():
        llm.step()
    assert [r.output for r in reqs] == want
    _whole(llm)


def _fail_deferred_sample_once(llm: LLM, exc: BaseException) -> dict:
    """Make the sampler of the next step ahead (the deferred half) raise `exc`, once."""
    real, calls = llm.core.runner.sample, {"n": 0}

    def sample(fw, mask=None):
        if llm.core._ahead is fw and calls["n"] == 0:
            calls["n"] += 1
            raise exc
        return real(fw, mask)

    llm.core.runner.sample = sample
    return calls


PENALISED = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, presence_penalty=1.5)


def test_a_failed_deferred_sampler_drops_the_step_ahead_and_the_work_is_recomputed() -> None:
    prompts = _prompts(3, seed=10)
    want = _outputs(_llm(False).generate(prompts, [PENALISED] * 3))
    llm = _llm(True)
    calls = _fail_deferred_sample_once(llm, RuntimeError("injected"))
    assert _outputs(llm.generate(prompts, [PENALISED] * 3)) == want
    assert calls["n"] == 1
    _whole(llm)


def test_an_interrupt_in_the_deferred_sampler_leaves_no_half_step_behind() -> None:
    """A KeyboardInterrupt propagates, and the engine goes on afterwards with the same outputs."""
    prompts = _prompts(3, seed=10)
    want = _outputs(_llm(False).generate(prompts, [PENALISED] * 3))
    llm = _llm(True)
    reqs = llm.add_requests(prompts, PENALISED)
    llm.step()
    llm.step()
    _fail_deferred_sample_once(llm, KeyboardInterrupt())
    with pytest.raises(KeyboardInterrupt):
        for _ in range(20):
            llm.step()
    assert llm.core._ahead is None and llm.core.scheduler.in_flight is None
    while llm.core.has_work():
        llm.step()
    assert [[(list(r.output), r.finish_reason.value, None)] for r in reqs] == want
    _whole(llm)
