"""LLM: the step loop over scheduler, model and sampler; generate(); sessions.

One step: the scheduler picks work (prefix matches give cached pages, so only uncached
tokens are computed) -> attention is planned for the Batch -> the model runs the ragged
batch, storing new K/V -> rows with `sample[b]` draw a token -> `scheduler.update` appends
it, and finished requests are inserted into the radix tree (prompt + output) and release
their pages, so the next turn of a chat or the next few-shot prompt hits.

Every request is validated before anything is scheduled; a bad one raises and leaves
requests already in flight untouched.
"""
from __future__ import annotations

import contextlib
import itertools
import threading
import operator
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, NamedTuple

import torch

from radixkv.batch import Batch
from radixkv.cache import PagePool, RadixCache
from radixkv.config import EngineConfig, KVDtype
from radixkv.request import Request, RequestOutput
from radixkv.scheduler import Scheduler

from .attention import Backend, PagedAttention
from .cuda_graphs import DecodeGraphs
from .kv_store import KVStore, default_num_pages
from .model import LlamaModel
from .sampling import SamplingParams, sample, sampling_rows
from .session import Session
from .weights import LoadedModel, load_model

Prompt = str | Sequence[int]


class _RowSampling(NamedTuple):
    """What the engine keeps in Request.sampling."""

    params: SamplingParams
    seed: int  # the request's, or one drawn from the engine's seed stream


