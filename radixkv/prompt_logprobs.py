"""Prompt logprobs as columns. No torch.

A prompt of 1,000 tokens has 999 scored positions; one Python object a position (and vLLM's dict of
Logprob objects a position) costs more host time than the GPU spends scoring them. So the engine core
carries a step's scores as a LogprobsBlock, one array a field, through the core, the wire (bytes, as
they are) and the output processor; PromptLogprobs gives vLLM's list of {token id: Logprob} dicts,
building each one only when it is read (vLLM's FlatLogprobs idea).
"""
from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, overload

import numpy as np

from .request import Logprob, LogprobsDict, PositionLogprobs

_I32, _F32 = np.dtype("<i4"), np.dtype("<f4")


@dataclass(frozen=True)
class LogprobsBlock:
    """Log-probabilities at n consecutive positions (log_softmax of the raw logits): the token each
    position scores, its log-probability and rank (1: the most likely), and the k most likely tokens
    with theirs, best first. Fields are little-endian arrays as bytes: tokens, ranks, top_ids int32
    ([n], [n], [n, k]); logprobs, top_logprobs float32 ([n], [n, k])."""

    n: int
    k: int
    tokens: bytes
    logprobs: bytes
    ranks: bytes
    top_ids: bytes
    top_logprobs: bytes

    @classmethod
    def of(cls, tokens: np.ndarray, logprobs: np.ndarray, ranks: np.ndarray, top_ids: np.ndarray,
           top_logprobs: np.ndarray) -> LogprobsBlock:
        """From arrays [n], [n], [n], [n, k], [n, k]."""
        n, k = top_ids.shape
        return cls(n, k, tokens.astype(_I32).tobytes(), logprobs.astype(_F32).tobytes(), ranks.astype(_I32).tobytes(),
                   top_ids.astype(_I32).tobytes(), top_logprobs.astype(_F32).tobytes())

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(tokens [n], logprobs [n], ranks [n], top_ids [n, k], top_logprobs [n, k]), read-only views."""
        shape = (self.n, self.k)
        return (np.frombuffer(self.tokens, _I32), np.frombuffer(self.logprobs, _F32), np.frombuffer(self.ranks, _I32),
                np.frombuffer(self.top_ids, _I32).reshape(shape), np.frombuffer(self.top_logprobs, _F32).reshape(shape))

    def slice(self, start: int, stop: int, k: int | None = None) -> LogprobsBlock:
        """Positions [start, stop), keeping the first k alternatives (all by default)."""
        t, lp, r, ti, tl = self.arrays()
        k = self.k if k is None else min(k, self.k)
        return LogprobsBlock.of(t[start:stop], lp[start:stop], r[start:stop], ti[start:stop, :k], tl[start:stop, :k])

    @staticmethod
    def concat(blocks: Sequence[LogprobsBlock]) -> LogprobsBlock:
        """The blocks one after another (the same k)."""
        if len(blocks) == 1:
            return blocks[0]
        cols = list(zip(*(b.arrays() for b in blocks)))
        return LogprobsBlock.of(*(np.concatenate(c) for c in cols))

    def positions(self) -> list[PositionLogprobs]:
        """One PositionLogprobs a position (the server's JSON is built from these)."""
        t, lp, r, ti, tl = (a.tolist() for a in self.arrays())
        return [PositionLogprobs(t[i], lp[i], r[i], tuple(ti[i]), tuple(tl[i])) for i in range(self.n)]


class PromptLogprobs(Sequence[LogprobsDict | None]):
    """vLLM's RequestOutput.prompt_logprobs: None for the first prompt token, then per token
    {token id: Logprob} of the prompt's token and the k most likely ones (ranked), each dict built
    when it is read. decode: a token id's text (None without a tokenizer). Compares equal to a list
    of the same entries."""

    def __init__(self, block: LogprobsBlock | None, decode: Callable[[int], str | None]) -> None:
        self._block, self._decode = block, decode
        self._cols = block.arrays() if block is not None else None

    def __len__(self) -> int:
        return 1 + (self._block.n if self._block is not None else 0)

    @overload
    def __getitem__(self, i: int) -> LogprobsDict | None: ...
    @overload
    def __getitem__(self, i: slice) -> list[LogprobsDict | None]: ...

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"prompt position {i} out of range for {n} prompt tokens")
        i %= n
        if i == 0:
            return None
        t, lp, r, ti, tl = self._cols  # type: ignore[misc]
        p = i - 1
        tok = int(t[p])
        out = {tok: Logprob(float(lp[p]), int(r[p]), self._decode(tok))}
        for rank, (a, v) in enumerate(zip(ti[p].tolist(), tl[p].tolist()), 1):
            if a not in out:
                out[a] = Logprob(v, rank, self._decode(a))
        return out

    def __iter__(self) -> Iterator[LogprobsDict | None]:
        return (self[i] for i in range(len(self)))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other))

    def __repr__(self) -> str:
        return f"PromptLogprobs({len(self)} positions)"
