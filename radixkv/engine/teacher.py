"""Teacher-forced scoring through an LLM's own paged KV: per-position next-token figures.

`teacher_forced(llm, rows)` runs whole token sequences through `llm.runner.model` and `llm.runner.attention`
over pages taken from `llm.core.pool`, and returns, for every position t of every row, the argmax
of the logits there and the log-probability of the row's actual token t + 1. Nothing is
sampled, nothing enters the prefix cache; the pages go back to the pool afterwards.

What attention reads: each layer's `attention.run` stores the new tokens' K/V into their pages
(quantised to the store's KV dtype) *before* it attends, and attends over the pages only, so
every query position t -- in a prefill step too -- sees positions 0..t as stored in the KV
dtype, its own K/V included. The two regimes differ only in which kernel reads the pages:
- prefill (`decode_from=None`): each row in one ragged prefill step (split into chunks of at
  most `max_step_tokens`, as chunked prefill does): `paged_prefill`.
- decode (`decode_from=P`): positions 0..P-1 as above, then positions P.. one token per step,
  every row a decode row: `paged_decode` (split-KV on the GPU), as generation reads its KV.
On the CPU both are the twins in radixkv.kernels.reference_*. CUDA graphs are not used (eager steps).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from radixkv.batch import Batch, BatchBuilder
from radixkv.request import Request

if TYPE_CHECKING:
    from .llm import LLM


@dataclass
class Forced:
    """One row's teacher-forced figures (CPU tensors); n = the row's length."""

    argmax: torch.Tensor  # int64 [n]: argmax of the logits at position t (a guess at token t + 1)
    next_logprob: torch.Tensor  # float32 [n - 1]: log p(token[t + 1] | tokens[0..t])
    decode_from: int | None  # positions >= this were computed as decode steps (None: prefill only)


def teacher_forced(llm: LLM, rows: Sequence[Sequence[int]], decode_from: int | None = None,
                   max_step_tokens: int = 4096) -> list[Forced]:
    """Per-position argmax and next-token log-probabilities of `rows` under llm's weights and KV dtype.

    decode_from: None = every position in prefill steps; P >= 1 = positions 0..P-1 in prefill
    steps, then one decode step per later position (all rows together). The LLM must be idle
    (no request in flight); cached prefixes are evicted as far as the rows' pages need."""
    if llm.has_work():
        raise RuntimeError("teacher_forced needs an idle LLM (requests are in flight)")
    rows = [list(map(int, r)) for r in rows]
    if not rows or any(len(r) < 2 for r in rows):
        raise ValueError("teacher_forced needs at least one row, every row of >= 2 tokens")
    if decode_from is not None and not 1 <= decode_from < min(map(len, rows)):
        raise ValueError(f"decode_from {decode_from} must be in [1, {min(map(len, rows))})")
    if max(map(len, rows)) > llm.max_model_len:
        raise ValueError(f"a row of {max(map(len, rows))} tokens exceeds the context of {llm.max_model_len}")
    V = llm.runner.vocab_size
    if any(not 0 <= t < V for r in rows for t in r):
        raise ValueError(f"a token id is outside the vocabulary [0, {V})")
    ps = llm.config.page_size
    need = [-(-len(r) // ps) for r in rows]
    short = sum(need) - llm.core.pool.num_free
    if short > 0:
        llm.core.cache.evict(short)
    pages = llm.core.pool.alloc(sum(need))  # OutOfPages when the pool is too small
    reqs, at = [], 0
    for i, (r, n) in enumerate(zip(rows, need)):
        req = Request(rid=i, prompt=r, max_tokens=1)
        req.pages = pages[at: at + n]
        at += n
        reqs.append(req)
    argmax = [torch.empty(len(r), dtype=torch.int64) for r in rows]
    logprob = [torch.empty(len(r) - 1, dtype=torch.float32) for r in rows]
    try:
        with torch.inference_mode():
            prefill_end = [len(r) if decode_from is None else decode_from for r in rows]
            for chunk in _prefill_chunks(prefill_end, max_step_tokens):
                b = BatchBuilder(ps)
                for i, start, q_len in chunk:
                    b.add(reqs[i], start, q_len)
                _score(llm, b.build(), [(i, start) for i, start, _ in chunk], rows, argmax, logprob)
            if decode_from is not None:
                for t in range(decode_from, max(map(len, rows))):
                    live = [i for i, r in enumerate(rows) if len(r) > t]
                    b = BatchBuilder(ps)
                    for i in live:
                        b.add(reqs[i], t, 1)
                    _score(llm, b.build(), [(i, t) for i in live], rows, argmax, logprob)
    finally:
        llm.core.pool.decref(pages)
    return [Forced(a, lp, decode_from) for a, lp in zip(argmax, logprob)]


def _prefill_chunks(ends: list[int], cap: int) -> list[list[tuple[int, int, int]]]:
    """Steps of (row, start, q_len) covering tokens [0, ends[i]) of every row, each step at most
    `cap` tokens; a row's chunks go to consecutive steps in order (chunked prefill)."""
    steps: list[list[tuple[int, int, int]]] = []
    cur: list[tuple[int, int, int]] = []
    room = cap
    for i, end in enumerate(ends):
        start = 0
        while start < end:
            if room == 0:
                steps.append(cur)
                cur, room = [], cap
            q = min(end - start, room)
            cur.append((i, start, q))
            start += q
            room -= q
    if cur:
        steps.append(cur)
    return steps


def _score(llm: LLM, batch: Batch, where: list[tuple[int, int]], rows: list[list[int]],
           argmax: list[torch.Tensor], logprob: list[torch.Tensor]) -> None:
    """Run one step with logits at every new token; write row i's figures from position start on."""
    dev = llm.runner.device
    llm.runner.attention.plan(batch)
    T = batch.num_tokens
    logits = llm.runner.model.forward(torch.tensor(batch.input_ids, dtype=torch.int64, device=dev),
                               torch.tensor(batch.positions, dtype=torch.int64, device=dev),
                               llm.runner.attention, torch.arange(T, dtype=torch.int64, device=dev))  # [T, V] fp32
    logits = logits[:, :llm.runner.vocab_size]
    top = logits.argmax(dim=-1).cpu()  # [T]
    # targets: the token after each position (0 at a row's final position, whose figure is dropped)
    targets = []
    for (i, start), q_len in zip(where, batch.q_lens):
        nxt = rows[i][start + 1: start + q_len + 1]
        targets.extend(nxt + [0] * (q_len - len(nxt)))
    tgt = torch.tensor(targets, dtype=torch.int64, device=dev)
    lp = (logits.gather(1, tgt[:, None])[:, 0] - torch.logsumexp(logits, dim=-1)).cpu()  # [T]
    at = 0
    for (i, start), q_len in zip(where, batch.q_lens):
        argmax[i][start: start + q_len] = top[at: at + q_len]
        last = min(start + q_len, len(rows[i]) - 1)  # the row's final position has no next token
        logprob[i][start: last] = lp[at: at + last - start]
        at += q_len
