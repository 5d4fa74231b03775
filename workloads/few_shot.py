"""Few-shot workload: k-shot prompts whose examples are shared through the prefix cache.

A template is an instruction plus k worked examples; every prompt of a template appends one
question. With GSM8K (train.jsonl for examples, test.jsonl for questions) the text is real and
tokenised byte-level (UTF-8 bytes, like the radixkv trace format's `text`); without it, examples
and questions are synthetic tokens.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from . import poisson_arrivals, random_tokens
from .multi_turn import _check_int, _check_rate
from .traces import TraceError, TraceRequest, byte_tokenize

INSTRUCTION = "Solve the grade-school math problem. Show your reasoning, then the answer after '####'.\n\n"


@dataclass(frozen=True)
class FewShotConfig:
    templates: int = 2  # distinct example sets
    shots: int = 5  # examples per prompt
    prompts_per_template: int = 16
    example_len: int = 160  # synthetic tokens per example (without GSM8K)
    question_len: int = 48  # synthetic tokens per question (without GSM8K)
    max_tokens: int = 256
    rate: float = 4.0  # Poisson arrivals per second (inf: all at 0)
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("templates", "shots", "prompts_per_template", "example_len", "question_len", "max_tokens"):
            _check_int(name, getattr(self, name), 1)
        _check_rate(self.rate)
        _check_int("seed", self.seed, 0, None)  # numpy takes any non-negative int


def _read_gsm8k(path: Path, n: int) -> list[dict]:
    rows = []
    with path.open("r", encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if len(rows) == n:
                break
            try:
                rec = json.loads(line)
                rows.append({"question": str(rec["question"]), "answer": str(rec["answer"])})
            except (json.JSONDecodeError, KeyError, TypeError):
                raise TraceError(path, lineno, "question", "not a GSM8K record") from None
    if len(rows) < n:
        raise ValueError(f"{path}: {len(rows)} records, {n} needed")
    return rows


def few_shot(cfg: FewShotConfig, gsm8k: str | Path | None = None) -> list[TraceRequest]:
    """Requests in arrival order (templates interleaved); `session` is "template-<t>".

    `gsm8k`: a folder holding train.jsonl and test.jsonl, or a single JSONL used for both.
    """
    rng = np.random.default_rng(cfg.seed)
    n_q = cfg.templates * cfg.prompts_per_template
    if gsm8k is not None:
        g = Path(gsm8k)
        train, test = (g / "train.jsonl", g / "test.jsonl") if g.is_dir() else (g, g)
        examples = _read_gsm8k(train, cfg.templates * cfg.shots)
        questions = _read_gsm8k(test, n_q + (cfg.templates * cfg.shots if train == test else 0))[-n_q:]
        heads = [byte_tokenize(INSTRUCTION + "".join(f"Question: {e['question']}\nAnswer: {e['answer']}\n\n"
                                                     for e in examples[t * cfg.shots:(t + 1) * cfg.shots]))
                 for t in range(cfg.templates)]
        tails = [byte_tokenize(f"Question: {q['question']}\nAnswer:") for q in questions]
    else:
        heads = [random_tokens(rng, cfg.shots * cfg.example_len) for _ in range(cfg.templates)]
        tails = [random_tokens(rng, cfg.question_len) for _ in range(n_q)]
    order = rng.permutation(n_q)  # prompt j uses template j % templates
    arrivals = poisson_arrivals(rng, n_q, cfg.rate)
    return [TraceRequest(float(t), np.concatenate([heads[j % cfg.templates], tails[j]]), cfg.max_tokens,
                         f"template-{j % cfg.templates}") for t, j in zip(arrivals, order.tolist())]
