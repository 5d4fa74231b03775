"""A failure inside a step loses nothing already running: faults injected at each stage of a step,
with requests of two callers in flight; one caller at a time; a refused call consumes nothing."""
from __future__ import annotations

import threading

import pytest
import torch

from radixkv import LLM, SamplingParams

from .tiny_models import tiny_config

GREEDY = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)


class Boom(Exception):
    pass


def _prompts(n: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 160, (int(torch.randint(5, 40, (1,), generator=g)),), generator=g).tolist()
            for _ in range(n)]


def _llm(num_pages: int = 64) -> LLM:
    return LLM(tiny_config("llama"), dtype="float32", page_size=4, num_pages=num_pages)


def _expected(prompts: list[list[int]], num_pages: int = 64) -> list[list[int]]:
    return [o.token_ids for o in _llm(num_pages).generate(prompts, GREEDY)]


def _assert_whole(llm: LLM) -> None:
    llm.core.cache.check_invariants()
    assert llm.reset_prefix_cache() and llm.core.pool.num_free == llm.core.pool.num_pages  # 0 leaked pages


def _fail_once(monkeypatch: pytest.MonkeyPatch, obj: object, name: str, exc: BaseException, after: int = 0) -> None:
    """obj.name raises exc on its (after + 1)-th call, then behaves again."""
    real, calls = getattr(obj, name), [0]

    def flaky(*args, **kwargs):
        calls[0] += 1
        if calls[0] == after + 1:
            raise exc
        return real(*args, **kwargs)

    monkeypatch.setattr(obj, name, flaky)


STAGES = ["schedule", "plan", "forward", "sample", "update"]


class _Trap:
    """Logits whose argmax raises, as a failing sampler would."""

    def __init__(self, logits: torch.Tensor, exc: BaseException) -> None:
        self.logits, self.exc, self.shape = logits, exc, logits.shape

    def argmax(self, *args, **kwargs):
        raise self.exc


def _inject(monkeypatch: pytest.MonkeyPatch, llm: LLM, stage: str, exc: BaseException, after: int = 0) -> None:
    """The (after + 1)-th call of one stage of a step raises exc: scheduler.schedule, attention.plan,
    model.forward, the sampler (greedy steps take the argmax of the logits: a trap raises there) or
    scheduler.update."""
    if stage == "sample":
        real, calls = llm.runner.model.forward, [0]

        def trapped(*args, **kwargs):
            calls[0] += 1
            out = real(*args, **kwargs)
            return _Trap(out, exc) if calls[0] == after + 1 else out

        monkeypatch.setattr(llm.runner.model, "forward", trapped)
    else:
        obj = {"schedule": llm.core.scheduler, "plan": llm.runner.attention, "forward": llm.runner.model, "update": llm.core.scheduler}[stage]
        _fail_once(monkeypatch, obj, stage, exc, after)


@pytest.mark.parametrize("stage", STAGES)
@pytest.mark.parametrize("exc", [Boom("injected"), KeyboardInterrupt()])
@pytest.mark.parametrize("num_pages", [64, 14])  # 14: preemption under the failure too
def test_a_failed_step_keeps_other_callers_requests(monkeypatch, stage, exc, num_pages) -> None:
    theirs, ours = _prompts(3, seed=1), _prompts(2, seed=2)
    want_theirs, want_ours = _expected(theirs, num_pages), _expected(ours, num_pages)
    llm = _llm(num_pages)
    other = llm.add_requests(theirs, GREEDY)  # another caller's requests, already in flight
    llm.step()
    _inject(monkeypatch, llm, stage, exc, after=1)
    with pytest.raises(type(exc)):
        llm.generate(ours, GREEDY)
    monkeypatch.undo()
    assert llm.core.scheduler.in_flight is None
    assert {e.req.rid for e in llm.core.scheduler.running + llm.core.scheduler.waiting} == {r.rid for r in other}
    while llm.has_work():  # the other caller carries on
        llm.step()
    assert [r.output for r in other] == want_theirs
    assert [o.token_ids for o in llm.generate(ours, GREEDY)] == want_ours  # and the same LLM serves again
    if num_pages == 14:
        assert llm.core.scheduler.metrics.preemptions > 0
    _assert_whole(llm)


