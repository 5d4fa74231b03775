"""EngineCore: the scheduler, the radix tree and the pool over one ModelRunner; one step at a time.

Both front ends drive it: the offline LLM in its own process, the server's engine-core process
(serve/core_proc.py). It never sees text: requests come in validated (engine/inputs.py), and each
step returns what it did to each request as RequestDeltas, which the front end's OutputProcessor
turns into text, stop strings and outputs.

One step: the scheduler picks work (prefix matches give cached pages, so only uncached tokens are
computed) -> the runner queues the forward pass and the sampler -> `scheduler.update` appends the
tokens; finished requests are inserted into the radix tree (prompt + output) and release their pages.

Async scheduling (on by default on CUDA): before reading a step's tokens, the next step is scheduled
ahead and queued behind it, the inputs of its rows that continue that step's rows taken from those tokens
on the device. The step ahead is the whole next step: decode rows, prompt chunks and admissions
(Scheduler.schedule_ahead). So the host's work between steps (reading tokens, update, the front end's
output processing, scheduling and planning the step after) runs while the GPU computes, and step() returns
with the next step in flight. Rows that finished meanwhile are dropped from the step ahead; a step that
cannot be planned ahead (logprobs, a preemption needed) runs after the update, as without async
scheduling. Rows whose sampler reads their latest token on the host (grammars, penalties, min_tokens, bad
words of several tokens) run ahead in two halves: the forward is queued ahead, the sampler once the update
has applied the tokens (and advanced the grammars), so the forward still overlaps the host's update.

Failure: a step is failure-atomic. If anything raises before its tokens are applied, the batch goes
back to the scheduler as if it never ran and the next step recomputes the same work. The step ahead is
optional work: an Exception while queueing it or its deferred sampler drops it alone (the step in flight
is applied; the next step schedules the same work afresh, where a failure is reported as below). An Exception
comes out as StepFailed naming the stage and the suspect requests (those admitted in the failed
step, else the head of the waiting queue when admission raised, else every running request); a
KeyboardInterrupt or SystemExit propagates as it is.

One caller at a time: a second thread, or a re-entrant call, is refused before it touches any state.
"""
from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch

from radixkv.batch import Batch
from radixkv.cache import PagePool, RadixCache
from radixkv.cache.events import KVEventPublisher
from radixkv.cache.tree_host import HostPool
from radixkv.config import EngineConfig
from radixkv.prompt_logprobs import LogprobsBlock
from radixkv.request import FinishReason, PositionLogprobs, Request
from radixkv.scheduler import Scheduler

from .grammar import Grammars
from .host_kv import HostKV, build_host_kv
from .runner import Forwarded, Launched, ModelRunner

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RequestDelta:
    """What one step did to one request: the tokens it appended, and how it ended if it did."""

    rid: int
    new_token_ids: list[int]
    finish_reason: str | None  # a FinishReason value once the request finished
    cached_tokens: int  # prompt tokens served from the prefix cache (known from its first admission)
    logprobs: list[PositionLogprobs] | None = None  # one per new token, when the request asked for them
    # with SamplingParams.prompt_logprobs: every prompt token's after the first, in the request's first delta
    prompt_logprobs: LogprobsBlock | None = None


@dataclass(frozen=True)
class EngineStats:
    """A torch-free snapshot of the core for metrics and log lines (EngineCore.stats())."""

    num_running: int
    num_waiting: int
    num_pages: int
    pages_used: int  # held by requests or by the tree and not evictable
    prompt_tokens: int  # counted at first admission
    hit_tokens: int  # prompt tokens served from the prefix cache
    preemptions: int
    num_steps: int
    mixed_steps: int  # steps that computed prompt tokens (not decode-only: no CUDA graph for them)
    # the host tier (issue 37; all 0 without one): host_hit_tokens of hit_tokens were loaded back from host
    # pages (the rest hit GPU pages); host_pages / host_pages_used: its capacity and the pages the tree holds
    # there; bytes_d2h / bytes_h2d: bytes copied device-to-host (demotions) and host-to-device (loads);
    # failed_copies: copies that raised (demotions dropped, loads recomputed)
    host_hit_tokens: int = 0
    host_pages: int = 0
    host_pages_used: int = 0
    bytes_d2h: int = 0
    bytes_h2d: int = 0
    failed_copies: int = 0

    @property
    def kv_usage(self) -> float:
        return self.pages_used / self.num_pages

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def gpu_hit_tokens(self) -> int:
        """Prompt tokens served from GPU-resident cache (hit_tokens less the host tier's)."""
        return self.hit_tokens - self.host_hit_tokens


