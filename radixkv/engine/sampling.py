"""SamplingParams (validated) and the per-row sampler.

temperature 0 is greedy (argmax). Otherwise logits are divided by the temperature, cut to
the `top_k` largest and the smallest set whose probability reaches `top_p`, and one token is
drawn with the request's own generator: a request with a `seed` produces the same tokens
whatever else shares its batch.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SamplingParams:
    """How to generate for one prompt.

    temperature: 0 means greedy. top_p in (0, 1]; top_k None keeps the whole vocabulary.
    max_tokens: tokens to generate at most. stop_token_ids: generation ends after any of them
    (the model's EOS is added unless ignore_eos). seed: per-request RNG seed (None: from the engine).
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int | None = None
    max_tokens: int = 16
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    seed: int | None = None

    def __post_init__(self) -> None:
        if not self.temperature >= 0.0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k is not None and (isinstance(self.top_k, bool) or self.top_k < 1):
            raise ValueError(f"top_k must be >= 1 or None, got {self.top_k}")
        if isinstance(self.max_tokens, bool) or not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise ValueError(f"max_tokens must be an int >= 1, got {self.max_tokens!r}")
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))
        for t in self.stop_token_ids:
            if isinstance(t, bool) or not isinstance(t, int) or t < 0:
                raise ValueError(f"stop_token_ids must be non-negative ints, got {t!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def sample(logits: torch.Tensor, params: list[SamplingParams],
           generators: list[torch.Generator]) -> list[int]:
    """logits: [S, V] float32, one row per sampling request -> S token ids.

    generators[i] must live on logits' device; greedy rows do not touch it.
    """
    S = logits.shape[0]
    assert len(params) == len(generators) == S, f"{S} rows, {len(params)} params, {len(generators)} generators"
    out = logits.argmax(dim=-1).tolist()  # greedy for every row; sampled rows overwrite
    for i, p in enumerate(params):
        if p.greedy:
            continue
        probs = _filtered_probs(logits[i] / p.temperature, p.top_k, p.top_p)  # [V]
        out[i] = int(torch.multinomial(probs, 1, generator=generators[i]).item())
    return out


def _filtered_probs(logits: torch.Tensor, top_k: int | None, top_p: float) -> torch.Tensor:
    """logits: [V] -> probabilities [V] with everything outside top-k / top-p set to 0."""
    if top_k is not None and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if top_p < 1.0:
        sorted_p, order = probs.sort(descending=True)
        before = sorted_p.cumsum(-1) - sorted_p  # mass strictly above each token
        drop = before >= top_p  # keep the smallest prefix reaching top_p (always the first token)
        sorted_p = sorted_p.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_p)
    return probs
