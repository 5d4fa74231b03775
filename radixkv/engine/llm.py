"""LLM: the offline front end. generate(), chat(), sessions; the step loop is EngineCore's.

    LLM.generate(prompts, params)
      1. InputProcessor (inputs.py): prompts -> validated Requests, all or nothing
      2. EngineCore (core.py): queue them; step until they finish (schedule -> run -> update)
      3. OutputProcessor (outputs.py): each step's deltas -> stop strings (ended in the core at once);
         finished requests -> RequestOutputs

The model, the KV pool and the sampler are the ModelRunner's (runner.py), the scheduler, tree and
pool the EngineCore's; `llm.runner` and `llm.core` reach them. The server drives the same core from
a process of its own (radixkv/serve/).
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import threading
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from radixkv.cache.events import KVEventPublisher
from radixkv.config import EngineConfig, budget_given
from radixkv.engine_args import vllm_port_kwargs
from radixkv.request import FinishReason, Request, RequestOutput
from radixkv.sampling_params import SamplingParams

from .attention import Backend
from .core import EngineCore, RequestDelta, StepFailed
from .inputs import InputProcessor, Prompt, token_id
from .outputs import OutputProcessor, RequestState, Update
from .runner import ModelRunner
from .session import Session
from .warmup import prepare_engine, use_radixkv_triton_cache
from .weights import folder_tokenizer, model_source


class LLM:
    """A Llama-family model served from a paged, prefix-cached KV pool.

    model: a local Hugging Face folder, a .gguf file (converted once, cached), a hub id already in the
    local Hugging Face cache, a config.json or a transformers PretrainedConfig (seeded random weights).
    attention_backend: Backend.AUTO runs Triton on CUDA and the PyTorch reference on CPU;
    Backend.TRITON on CPU needs TRITON_INTERPRET=1 (tests).
    cascade: decode steps whose rows share cached prefix pages attend through the cascade kernels
    (each shared prefix read once per group), replayed from CUDA graphs (runner.py); not given: on with CUDA
    (the KV dtype's rule decides each step), off on CPU. max_num_seqs not given: sized from the KV pool on
    CUDA, 256 on CPU (config.engine_max_running); `llm.config` holds the decided values.
    kv_events: a publisher (radixkv.cache.events, e.g. QueuePublisher) told of every block the prefix cache
    stores or drops, in vLLM's KV event shape, so a router can follow what this engine holds.
    Other keyword arguments are EngineConfig fields (num_pages, seed, scheduler, ...) or vLLM's names.
    """

    def __init__(self, model: Any, dtype: Any = "auto", kv_dtype: Any = "auto", page_size: int = 16,
                 device: Any = None, *, attention_backend: Backend = Backend.AUTO,
                 kv_events: KVEventPublisher | None = None, **more: Any) -> None:
        more = vllm_port_kwargs(more)
        tokenizer = more.pop("tokenizer", None)
        self.config = cfg = engine_config(dtype, kv_dtype, page_size, device, more)
        use_radixkv_triton_cache()  # compiled kernels persist across restarts
        self.runner, loaded = ModelRunner.load(model_source(model, cfg.load_format), cfg, attention_backend)
        self.tokenizer, self.hf_config, self.eos_token_ids = loaded.tokenizer, loaded.config, loaded.eos_token_ids
        if tokenizer is not None and tokenizer != model:  # vLLM's tokenizer=: another folder's tokenizer
            self.tokenizer = tokenizer_from(str(tokenizer))
        self.config = cfg = self.runner.config  # with the defaults the engine decided once the pool was sized
        self.core = EngineCore(self.runner, cfg, kv_events)
        self.warmup_report = prepare_engine(self.core, budget_given=budget_given(more))  # warm before ready
        self.inputs = InputProcessor(self.tokenizer, self.runner.limits, self.eos_token_ids, cfg.seed)
        self.core.grammars = self.inputs.grammars  # structured outputs: one compile cache, the core's matchers
        self.outputs = OutputProcessor(self.tokenizer)
        self._requests: dict[int, Request] = {}  # live requests by rid
        self._recorded: list[Request] | None = None  # requests added while recording
        self._busy = threading.Lock()  # held by the one call running (generate, step, add_requests)
        self._owner: threading.Thread | None = None  # a serving loop's thread (serve/inproc.py), while it runs

    @property
    def num_pages(self) -> int:
        return self.runner.num_pages

    @property
    def max_model_len(self) -> int:
        """Prompt + output tokens a request may hold: the model's context, or less if configured."""
        return self.inputs.limits.max_model_len

    @property
    def dead(self) -> bool:
        """True once the engine can serve nothing more (its tensor-parallel ranks were shut down after a
        failure); a server should then stop and report unhealthy."""
        return self.runner.dead

    def close(self) -> None:
        """Stop the tensor-parallel worker ranks, if any (idempotent; also run by `with LLM(...)`, when the
        LLM is garbage-collected, and at interpreter exit)."""
        self.runner.close()

    def __enter__(self) -> LLM:  # noqa: PYI034 - LLM is not subclassed
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def reset_prefix_cache(self) -> bool:
        """Evict every cached prefix no running request holds (vLLM's name); True when the tree
        is now empty. With no request in flight, the pool is then entirely free."""
        return self.core.reset_prefix_cache()

    def encode(self, prompt: Prompt, index: int = 0) -> list[int]:
        """Token ids of one prompt, validated (ValueError/TypeError naming the prompt and problem)."""
        return self.inputs.encode(prompt, index)

    def get_tokenizer(self) -> Any:
        """The model's transformers tokenizer (vLLM's name); ValueError when the model has none."""
        if self.tokenizer is None:
            raise ValueError("this model has no tokenizer (its folder holds no tokenizer files, or it was built "
                             "from a config); pass token ids to generate")
        return self.tokenizer

    def get_default_sampling_params(self) -> SamplingParams:
        """SamplingParams with the model's generation_config.json defaults, as vLLM reads them: the
        values that differ from transformers' GenerationConfig defaults among temperature, top_p, top_k,
        min_p, repetition_penalty and max_new_tokens (as max_tokens); SamplingParams() without one."""
        folder = getattr(self.hf_config, "_name_or_path", None) or ""
        file = os.path.join(folder, "generation_config.json") if isinstance(folder, str) else ""
        if not file or not os.path.isfile(file):
            return SamplingParams()
        from transformers import GenerationConfig

        diff = GenerationConfig.from_pretrained(folder, local_files_only=True).to_diff_dict()
        named = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "min_p": "min_p",
                 "repetition_penalty": "repetition_penalty", "max_new_tokens": "max_tokens"}
        kw = {ours: diff[theirs] for theirs, ours in named.items() if diff.get(theirs) is not None}
        if kw.get("top_k") is not None and kw["top_k"] <= 0:  # transformers' 0 means off
            kw["top_k"] = None
        return SamplingParams(**kw)

    # ------------------------------------------------------------------ requests and steps

    def add_requests(self, prompts: Sequence[Prompt],
                     params: SamplingParams | Sequence[SamplingParams]) -> list[Request]:
        """Validate every prompt, then queue them all (all or nothing: a refused call consumes no
        request id and no seed, so later outputs equal a fresh engine's). A prompt whose params
        have n > 1 gives n requests (consecutive, completion index in request.sampling.index)."""
        with self._exclusive("add_requests"):
            return [r for r, _ in self._add(prompts, params)]

    def _add(self, prompts: Any, params: Any) -> list[tuple[Request, RequestState]]:
        reqs = self.inputs.process(prompts, params, self.core.now())
        self.core.add(reqs)
        if self._recorded is not None:
            self._recorded.extend(reqs)
        added = []
        for r in reqs:
            self._requests[r.rid] = r
            added.append((r, self.outputs.add(r)))
        return added

    def has_work(self) -> bool:
        return self.core.has_work()

    def step(self) -> list[Request]:
        """Run one engine step; returns the requests that finished in it (a stop string in the text
        ends its request at once). A step is failure-atomic: if anything raises before its tokens are
        applied, the batch goes back to the scheduler as if it never ran, the original exception
        propagates, and the next step recomputes the same work."""
        with self._exclusive("step"):
            return self._step()

    def _step(self) -> list[Request]:
        try:
            deltas = self.core.step()
        except StepFailed as err:
            raise err.cause from None  # offline callers see the error itself
        return [self._requests.pop(u.state.rid) for u in self.process_outputs(deltas)
                if u.finished and u.state.rid in self._requests]

    def process_outputs(self, deltas: Sequence[RequestDelta]) -> list[Update]:
        """Apply one core step's deltas: text and stop strings (a request whose text now holds one is
        ended in the core at once). The in-process server loop calls this after its own core.step()."""
        updates, stopped = self.outputs.process(deltas)
        for rid in stopped:
            self.core.finish(rid, FinishReason.STOP)
        for u in updates:
            req = self._requests.get(u.state.rid)
            if u.finished and req is not None:
                req.finish_reason = FinishReason(u.state.finish_reason)
        return updates

    @contextlib.contextmanager
    def _exclusive(self, what: str) -> Iterator[None]:
        """One caller at a time: a second thread, or a re-entrant call, is refused before it
        touches any state. (Many callers share an engine through one loop that owns the LLM.) While a
        serving loop owns the LLM, only that loop's thread may call (`AsyncLLM.call(fn)`)."""
        owner = self._owner
        if owner is not None and owner is not threading.current_thread():
            raise RuntimeError(f"LLM.{what}() refused: an AsyncLLM serves this LLM from its own thread; send "
                               f"requests through it (or AsyncLLM.call) while it runs")
        if not self._busy.acquire(blocking=False):
            raise RuntimeError(f"LLM.{what}() refused: this LLM is busy with another call (another thread, "
                               f"or a call from inside one of its own); an LLM serves one caller at a time")
        try:
            yield
        finally:
            self._busy.release()

    @contextlib.contextmanager
    def owned_by_this_thread(self) -> Iterator[None]:
        """While inside, calls from any other thread are refused (a serving loop's thread owns the LLM)."""
        if self._owner is not None:
            raise RuntimeError("this LLM is already served by another AsyncLLM")
        self._owner = threading.current_thread()
        try:
            yield
        finally:
            self._owner = None

    def start_recording(self) -> None:
        """Keep every request added from now on, for `save_recording` (off by default: it grows)."""
        self._recorded = []

    def save_recording(self, path: str) -> int:
        """Write the recorded requests as radixkv trace JSONL (replayable); returns how many."""
        if self._recorded is None:
            raise RuntimeError("start_recording() was not called")
        from radixkv.workloads.traces import record_requests

        return record_requests(path, self._recorded)

    # ------------------------------------------------------------------ generate, chat, sessions

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
            added = self._add(list(prompts) if isinstance(prompts, Iterable) else prompts, params)
            try:
                self._run_until_done([r for r, _ in added], use_tqdm)
            except BaseException:  # withdraw our own requests; anyone else's stay queued
                for r, _ in added:
                    if not r.finished:
                        self.core.abort(r.rid)
                    self._requests.pop(r.rid, None)
                    self.outputs.end(r.rid, FinishReason.ABORT)
                raise
        groups: list[list[RequestState]] = []
        for _, state in added:
            if state.index == 0:
                groups.append([])
            groups[-1].append(state)
        return [self.outputs.request_output(g) for g in groups]

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
                if not self.core.has_work():
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