_EMPTY_BLOCK = LogprobsBlock(0, 0, b"", b"", b"", b"", b"")  # a one-token prompt scores no position


class StepFailed(Exception):
    """A step raised. stage: "schedule", "run" or "update"; suspects: the request ids most likely at
    fault (the module docstring says which). The step was undone; `__cause__` is the original error."""

    def __init__(self, stage: str, suspects: Sequence[int], cause: BaseException) -> None:
        super().__init__(f"the engine step failed in {stage} ({cause!r}); suspect requests: {list(suspects)}")
        self.stage, self.suspects, self.cause = stage, list(suspects), cause


class EngineCore:
    """Scheduler + runner (see the module docstring). kv_events: told of every block the prefix
    cache stores or drops (radixkv.cache.events)."""

    def __init__(self, runner: ModelRunner, cfg: EngineConfig, kv_events: KVEventPublisher | None = None) -> None:
        self.runner, self.config = runner, cfg
        self.pool = PagePool(runner.num_pages)
        # the host tier (issue 37): pinned host pages under the pool; the tree demotes to them and loads back
        self.host_kv: HostKV | None = build_host_kv(runner, cfg)
        self.cache = RadixCache(self.pool, page_size=cfg.page_size, events=kv_events,
                                host_pool=None if self.host_kv is None else HostPool(self.host_kv.num_pages),
                                mover=self.host_kv)
        self.scheduler = Scheduler(self.pool, self.cache, cfg.scheduler, cfg.page_size,
                                   cascade_rule=runner.cascade_rule)
        # tensor parallel workers read each step's input ids from the host batch: no steps ahead there
        self.async_scheduling = (runner.device.type == "cuda" and runner.tp is None if cfg.async_scheduling is None
                                 else cfg.async_scheduling)
        self.num_steps = 0
        self.mixed_steps = 0
        self.steps_ahead = 0  # steps that were scheduled ahead (for tests and benchmarks)
        # the step queued behind the last one returned (async scheduling): sampled by the time step() returns
        self._ahead: Launched | Forwarded | None = None
        self._sent: dict[int, int] = {}  # rid -> output tokens already reported, for live requests
        self._prompt_lps: dict[int, list[LogprobsBlock]] = {}  # rid -> its prompt's scores so far, until sent
        # structured outputs: the compiled grammars and matchers (set by the front end that built this core:
        # it shares its InputProcessor's, or the core process builds one); rids with a matcher
        self.grammars: Grammars | None = None
        self._constrained: set[int] = set()
        self._ran: set[int] = set()  # requests running after the last successful step
        self.t0 = time.monotonic()  # the clock origin of arrivals (time.monotonic is one clock per machine)
        self._busy = threading.Lock()

    def now(self) -> float:
        """Seconds since the core started: the clock arrivals and waits are measured on."""
        return time.monotonic() - self.t0

    # ------------------------------------------------------------------ requests

    def add(self, reqs: Sequence[Request]) -> None:
        """Queue validated requests, all or nothing (ValueError for a duplicate id)."""
        with self.exclusive("add"):
            added: list[Request] = []
            try:
                for r in reqs:
                    self.scheduler.add(r, r.arrival_s)
                    added.append(r)
            except BaseException:
                for r in added:
                    self.scheduler.abort(r.rid)
                raise
            for r in reqs:
                self._sent[r.rid] = len(r.output)
                if r.sampling is not None and r.sampling.params.prompt_logprobs is not None:
                    self._prompt_lps[r.rid] = []
                so = r.sampling.params.structured_outputs if r.sampling is not None else None
                if so is not None:
                    if self.grammars is None:
                        raise ValueError("structured outputs need a tokenizer; this engine has none")
                    self.grammars.start(r.rid, so, r.output)
                    self._constrained.add(r.rid)

    def abort(self, rid: int) -> Request | None:
        """Withdraw a request: pages released now, full blocks stay cached. None for an unknown or finished id."""
        with self.exclusive("abort"):
            self._sent.pop(rid, None)
            self._prompt_lps.pop(rid, None)
            self._release_grammar(rid)
            return self.scheduler.abort(rid)

    def finish(self, rid: int, reason: FinishReason = FinishReason.STOP) -> Request | None:
        """End a running request as a natural finish (a stop string found in its text): counted as
        completed, its computed blocks cached. None when it is no longer running."""
        with self.exclusive("finish"):
            self._sent.pop(rid, None)
            self._prompt_lps.pop(rid, None)
            self._release_grammar(rid)
            try:
                return self.scheduler.finish(rid, reason)
            except ValueError:  # not running (any more)
                return None

    def has_work(self) -> bool:
        return self.scheduler.has_work()

    def reset_prefix_cache(self) -> bool:
        """Evict every cached prefix no running request holds (vLLM's name); True when the tree is now empty."""
        with self.exclusive("reset_prefix_cache"):
            if self.host_kv is not None:
                self.cache.clear()  # drops unlocked blocks (no demotion) and the whole host tier
                return self.cache.num_cached_pages == 0 and self.cache.num_host_pages == 0
            self.cache.evict(self.pool.num_pages)
            return self.cache.num_cached_pages == 0

    def stats(self) -> EngineStats:
        s, pool, m, cache, host = self.scheduler, self.pool, self.scheduler.metrics, self.cache, self.host_kv
        return EngineStats(s.num_running, s.num_waiting, pool.num_pages,
                           pool.num_pages - pool.num_free - cache.num_evictable_pages,
                           m.prompt_tokens, m.hit_tokens, m.preemptions, self.num_steps, self.mixed_steps,
                           m.host_hit_tokens, 0 if host is None else host.num_pages, cache.num_host_pages,
                           0 if host is None else host.bytes_d2h, 0 if host is None else host.bytes_h2d,
                           cache.failed_demotes + cache.failed_promotes)

    # ------------------------------------------------------------------ the step

    def step(self) -> list[RequestDelta]:
        """Run one scheduler step; returns a delta for every request that gained tokens or finished."""
        with self.exclusive("step"):
            return self._step()

    @torch.inference_mode()
    def _step(self) -> list[RequestDelta]:
        self._drop_finished_ahead()
        stage, batch = "schedule", None
        try:
            launched, self._ahead = self._ahead, None
            if launched is None:
                batch = self.scheduler.schedule(self.now())
                if batch is None:
                    return []
                stage = "run"
                self._fence()
                launched = self.runner.launch(batch, grammar_mask=self._grammar_mask(batch))
            batch, stage = launched.batch, "run"
            if self.async_scheduling and self._may_run_ahead(launched):
                self._run_ahead(launched)
            tokens = self.runner.collect(launched)  # the step's one wait on the device
            stage = "update"
            before = [len(r.output) for r in batch.requests]
            self.scheduler.update(batch, tokens, self.now())
            self._advance_grammars(batch, before)
        except BaseException as err:
            self._ahead = None
            # what was not updated never happened: abandoning the oldest batch in flight drops the one
            # scheduled ahead of it too (update() refuses a bad call before it changes anything; one that
            # raises midway has made the step ahead the one in flight)
            if self.scheduler.in_flight is not None:
                self.scheduler.abandon(self.scheduler.in_flight)
            if isinstance(err, Exception):
                raise StepFailed(stage, self._suspects(batch), err) from err
            raise
        self.num_steps += 1
        self.mixed_steps += not batch.is_decode_only
        self._drop_finished_ahead()
        self._sample_ahead()
        deltas = self._deltas(launched, before)
        self._ran = {e.req.rid for e in self.scheduler.running}
        self._drop_finished_ahead()
        return deltas

    def _run_ahead(self, launched: Launched) -> None:
        """Schedule and queue the step after `launched` (async scheduling). Optional work: if planning or
        queueing it fails, it is dropped and `launched` goes on (the next step schedules the same work afresh,
        where a failure is reported with its suspects)."""
        try:
            nxt = self.scheduler.schedule_ahead(self.now())
        except Exception:  # (an admission undoes itself; pages taken for rows stay theirs)
            log.debug("the step ahead could not be scheduled; the next step schedules afresh", exc_info=True)
            return
        if nxt is None:
            return
        try:
            self._fence()
            # rows that read their latest token (grammars, penalties): the forward now, the sampler once this
            # step's tokens are applied (_sample_ahead)
            reads = any(r.sampling.params.reads_output for r in nxt.requests)
            self._ahead = self.runner.forward(nxt, launched) if reads else self.runner.launch(nxt, launched)
        except Exception:
            log.debug("the step ahead could not be queued; dropped", exc_info=True)
            self.scheduler.abandon(nxt)
            return
        self.steps_ahead += 1

    def _fence(self) -> None:
        """Before a step is launched: the host tier's copies queued while scheduling it (demotions of pages
        it may reuse, loads of pages it reads) land first (HostKV.fence: a stream wait, no host sync)."""
        if self.host_kv is not None:
            self.host_kv.fence()

    def _deltas(self, launched: Launched, before: list[int]) -> list[RequestDelta]:
        out: list[RequestDelta] = []
        for b, r in enumerate(launched.batch.requests):
            sent = self._sent.get(r.rid)
            if sent is None:  # finished or aborted before this step was read: reported already
                continue
            scored = self._prompt_lps.get(r.rid)
            if scored is not None and b in launched.prompt_logprobs:
                pos, block = launched.prompt_logprobs[b]
                have = sum(x.n for x in scored)
                assert pos <= have, f"request {r.rid}: prompt position {pos} scored before {have}"
                if pos + block.n > have:  # a recomputed chunk adds nothing twice
                    scored.append(block if pos == have else block.slice(have - pos, block.n))
            new = r.output[sent:]
            if not new and not r.finished:
                continue
            lp = launched.logprobs.get(b)
            lps = [lp] if lp is not None and len(r.output) > before[b] else None
            reason = r.finish_reason.value if r.finished else None
            if r.finished:
                del self._sent[r.rid]
            else:
                self._sent[r.rid] = len(r.output)
            blocks = self._prompt_lps.pop(r.rid, None)
            prompt_lps = None if blocks is None else LogprobsBlock.concat(blocks) if blocks else _EMPTY_BLOCK
            out.append(RequestDelta(r.rid, new, reason, r.cached_tokens, lps, prompt_lps))
        return out

    def _grammar_mask(self, batch: Batch) -> tuple[torch.Tensor, list[int]] | None:
        """The step's structured-output mask over its sampling rows (Grammars.bitmask), None without one."""
        if self.grammars is None or not self._constrained:
            return None
        return self.grammars.bitmask([r.rid if r.rid in self._constrained else None
                                      for r, s in zip(batch.requests, batch.sample) if s])

    def _advance_grammars(self, batch: Batch, before: list[int]) -> None:
        """Advance each constrained request's matcher over its new token; a request whose grammar has
        terminated ends (a stop token it accepted already ended it, unless ignore_eos)."""
        for b, r in enumerate(batch.requests):
            if r.rid not in self._constrained or len(r.output) == before[b]:
                continue
            if self.grammars.accept(r.rid, r.output[before[b]:]) and not r.finished:
                self.scheduler.finish(r.rid, FinishReason.STOP)
            if r.finished:
                self._release_grammar(r.rid)

    def _release_grammar(self, rid: int) -> None:
        if rid in self._constrained:
            self._constrained.discard(rid)
            self.grammars.drop(rid)

    def _suspects(self, batch: Batch | None) -> list[int]:
        if batch is None:  # admission raised (it puts its requests back): the head of the queue
            return [e.req.rid for e in self.scheduler.waiting[:1]]
        rids = [r.rid for r in batch.requests]
        return [rid for rid in rids if rid not in self._ran] or rids

    def _drop_finished_ahead(self) -> None:
        if self._ahead is not None and all(r.finished for r in self._ahead.batch.requests):
            self.scheduler.abandon(self._ahead.batch)  # nothing left to read from it
            self._ahead = None

    def _sample_ahead(self) -> None:
        """The step ahead was forwarded only (rows that read their latest token): queue its sampler now that
        this step's tokens are applied and the grammars advanced. If that fails, the step ahead is dropped
        (the next step schedules the same work afresh, where a failure is reported with its suspects)."""
        fw = self._ahead
        if not isinstance(fw, Forwarded):
            return
        try:
            self._ahead = self.runner.sample(fw, self._grammar_mask(fw.batch))
        except BaseException as err:  # never leave a step ahead without its sampler
            self._ahead = None
            self.scheduler.abandon(fw.batch)
            if not isinstance(err, Exception):
                raise
            log.debug("the sampler of the step ahead failed; the step is dropped", exc_info=True)

    def _may_run_ahead(self, launched: Launched) -> bool:
        """Whether the step after `launched` may be scheduled before its tokens are read: no row asks for
        logprobs (read when the step is launched). Rows whose sampler reads their latest token on the host
        (SamplingParams.reads_output: grammars, penalties, min_tokens, bad words of several tokens) run ahead
        too: their forward is queued ahead, their sampler after the update (_sample_ahead)."""
        for r in launched.batch.requests:
            p = r.sampling.params if r.sampling is not None else None
            if p is None or p.logprobs is not None:
                return False
        return True

    @contextlib.contextmanager
    def exclusive(self, what: str) -> Iterator[None]:
        """One caller at a time: a second thread, or a re-entrant call, is refused before it
        touches any state. (Many callers share an engine through one loop that owns it.)"""
        if not self._busy.acquire(blocking=False):
            raise RuntimeError(f"{what}() refused: this engine is busy with another call (another thread, "
                               f"or a call from inside one of its own); an engine serves one caller at a time")
        try:
            yield
        finally:
            self._busy.release()
