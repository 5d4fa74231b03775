"""Log-probabilities the API returns: of sampled tokens, and of prompt tokens (prompt logprobs).

Both read log_softmax of the model's raw logits (before penalties, temperature and logits controls,
as vLLM's default "raw_logprobs"). Each position's result is a PositionLogprobs: the token there, its
log-probability, its rank (1 + the tokens strictly more likely), and the k most likely tokens.

Prompt logprobs score every prompt position a step computes: the logits at position i give the
log-probability of prompt token i + 1. Those logits come from the residual rows of the step
(LlamaModel.hidden), run through the LM head a slice at a time so that at most MAX_LOGIT_ELEMENTS
float32 logits exist at once, whatever the prompt's length; a step's scores come back as one
LogprobsBlock (columns, radixkv/prompt_logprobs.py), not an object a position.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch
from torch import Tensor

from radixkv.prompt_logprobs import LogprobsBlock
from radixkv.request import PositionLogprobs

MAX_LOGIT_ELEMENTS = 1 << 27  # 512 MiB of float32 logits in flight per slice


def _score(logits: Tensor, tokens: Tensor, k: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """logits [N, V] float32, tokens [N] int64 -> (logprob [N], rank [N], top values [N, k], top ids [N, k])."""
    lse = torch.logsumexp(logits, dim=-1, keepdim=True)  # [N, 1]
    picked = logits.gather(1, tokens.view(-1, 1))  # [N, 1]
    rank = (logits > picked).sum(dim=-1) + 1  # [N]
    if k > 0:
        top_v, top_i = logits.topk(k, dim=-1)  # [N, k] each
    else:
        top_v, top_i = logits[:, :0], tokens.new_zeros((logits.shape[0], 0))
    return (picked - lse).squeeze(1), rank, top_v - lse, top_i


def _rows(tokens: list[int], lp: list[float], rank: list[int], top_v: list[list[float]],
          top_i: list[list[int]], ks: Sequence[int]) -> list[PositionLogprobs]:
    return [PositionLogprobs(t, float(lp[n]), int(rank[n]), tuple(top_i[n][:ks[n]]), tuple(top_v[n][:ks[n]]))
            for n, t in enumerate(tokens)]


def token_logprobs(logits: Tensor, tokens: Tensor, ks: Sequence[int]) -> list[PositionLogprobs]:
    """Per row of logits [S, V] (raw): the sampled token tokens[s] and the ks[s] most likely. One host copy."""
    lp, rank, top_v, top_i = _score(logits.float(), tokens, max(ks))
    return _rows(tokens.tolist(), lp.tolist(), rank.tolist(), top_v.tolist(), top_i.tolist(), ks)


def prompt_logprobs(logits_of: Callable[[Tensor], Tensor], hidden: Tensor, targets: list[int], k: int,
                    vocab_size: int) -> LogprobsBlock:
    """Score `targets` (the prompt's next tokens) at the residual rows `hidden` [N, H]; k top alternatives.

    logits_of: rows [n, H] -> logits [n, V] float32 (LlamaModel.logits); vocab_size: V. Slices of rows keep
    the logits in flight under MAX_LOGIT_ELEMENTS; one host copy a field."""
    step = max(1, MAX_LOGIT_ELEMENTS // vocab_size)
    tok = torch.tensor(targets, dtype=torch.int64, device=hidden.device)  # [N]
    parts = [_score(logits_of(hidden[lo: lo + step]), tok[lo: lo + step], k) for lo in range(0, hidden.shape[0], step)]
    lp, rank, top_v, top_i = (torch.cat(x) for x in zip(*parts))
    return LogprobsBlock.of(np.asarray(targets), lp.cpu().numpy(), rank.cpu().numpy(), top_i.cpu().numpy(),
                            top_v.cpu().numpy())