class LLM:
    """A Llama-family model served from a paged, prefix-cached KV pool.

    model: a local Hugging Face folder, a .gguf file (converted once, cached), a hub id already in the
    local Hugging Face cache, a config.json or a transformers PretrainedConfig (seeded random weights).
    attention_backend: Backend.AUTO runs Triton on CUDA and the PyTorch reference on CPU;
    Backend.TRITON on CPU needs TRITON_INTERPRET=1 (tests).
    Other keyword arguments are EngineConfig fields (num_pages, seed, scheduler, ...).
    """

    def __init__(self, model: Any, dtype: Any = "auto", kv_dtype: Any = "auto", page_size: int = 16,
                 device: str | torch.device | None = None, *, attention_backend: Backend = Backend.AUTO,
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
        self.model = LlamaModel(loaded.spec, loaded.state_dict, loaded.dtype, self.device, fused=triton)
        del loaded
        # token ids must index the embedding (a config may claim more rows than the checkpoint holds)
        self.vocab_size = min(self.spec.vocab_size, self.model.embed.shape[0], self.model.lm_head.shape[0])
        self.kv_dtype = (KVDtype.for_compute(str(self.dtype).removeprefix("torch.")) if cfg.kv_dtype == "auto"
                         else KVDtype(cfg.kv_dtype))
        num_pages = cfg.num_pages or default_num_pages(self.spec, cfg, self.kv_dtype, self.dtype, self.device)
        s = self.spec
        use_graphs = triton and self.device.type == "cuda" and not cfg.enforce_eager
        # with CUDA graphs one more page, never in the pool, takes the padding rows' K/V
        self.kv = KVStore(s.num_layers, num_pages + use_graphs, cfg.page_size, s.num_kv_heads, s.head_dim,
                          self.kv_dtype, self.device, self.dtype)
        self.attention = PagedAttention(self.kv, s.num_q_heads, s.head_dim, s.head_dim ** -0.5, attention_backend)
        self.graphs = (DecodeGraphs(self.model, self.attention, cfg.scheduler.max_running,
                                    -(-self.max_model_len // cfg.page_size), scratch_page=num_pages)
                       if use_graphs else None)
        if self.graphs is not None:
            self.graphs.capture_all()
        self.pool = PagePool(num_pages)
        self.cache = RadixCache(self.pool, page_size=cfg.page_size)
        self.scheduler = Scheduler(self.pool, self.cache, cfg.scheduler, cfg.page_size)
        self._rids = itertools.count()
        self._seeds = torch.Generator().manual_seed(cfg.seed)  # per-request seeds when none is given
        self._t0 = time.monotonic()
        self.num_steps = 0
        self._recorded: list[Request] | None = None  # requests added while recording
        self._busy = threading.Lock()  # held by the one call running (generate, step, add_requests)

    @property
    def num_pages(self) -> int:
        return self.pool.num_pages

    @property
    def max_model_len(self) -> int:
        """Prompt + output tokens a request may hold: the model's context, or less if configured."""
        cap = self.config.max_model_len
        return self.spec.max_position if cap is None else min(cap, self.spec.max_position)

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

    def _make_request(self, ids: list[int], params: SamplingParams) -> Request:
        """A Request for validated ids: takes the next request id and, unseeded, the next seed."""
        stop = set(params.stop_token_ids)
        if not params.ignore_eos:
            stop |= self.eos_token_ids
        seed = params.seed if params.seed is not None else int(torch.randint(0, 2**62, (1,), generator=self._seeds))
        return Request(rid=next(self._rids), prompt=ids, max_tokens=params.max_tokens,
                       arrival_s=self._now(), stop_token_ids=frozenset(stop), sampling=_RowSampling(params, seed))

    def add_requests(self, prompts: Sequence[Prompt],
                     params: SamplingParams | Sequence[SamplingParams]) -> list[Request]:
        """Validate every prompt, then queue them all (all or nothing: a refused call consumes no
        request id and no seed, so later outputs equal a fresh engine's)."""
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
        reqs = [self._make_request(tokens, sp) for tokens, sp in zip(ids, params)]
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
        batch = self.scheduler.schedule(self._now())
        if batch is None:
            return []
        try:
            tokens = self._run(batch)
            finished = self.scheduler.update(batch, tokens, self._now())
        except BaseException:
            if self.scheduler.in_flight is batch:  # update() refuses before it changes anything
                self.scheduler.abandon(batch)
            raise
        self.num_steps += 1
        return finished

    def forward_logits(self, batch: Batch, use_graphs: bool = True) -> torch.Tensor:
        """Logits [S, V] float32 of the batch's sampling rows: from a CUDA graph when the step fits
        one (and use_graphs), else eagerly. Stores the step's K/V either way."""
        if use_graphs and self.graphs is not None and self.graphs.fits(batch):
            return self.graphs.run(batch)  # every decode row samples
        dev = self.device
        self.attention.plan(batch)
        last = [batch.q_start[b] + batch.q_lens[b] - 1 for b, s in enumerate(batch.sample) if s]
        return self.model.forward(torch.tensor(batch.input_ids, dtype=torch.int64, device=dev),
                                  torch.tensor(batch.positions, dtype=torch.int64, device=dev),
                                  self.attention, torch.tensor(last, dtype=torch.int64, device=dev))

    def _run(self, batch: Batch) -> list[int | None]:
        """The forward pass and the sampler: one token per sampling row (None for the others)."""
        dev = self.device
        rows = [b for b, s in enumerate(batch.sample) if s]
        logits = self.forward_logits(batch)
        reqs = [batch.requests[b] for b in rows]
        params = [r.sampling.params for r in reqs]
        if all(p.greedy for p in params):
            drawn = logits.argmax(dim=-1).tolist()  # the step's one host sync
        else:
            sampling = sampling_rows(params, [r.sampling.seed for r in reqs], [len(r.output) for r in reqs],
                                     logits.shape[1], dev)
            drawn = sample(logits, sampling).tolist()
        tokens: list[int | None] = [None] * len(batch.requests)
        for b, t in zip(rows, drawn):
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

    def output_of(self, req: Request) -> RequestOutput:
        assert req.finish_reason is not None, f"request {req.rid} has not finished"
        text = None if self.tokenizer is None else self.tokenizer.decode(req.output, skip_special_tokens=True)
        return RequestOutput(req.rid, list(req.prompt), list(req.output), text, req.cached_tokens, req.finish_reason)

    def generate(self, prompts: Prompt | Sequence[Prompt],
                 sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
                 use_tqdm: bool = False) -> list[RequestOutput]:
        """Generate for every prompt (str or token ids); outputs in prompt order.

        sampling_params: one for all prompts or one per prompt (default: SamplingParams()).
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
        return [self.output_of(r) for r in reqs]

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

    def session(self, system: str | Sequence[int] | None = None, params: SamplingParams | None = None) -> "Session":
        """A multi-turn chat whose every turn reuses the KV of all earlier turns.

        system: text, or token ids (a model without tokenizer takes ids only)."""
        return Session(self, system, params or SamplingParams(temperature=0.0, max_tokens=64))


def _token_id(t: Any) -> int | None:
    """t as a token id (int, numpy or 0-d torch integer), or None when it is not an integer."""
    if isinstance(t, bool):
        return None
    try:
        return operator.index(t)
    except TypeError:
        return None


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
