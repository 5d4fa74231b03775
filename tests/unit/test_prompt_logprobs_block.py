"""LogprobsBlock (a step's prompt scores as columns) and PromptLogprobs (vLLM's list of dicts, built
when read): slicing, concatenation, the dicts' ranks, and list-like behaviour."""
from __future__ import annotations

import numpy as np
import pytest

from radixkv.prompt_logprobs import LogprobsBlock, PromptLogprobs
from radixkv.request import Logprob


def _block(n: int = 4, k: int = 3, first: int = 0) -> LogprobsBlock:
    pos = np.arange(first, first + n)
    top = np.stack([pos * 10 + j for j in range(k)], axis=1)
    return LogprobsBlock.of(pos + 100, -pos.astype(float), pos % 3 + 1, top, -(top.astype(float)) / 100)


def test_slices_and_concatenation_keep_every_column() -> None:
    b = _block(6, 3)
    head, tail = b.slice(0, 2), b.slice(2, 6)
    assert LogprobsBlock.concat([head, tail]) == b
    narrow = b.slice(1, 3, k=1)
    assert (narrow.n, narrow.k) == (2, 1) and narrow.positions()[0].top_ids == (10,)
    assert [p.token for p in b.positions()] == [100, 101, 102, 103, 104, 105]


def test_prompt_logprobs_read_as_vllms_list() -> None:
    lps = PromptLogprobs(_block(3, 2), lambda t: f"<{t}>")
    assert len(lps) == 4 and lps[0] is None and list(lps)[0] is None
    d = lps[2]  # position 1 of the block: token 101, rank 2; top ids 10, 11
    assert d[101] == Logprob(-1.0, 2, "<101>")
    assert d[10] == Logprob(pytest.approx(-0.1), 1, "<10>") and d[11].rank == 2
    assert lps[-1] == lps[3] and lps[1:] == [lps[1], lps[2], lps[3]]
    assert lps == list(lps) and lps != list(lps)[:-1]
    with pytest.raises(IndexError):
        lps[4]
    assert PromptLogprobs(None, lambda t: None) == [None]