@pytest.mark.parametrize("stage", STAGES)
@pytest.mark.parametrize("num_pages", [64, 14])
def test_a_failed_step_call_loses_nothing(monkeypatch, stage, num_pages) -> None:
    """add_requests from two callers, then LLM.step raises at a stage (an out-of-memory): the
    step never happened (no token, no step counted), and stepping on serves everyone exactly."""
    a, b = _prompts(3, seed=3), _prompts(2, seed=4)
    want = _expected(a + b, num_pages)
    llm = _llm(num_pages)
    reqs = llm.add_requests(a, GREEDY)
    llm.step()
    reqs += llm.add_requests(b, GREEDY)
    for _ in range(3):
        llm.step()
    before = [(list(r.output), r.num_computed, r.status) for r in reqs]
    steps = llm.core.num_steps
    exc = torch.OutOfMemoryError("injected: CUDA out of memory")
    _inject(monkeypatch, llm, stage, exc)
    with pytest.raises(torch.OutOfMemoryError):
        llm.step()
    monkeypatch.undo()
    assert llm.core.scheduler.in_flight is None and llm.core.num_steps == steps
    assert [(list(r.output), r.num_computed, r.status) for r in reqs] == before
    llm.core.cache.check_invariants()
    while llm.has_work():
        llm.step()
    assert [r.output for r in reqs] == want
    if num_pages == 14:
        assert llm.core.scheduler.metrics.preemptions > 0
    _assert_whole(llm)


@pytest.mark.parametrize("stage", STAGES)
@pytest.mark.parametrize("num_pages", [64, 14])
def test_a_failed_session_turn_keeps_the_chat(monkeypatch, stage, num_pages) -> None:
    """A chat turn whose step is interrupted (Ctrl-C) while another caller's requests run: the
    chat's history is as before the turn, the same turn sent again gets a fresh engine's reply,
    and the other caller's requests end as if nothing had happened."""
    system, turns = _prompts(1, seed=5)[0][:12], [[7, 8, 9, 10, 11], [12, 13, 14]]
    theirs = _prompts(2, seed=6)
    fresh = _llm(num_pages).session(system=system, params=GREEDY)
    want_replies = [fresh.send(t) for t in turns]
    want_theirs = _expected(theirs, num_pages)
    llm = _llm(num_pages)
    chat = llm.session(system=system, params=GREEDY)
    assert chat.send(turns[0]) == want_replies[0]
    history, sent = list(chat.history), len(chat.outputs)
    other = llm.add_requests(theirs, GREEDY)
    llm.step()
    _inject(monkeypatch, llm, stage, KeyboardInterrupt(), after=1)
    with pytest.raises(KeyboardInterrupt):
        chat.send(turns[1])
    monkeypatch.undo()
    assert chat.history == history and len(chat.outputs) == sent  # the turn never happened
    assert llm.core.scheduler.in_flight is None
    assert chat.send(turns[1]) == want_replies[1]  # steps the other caller's requests too
    assert chat.history == fresh.history
    while llm.has_work():
        llm.step()
    assert [r.output for r in other] == want_theirs
    _assert_whole(llm)


def test_an_interrupt_inside_schedule_loses_nothing(monkeypatch) -> None:
    """A KeyboardInterrupt can land anywhere, also inside the scheduler's own page allocation."""
    theirs = _prompts(4, seed=3)
    want = _expected(theirs, 14)
    llm = _llm(14)
    other = llm.add_requests(theirs, GREEDY)
    _fail_once(monkeypatch, llm.core.pool, "alloc_into", KeyboardInterrupt())
    with pytest.raises(KeyboardInterrupt):
        llm.step()
    monkeypatch.undo()
    assert llm.core.scheduler.in_flight is None
    while llm.has_work():
        llm.step()
    assert [r.output for r in other] == want
    _assert_whole(llm)


