"""Hypothesis state machine over the whole engine: LLM (scheduler + radix cache + model) on a tiny fp32
random Llama, driven by several callers at once, with failures.

Rules: `generate` (short prompts that often share prefixes with earlier prompts and outputs, greedy
or seeded sampling, random max_tokens / ignore_eos / a stop token, one to three prompts, one params
for all or one each, a single prompt sometimes bare or as vLLM's dict), `repeat` (the prompt a lone
generate just served: a full prefix hit), `refused` (a call validation refuses: an id beyond the
vocabulary, a negative or float id, an empty prompt, too long for the context or the pool, a params
list of the wrong length or type, top_k=2.5, no prompt list), `injected` (a generate whose step
raises at schedule / plan / forward / sample / update, on its first or a later step: an Exception,
KeyboardInterrupt or torch.OutOfMemoryError), `crowd` (tiny pool: another caller's requests plus a
generate's, more than the pool holds, so decode preempts; sometimes with a fault mid-way), `add` /
`step` / `step_fails` / `abort` / `drain` (another caller through add_requests and step, a failing
step, Scheduler.abort), `session_new` / `session_send` (multi-turn chats over token ids) and `reset`
(reset_prefix_cache).

Model: every request's output equals what a reference engine (same weights, prefix caching off,
a big pool, each request served alone) produces for the same prompt and params; a refused call
consumes no request id, any other call one per prompt; an aborted request's partial output is a
prefix of its reference; a failed call leaves none of its requests live and every other caller's
untouched; exactly the requests the model thinks are live are in the scheduler.

Invariants after every rule: no batch in flight and the LLM not busy; `cache.check_invariants()`;
page accounting: the pool's references are the tree's pages plus the running requests' pages,
waiting requests hold none, and with no running request every used page is a cached one; teardown
drains, clears the tree and finds the pool whole (0 leaked pages).

The engine config is drawn per run: page size 1/2/4, a tiny pool (preemption, eviction) or a roomy
one, small token budgets (chunked prefill), max_running 2 (queueing) and every admission policy.
Examples and steps follow the profile (tests/conftest.py): ci 12 x 25, long 150 x 50, dev 3 x 15.
"""
from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from radixkv import LLM, Policy, SamplingParams
from radixkv.engine import runner as runner_module
from radixkv.request import FinishReason

VOCAB = 160
EOS = 2
CONTEXT = 512
STAGES = ["schedule", "plan", "forward", "sample", "update"]

_CONFIG: list[Any] = []
_REFERENCE: dict[int, LLM] = {}  # page_size -> reference engine (prefix caching off, big pool)
_REF_OUT: dict[tuple, list[int]] = {}  # (page_size, prompt, seed) -> the longest output computed


def _config() -> Any:
    """tests/e2e/tiny_models.py's tiny_config("llama"): 2 layers, hidden 64, GQA 4:2, vocab 160."""
    if not _CONFIG:
        from transformers import LlamaConfig

        _CONFIG.append(LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=CONTEXT,
                                   bos_token_id=1, eos_token_id=EOS, pad_token_id=0))
    return _CONFIG[0]


def _sampling(seed: int | None, **more: Any) -> SamplingParams:
    """Greedy (seed None), or seeded sampling: a seeded request draws the same tokens whatever
    shares its batch, preemption and recomputation included (sampling.py)."""
    if seed is None:
        return SamplingParams(temperature=0.0, **more)
    return SamplingParams(temperature=0.8, top_p=0.9, top_k=40, seed=seed, **more)


def _reference_tokens(ps: int, prompt: list[int], n: int, seed: int | None = None) -> list[int]:
    """The first n tokens (EOS an ordinary token) of a fresh engine serving `prompt` alone."""
    key = (ps, tuple(prompt), seed)
    have = _REF_OUT.get(key, [])
    if len(have) < n:
        ref = _REFERENCE.get(ps)
        if ref is None:
            ref = _REFERENCE[ps] = LLM(_config(), dtype="float32", page_size=ps, num_pages=2048 // ps,
                                       enable_prefix_caching=False)
        want = max(n, 8)
        have = ref.generate([prompt], _sampling(seed, max_tokens=want, ignore_eos=True))[0].token_ids
        assert ref.core.pool.num_free == ref.core.pool.num_pages and ref.core.cache.num_cached_pages == 0
        _REF_OUT[key] = have
    return have[:n]


