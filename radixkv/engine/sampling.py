"""SamplingParams (validated) and the batched sampler.

temperature below GREEDY_BELOW is greedy (argmax). Otherwise logits are divided by the
temperature, cut to the `top_k` largest, the smallest set whose probability reaches `top_p`
and the tokens at least `min_p` times as likely as the most likely one, and one token is drawn
by the Gumbel-max trick: argmax(logits / T + g) with g = -log(-log(u)).

The uniforms u come from a counter-based hash of (request seed, index of the token in the
request's output, vocabulary id), computed on the logits' device for the whole batch at once.
So a request with a `seed` draws the same tokens whatever else shares its batch, preemption
and recomputation included, and no per-row Python loop, generator or host sync is needed.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor

GREEDY_BELOW = 1e-5  # vLLM's epsilon: smaller temperatures overflow logits / T, so they mean greedy


@dataclass(frozen=True)
class SamplingParams:
    """How to generate for one prompt.

    temperature: 0 (or below GREEDY_BELOW) means greedy. top_p in (0, 1]; top_k None (or -1,
    vLLM's spelling) keeps the whole vocabulary; min_p in [0, 1]. max_tokens: tokens to generate
    at most. stop_token_ids: generation ends after any of them (the model's EOS is added unless
    ignore_eos). seed: per-request RNG seed (None: drawn from the engine's seed).
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int | None = None
    min_p: float = 0.0
    max_tokens: int = 16
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    seed: int | None = None

    def __post_init__(self) -> None:
        _check_finite("temperature", self.temperature, 0.0, math.inf)
        _check_finite("top_p", self.top_p, 0.0, 1.0)
        if not self.top_p > 0.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        _check_finite("min_p", self.min_p, 0.0, 1.0)
        if self.top_k == -1:
            object.__setattr__(self, "top_k", None)
        if self.top_k is not None and (not _is_int(self.top_k) or self.top_k < 1):
            raise ValueError(f"top_k must be an int >= 1, -1 or None, got {self.top_k!r}")
        if not _is_int(self.max_tokens) or self.max_tokens < 1:
            raise ValueError(f"max_tokens must be an int >= 1, got {self.max_tokens!r}")
        if self.seed is not None and not _is_int(self.seed):
            raise ValueError(f"seed must be an int or None, got {self.seed!r}")
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))
        for t in self.stop_token_ids:
            if not _is_int(t) or t < 0:
                raise ValueError(f"stop_token_ids must be non-negative ints, got {t!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_BELOW


def _is_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _check_finite(name: str, x: object, lo: float, hi: float) -> None:
    try:
        v = float(x)  # type: ignore[arg-type]
    except (TypeError, ValueError, OverflowError):
        raise ValueError(f"{name} must be a finite number, got {x!r}") from None
    if isinstance(x, bool) or not math.isfinite(v) or not lo <= v <= hi:
        raise ValueError(f"{name} must be a finite number in [{lo}, {hi}], got {x!r}")


class SamplingRows(NamedTuple):
    """The sampling rows of one step, as device tensors. S rows, V the vocabulary."""

    temperature: Tensor  # float32 [S]; rows below GREEDY_BELOW are greedy
    top_k: Tensor  # int64 [S]; V keeps everything
    top_p: Tensor  # float32 [S]
    min_p: Tensor  # float32 [S]
    seed: Tensor  # int64 [S]
    counter: Tensor  # int64 [S]: index of the token being drawn in its request's output
    all_greedy: bool  # host-side: skip everything but the argmax
    filtered: bool  # host-side: some row has top_k, top_p or min_p


def sampling_rows(params: Sequence[SamplingParams], seeds: Sequence[int], counters: Sequence[int],
                  vocab_size: int, device: torch.device) -> SamplingRows:
    """Pack the per-request parameters of a step's sampling rows: two host-to-device copies."""
    k = [vocab_size if p.top_k is None else min(p.top_k, vocab_size) for p in params]
    floats = torch.tensor([[p.temperature for p in params], [p.top_p for p in params], [p.min_p for p in params]],
                          dtype=torch.float32).to(device, non_blocking=True)  # [3, S]
    ints = torch.tensor([k, _as_int64(seeds), list(counters)], dtype=torch.int64).to(device, non_blocking=True)
    return SamplingRows(temperature=floats[0], top_k=ints[0], top_p=floats[1], min_p=floats[2], seed=ints[1],
                        counter=ints[2], all_greedy=all(p.greedy for p in params),
                        filtered=any(p.top_k is not None or p.top_p < 1.0 or p.min_p > 0.0 for p in params))


def _as_int64(seeds: Sequence[int]) -> list[int]:
    """Seeds folded into the int64 range (any Python int is a valid seed)."""
    return [((s + 2**63) % 2**64) - 2**63 for s in seeds]


def sample(logits: Tensor, rows: SamplingRows) -> Tensor:
    """logits: [S, V] float32 -> token ids int64 [S] on logits' device (no host sync).

    The draw is argmax(x / T + gumbel) in one pass over the vocabulary: the Triton kernel
    kernels/sample.py on the GPU, its twin on the CPU. Filters (top-k, top-p, min-p) sort first."""
    greedy = logits.argmax(dim=-1)
    if rows.all_greedy:
        return greedy
    is_greedy = rows.temperature < GREEDY_BELOW
    temperature = torch.where(is_greedy, 1.0, rows.temperature)  # [S]
    if rows.filtered:
        x = _filter(logits / temperature[:, None], rows.top_k, rows.top_p, rows.min_p)  # [S, V]
        inv_temperature = torch.ones_like(temperature)
    else:
        x, inv_temperature = logits, 1.0 / temperature
    draw = _gumbel_argmax(x.device)
    return torch.where(is_greedy, greedy, draw(x, inv_temperature, rows.seed, rows.counter))


def _gumbel_argmax(device: torch.device) -> Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]:
    """The Triton kernel on CUDA (imports Triton), else its PyTorch twin."""
    if device.type == "cuda":
        from radixkv.kernels import gumbel_argmax

        return gumbel_argmax
    from radixkv.kernels.reference import gumbel_argmax_ref

    return gumbel_argmax_ref


def _filter(x: Tensor, top_k: Tensor, top_p: Tensor, min_p: Tensor) -> Tensor:
    """x: [S, V] scaled logits -> the same with tokens outside top-k / top-p / min-p at -inf."""
    V = x.shape[1]
    sorted_x, order = x.sort(dim=-1, descending=True)  # [S, V]
    rank = torch.arange(V, device=x.device)[None, :]
    sorted_x = sorted_x.masked_fill(rank >= top_k[:, None], float("-inf"))
    probs = torch.softmax(sorted_x, dim=-1)
    before = probs.cumsum(dim=-1) - probs  # mass strictly above each token
    drop = (before >= top_p[:, None]) & (rank > 0)  # the smallest prefix reaching top_p; never the first
    drop |= probs < min_p[:, None] * probs[:, :1]
    sorted_x = sorted_x.masked_fill(drop, float("-inf"))
    return torch.empty_like(x).scatter_(1, order, sorted_x)