def engine_config(dtype: Any, kv_dtype: Any, page_size: int, device: Any, more: dict[str, Any]) -> EngineConfig:
    """The EngineConfig of LLM(...)'s arguments; vLLM's spellings (block_size, kv_cache_dtype) may stand in
    for a default left as it is."""
    named: dict[str, Any] = {"dtype": dtype, "device": None if device is None else str(device)}
    if page_size != 16 or "block_size" not in more:
        named["page_size"] = page_size
    if kv_dtype != "auto" or "kv_cache_dtype" not in more:
        named["kv_dtype"] = kv_dtype
    return EngineConfig.from_kwargs(**named, **more)


def tokenizer_from(path: str) -> Any:
    """The tokenizer of folder `path` (vLLM's LLM(tokenizer=...)); ValueError when it holds none."""
    tok = folder_tokenizer(path) if os.path.isdir(path) else None
    if tok is None:
        raise ValueError(f"tokenizer={path!r}: not a folder holding tokenizer files (tokenizer.json, "
                         f"tokenizer_config.json, ...)")
    return tok


def _is_single_prompt(prompts: Any) -> bool:
    """True for one bare prompt (a str, a vLLM dict prompt, a flat sequence of token ids, a 1-D
    array or tensor)."""
    if isinstance(prompts, (str, dict)):
        return True
    if getattr(prompts, "ndim", None) == 1:
        return True
    return (isinstance(prompts, Sequence) and len(prompts) > 0
            and all(token_id(t) is not None for t in prompts))
