"""LLM: the step loop over scheduler, model and sampler; generate(); sessions.

One step: the scheduler picks work (prefix matches give cached pages, so only uncached
tokens are computed) -> attention is planned for the Batch -> the model runs the ragged
batch, storing new K/V -> rows with `sample[b]` draw a token -> `scheduler.update` appends
it, and finished requests are inserted into the radix tree (prompt + output) and release
their pages, so the next turn of a chat or the next few-shot prompt hits.

Async scheduling (on by default on CUDA): a step's forward and sampler are queued on the device
(`_launch`) and its tokens copied to a pinned buffer; before reading them, the next decode step of
the same rows is scheduled ahead and queued behind it, its input ids taken from those tokens on the
device. So the host's work between steps (reading tokens, update, stop checks, scheduling and
planning the step after) runs while the GPU computes, and a step() returns with the next step in
flight. The host waits once a step, for the sampled tokens. Rows that finished meanwhile are
dropped from the step ahead; a step that cannot be planned ahead (admissions, prefill chunks,
penalties, logprobs, pages short) runs after the update, as without async scheduling.

Every request is validated before anything is scheduled; a bad one raises and leaves
requests already in flight untouched.
"""
from __future__ import annotations

import contextlib
import dataclasses
import itertools
import operator
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, NamedTuple

import torch
from torch import Tensor

from radixkv.batch import Batch
from radixkv.cache import PagePool, RadixCache
from radixkv.cache.events import KVEventPublisher
from radixkv.config import EngineConfig, KVDtype
from radixkv.request import CompletionOutput, FinishReason, Request, RequestOutput
from radixkv.scheduler import Scheduler
from radixkv.plan import kv_sink_for, kv_window_for
from radixkv.scheduler.cascade_groups import RULE_NEVER, rule_for

from .attention import Backend, PagedAttention, host_to_device
from .cuda_graphs import DecodeGraphs
from .kv_store import KVStore, default_num_pages
from .kv_window import KVWindow
from .model import LlamaModel
from .parallel import TPGroup
from .sampling import SamplingParams, penalize, sample, sampling_rows, top_logprobs
from .session import Session
from .tp_workers import TensorParallel
from .weights import LoadedModel, load_model

Prompt = str | Sequence[int]


@dataclasses.dataclass(eq=False)
class _RowSampling:
    """What the engine keeps in Request.sampling."""

    params: SamplingParams
    seed: int  # the request's (+ index), or one drawn from the engine's seed stream
    index: int = 0  # which of its prompt's n completions
    prompt_text: str | None = None  # the prompt as text, when it was given as text
    logprobs: list[dict[int, float]] | None = None  # one per generated token, with params.logprobs
    stop_reason: int | str | None = None  # the stop string or stop token id that ended it


class _Launched(NamedTuple):
    """A step whose forward and sampler are queued on the device; its tokens not read yet."""

    batch: Batch
    rows: list[int]  # [S] the batch rows that sample, in the sampler's order
    drawn: Tensor  # int64 [S] sampled tokens, on the device
    host: Tensor | None  # int64 [S] pinned copy of drawn, valid once `ready` has fired (CUDA); None on CPU
    ready: torch.cuda.Event | None
    logprobs: dict[int, dict[int, float]]  # by row, for rows that asked for them