def expected(ps: int, prompt: list[int], params: SamplingParams) -> list[int]:
    """The reference output under params' max_tokens and stop rules (token i of a greedy or
    seeded request depends only on the tokens before it, so stopping is truncating)."""
    assert params == _sampling(params.seed, max_tokens=params.max_tokens, ignore_eos=params.ignore_eos,
                               stop_token_ids=params.stop_token_ids)
    out = _reference_tokens(ps, prompt, params.max_tokens, params.seed)
    stop = set(params.stop_token_ids) | (set() if params.ignore_eos else {EOS})
    for i, t in enumerate(out):
        if t in stop:
            return out[: i + 1]
    return out


class Boom(Exception):
    pass


# EngineCore's optional work for the step after the one in flight (async scheduling): an Exception there drops
# that step ahead only (the same work is scheduled afresh next step) instead of failing the step
AHEAD_FRAMES = ("_run_ahead", "_sample_ahead")


def _raise(exc: BaseException, calls: list[int]) -> None:
    """Raise `exc`; calls[1] counts the faults the engine swallows (an Exception inside a step ahead)."""
    if isinstance(exc, Exception) and any(f.function in AHEAD_FRAMES for f in inspect.stack(0)):
        calls[1] += 1
    raise exc


class _Trap:
    """Logits whose argmax (greedy steps) or sampler (sampled steps) raises, as a failing sampler would."""

    def __init__(self, logits: torch.Tensor, exc: BaseException, calls: list[int]) -> None:
        self.logits, self.exc, self.shape, self.calls = logits, exc, logits.shape, calls

    def argmax(self, *args: Any, **kwargs: Any) -> Any:
        _raise(self.exc, self.calls)


@contextlib.contextmanager
def fault_at(llm: LLM, stage: str, exc: BaseException, after: int) -> Iterator[list[int]]:
    """Stage `stage` of a step raises `exc` on its (after + 1)-th call inside the block; yields
    [calls, swallowed] so the caller can tell whether it fired, and whether inside a step ahead whose failure
    the engine drops (AHEAD_FRAMES)."""
    calls = [0, 0]

    def fires() -> bool:
        calls[0] += 1
        return calls[0] == after + 1

    if stage == "sample":
        target, name = llm.runner.model, "forward"
        real = target.forward

        def patched(*args: Any, **kwargs: Any) -> Any:
            out = real(*args, **kwargs)
            return _Trap(out, exc, calls) if fires() else out
    else:
        target = {"schedule": llm.core.scheduler, "plan": llm.runner.attention, "forward": llm.runner.model,
                  "update": llm.core.scheduler}[stage]
        name = stage
        real = getattr(target, name)

        def patched(*args: Any, **kwargs: Any) -> Any:
            if fires():
                _raise(exc, calls)
            return real(*args, **kwargs)

    assert name not in vars(target)
    setattr(target, name, patched)
    ahead = stage == "schedule"  # with async scheduling a step schedules through schedule_ahead too
    if ahead:
        real_ahead = llm.core.scheduler.schedule_ahead

        def patched_ahead(*args: Any, **kwargs: Any) -> Any:
            if fires():
                _raise(exc, calls)
            return real_ahead(*args, **kwargs)

        llm.core.scheduler.schedule_ahead = patched_ahead
    real_sample = runner_module.sample  # sampled steps: the sampler raises on the trap

    def sample(logits: Any, *args: Any) -> Any:
        if isinstance(logits, _Trap):
            _raise(logits.exc, calls)
        return real_sample(logits, *args)

    runner_module.sample = sample
    try:
        yield calls
    finally:
        delattr(target, name)  # the class's method again
        if ahead:
            del llm.core.scheduler.schedule_ahead
        runner_module.sample = real_sample


