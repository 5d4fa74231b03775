"""InputProcessor: prompts + SamplingParams -> validated Requests, all or nothing, once.

Both front ends call it (the offline LLM in its process; the server in its API process, which
then hands the Requests to the engine core unchecked). It tokenises text prompts, checks token ids
against the vocabulary and prompt + max_tokens against the context, the model's sliding window and
the pool, and gives each request its id and seed. A refused call consumes no request id and no
seed, so later outputs equal a fresh engine's.
"""
from __future__ import annotations

import itertools
import operator
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from radixkv.request import Request
from radixkv.sampling_params import RequestSampling, SamplingParams

from .grammar import Grammars

Prompt = str | Sequence[int] | dict[str, Any]


@dataclass(frozen=True)
class ModelLimits:
    """What validating a request needs to know of the engine (ModelRunner.limits)."""

    vocab_size: int  # token ids must be in [0, vocab_size)
    max_model_len: int  # prompt + output tokens a request may hold
    sliding_window: int | None  # the model's window: longer sequences are refused
    page_size: int
    num_pages: int  # the pool: a request may not need more pages than it has
    prompt_logprobs: bool = True  # whether prompt logprobs can be computed (not under tensor parallelism)

    @property
    def max_tokens_room(self) -> int:
        """Prompt + output tokens one request may hold at most (context and pool)."""
        return min(self.max_model_len, self.num_pages * self.page_size)


class InputProcessor:
    """Validates prompts and builds Requests (see the module docstring).

    tokenizer: a transformers tokenizer, or None (token-id prompts only). eos_token_ids: added to
    every request's stop ids unless ignore_eos. seed: the stream unseeded requests' seeds come from.
    """

    def __init__(self, tokenizer: Any, limits: ModelLimits, eos_token_ids: frozenset[int], seed: int) -> None:
        self.tokenizer, self.limits, self.eos_token_ids = tokenizer, limits, eos_token_ids
        self.grammars = Grammars(tokenizer, limits.vocab_size)  # structured outputs: compiled (cached) to validate
        self._rids = itertools.count()
        self._seeds = torch.Generator().manual_seed(seed)

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
            ids = [token_id(t) for t in prompt]
            if None in ids:
                raise TypeError(f"prompt {index} holds a token id that is not an integer")
        if not ids:
            raise ValueError(f"prompt {index} is empty")
        V = self.limits.vocab_size
        bad = [t for t in ids if not 0 <= t < V]
        if bad:
            raise ValueError(f"prompt {index}: token id {bad[0]} is outside the vocabulary [0, {V})")
        return ids

    def check_fits(self, ids: Sequence[int], params: SamplingParams, index: int = 0) -> None:
        """ValueError naming the prompt when prompt + max_tokens exceed the context, window or pool,
        or when params ask for what this model cannot give."""
        lim = self.limits
        total = len(ids) + params.max_tokens
        if total > lim.max_model_len:
            raise ValueError(f"prompt {index}: {len(ids)} prompt tokens + max_tokens {params.max_tokens} = {total} "
                             f"exceeds the model's context of {lim.max_model_len} tokens")
        if lim.sliding_window is not None and total > lim.sliding_window:
            raise ValueError(f"prompt {index}: {total} tokens exceed the model's sliding window of "
                             f"{lim.sliding_window}; windowed attention is not implemented, so only sequences "
                             f"within it are served")
        pages = -(-total // lim.page_size)
        if pages > lim.num_pages:
            raise ValueError(f"prompt {index}: {total} tokens need {pages} KV pages, more than the pool's "
                             f"{lim.num_pages}")
        if params.stop and self.tokenizer is None:
            raise ValueError(f"params {index}: stop strings need a tokenizer; this model has none "
                             f"(use stop_token_ids)")
        for name in ("logprobs", "prompt_logprobs"):
            k = getattr(params, name)
            if k is not None and k > lim.vocab_size:
                raise ValueError(f"params {index}: {name} {k} exceeds the vocabulary ({lim.vocab_size})")
        if params.prompt_logprobs is not None and not lim.prompt_logprobs:
            raise ValueError(f"params {index}: prompt_logprobs is not supported with tensor parallelism "
                             f"(tensor_parallel_size > 1)")

    def truncate(self, ids: list[int], k: int | None, room: int) -> list[int]:
        """The prompt cut to its last k tokens (vLLM's truncate_prompt_tokens; -1: `room`, what the
        context leaves after max_tokens); unchanged when it is shorter or k is None."""
        if k is None:
            return ids
        if k == -1:
            k = max(1, room)
        return ids[-k:] if len(ids) > k else ids

    def prepare(self, params: SamplingParams) -> SamplingParams:
        """params ready for the sampler: a validated copy (fields assigned since construction are
        checked; later changes to the caller's object do not reach the request), bad words tokenised,
        every token id checked against the vocabulary, structured outputs compiled (ValueError naming
        the field)."""
        params = replace(params).with_bad_words_tokenized(self.tokenizer)
        params.check_vocab(self.limits.vocab_size)
        if params.structured_outputs is not None:
            self.grammars.compile(params.structured_outputs)  # ValueError naming the field; warms the cache
        return params

    def process(self, prompts: Sequence[Prompt], params: SamplingParams | Sequence[SamplingParams],
                arrival_s: float) -> list[Request]:
        """Validate every prompt, then build its Requests (all or nothing). A prompt whose params
        have n > 1 gives n requests (consecutive, completion index in request.sampling.index)."""
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
        params = [self.prepare(sp) for sp in params]
        ids = [self.truncate(self.encode(p, i), sp.truncate_prompt_tokens, self.limits.max_model_len - sp.max_tokens)
               for i, (p, sp) in enumerate(zip(prompts, params))]
        for i, (tokens, sp) in enumerate(zip(ids, params)):
            self.check_fits(tokens, sp, i)
        return [self.request(tokens, sp, arrival_s, j, prompt_text(prompt))
                for tokens, sp, prompt in zip(ids, params, prompts) for j in range(sp.n)]

    def request(self, ids: list[int], params: SamplingParams, arrival_s: float, index: int = 0,
                text: str | None = None) -> Request:
        """A Request for validated ids: takes the next request id and, unseeded, the next seed.
        Its namespace is params.cache_salt: requests with different salts never share pages."""
        stop = set(params.stop_token_ids)
        if not params.ignore_eos:
            stop |= self.eos_token_ids
        seed = (params.seed + index if params.seed is not None
                else int(torch.randint(0, 2**62, (1,), generator=self._seeds)))
        return Request(rid=next(self._rids), prompt=ids, max_tokens=params.max_tokens, arrival_s=arrival_s,
                       namespace=params.cache_salt, stop_token_ids=frozenset(stop),
                       sampling=RequestSampling(params, seed, index, text),
                       read_cache=params.prompt_logprobs is None)


def token_id(t: Any) -> int | None:
    """t as a token id (int, numpy or 0-d torch integer), or None when it is not an integer."""
    if isinstance(t, bool):
        return None
    try:
        return operator.index(t)
    except TypeError:
        return None


def prompt_text(prompt: Any) -> str | None:
    """The prompt as text when it was given as text (vLLM's RequestOutput.prompt), else None."""
    if isinstance(prompt, dict):
        prompt = prompt.get("prompt")
    return prompt if isinstance(prompt, str) else None