class LLM:
    """A Llama-family model served from a paged, prefix-cached KV pool.

    model: a local Hugging Face folder, a .gguf file (converted once, cached), a hub id already in the
    local Hugging Face cache, a config.json or a transformers PretrainedConfig (seeded random weights).
    attention_backend: Backend.AUTO runs Triton on CUDA and the PyTorch reference on CPU;
    Backend.TRITON on CPU needs TRITON_INTERPRET=1 (tests).
    cascade=True: decode steps whose rows share cached prefix pages attend through the cascade kernels
    (each shared prefix read once per group), replayed from CUDA graphs up to cascade_inputs.MAX_GROUPS groups,
    captured at start-up for every key the KV dtype's rule can reach (DecodeGraphs.warm_cascade), one level;
    an eager step runs two (a system prompt once over few-shot blocks) when cascade_groups.outer_level_pays.
    kv_events: a publisher (radixkv.cache.events, e.g. QueuePublisher) told of every block the prefix cache
    stores or drops, in vLLM's KV event shape, so a router can follow what this engine holds.
    Other keyword arguments are EngineConfig fields (num_pages, seed, scheduler, ...).
    """

    def __init__(self, model: Any, dtype: Any = "auto", kv_dtype: Any = "auto", page_size: int = 16,
                 device: str | torch.device | None = None, *, attention_backend: Backend = Backend.AUTO,
                 kv_events: KVEventPublisher | None = None, _tp_group: TPGroup | None = None,
                 **more: Any) -> None:
        named = {"dtype": dtype, "device": None if device is None else str(device)}
        # vLLM's spellings (block_size, kv_cache_dtype) may stand in for a default left as it is
        if page_size != 16 or "block_size" not in more:
            named["page_size"] = page_size
        if kv_dtype != "auto" or "kv_cache_dtype" not in more:
            named["kv_dtype"] = kv_dtype
        self.config = cfg = EngineConfig.from_kwargs(**named, **more)
        self.device = pick_device(cfg.device)
        loaded: LoadedModel = load_model(model, cfg.dtype, self.device, cfg.seed)
        self.spec, self.dtype, self.tokenizer = loaded.spec, loaded.dtype, loaded.tokenizer
        self.hf_config = loaded.config
        self.eos_token_ids = loaded.eos_token_ids  # generation stops at any of these unless ignore_eos
        auto_triton = attention_backend is Backend.AUTO and self.device.type == "cuda"
        triton = attention_backend is Backend.TRITON or auto_triton
        # tensor parallel (tp_workers.py): this process is rank 0 and starts the others, each of which builds
        # this same LLM with its _tp_group; the scheduler and tree of those stay unused
        self.tp = (TensorParallel.launch(type(self), model, dict(dtype=dtype, kv_dtype=kv_dtype, page_size=page_size,
                                         device=device, attention_backend=attention_backend, **more),
                                         loaded.spec, cfg.tensor_parallel_size, self.device, cfg.dist_timeout_s)
                   if cfg.tensor_parallel_size > 1 and _tp_group is None else None)
        tp_group = self.tp.group if self.tp is not None else _tp_group
        self.model = LlamaModel(loaded.spec, loaded.state_dict, loaded.dtype, self.device, fused=triton, tp=tp_group)
        del loaded
        # token ids must index the embedding (a config may claim more rows than the checkpoint holds)
        self.vocab_size = min(self.spec.vocab_size, self.model.embed.shape[0], self.model.vocab_rows)
        self.kv_dtype = (KVDtype.for_compute(str(self.dtype).removeprefix("torch.")) if cfg.kv_dtype == "auto"
                         else KVDtype(cfg.kv_dtype))
        s = self.model.shard_spec  # this rank's heads (all of them without tensor parallelism)
        num_pages = cfg.num_pages or default_num_pages(s, cfg, self.kv_dtype, self.dtype, self.device)
        if tp_group is not None:
            num_pages = tp_group.min_over_ranks(num_pages)  # every rank's pool has the same page ids
        use_graphs = triton and self.device.type == "cuda" and not cfg.enforce_eager
        # with CUDA graphs one more page, never in the pool, takes the padding rows' K/V
        self.kv = KVStore(s.num_layers, num_pages + use_graphs, cfg.page_size, s.num_kv_heads, s.head_dim,
                          self.kv_dtype, self.device, self.dtype)
        # KIVI's recent-token window (INT pages by default): shadow pages for every running row's latest tokens
        self.kv_window = kv_window_for(self.kv_dtype, cfg.kv_window)
        self.kv_sink = kv_sink_for(self.kv_dtype, self.kv_window, cfg.page_size, cfg.kv_sink)
        window = (KVWindow(self.kv, self.kv_window, cfg.scheduler.max_running, self.kv_sink) if self.kv_window
                  else None)
        self.attention = PagedAttention(self.kv, s.num_q_heads, s.head_dim, s.head_dim ** -0.5, attention_backend,
                                        window=window)
        cascade_rule = RULE_NEVER if window is not None else rule_for(self.kv_dtype)
        self.graphs = (DecodeGraphs(self.model, self.attention, cfg.scheduler.max_running,
                                    -(-self.max_model_len // cfg.page_size), scratch_page=num_pages,
                                    cascade=cfg.scheduler.cascade and cascade_rule is not RULE_NEVER)
                       if use_graphs else None)
        if self.graphs is not None:
            self.graphs.capture_all()
            floor = cascade_rule.floor if cfg.scheduler.cascade else None
            if floor is not None:  # cascade graphs too, so a workload's cascade steps neither compile nor capture
                self.graphs.warm_cascade(*floor)
        self.pool = PagePool(num_pages)
        self.cache = RadixCache(self.pool, page_size=cfg.page_size, events=kv_events)
        # cascade=True: decode steps whose rows share cached pages read them once per group (attention.py);
        # the KV dtype's rule says when a group is worth it (INT4/INT2: never)
        self.scheduler = Scheduler(self.pool, self.cache, cfg.scheduler, cfg.page_size,
                                   cascade_rule=cascade_rule)
        self._rids = itertools.count()
        self._seeds = torch.Generator().manual_seed(cfg.seed)  # per-request seeds when none is given
        self._t0 = time.monotonic()
        self.num_steps = 0
        self._recorded: list[Request] | None = None  # requests added while recording
        self._busy = threading.Lock()  # held by the one call running (generate, step, add_requests)
        # tensor parallel workers read each step's input ids from the host batch: no steps ahead there
        self.async_scheduling = (self.device.type == "cuda" and self.tp is None if cfg.async_scheduling is None
                                 else cfg.async_scheduling)
        self._ahead: _Launched | None = None  # the step queued behind the last one returned (async scheduling)
        self.steps_ahead = 0  # steps that were scheduled ahead (for tests and benchmarks)
        if self.device.type == "cuda":  # two pinned token buffers, alternate steps (one may still be filling)
            rows = cfg.scheduler.max_running
            self._token_hosts = [torch.zeros(rows, dtype=torch.int64, pin_memory=True) for _ in range(2)]
            self._token_events = [torch.cuda.Event(), torch.cuda.Event()]
            self._token_turn = 0

    @property
    def num_pages(self) -> int:
        return self.pool.num_pages

    @property
    def max_model_len(self) -> int:
        """Prompt + output tokens a request may hold: the model's context, or less if configured."""
        cap = self.config.max_model_len
        return self.spec.max_position if cap is None else min(cap, self.spec.max_position)

    @property
    def dead(self) -> bool:
        """True once the engine can serve nothing more (its tensor-parallel ranks were shut down after a
        failure); a server should then stop and report unhealthy."""
        return self.tp is not None and self.tp.failed

    def close(self) -> None:
        """Stop the tensor-parallel worker ranks, if any (idempotent; also run by `with LLM(...)`, when the
        LLM is garbage-collected, and at interpreter exit)."""
        if self.tp is not None:
            self.tp.close()

    def __enter__(self) -> LLM:  # noqa: PYI034 - LLM is not subclassed
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def reset_prefix_cache(self) -> bool:
        """Evict every cached prefix no running request holds (vLLM's name); True when the tree
        is now empty. With no request in flight, the pool is then entirely free."""
        self.cache.evict(self.pool.num_pages)
        return self.cache.num_cached_pages == 0

    # ------------------------------------------------------------------ requests

    def encode(self, prompt: Prompt, index: int = 0) -> list[int]:
        """Token ids of one prompt, validated (ValueError/TypeError naming the prompt and problem).

        prompt: text, token ids, or vLLM's {"prompt": text} / {"prompt_token_ids": ids}."""
        if isinstance(prompt, dict):
            keys = set(prompt) & {"prompt", "prompt_token_ids"}
            if len(keys) != 1:
                raise ValueError(f"prompt {index}: a dict prompt needs exactly one of 'prompt' or "
                                 f"'prompt_token_ids', got keys {sorted(prompt)}")
            prompt = prompt[keys.pop()]
            if prompt is None or isinstance(prompt, dict):
                raise TypeError(f"prompt {index}: the dict's value must be text or token ids, got {prompt!r}")
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError(f"prompt {index} is text but the model has no tokenizer; pass token ids")
            if not prompt:
                raise ValueError(f"prompt {index} is empty")
            ids = list(self.tokenizer(prompt).input_ids)
        else:
            if not isinstance(prompt, Iterable):
                raise TypeError(f"prompt {index} must be a string or a sequence of token ids, got {prompt!r}")
            ids = [_token_id(t) for t in prompt]
            if None in ids:
                raise TypeError(f"prompt {index} holds a token id that is not an integer")
        if not ids:
            raise ValueError(f"prompt {index} is empty")
        V = self.vocab_size
        bad = [t for t in ids if not 0 <= t < V]
        if bad:
            raise ValueError(f"prompt {index}: token id {bad[0]} is outside the vocabulary [0, {V})")
        return ids

    def _check_fits(self, ids: list[int], params: SamplingParams, index: int) -> None:
        """ValueError naming the prompt when prompt + max_tokens exceed the context, window or pool."""
        total = len(ids) + params.max_tokens
        if total > self.max_model_len:
            raise ValueError(f"prompt {index}: {len(ids)} prompt tokens + max_tokens {params.max_tokens} = {total} "
                             f"exceeds the model's context of {self.max_model_len} tokens")
        window = self.spec.sliding_window
        if window is not None and total > window:
            raise ValueError(f"prompt {index}: {total} tokens exceed the model's sliding window of {window}; "
                             f"windowed attention is not implemented, so only sequences within it are served")
        ps = self.config.page_size
        if -(-total // ps) > self.num_pages:
            raise ValueError(f"prompt {index}: {total} tokens need {-(-total // ps)} KV pages, "
                             f"more than the pool's {self.num_pages}")

    def _make_request(self, ids: list[int], params: SamplingParams, index: int = 0,
                      prompt_text: str | None = None) -> Request:
        """A Request for validated ids: takes the next request id and, unseeded, the next seed.
        Its namespace is params.cache_salt: requests with different salts never share pages."""
        stop = set(params.stop_token_ids)
        if not params.ignore_eos:
            stop |= self.eos_token_ids
        seed = (params.seed + index if params.seed is not None
                else int(torch.randint(0, 2**62, (1,), generator=self._seeds)))
        row = _RowSampling(params, seed, index, prompt_text, [] if params.logprobs is not None else None)
        return Request(rid=next(self._rids), prompt=ids, max_tokens=params.max_tokens, arrival_s=self._now(),
                       namespace=params.cache_salt, stop_token_ids=frozenset(stop), sampling=row)

    def add_requests(self, prompts: Sequence[Prompt],
                     params: SamplingParams | Sequence[SamplingParams]) -> list[Request]:
        """Validate every prompt, then queue them all (all or nothing: a refused call consumes no
        request id and no seed, so later outputs equal a fresh engine's). A prompt whose params
        have n > 1 gives n requests (consecutive, completion index in request.sampling.index)."""
        with self._exclusive("add_requests"):
            return self._add_requests(prompts, params)

    def _add_requests(self, prompts: Any, params: Any) -> list[Request]:
        if isinstance(prompts, (str, bytes)) or not isinstance(prompts, Sequence):
            raise TypeError(f"prompts must be a list of prompts (str, token ids or dicts), "
                            f"got {type(prompts).__name__}")
        if isinstance(params, SamplingParams):
            params = [params] * len(prompts)
        if isinstance(params, (str, bytes)) or not isinstance(params, Sequence):
            raise TypeError(f"sampling_params must be a SamplingParams or a list of them, got {params!r}")
        if len(params) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(params)} SamplingParams")
        for i, p in enumerate(params):
            if not isinstance(p, SamplingParams):
                raise TypeError(f"params {i} must be a SamplingParams, got {p!r}")
        ids = [self.encode(p, i) for i, p in enumerate(prompts)]
        for i, (tokens, sp) in enumerate(zip(ids, params)):
            self._check_fits(tokens, sp, i)
            if sp.stop and self.tokenizer is None:
                raise ValueError(f"params {i}: stop strings need a tokenizer; this model has none "
                                 f"(use stop_token_ids)")
            if sp.logprobs is not None and sp.logprobs > self.vocab_size:
                raise ValueError(f"params {i}: logprobs {sp.logprobs} exceeds the vocabulary ({self.vocab_size})")
        texts = [_prompt_text(p) for p in prompts]
        reqs = [self._make_request(tokens, sp, j, text) for tokens, sp, text in zip(ids, params, texts)
                for j in range(sp.n)]
        added: list[Request] = []
        try:
            for r in reqs:
                self.scheduler.add(r, r.arrival_s)
                added.append(r)
        except BaseException:
            for r in added:
                self.scheduler.abort(r.rid)
            raise
        if self._recorded is not None:
            self._recorded.extend(reqs)
        return reqs

    def start_recording(self) -> None:
        """Keep every request added from now on, for `save_recording` (off by default: it grows)."""
        self._recorded = []

    def save_recording(self, path: str) -> int:
        """Write the recorded requests as radixkv trace JSONL (replayable); returns how many."""
        if self._recorded is None:
            raise RuntimeError("start_recording() was not called")
        from radixkv.workloads.traces import record_requests

        return record_requests(path, self._recorded)

    def has_work(self) -> bool:
        return self.scheduler.has_work()

    def _now(self) -> float:
        return time.monotonic() - self._t0

    # ------------------------------------------------------------------ the step

    def step(self) -> list[Request]:
        """Run one scheduler step; returns the requests that finished in it. A step is failure-
        atomic: if anything raises before its tokens are applied (a kernel, an out-of-memory, a
        KeyboardInterrupt), the batch goes back to the scheduler as if it never ran, the exception
        propagates, and the next step recomputes the same work."""
        with self._exclusive("step"):
            return self._step()

    @torch.inference_mode()
    def _step(self) -> list[Request]:
        try:
            launched, self._ahead = self._ahead, None
            if launched is None:
                batch = self.scheduler.schedule(self._now())
                if batch is None:
                    return []
                launched = self._launch(batch)
            if self.async_scheduling and self._may_run_ahead(launched):
                nxt = self.scheduler.schedule_ahead(self._now())
                if nxt is not None:
                    self._ahead = self._launch(nxt, launched)
                    self.steps_ahead += 1
            tokens = self._collect(launched)  # the step's one wait on the device
            finished = self.scheduler.update(launched.batch, tokens, self._now())
        except BaseException:
            self._ahead = None
            # what was not updated never happened: abandoning the oldest batch in flight drops the one
            # scheduled ahead of it too (update() refuses a bad call before it changes anything; one that
            # raises midway has made the step ahead the one in flight)
            if self.scheduler.in_flight is not None:
                self.scheduler.abandon(self.scheduler.in_flight)
            raise
        batch = launched.batch
        self.num_steps += 1
        for b, lp in launched.logprobs.items():
            batch.requests[b].sampling.logprobs.append(lp)
        finished = self._stop_strings(batch, finished)
        if self._ahead is not None and all(r.finished for r in self._ahead.batch.requests):
            self.scheduler.abandon(self._ahead.batch)  # nothing left to read from it
            self._ahead = None
        return finished

    def _may_run_ahead(self, launched: _Launched) -> bool:
        """Whether the step after `launched` may be scheduled before its tokens are read: every row
        samples, and none needs its own latest token on the host to sample the next (penalties,
        min_tokens) or asks for logprobs (read when the step is launched)."""
        batch = launched.batch
        if not all(batch.sample):
            return False
        for r in batch.requests:
            p = r.sampling.params if isinstance(r.sampling, _RowSampling) else None
            if p is None or p.penalized or p.min_tokens or p.logprobs is not None:
                return False
        return True

    def _stop_strings(self, batch: Batch, finished: list[Request]) -> list[Request]:
        """End the step's requests whose detokenised output now holds one of their stop strings
        (finished in the scheduler at once, counted as completed: their computed blocks stay cached)."""
        if self.tokenizer is None:
            return finished
        done = {r.rid for r in finished}
        for b, s in enumerate(batch.sample):
            r = batch.requests[b]
            if r.finished and r.rid not in done:  # a row of a step ahead whose request had finished: dropped
                continue
            p = r.sampling.params if s and isinstance(r.sampling, _RowSampling) else None
            if p is None or not p.stop or len(r.output) < p.min_tokens:
                continue
            # the stop strings can only have completed in the last few tokens: decode a window
            window = r.output[-(2 * max(map(len, p.stop)) + 8):]
            hit = _find_stop(self.tokenizer.decode(window, skip_special_tokens=p.skip_special_tokens), p.stop)
            if hit is None:
                continue
            r.sampling.stop_reason = hit[1]
            if r.rid not in done:
                self.scheduler.finish(r.rid, FinishReason.STOP)
                finished.append(r)
            r.finish_reason = FinishReason.STOP
        return finished

    def forward_logits(self, batch: Batch, use_graphs: bool = True, input_ids: Tensor | None = None) -> Tensor:
        """Logits [S, V] float32 of the batch's sampling rows: from a CUDA graph when the step fits
        one (and use_graphs), else eagerly. Stores the step's K/V either way (on every rank). input_ids:
        int64 [T] on the device in place of batch.input_ids (a step scheduled ahead; not with tensor
        parallelism, whose workers read the batch's host ids: async scheduling is off there)."""
        if self.tp is not None:  # tensor parallel: the workers run the same forward over their shards
            if input_ids is not None:
                raise RuntimeError("a step scheduled ahead cannot run tensor parallel (its ids are on rank 0's device)")
            return self.tp.run_step(batch, use_graphs, self.forward_local)
        return self.forward_local(batch, use_graphs, input_ids)

    def forward_local(self, batch: Batch, use_graphs: bool = True, input_ids: Tensor | None = None) -> Tensor:
        """forward_logits on this process's shard only (a tensor-parallel worker runs this each step)."""
        if use_graphs and self.graphs is not None and self.graphs.fits(batch):
            return self.graphs.run(batch, input_ids)  # every decode row samples
        dev = self.device
        self.attention.plan(batch)
        last = [batch.q_start[b] + batch.q_lens[b] - 1 for b, s in enumerate(batch.sample) if s]
        if input_ids is None:
            input_ids = host_to_device(batch.input_ids, torch.int64, dev)
        return self.model.forward(input_ids, host_to_device(batch.positions, torch.int64, dev), self.attention,
                                  host_to_device(last, torch.int64, dev))

    def _launch(self, batch: Batch, prev: _Launched | None = None) -> _Launched:
        """Queue the forward pass and the sampler of `batch` (one token per sampling row) and the copy
        of the tokens to the host; read the logprobs of the rows that asked for them. prev: the step
        `batch` was scheduled ahead of (its tokens are batch's inputs). Changes no request."""
        dev = self.device
        rows = [b for b, s in enumerate(batch.sample) if s]
        ids = None
        if batch.follows is not None:
            # every row of prev samples (_may_run_ahead), so follows indexes prev.drawn
            ids = (prev.drawn if batch.follows == prev.rows
                   else prev.drawn.index_select(0, host_to_device(batch.follows, torch.int64, dev)))
        raw = logits = self.forward_logits(batch, input_ids=ids)
        reqs = [batch.requests[b] for b in rows]
        params = [r.sampling.params for r in reqs]
        if any(p.penalized or p.min_tokens for p in params):
            logits = penalize(logits, params, [r.prompt for r in reqs], [r.output for r in reqs],
                              [r.stop_token_ids for r in reqs])
        if all(p.greedy for p in params):
            drawn = logits.argmax(dim=-1)
        else:
            # the index in its request's output of the token each row draws (one past the host's
            # output for a step scheduled ahead)
            counters = [batch.seq_lens[b] - len(r.prompt) for b, r in zip(rows, reqs)]
            drawn = sample(logits, sampling_rows(params, [r.sampling.seed for r in reqs], counters,
                                                 logits.shape[1], dev))
        want = [i for i, p in enumerate(params) if p.logprobs is not None]
        logprobs: dict[int, dict[int, float]] = {}
        if want:
            idx = torch.tensor(want, dtype=torch.int64, device=dev)
            lps = top_logprobs(raw.index_select(0, idx), drawn.index_select(0, idx),
                               [params[i].logprobs for i in want])
            logprobs = {rows[i]: lp for i, lp in zip(want, lps)}
        host = ready = None
        if dev.type == "cuda":
            turn = self._token_turn
            self._token_turn ^= 1
            if len(rows) > self._token_hosts[turn].numel():
                self._token_hosts[turn] = torch.zeros(len(rows), dtype=torch.int64, pin_memory=True)
            host, ready = self._token_hosts[turn][:len(rows)], self._token_events[turn]
            host.copy_(drawn, non_blocking=True)
            ready.record()
        return _Launched(batch, rows, drawn, host, ready, logprobs)

    def _collect(self, launched: _Launched) -> list[int | None]:
        """The launched step's tokens by row (None for rows that do not sample): waits for them."""
        if launched.ready is not None:
            launched.ready.synchronize()
            drawn = launched.host.tolist()
        else:
            drawn = launched.drawn.tolist()
        tokens: list[int | None] = [None] * len(launched.batch.requests)
        for b, t in zip(launched.rows, drawn):
            tokens[b] = t
        return tokens

    @contextlib.contextmanager
    def _exclusive(self, what: str) -> Iterator[None]:
        """One caller at a time: a second thread, or a re-entrant call, is refused before it
        touches any state. (Many callers share an engine through one loop that owns the LLM.)"""
        if not self._busy.acquire(blocking=False):
            raise RuntimeError(f"LLM.{what}() refused: this LLM is busy with another call (another thread, "
                               f"or a call from inside one of its own); an LLM serves one caller at a time")
        try:
            yield
        finally:
            self._busy.release()

    def completion_of(self, req: Request) -> CompletionOutput:
        """vLLM's CompletionOutput of one finished request."""
        assert req.finish_reason is not None, f"request {req.rid} has not finished"
        row = req.sampling if isinstance(req.sampling, _RowSampling) else None
        p = row.params if row is not None else SamplingParams()
        text = None
        if self.tokenizer is not None:
            text = self.tokenizer.decode(req.output, skip_special_tokens=p.skip_special_tokens)
        stop_reason = row.stop_reason if row is not None else None
        if isinstance(stop_reason, str) and text is not None:
            i, s = _find_stop(text, p.stop) or (len(text), stop_reason)
            text = text[: i + len(s)] if p.include_stop_str_in_output else text[:i]
            stop_reason = s
        elif (req.finish_reason is FinishReason.STOP and req.output and req.output[-1] in p.stop_token_ids):
            stop_reason = req.output[-1]
        lps = None if row is None or row.logprobs is None else list(row.logprobs)
        cum = None if lps is None else float(sum(d[t] for d, t in zip(lps, req.output)))
        return CompletionOutput(row.index if row is not None else 0, text, list(req.output),
                                req.finish_reason.value, lps, stop_reason, cum)

    def output_of(self, req: Request | Sequence[Request]) -> RequestOutput:
        """The RequestOutput of one finished request, or of a prompt's n finished requests."""
        reqs = [req] if isinstance(req, Request) else list(req)
        first = reqs[0]
        outs = [self.completion_of(r) for r in reqs]
        row = first.sampling if isinstance(first.sampling, _RowSampling) else None
        return RequestOutput(str(first.rid), list(first.prompt), outs[0].token_ids, outs[0].text,
                             first.cached_tokens, first.finish_reason,
                             prompt=row.prompt_text if row is not None else None, outputs=outs, finished=True)

    def generate(self, prompts: Prompt | Sequence[Prompt],
                 sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
                 use_tqdm: bool = False) -> list[RequestOutput]:
        """Generate for every prompt (str or token ids); outputs in prompt order.

        sampling_params: one for all prompts or one per prompt (default: SamplingParams()).
        Each RequestOutput holds its prompt's n completions in `outputs` (vLLM's shape).
        use_tqdm: show a progress bar of finished prompts (vLLM's flag; off by default here).
        """
        if _is_single_prompt(prompts):
            prompts = [prompts]  # one prompt given bare: text, token ids, or a 1-D array
        params = SamplingParams() if sampling_params is None else sampling_params
        with self._exclusive("generate"):
            reqs = self._add_requests(list(prompts) if isinstance(prompts, Iterable) else prompts, params)
            try:
                self._run_until_done(reqs, use_tqdm)
            except BaseException:  # withdraw our own requests; anyone else's stay queued
                for r in reqs:
                    if not r.finished:
                        self.scheduler.abort(r.rid)
                raise
        groups: list[list[Request]] = []
        for r in reqs:
            if r.sampling.index == 0:
                groups.append([])
            groups[-1].append(r)
        return [self.output_of(g) for g in groups]

    def chat(self, messages: Sequence[dict[str, Any]] | Sequence[Sequence[dict[str, Any]]],
             sampling_params: SamplingParams | Sequence[SamplingParams] | None = None, use_tqdm: bool = False,
             *, chat_template: str | None = None, add_generation_prompt: bool = True,
             continue_final_message: bool = False) -> list[RequestOutput]:
        """vLLM's LLM.chat: one conversation (a list of {"role", "content"} dicts) or a list of them,
        rendered with the tokenizer's chat template (or `chat_template`), then generated.
        ValueError when the model has no tokenizer or the tokenizer has no chat template."""
        if self.tokenizer is None:
            raise ValueError("LLM.chat needs a tokenizer with a chat template; this model has no tokenizer "
                             "(use generate with token ids)")
        template = chat_template or getattr(self.tokenizer, "chat_template", None)
        if not template:
            raise ValueError("LLM.chat: the tokenizer has no chat template; pass chat_template=... or use generate")
        if isinstance(messages, Sequence) and messages and isinstance(messages[0], dict):
            conversations = [messages]
        elif isinstance(messages, Sequence) and not isinstance(messages, (str, bytes)) and messages:
            conversations = list(messages)
        else:
            raise TypeError(f"messages must be a list of {{'role', 'content'}} dicts or a list of such lists, "
                            f"got {messages!r}")
        texts, prompts = [], []
        for i, conv in enumerate(conversations):
            if (isinstance(conv, (str, bytes)) or not isinstance(conv, Sequence)
                    or not all(isinstance(m, dict) and "role" in m for m in conv)):
                raise TypeError(f"conversation {i} must be a list of {{'role', 'content'}} dicts, got {conv!r}")
            text = self.tokenizer.apply_chat_template(
                list(conv), chat_template=template, tokenize=False,
                add_generation_prompt=add_generation_prompt and not continue_final_message,
                continue_final_message=continue_final_message)
            texts.append(text)
            prompts.append(list(self.tokenizer(text, add_special_tokens=False).input_ids))
        outs = self.generate(prompts, sampling_params, use_tqdm)
        return [dataclasses.replace(o, prompt=t) for o, t in zip(outs, texts)]

    def _run_until_done(self, reqs: list[Request], use_tqdm: bool) -> None:
        pending = {r.rid for r in reqs}
        bar = None
        if use_tqdm:
            from tqdm import tqdm

            bar = tqdm(total=len(reqs), unit="prompt", desc="generate")
        try:
            while pending:
                if not self.scheduler.has_work():
                    raise RuntimeError(f"scheduler idle with requests {sorted(pending)} unfinished")
                done = [r.rid for r in self._step() if r.rid in pending]
                pending.difference_update(done)
                if bar is not None:
                    bar.update(len(done))
        finally:
            if bar is not None:
                bar.close()

    def session(self, system: str | Sequence[int] | None = None, params: SamplingParams | None = None,
                cache_salt: str | None = None) -> Session:
        """A multi-turn chat whose every turn reuses the KV of all earlier turns.

        system: text, or token ids (a model without tokenizer takes ids only). cache_salt: the
        chat's prefix-cache namespace (every turn's params get it): sessions with different salts
        never share pages."""
        return Session(self, system, params or SamplingParams(temperature=0.0, max_tokens=64), cache_salt=cache_salt)


def _token_id(t: Any) -> int | None:
    """t as a token id (int, numpy or 0-d torch integer), or None when it is not an integer."""
    if isinstance(t, bool):
        return None
    try:
        return operator.index(t)
    except TypeError:
        return None


def _prompt_text(prompt: Any) -> str | None:
    """The prompt as text when it was given as text (vLLM's RequestOutput.prompt), else None."""
    if isinstance(prompt, dict):
        prompt = prompt.get("prompt")
    return prompt if isinstance(prompt, str) else None


def _find_stop(text: str, stops: Sequence[str]) -> tuple[int, str] | None:
    """(position, string) of the earliest stop string in text, or None."""
    best: tuple[int, str] | None = None
    for s in stops:
        i = text.find(s)
        if i >= 0 and (best is None or i < best[0]):
            best = (i, s)
    return best


def _is_single_prompt(prompts: Any) -> bool:
    """True for one bare prompt (a str, a vLLM dict prompt, a flat sequence of token ids, a 1-D
    array or tensor)."""
    if isinstance(prompts, (str, dict)):
        return True
    if getattr(prompts, "ndim", None) == 1:
        return True
    return (isinstance(prompts, Sequence) and len(prompts) > 0
            and all(_token_id(t) is not None for t in prompts))


def pick_device(name: str | None) -> torch.device:
    """The device `name` names (CUDA when None and available), checked to exist in this torch build."""
    try:
        device = torch.device(name or ("cuda" if torch.cuda.is_available() else "cpu"))
    except RuntimeError as e:
        raise ValueError(f"invalid device {name!r}: {e}") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device {name!r} asked for, but this torch build ({torch.__version__}) has no "
                             f"usable CUDA GPU; use device='cpu'")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ValueError(f"device {name!r}: only {torch.cuda.device_count()} CUDA device(s) visible")
    elif device.type != "cpu":
        raise ValueError(f"device {name!r} is not supported; use 'cuda', 'cuda:N' or 'cpu'")
    return device