# ---- strategies ---------------------------------------------------------------------------------
# A prompt: (which earlier sequence to continue, how much of it to keep, new tokens). Earlier
# sequences are prompts and prompt + output of finished requests, so prompts share prefixes.
TOKENS = st.integers(0, VOCAB - 1)
PROMPT = st.tuples(st.integers(0, 10**6), st.integers(0, 24), st.lists(TOKENS, max_size=12))
# max_tokens, ignore_eos, stop (at the reference's k-th token), seed (None: greedy)
PARAMS = st.tuples(st.integers(1, 10), st.booleans(), st.none() | st.integers(0, 7),
                   st.sampled_from([None, None, None, 0, 1, 2]))
EXCEPTIONS = st.sampled_from(["boom", "interrupt", "oom"])
BAD = st.sampled_from(["vocab", "negative", "empty", "context", "pool", "params_len", "params_type",
                       "top_k", "not_a_list", "float_id"])


def _exception(kind: str) -> BaseException:
    return {"boom": Boom("injected"), "interrupt": KeyboardInterrupt(),
            "oom": torch.OutOfMemoryError("injected: CUDA out of memory")}[kind]


class LLMMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.llm: LLM | None = None

    @initialize(ps=st.sampled_from([4, 4, 2, 1]), tiny=st.booleans(),
                budget=st.sampled_from([8192, 8192, 16, 5]), max_running=st.sampled_from([256, 256, 2]),
                policy=st.sampled_from(list(Policy)), overlap=st.booleans())
    def build(self, ps: int, tiny: bool, budget: int, max_running: int, policy: Policy, overlap: bool) -> None:
        # one intra-op thread: on a busy 2-core machine, tiny matmuls over two threads run 10-30x slower
        self.threads = torch.get_num_threads()
        torch.set_num_threads(1)
        self.ps = ps
        self.tiny = tiny
        pool_tokens = 40 if tiny else 1024  # tiny: a few requests at once, preemption and eviction
        self.llm = LLM(_config(), dtype="float32", page_size=ps, num_pages=pool_tokens // ps,
                       max_batch_tokens=min(budget, pool_tokens // ps * ps),  # an explicit budget fits the pool
                       max_running=max_running, policy=policy, async_scheduling=overlap)
        self.next_rid = 0
        self.known: list[list[int]] = [list(range(1, 17)), list(range(1, 9)) + [99] * 8]  # new prompts continue these
        self.pending: dict[int, tuple[Any, SamplingParams]] = {}  # rid -> (Request, params) of add_requests
        self.sessions: list[tuple[Any, SamplingParams]] = []
        self.last: tuple[list[int], SamplingParams] | None = None  # the last successful prompt
        event(f"page_size={ps} pool={'tiny' if tiny else 'roomy'} budget={budget} max_running={max_running} "
              f"async={overlap}")

    # ---- helpers -----------------------------------------------------------------------------
    def prompt(self, spec: tuple[int, int, list[int]]) -> list[int]:
        which, keep, new = spec
        base = self.known[which % len(self.known)]
        ids = base[: keep] + new
        return ids or [which % VOCAB]

    def params(self, prompt: list[int], spec: tuple[int, bool, int | None, int | None]) -> SamplingParams:
        max_tokens, ignore_eos, stop, seed = spec
        stops: tuple[int, ...] = ()
        if stop is not None and self.fits(prompt, max_tokens):  # stop at a token the reference emits
            stops = (_reference_tokens(self.ps, prompt, 8, seed)[stop],)
        return _sampling(seed, max_tokens=max_tokens, ignore_eos=ignore_eos, stop_token_ids=stops)

    def fits(self, prompt: list[int], max_tokens: int) -> bool:
        total = len(prompt) + max_tokens
        return total <= CONTEXT and -(-total // self.ps) <= self.llm.num_pages

    def remember(self, prompt: list[int], output: list[int]) -> None:
        self.known.append(list(prompt))
        self.known.append(list(prompt) + list(output))
        del self.known[:-40]

    def check_output(self, out: Any, prompt: list[int], params: SamplingParams) -> None:
        want = expected(self.ps, prompt, params)
        assert out.request_id == str(self.next_rid), (out.request_id, self.next_rid)
        self.next_rid += 1
        assert out.prompt_token_ids == prompt
        assert out.token_ids == want, f"prompt {prompt}: got {out.token_ids}, reference {want}"
        stopped = want[-1] in params.stop_token_ids or (not params.ignore_eos and want[-1] == EOS)
        assert out.finish_reason is (FinishReason.STOP if stopped else FinishReason.LENGTH)
        assert out.cached_tokens % self.ps == 0 and 0 <= out.cached_tokens < len(prompt)
        if out.cached_tokens:
            event("prefix hit")
        if params.seed is not None:
            event("seeded sampling")
        self.remember(prompt, out.token_ids)

    def collect_pending(self) -> None:
        """Check the other caller's requests that have finished."""
        for rid, (req, params) in list(self.pending.items()):
            if req.finished:
                assert req.finish_reason is not FinishReason.ABORT, f"request {rid} aborted by someone else"
                assert req.output == expected(self.ps, req.prompt, params), f"request {rid}"
                self.remember(req.prompt, req.output)
                del self.pending[rid]

    def consume(self, n: int) -> None:
        self.next_rid += n

    # ---- generate ----------------------------------------------------------------------------
    @rule(specs=st.lists(PROMPT, min_size=1, max_size=3), params=st.lists(PARAMS, min_size=1, max_size=3),
          per_prompt=st.booleans(), form=st.integers(0, 2))
    def generate(self, specs, params, per_prompt, form) -> None:
        prompts = [self.prompt(s) for s in specs]
        if per_prompt:
            sps = [self.params(p, params[i % len(params)]) for i, p in enumerate(prompts)]
        else:
            sps = [self.params(prompts[0], params[0])] * len(prompts)
        if not all(self.fits(p, sp.max_tokens) for p, sp in zip(prompts, sps)):
            with pytest.raises(ValueError, match="exceeds|KV pages"):
                self.llm.generate(prompts, sps if per_prompt else sps[0])
            event("generate refused: does not fit")
            return
        alone = len(prompts) == 1 and not self.pending  # nothing else runs until it finishes
        given: Any = prompts
        if len(prompts) == 1 and form:  # one prompt given bare: token ids or vLLM's dict
            given = prompts[0] if form == 1 else {"prompt_token_ids": prompts[0]}
        outs = self.llm.generate(given, sps if per_prompt else sps[0])
        assert len(outs) == len(prompts)
        for out, p, sp in zip(outs, prompts, sps):
            self.check_output(out, p, sp)
        self.last = (prompts[0], sps[0]) if alone else None
        self.collect_pending()
        event(f"generate: {len(prompts)} prompts")

    @precondition(lambda self: self.last is not None and not self.pending)
    @rule()
    def repeat(self) -> None:
        """The prompt a lone generate just served, again: every full block of it but the last
        token's is served from the cache (inserted when the request finished, nothing evicted since)."""
        prompt, params = self.last
        out = self.llm.generate([prompt], params)[0]
        assert out.cached_tokens == (len(prompt) - 1) // self.ps * self.ps, (out.cached_tokens, len(prompt))
        self.check_output(out, prompt, params)

    @rule(spec=PROMPT, bad=BAD, at=st.integers(0, 2))
    def refused(self, spec, bad, at) -> None:
        """Validation refuses the whole call before anything runs: no request id is consumed."""
        good = self.prompt(spec)[:20]
        prompts: Any = [good, good[:3] or [7], good[1:] or [8]]
        params: Any = SamplingParams(temperature=0.0, max_tokens=3)
        if bad == "vocab":
            prompts[at] = prompts[at] + [VOCAB + at]
        elif bad == "negative":
            prompts[at] = [-1] + prompts[at]
        elif bad == "float_id":
            prompts[at] = prompts[at] + [2.5]
        elif bad == "empty":
            prompts[at] = []
        elif bad == "context":
            params = [params] * 3
            params[at] = SamplingParams(temperature=0.0, max_tokens=CONTEXT)
        elif bad == "pool":
            prompts[at] = [5] * (self.llm.num_pages * self.ps)
        elif bad == "params_len":
            params = [params] * (2 + 2 * (at % 2))
        elif bad == "params_type":
            params = [params] * 3
            params[at] = {"temperature": 0.0}
        elif bad == "not_a_list":
            prompts = [None, 5, {"prompt_token_ids": good, "prompt": "x"}][at]
        if bad == "top_k":
            with pytest.raises(ValueError, match="top_k"):
                self.llm.generate(prompts, SamplingParams(temperature=0.0, top_k=2.5))
        else:
            with pytest.raises((ValueError, TypeError)):
                self.llm.generate(prompts, params)
        self.collect_pending()
        event(f"refused: {bad}")

    @rule(specs=st.lists(PROMPT, min_size=1, max_size=3), param=PARAMS, stage=st.sampled_from(STAGES),
          exc=EXCEPTIONS, after=st.integers(0, 3))
    def injected(self, specs, param, stage, exc, after) -> None:
        """A step of this generate raises: the exception propagates, generate withdraws its own
        requests, everyone else's carry on (checked by the model), nothing leaks."""
        self.last = None  # other work may evict its blocks
        prompts = [self.prompt(s) for s in specs]
        sp = self.params(prompts[0], param)
        if not all(self.fits(p, sp.max_tokens) for p in prompts):
            return
        err = _exception(exc)
        with fault_at(self.llm, stage, err, after) as calls:
            try:
                outs = self.llm.generate(prompts, sp)
            except type(err) as caught:
                assert caught is err
                outs = None
        self.no_plain_batch_in_flight()
        if outs is None:
            assert calls[0] == after + 1
            self.consume(len(prompts))  # its requests were added, then aborted
            event(f"injected: {stage} raised")
        else:  # finished before the stage's (after + 1)-th call, or it fired in a step ahead, which was dropped
            assert calls[0] <= after or calls[1] == 1
            for out, p in zip(outs, prompts):
                self.check_output(out, p, sp)
        self.collect_pending()

    @precondition(lambda self: self.tiny and len(self.pending) < 2)
    @rule(specs=st.lists(PROMPT, min_size=3, max_size=4), theirs=st.integers(0, 2),
          fault=st.none() | st.tuples(st.sampled_from(STAGES), EXCEPTIONS, st.integers(0, 12)))
    def crowd(self, specs, theirs, fault) -> None:
        """More work than the tiny pool holds: another caller's requests (add_requests) and a
        generate's, long outputs, so decode runs out of pages and preempts; sometimes a stage of
        a later step raises in the middle of it."""
        self.last = None
        size = self.llm.num_pages * self.ps // 3 - 2
        prompts = [(self.prompt(spec) + list(range(20, 20 + size)))[:size] for spec in specs]
        sp = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
        for r in self.llm.add_requests(prompts[:theirs], sp):
            assert r.rid == self.next_rid
            self.next_rid += 1
            self.pending[r.rid] = (r, sp)
        ours = prompts[theirs:]
        preempted = self.llm.core.scheduler.metrics.preemptions
        with contextlib.ExitStack() as stack:
            err = calls = None
            if fault is not None:
                err = _exception(fault[1])
                calls = stack.enter_context(fault_at(self.llm, fault[0], err, fault[2]))
            try:
                outs = self.llm.generate(ours, sp)
            except BaseException as caught:
                if caught is not err:
                    raise
                outs = None
        if outs is None:
            assert calls[0] == fault[2] + 1
            self.consume(len(ours))
            event(f"crowd: {fault[0]} raised")
        else:
            for out, p in zip(outs, ours):
                self.check_output(out, p, sp)
        if self.llm.core.scheduler.metrics.preemptions > preempted:
            event("crowd: preempted")
        self.collect_pending()

    # ---- another caller: add_requests / step / abort -------------------------------------------
    @precondition(lambda self: len(self.pending) < 4)
    @rule(specs=st.lists(PROMPT, min_size=1, max_size=2), param=PARAMS, steps=st.integers(0, 3),
          then_abort=st.none() | st.integers(0, 10))
    def add(self, specs, param, steps, then_abort) -> None:
        """Another caller queues requests (LLM.add_requests), steps a few times, maybe aborts one."""
        self.last = None  # other work may evict its blocks
        prompts = [self.prompt(s) for s in specs]
        sp = self.params(prompts[0], param)
        if not all(self.fits(p, sp.max_tokens) for p in prompts):
            with pytest.raises(ValueError):
                self.llm.add_requests(prompts, sp)
            return
        reqs = self.llm.add_requests(prompts, sp)
        for r in reqs:
            assert r.rid == self.next_rid
            self.next_rid += 1
            self.pending[r.rid] = (r, sp)
        for _ in range(steps):
            if self.llm.has_work():
                self.llm.step()
        self.collect_pending()
        if then_abort is not None and self.pending:
            self.abort(then_abort)

    @precondition(lambda self: self.pending)
    @rule(n=st.integers(1, 6))
    def step(self, n) -> None:
        self.last = None  # other work may evict its blocks
        for _ in range(n):
            if not self.llm.has_work():
                break
            self.llm.step()
        self.collect_pending()

    @precondition(lambda self: self.pending)
    @rule(stage=st.sampled_from(STAGES), exc=EXCEPTIONS)
    def step_fails(self, stage, exc) -> None:
        """LLM.step raising at a stage: the step never happened; the same work runs next step. (With async
        scheduling a step that only reads the tokens of the step ahead runs no stage before update.)"""
        self.last = None  # other work may evict its blocks
        err = _exception(exc)
        before = {rid: (len(r.output), r.num_computed) for rid, (r, _) in self.pending.items()}
        ahead = self.llm.core._ahead is not None
        with fault_at(self.llm, stage, err, 0) as calls:
            try:
                self.llm.step()
                raised = False
            except type(err) as caught:
                assert caught is err
                raised = True
        self.no_plain_batch_in_flight()
        if not raised:
            assert (ahead and calls[0] == 0 and stage != "update") or calls[1] == 1, f"{stage} ran and did not raise"
            event("step_fails: a step ahead only read" if calls[1] == 0 else "step_fails: the step ahead dropped")
        else:
            assert self.llm.core.scheduler.in_flight is None and self.llm.core._ahead is None
            for rid, (r, _) in self.pending.items():
                assert not r.finished and len(r.output) == before[rid][0]
        self.llm.step()  # and serves on
        self.collect_pending()
        event(f"step_fails: {stage}")

    @precondition(lambda self: self.pending)
    @rule(which=st.integers(0, 10))
    def abort(self, which) -> None:
        """Scheduler.abort of a live request: FINISHED with ABORT, pages released, its partial
        output a prefix of the reference; its computed blocks stay cached for later prompts."""
        rids = sorted(self.pending)
        rid = rids[which % len(rids)]
        req, params = self.pending.pop(rid)
        if req.finished:  # finished in the last step: check it, then abort is a no-op
            self.pending[rid] = (req, params)
            self.collect_pending()
            assert self.llm.core.scheduler.abort(rid) is None
            return
        assert self.llm.core.scheduler.abort(rid) is req
        assert req.finish_reason is FinishReason.ABORT and not req.pages
        want = expected(self.ps, req.prompt, params)
        assert req.output == want[: len(req.output)] and len(req.output) < len(want)
        assert self.llm.core.scheduler.abort(rid) is None  # no longer live
        event("abort")

    @precondition(lambda self: self.pending)
    @rule()
    def drain(self) -> None:
        self.last = None  # other work may evict its blocks
        for _ in range(1000):
            if not self.llm.has_work():
                break
            self.llm.step()
        assert not self.llm.has_work()
        self.collect_pending()
        assert not self.pending

    # ---- sessions -----------------------------------------------------------------------------
    @precondition(lambda self: len(self.sessions) < 3)
    @rule(system=st.none() | PROMPT, param=PARAMS)
    def session_new(self, system, param) -> None:
        sys_ids = None if system is None else self.prompt(system)
        sp = _sampling(param[3], max_tokens=param[0], ignore_eos=param[1])
        chat = self.llm.session(system=sys_ids, params=sp)
        assert chat.history == (sys_ids or [])
        self.sessions.append((chat, sp))

    @precondition(lambda self: self.sessions)
    @rule(which=st.integers(0, 10), message=st.lists(TOKENS, min_size=1, max_size=6))
    def session_send(self, which, message) -> None:
        self.last = None  # other work may evict its blocks
        chat, sp = self.sessions[which % len(self.sessions)]
        prompt = chat.history + message
        if not self.fits(prompt, sp.max_tokens):
            before = list(chat.history)
            with pytest.raises(ValueError):
                chat.send(message)
            assert chat.history == before
            self.sessions.remove((chat, sp))  # this chat is full
            event("session full")
            return
        reply = chat.send(message)
        self.check_output(chat.last, prompt, sp)
        assert reply == chat.last.token_ids and chat.history == prompt + reply
        self.collect_pending()
        if len(chat.outputs) > 1:
            event("session: later turn")

    # ---- the cache ----------------------------------------------------------------------------
    @rule()
    def reset(self) -> None:
        self.last = None  # other work may evict its blocks
        emptied = self.llm.reset_prefix_cache()
        if not self.live_requests():
            assert emptied and self.llm.core.pool.num_free == self.llm.core.pool.num_pages
        else:  # only what running requests lock stays
            assert self.llm.core.cache.num_evictable_pages == 0

    # ---- invariants ---------------------------------------------------------------------------
    def live_requests(self) -> list[Any]:
        s = self.llm.core.scheduler
        return [e.req for e in s.running] + [e.req for e in s.waiting]

    def no_plain_batch_in_flight(self) -> None:
        """Between calls nothing is in flight but, with async scheduling, a step scheduled ahead."""
        s = self.llm.core.scheduler
        assert s.ahead is None and (s.in_flight is None or s.in_flight.follows is not None)
        if s.in_flight is not None:
            assert self.llm.core.async_scheduling and self.llm.core._ahead.batch is s.in_flight
            event("a step ahead in flight between calls")

    @invariant()
    def engine_idle_between_calls(self) -> None:
        if self.llm is None:
            return
        self.no_plain_batch_in_flight()
        assert not self.llm._busy.locked()

    @invariant()
    def cache_invariants(self) -> None:
        if self.llm is not None:
            self.llm.core.cache.check_invariants()

    @invariant()
    def pages_accounted(self) -> None:
        """Pool references = the tree's pages + the running requests' pages; nothing else."""
        if self.llm is None:
            return
        llm, s = self.llm, self.llm.core.scheduler
        assert all(not e.req.pages for e in s.waiting), "a waiting request holds pages"
        held = [p for e in s.running for p in e.req.pages]
        refs = llm.core.pool.refcounts(range(llm.core.pool.num_pages))
        assert int(refs.sum()) == llm.core.cache.num_cached_pages + len(held), "page references leaked"
        assert all(llm.core.pool.refcount(p) >= 1 for p in held)
        for e in s.running:
            assert len(e.req.pages) * self.ps >= e.req.num_computed
        if not held:
            assert llm.core.pool.num_used == llm.core.cache.num_cached_pages, "pages used that nobody holds"

    @invariant()
    def live_requests_are_the_models(self) -> None:
        if self.llm is None:
            return
        live = {r.rid for r in self.live_requests()}
        want = {rid for rid, (r, _) in self.pending.items() if not r.finished}
        assert live == want, f"live requests {sorted(live)}, expected {sorted(want)}"

    def teardown(self) -> None:
        if self.llm is None:
            if hasattr(self, "threads"):
                torch.set_num_threads(self.threads)
            return
        try:
            self.drain()
            self.llm.core.cache.check_invariants()
            assert self.llm.reset_prefix_cache()
            assert self.llm.core.pool.num_free == self.llm.core.pool.num_pages, "leaked pages"
            if self.llm.core.scheduler.metrics.preemptions:
                event("preempted")
        finally:
            torch.set_num_threads(self.threads)


_BASE = settings()  # the profile's (tests/conftest.py): ci 100 / 50, long 1200 / 100, dev 10 / 30
LLMMachine.TestCase.settings = settings(_BASE, max_examples=max(3, _BASE.max_examples // 8),
                                        stateful_step_count=max(10, _BASE.stateful_step_count // 2))
TestLLMMachine = LLMMachine.TestCase