@pytest.mark.parametrize("after", [0, 1, 3])
def test_an_interrupt_right_after_the_pool_allocates_loses_nothing(monkeypatch, after) -> None:
    """Issue 33 item 3: a Ctrl-C landing just after the pool has handed out pages (before the caller
    stored them) once lost them for good. Whatever allocation call the scheduler makes, it raises
    right after the real one returns; no page is lost and the requests end as on a fresh engine."""
    theirs = _prompts(4, seed=3)
    want = _expected(theirs, 14)
    llm = _llm(14)
    other = llm.add_requests(theirs, GREEDY)
    pool, calls = llm.core.pool, [0]
    for name in ("alloc", "alloc_into", "alloc_each"):
        real = getattr(pool, name, None)
        if real is None:
            continue

        def then_interrupt(*args, _real=real, **kwargs):
            out = _real(*args, **kwargs)
            calls[0] += 1
            if calls[0] == after + 1:
                raise KeyboardInterrupt
            return out

        monkeypatch.setattr(pool, name, then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        while llm.has_work():
            llm.step()
    monkeypatch.undo()
    assert llm.core.scheduler.in_flight is None
    while llm.has_work():
        llm.step()
    assert [r.output for r in other] == want
    _assert_whole(llm)


def test_bad_sampling_params_are_refused_before_anything_runs() -> None:
    llm = _llm()
    for bad in (dict(top_k=2.5), dict(temperature=10**400), dict(temperature=float("inf"))):
        with pytest.raises(ValueError):
            llm.generate([[5, 6, 7]], SamplingParams(max_tokens=3, **bad))
    assert llm.generate([[5, 6, 7]], SamplingParams(temperature=1e-40, max_tokens=3)).__len__() == 1  # greedy
    _assert_whole(llm)


def test_nan_logits_still_give_a_token_in_the_vocabulary(monkeypatch) -> None:
    llm = _llm()
    real = llm.runner.model.forward
    monkeypatch.setattr(llm.runner.model, "forward", lambda *a, **k: real(*a, **k) * float("nan"))
    for params in (GREEDY, SamplingParams(temperature=0.7, top_p=0.9, max_tokens=4, ignore_eos=True)):
        out = llm.generate([[5, 6, 7, 8]], params)[0]
        assert all(0 <= t < llm.runner.vocab_size for t in out.token_ids)
    _assert_whole(llm)


def test_a_refused_call_consumes_no_request_id_and_no_seed() -> None:
    params = SamplingParams(temperature=1.0, max_tokens=8, ignore_eos=True)
    fresh = _llm().generate([[5, 6, 7]], params)[0]
    llm = _llm()
    with pytest.raises(ValueError, match="prompt 1"):
        llm.generate([[5, 6, 7], [10**9]], params)  # the second prompt is out of the vocabulary
    with pytest.raises(TypeError):
        llm.generate(None, params)
    out = llm.generate([[5, 6, 7]], params)[0]
    assert (out.request_id, out.token_ids) == (fresh.request_id, fresh.token_ids)


def test_dict_prompts_take_vllm_keys() -> None:
    llm = _llm()
    a = llm.generate([{"prompt_token_ids": [5, 6, 7]}], GREEDY)[0]
    assert a.prompt_token_ids == [5, 6, 7] and a.token_ids == llm.generate([[5, 6, 7]], GREEDY)[0].token_ids
    bare = llm.generate({"prompt_token_ids": [5, 6, 7]}, GREEDY)  # one dict prompt, not in a list (vLLM)
    assert len(bare) == 1 and bare[0].token_ids == a.token_ids
    with pytest.raises(ValueError, match="exactly one"):
        llm.generate([{"prompt_ids": [1]}], GREEDY)


def test_a_second_caller_is_refused_while_one_runs(monkeypatch) -> None:
    llm = _llm()
    inside, release = threading.Event(), threading.Event()
    real = llm.runner.model.forward

    def slow(*args, **kwargs):
        inside.set()
        release.wait(30)
        return real(*args, **kwargs)

    monkeypatch.setattr(llm.runner.model, "forward", slow)
    result: dict[str, object] = {}
    worker = threading.Thread(target=lambda: result.update(out=llm.generate([[5, 6, 7]], GREEDY)))
    worker.start()
    assert inside.wait(30)
    for call in (lambda: llm.generate([[8, 9]], GREEDY), llm.step, lambda: llm.add_requests([[8]], GREEDY)):
        with pytest.raises(RuntimeError, match="one caller at a time"):
            call()
    release.set()
    worker.join(30)
    monkeypatch.undo()
    assert len(result["out"]) == 1 and result["out"][0].token_ids == _expected([[5, 6, 7]])[0]
    _assert_whole(llm)


def test_a_reentrant_call_is_refused(monkeypatch) -> None:
    llm = _llm()
    real, seen = llm.runner.model.forward, []

    def reenter(*args, **kwargs):
        try:
            llm.generate([[4, 4]], GREEDY)
        except RuntimeError as e:
            seen.append(str(e))
        return real(*args, **kwargs)

    monkeypatch.setattr(llm.runner.model, "forward", reenter)
    assert llm.generate([[5, 6, 7]], GREEDY)[0].token_ids == _expected([[5, 6, 7]])[0]
    assert seen and "busy" in seen[0]
