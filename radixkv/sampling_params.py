"""SamplingParams and a request's sampling state. No torch: every seam that carries them is typed.

temperature below GREEDY_BELOW is greedy (argmax); the batched sampler that reads these fields
is radixkv/engine/sampling.py.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from .structured_outputs import StructuredOutputsParams

GREEDY_BELOW = 1e-5  # vLLM's epsilon: smaller temperatures overflow logits / T, so they mean greedy


@dataclass
class SamplingParams:
    """How to generate for one prompt.

    temperature: 0 (or below GREEDY_BELOW) means greedy. top_p in (0, 1]; top_k None (or -1,
    vLLM's spelling) keeps the whole vocabulary; min_p in [0, 1]. max_tokens: tokens to generate
    at most. stop_token_ids: generation ends after any of them (the model's EOS is added unless
    ignore_eos). seed: per-request RNG seed (None: drawn from the engine's seed).

    vLLM's fields: n completions per prompt (RequestOutput.outputs; with a seed, completion j
    draws with seed + j). stop: strings; generation ends once the detokenised output contains
    one (cut before it, or kept with include_stop_str_in_output). min_tokens: EOS and
    stop_token_ids are suppressed (and stop strings not looked for) until that many tokens are
    generated. presence_penalty / frequency_penalty in [-2, 2] (on generated tokens) and
    repetition_penalty > 0 (on prompt and generated tokens), as vLLM applies them, before
    temperature. logprobs: k >= 0 returns, per generated token, the log-probabilities (of the
    model's raw distribution) of the sampled token and the k most likely ones. skip_special_tokens:
    how the text is decoded. prompt_logprobs: k >= 0 returns, per prompt token after the first, its
    log-probability and the k most likely tokens' (RequestOutput.prompt_logprobs); such a request
    computes its whole prompt (a cached prefix has no logits). truncate_prompt_tokens: k >= 1 keeps
    only the prompt's last k tokens (-1: as many as the context leaves room for). cache_salt: the request's prefix-cache namespace: requests with
    different salts never share KV pages, the same salt (or none) shares.

    Logits controls (vLLM's; applied before penalties and temperature, greedy rows included):
    logit_bias {token id: bias in [-100, 100]} is added to those logits (OpenAI's semantics: -100
    all but bans a token, +100 all but forces it). allowed_token_ids: only these may be sampled.
    bad_words: strings that may not be generated; each is tokenised as written and with a leading
    space (`with_bad_words_tokenized`, which InputProcessor.prepare calls; bad_words_token_ids holds the result),
    a one-token word is never sampled, and a longer one's last token is banned whenever the output
    ends with the rest of it. Token ids are checked against the vocabulary by `check_vocab`.
    top_k 0 (vLLM's "off") is the same as None. structured_outputs: a StructuredOutputsParams (or a dict
    of its fields): every token is sampled from those the grammar allows (radixkv/structured_outputs.py).

    Fields may be assigned after construction (as vLLM's may); the engine validates and copies the
    params when a request is queued (InputProcessor.prepare), so later changes do not reach it.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int | None = None
    min_p: float = 0.0
    max_tokens: int = 16
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    seed: int | None = None
    n: int = 1
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    stop: str | Sequence[str] | None = None
    include_stop_str_in_output: bool = False
    min_tokens: int = 0
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    truncate_prompt_tokens: int | None = None
    skip_special_tokens: bool = True
    cache_salt: str | None = None
    logit_bias: dict[int, float] | None = None
    allowed_token_ids: tuple[int, ...] | None = None
    bad_words: tuple[str, ...] = ()
    bad_words_token_ids: tuple[tuple[int, ...], ...] | None = None
    structured_outputs: StructuredOutputsParams | None = None

    def __post_init__(self) -> None:
        if not _is_int(self.n) or self.n < 1:
            raise ValueError(f"n must be an int >= 1, got {self.n!r}")
        _check_finite("presence_penalty", self.presence_penalty, -2.0, 2.0)
        _check_finite("frequency_penalty", self.frequency_penalty, -2.0, 2.0)
        _check_finite("repetition_penalty", self.repetition_penalty, 0.0, math.inf)
        if not self.repetition_penalty > 0.0:
            raise ValueError(f"repetition_penalty must be > 0, got {self.repetition_penalty!r}")
        stop = () if self.stop is None else (self.stop,) if isinstance(self.stop, str) else self.stop
        if isinstance(stop, (bytes, dict)) or not isinstance(stop, Sequence):
            raise ValueError(f"stop must be a string or a list of strings, got {self.stop!r}")
        for x in stop:
            if not isinstance(x, str) or not x:
                raise ValueError(f"stop must hold non-empty strings, got {x!r}")
        object.__setattr__(self, "stop", tuple(stop))
        for name in ("include_stop_str_in_output", "skip_special_tokens", "ignore_eos"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be a bool, got {getattr(self, name)!r}")
        if not _is_int(self.min_tokens) or self.min_tokens < 0:
            raise ValueError(f"min_tokens must be an int >= 0, got {self.min_tokens!r}")
        if _is_int(self.max_tokens) and self.min_tokens > self.max_tokens:
            raise ValueError(f"min_tokens ({self.min_tokens}) must be <= max_tokens ({self.max_tokens})")
        for name in ("logprobs", "prompt_logprobs"):
            k = getattr(self, name)
            if k is not None and (not _is_int(k) or k < 0):
                raise ValueError(f"{name} must be an int >= 0 or None, got {k!r}")
        k = self.truncate_prompt_tokens
        if k is not None and (not _is_int(k) or (k < 1 and k != -1)):
            raise ValueError(f"truncate_prompt_tokens must be an int >= 1, -1 (the context) or None, got {k!r}")
        if self.cache_salt is not None and (not isinstance(self.cache_salt, str) or not self.cache_salt):
            raise ValueError(f"cache_salt must be a non-empty string or None, got {self.cache_salt!r}")
        _check_finite("temperature", self.temperature, 0.0, math.inf)
        _check_finite("top_p", self.top_p, 0.0, 1.0)
        if not self.top_p > 0.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        _check_finite("min_p", self.min_p, 0.0, 1.0)
        if self.top_k in (-1, 0) and _is_int(self.top_k):
            object.__setattr__(self, "top_k", None)
        if self.top_k is not None and (not _is_int(self.top_k) or self.top_k < 1):
            raise ValueError(f"top_k must be an int >= 1, 0 or -1 (off) or None, got {self.top_k!r}")
        if not _is_int(self.max_tokens) or self.max_tokens < 1:
            raise ValueError(f"max_tokens must be an int >= 1, got {self.max_tokens!r}")
        if self.seed is not None and not _is_int(self.seed):
            raise ValueError(f"seed must be an int or None, got {self.seed!r}")
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))
        for t in self.stop_token_ids:
            if not _is_int(t) or t < 0:
                raise ValueError(f"stop_token_ids must be non-negative ints, got {t!r}")
        self._check_logits_controls()
        object.__setattr__(self, "structured_outputs", StructuredOutputsParams.coerce(self.structured_outputs))

    def _check_logits_controls(self) -> None:
        bias = self.logit_bias
        if bias is not None:
            if not isinstance(bias, Mapping):
                raise ValueError(f"logit_bias must be a mapping of token id to bias, got {bias!r}")
            norm: dict[int, float] = {}
            for k, v in bias.items():
                t = _token_key(k)
                if t is None:
                    raise ValueError(f"logit_bias keys must be token ids (ints >= 0), got {k!r}")
                _check_finite("logit_bias", v, -100.0, 100.0)
                norm[t] = float(v)
            object.__setattr__(self, "logit_bias", norm or None)
        allowed = self.allowed_token_ids
        if allowed is not None:
            if isinstance(allowed, (str, bytes, Mapping)) or not isinstance(allowed, Sequence) or not allowed:
                raise ValueError(f"allowed_token_ids must be a non-empty list of token ids, got {allowed!r}")
            for t in allowed:
                if not _is_int(t) or t < 0:
                    raise ValueError(f"allowed_token_ids must hold token ids (ints >= 0), got {t!r}")
            object.__setattr__(self, "allowed_token_ids", tuple(allowed))
        words = () if self.bad_words is None else self.bad_words
        if isinstance(words, (str, bytes, Mapping)) or not isinstance(words, Sequence):
            raise ValueError(f"bad_words must be a list of strings, got {self.bad_words!r}")
        for w in words:
            if not isinstance(w, str) or not w.strip():
                raise ValueError(f"bad_words must hold non-blank strings, got {w!r}")
        object.__setattr__(self, "bad_words", tuple(words))
        seqs = self.bad_words_token_ids
        if seqs is not None:
            if isinstance(seqs, (str, bytes)) or not isinstance(seqs, Sequence):
                raise ValueError(f"bad_words_token_ids must be a list of token-id lists, got {seqs!r}")
            out = []
            for seq in seqs:
                if isinstance(seq, (str, bytes)) or not isinstance(seq, Sequence) or not seq \
                        or not all(_is_int(t) and t >= 0 for t in seq):
                    raise ValueError(f"bad_words_token_ids must hold non-empty lists of token ids, got {seq!r}")
                out.append(tuple(seq))
            object.__setattr__(self, "bad_words_token_ids", tuple(out))

    def check_vocab(self, vocab_size: int) -> None:
        """ValueError, starting with the field's name, for a token id outside [0, vocab_size)."""
        for name, ids in (("logit_bias", self.logit_bias or ()), ("allowed_token_ids", self.allowed_token_ids or ()),
                          ("bad_words", [t for seq in self.bad_words_token_ids or () for t in seq])):
            bad = [t for t in ids if not 0 <= t < vocab_size]
            if bad:
                raise ValueError(f"{name} holds token id {bad[0]}, outside the vocabulary [0, {vocab_size})")

    def with_bad_words_tokenized(self, tokenizer: Any) -> "SamplingParams":
        """These params with bad_words_token_ids filled from `tokenizer` (as vLLM does: each word as
        written, and with a leading space when that spelling is as many tokens but starts differently).
        Returns self when there are no bad words or they are already tokenised."""
        if not self.bad_words or self.bad_words_token_ids is not None:
            return self
        if tokenizer is None:
            raise ValueError("bad_words need a tokenizer; this model has none")
        seqs: list[tuple[int, ...]] = []
        for word in self.bad_words:
            plain = tuple(tokenizer.encode(word.lstrip(), add_special_tokens=False))
            spaced = tuple(tokenizer.encode(" " + word.lstrip(), add_special_tokens=False))
            if plain:
                seqs.append(plain)
            if spaced and (not plain or (len(spaced) == len(plain) and spaced[0] != plain[0])):
                seqs.append(spaced)
        return replace(self, bad_words_token_ids=tuple(seqs))

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_BELOW

    @property
    def has_penalties(self) -> bool:
        """presence, frequency or repetition penalty (they read the request's tokens on the host)."""
        return self.presence_penalty != 0.0 or self.frequency_penalty != 0.0 or self.repetition_penalty != 1.0

    @property
    def constrains_logits(self) -> bool:
        """logit_bias, allowed_token_ids or bad_words."""
        return bool(self.logit_bias or self.allowed_token_ids or self.bad_words or self.bad_words_token_ids)

    @property
    def reads_output(self) -> bool:
        """Whether sampling this row's next token reads its latest tokens on the host: penalties,
        min_tokens, a bad word of several tokens, or structured outputs (the grammar's mask follows the
        last token). EngineCore runs such rows ahead in two halves: the forward queued ahead, the sampler
        once their tokens are applied; logit_bias, allowed_token_ids and one-token bad words need neither."""
        words = self.bad_words_token_ids
        multi = bool(self.bad_words) if words is None else any(len(w) > 1 for w in words)
        return self.has_penalties or self.min_tokens > 0 or multi or self.structured_outputs is not None

    @property
    def penalized(self) -> bool:
        """Whether the sampler must run `penalize` on this row's logits (penalties or logits controls)."""
        return self.has_penalties or self.constrains_logits


def _token_key(k: object) -> int | None:
    """A logit_bias key as a token id (ints, or digit strings as JSON sends them), else None."""
    if _is_int(k):
        return k if k >= 0 else None  # type: ignore[operator,return-value]
    if isinstance(k, str) and k.strip().isdigit():
        return int(k)
    return None


def _is_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _check_finite(name: str, x: object, lo: float, hi: float) -> None:
    try:
        v = float(x)  # type: ignore[arg-type]
    except (TypeError, ValueError, OverflowError):
        raise ValueError(f"{name} must be a finite number, got {x!r}") from None
    if isinstance(x, bool) or not math.isfinite(v) or not lo <= v <= hi:
        raise ValueError(f"{name} must be a finite number in [{lo}, {hi}], got {x!r}")


@dataclass(frozen=True)
class RequestSampling:
    """What a Request carries for the sampler (Request.sampling).

    seed: the params' seed (+ index), or one drawn from the engine's seed stream; the sampler's
    uniforms hash (seed, output index, token id), so a seeded request draws the same tokens in any batch.
    index: which of its prompt's n completions. prompt_text: the prompt when it was given as text.
    """

    params: SamplingParams
    seed: int
    index: int = 0
    prompt_text: str | None = None
