"""Shared-prefix workload: N groups x M prompts, each group behind its own system prompt.

Shaped like SGLang's generated-shared-prefix benchmark: every prompt of group g is
system[g] + question (fresh tokens); a perfect cache computes each system prompt once.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import poisson_arrivals, random_tokens
from .multi_turn import _check_int, _check_rate
from .traces import TraceRequest


@dataclass(frozen=True)
class SharedPrefixConfig:
    groups: int = 8
    prompts_per_group: int = 16
    system_len: int = 1024  # tokens of each group's shared system prompt
    question_len: int = 128  # tokens of each prompt's own question
    max_tokens: int = 64
    rate: float = 4.0  # Poisson arrivals per second (inf: all at 0)
    shuffle: bool = True  # interleave groups (False: group after group)
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("groups", "prompts_per_group", "system_len", "question_len", "max_tokens"):
            _check_int(name, getattr(self, name), 1)
        _check_rate(self.rate)
        _check_int("seed", self.seed, 0, None)  # numpy takes any non-negative int
        if not isinstance(self.shuffle, bool):
            raise ValueError(f"shuffle must be True or False, got {self.shuffle!r}")


def shared_prefix(cfg: SharedPrefixConfig) -> list[TraceRequest]:
    """Requests in arrival order; `session` names the group ("group-3")."""
    rng = np.random.default_rng(cfg.seed)
    systems = [random_tokens(rng, cfg.system_len) for _ in range(cfg.groups)]
    order = [(g, i) for g in range(cfg.groups) for i in range(cfg.prompts_per_group)]
    if cfg.shuffle:
        order = [order[k] for k in rng.permutation(len(order))]
    arrivals = poisson_arrivals(rng, len(order), cfg.rate)
    return [TraceRequest(float(t), np.concatenate([systems[g], random_tokens(rng, cfg.question_len)]),
                         cfg.max_tokens, f"group-{g}")
            for t, (g, _) in zip(arrivals, order)]
