"""The batched sampler (SamplingParams live in radixkv/sampling_params.py).

temperature below GREEDY_BELOW is greedy (argmax). Otherwise logits are scaled by 1 / temperature,
cut to the `top_k` largest, the smallest set whose probability reaches `top_p` and the tokens at
least `min_p` times as likely as the most likely one, and one token is drawn by the Gumbel-max
trick: argmax(logits / T + g) with g = -log(-log(u)). Nothing is sorted: top-k masks below each
row's k-th largest logit (torch.topk), top-p and min-p draw by rejection (kernels/nucleus.py).

The uniforms u come from a counter-based hash of (request seed, index of the token in the
request's output, vocabulary id), computed on the logits' device for the whole batch at once.
So a request with a `seed` draws the same tokens whatever else shares its batch, preemption
and recomputation included, and no per-row Python loop, generator or host sync is needed.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import NamedTuple

import torch
from torch import Tensor

from radixkv.sampling_params import GREEDY_BELOW, SamplingParams


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
    max_top_k: int  # host-side: the largest top_k below V of any row (0: no row has one)


def sampling_rows(params: Sequence[SamplingParams], seeds: Sequence[int], counters: Sequence[int],
                  vocab_size: int, device: torch.device) -> SamplingRows:
    """Pack the per-request parameters of a step's sampling rows: two host-to-device copies, from pinned
    memory on CUDA (a copy from pageable memory may wait for the stream, which async scheduling must not)."""
    k = [vocab_size if p.top_k is None else min(p.top_k, vocab_size) for p in params]
    pin = torch.device(device).type == "cuda"
    floats = torch.tensor([[p.temperature for p in params], [p.top_p for p in params], [p.min_p for p in params]],
                          dtype=torch.float32, pin_memory=pin).to(device, non_blocking=True)  # [3, S]
    ints = torch.tensor([k, _as_int64(seeds), list(counters)], dtype=torch.int64,
                        pin_memory=pin).to(device, non_blocking=True)  # [3, S]
    return SamplingRows(temperature=floats[0], top_k=ints[0], top_p=floats[1], min_p=floats[2], seed=ints[1],
                        counter=ints[2], all_greedy=all(p.greedy for p in params),
                        filtered=any(p.top_k is not None or p.top_p < 1.0 or p.min_p > 0.0 for p in params),
                        max_top_k=max((x for x in k if x < vocab_size), default=0))


def _as_int64(seeds: Sequence[int]) -> list[int]:
    """Seeds folded into the int64 range (any Python int is a valid seed)."""
    return [((s + 2**63) % 2**64) - 2**63 for s in seeds]


def sample(logits: Tensor, rows: SamplingRows) -> Tensor:
    """logits: [S, V] float32 -> token ids int64 [S] on logits' device (no host sync).

    Unfiltered rows: argmax(x * (1 / T) + gumbel) in one pass over the vocabulary (kernels/sample.py's
    gumbel_argmax on the GPU, its twin on the CPU). With a filter in the batch: x masked below each
    top-k row's k-th largest logit, then kernels/nucleus.py's rejection draw for top-p and min-p
    (its twin on the CPU), which gives a row without filters the same token gumbel_argmax would."""
    greedy = logits.argmax(dim=-1)
    if rows.all_greedy:
        return greedy
    is_greedy = rows.temperature < GREEDY_BELOW
    inv_temperature = 1.0 / torch.where(is_greedy, 1.0, rows.temperature)  # [S]
    cuda = logits.device.type == "cuda"
    if not rows.filtered:
        if cuda:
            from radixkv.kernels import gumbel_argmax as draw
        else:
            from radixkv.kernels.reference_sampling import gumbel_argmax_ref as draw
        return torch.where(is_greedy, greedy, draw(logits, inv_temperature, rows.seed, rows.counter))
    x = _top_k(logits, rows.top_k, rows.max_top_k)  # [S, V]
    if cuda:
        from radixkv.kernels import nucleus_draw as nucleus
    else:
        from radixkv.kernels.reference_sampling import nucleus_draw_ref as nucleus
    return torch.where(is_greedy, greedy, nucleus(x, inv_temperature, rows.top_p, rows.min_p, rows.seed, rows.counter))


def _top_k(logits: Tensor, top_k: Tensor, max_top_k: int) -> Tensor:
    """logits [S, V] with entries below each row's top_k-th largest at -inf (ties with it kept);
    rows whose top_k is V untouched. max_top_k: the largest top_k below V (0: none, logits returned)."""
    if max_top_k == 0:
        return logits
    V = logits.shape[1]
    top = logits.topk(max_top_k, dim=-1).values  # [S, max_top_k], descending
    kth = top.gather(1, (top_k.clamp(max=max_top_k) - 1)[:, None])  # [S, 1]
    kth = torch.where(top_k[:, None] >= V, float("-inf"), kth)
    return logits.masked_fill(logits < kth, float("-inf"))


def penalize(logits: Tensor, params: Sequence[SamplingParams], prompts: Sequence[Sequence[int]],
             outputs: Sequence[Sequence[int]], stop_ids: Sequence[Iterable[int]]) -> Tensor:
    """logits [S, V] of a step's sampling rows -> the logits the sampler draws from, greedy rows
    included. In vLLM's order: the logits controls (`_constrain`: allowed_token_ids, bad_words,
    logit_bias); for rows below their min_tokens, the stop token ids (EOS included) at -inf; then
    vLLM's repetition_penalty (prompt + output tokens: positive logits divided by it, negative ones
    multiplied), frequency_penalty (times each output token's count) and presence_penalty (once per
    distinct output token) subtracted. Vectorised over the batch: a few host-to-device copies of the
    rows' token ids, no per-row loop over the vocabulary; rows without a control pay nothing.
    Returns `logits` itself when no row needs anything."""
    S, V = logits.shape
    dev = logits.device
    masked = [(i, t) for i, (p, out, stops) in enumerate(zip(params, outputs, stop_ids))
              if len(out) < p.min_tokens for t in stops if 0 <= t < V]
    rows = [i for i, p in enumerate(params) if p.has_penalties]
    ctl = [i for i, p in enumerate(params) if p.constrains_logits]
    if not masked and not rows and not ctl:
        return logits
    logits = logits.clone()
    if ctl:
        _constrain(logits, params, outputs, ctl)
    if masked:
        _fill(logits, masked, float("-inf"))
    if rows:
        R = len(rows)
        idx = torch.tensor(rows, dtype=torch.int64).to(dev, non_blocking=True)
        out_pad = _padded([outputs[i] for i in rows], V).to(dev, non_blocking=True)  # [R, Lo], pad = V
        seen_pad = _padded([list(prompts[i]) + list(outputs[i]) for i in rows], V).to(dev, non_blocking=True)
        coef = torch.tensor([[params[i].repetition_penalty, params[i].frequency_penalty, params[i].presence_penalty]
                             for i in rows], dtype=torch.float32).to(dev, non_blocking=True)  # [R, 3]
        counts = torch.zeros(R, V + 1, dtype=torch.float32, device=dev)
        counts.scatter_add_(1, out_pad, torch.ones_like(out_pad, dtype=torch.float32))
        counts = counts[:, :V]
        seen = torch.zeros(R, V + 1, dtype=torch.bool, device=dev).scatter_(1, seen_pad, True)[:, :V]
        x = logits.index_select(0, idx)
        rep = coef[:, 0:1]
        x = torch.where(seen, torch.where(x > 0, x / rep, x * rep), x)
        x = x - coef[:, 1:2] * counts - coef[:, 2:3] * (counts > 0).float()
        logits.index_copy_(0, idx, x)
    return logits


def _constrain(logits: Tensor, params: Sequence[SamplingParams], outputs: Sequence[Sequence[int]],
               ctl: Sequence[int]) -> None:
    """In place on logits [S, V], for the rows `ctl` (those with a control): every token outside a
    row's allowed_token_ids at -inf; bad words' banned tokens at -inf (a one-token word always, a
    longer one's last token when the row's output ends with the rest of it, as vLLM does); then
    logit_bias added. One scatter per kind for the whole batch; ids outside [0, V) are skipped
    (the server refuses them first)."""
    S, V = logits.shape
    dev = logits.device
    allowed = [i for i in ctl if params[i].allowed_token_ids]
    if allowed:
        pairs = [(r, t) for r, i in enumerate(allowed) for t in params[i].allowed_token_ids if 0 <= t < V]
        keep = torch.zeros(len(allowed), V, dtype=torch.bool, device=dev)
        if pairs:
            r, t = zip(*pairs)
            keep[_ids(r, dev), _ids(t, dev)] = True
        idx = _ids(allowed, dev)
        logits.index_copy_(0, idx, logits.index_select(0, idx).masked_fill(~keep, float("-inf")))
    banned = []
    for i in ctl:
        seqs = params[i].bad_words_token_ids
        if seqs is None and params[i].bad_words:
            raise ValueError("bad_words were not tokenised: pass SamplingParams.with_bad_words_tokenized(tokenizer)")
        if not seqs:
            continue
        out = outputs[i]
        for seq in seqs:
            n = len(seq) - 1
            if n == 0 or (len(out) >= n and list(out[len(out) - n:]) == list(seq[:n])):
                banned.append((i, seq[-1]))
    banned = [(i, t) for i, t in banned if 0 <= t < V]
    if banned:
        _fill(logits, banned, float("-inf"))
    bias = [(i, t, b) for i in ctl for t, b in (params[i].logit_bias or {}).items() if 0 <= t < V]
    if bias:
        r, t, b = zip(*bias)
        logits.index_put_((_ids(r, dev), _ids(t, dev)),
                          torch.tensor(b, dtype=logits.dtype).to(dev, non_blocking=True), accumulate=True)


def _ids(xs: Sequence[int], dev: torch.device) -> Tensor:
    return torch.tensor(list(xs), dtype=torch.int64).to(dev, non_blocking=True)


def _fill(logits: Tensor, pairs: Sequence[tuple[int, int]], value: float) -> None:
    """logits[row, token] = value for each (row, token) pair, in one index_put_."""
    r, t = zip(*pairs)
    logits.index_put_((_ids(r, logits.device), _ids(t, logits.device)), torch.tensor(value, device=logits.device))


def _padded(seqs: Sequence[Sequence[int]], pad: int) -> Tensor:
    """int64 [len(seqs), max(1, longest)] of the sequences, right-padded with `pad`."""
    width = max(1, max((len(s) for s in seqs), default=0))
    return torch.tensor([list(map(int, s)) + [pad] * (width - len(s)) for s in seqs], dtype=torch.int64)
