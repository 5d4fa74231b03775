"""radixkv.workloads: trace formats (traces.py; reading any of them: trace_loading.py) and synthetic generators.

Generators return `TraceRequest` lists (write them with `traces.write_trace`):
- multi_turn.multi_turn: chat sessions resending their history each turn (ShareGPT lengths)
- few_shot.few_shot: k-shot prompts sharing their examples (GSM8K text, byte-level tokens)
- shared_prefix.shared_prefix: N groups x M prompts behind a per-group system prompt

json_schemas.SCHEMAS: 30 JSON schemas for structured outputs (tests/e2e and benchmarks/engine/structured_suite.py).

Synthetic token ids are drawn uniformly from [0, SYNTHETIC_VOCAB) with a seeded generator.
"""
from __future__ import annotations

import enum

import numpy as np

SYNTHETIC_VOCAB = 32000  # a Llama-sized vocabulary


class WorkloadKind(enum.Enum):
    MULTI_TURN = "multi-turn"
    FEW_SHOT = "few-shot"
    SHARED_PREFIX = "shared-prefix"

    def __str__(self) -> str:  # argparse shows choices with str()
        return self.value


def random_tokens(rng: np.random.Generator, n: int, vocab: int = SYNTHETIC_VOCAB) -> np.ndarray:
    """n uniform token ids, int32 [n]."""
    return rng.integers(0, vocab, size=n, dtype=np.int32)


def poisson_arrivals(rng: np.random.Generator, n: int, rate: float) -> np.ndarray:
    """n arrival times (s) of a Poisson process of `rate` per second starting at 0; all 0 if rate is inf."""
    if rate <= 0:
        raise ValueError(f"rate must be > 0, got {rate}")
    if np.isinf(rate):
        return np.zeros(n)
    gaps = rng.exponential(1.0 / rate, size=n)
    gaps[:1] = 0.0
    return np.cumsum(gaps)
