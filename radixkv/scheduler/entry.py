"""Entry: the scheduler's state of one live request, and the keys it shares prefixes by. No torch."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from radixkv.cache import MatchResult
from radixkv.cache.node import Node
from radixkv.request import Request

ShareKey = tuple[int, int, bytes]  # (id(end node of the cached path), its tokens, next block's bytes)


@dataclass(eq=False)
class Entry:
    """Scheduler-side state of one live (waiting or running) request."""

    req: Request
    seq: int  # add order; breaks ties between equal arrivals
    arrival: float  # `now` at add()
    arrival_step: int  # steps scheduled before add()
    prompt_arr: np.ndarray  # int32 [len(prompt)], what the tree is given
    wait_since: float  # start of the current waiting episode
    wait_s: float = 0.0  # finished waiting episodes
    admit_seq: int = 0  # larger: admitted more recently
    locked: MatchResult | None = None  # the cached path this request locks while running
    admitted_once: bool = False
    score: int | None = None  # cached tokens at its last match (None: not matched yet)
    node: Node | None = None  # where that match ended (DFS_WEIGHT's grouping)
    last: MatchResult | None = None  # its latest match while waiting (RadixCache.match's `since`)
    host_loaded: int = 0  # prompt tokens the host tier loaded back for it before its first admission

    def order_key(self) -> tuple[float, int]:
        return (self.arrival, self.seq)

    def waiting_tokens(self) -> np.ndarray:
        """All its tokens (prompt + output) as int32: what a waiting request is matched with.
        The prompt array itself while there is no output (no slice, no copy)."""
        out = self.req.output
        if not out:
            return self.prompt_arr
        return self.token_array(len(self.prompt_arr) + len(out))

    def token_array(self, n: int) -> np.ndarray:
        """The first n tokens of prompt + output as int32."""
        p = self.prompt_arr
        if n <= len(p):
            return p[:n]
        return np.concatenate((p, np.asarray(self.req.output[: n - len(p)], dtype=np.int32)))

    def token_slice(self, start: int, stop: int) -> np.ndarray:
        """Tokens [start, stop) of prompt + output as int32 (a view while inside the prompt)."""
        p = self.prompt_arr
        if stop <= len(p):
            return p[start:stop]
        out = np.asarray(self.req.output[max(start - len(p), 0): stop - len(p)], dtype=np.int32)
        return out if start >= len(p) else np.concatenate((p[start:], out))


def worst_case_pages(req: Request, page_size: int) -> int:
    """Pages a request holds at most: K/V of its prompt and all outputs but the last."""
    return -(-(len(req.prompt) + req.max_tokens - 1) // page_size)


def share_key(m: MatchResult, tokens: np.ndarray, ps: int) -> ShareKey | None:
    """Identity of the first block past m's cached path (None when tokens lack a full one).

    The end node of a path identifies the path, so equal keys mean equal prefixes."""
    n = m.num_tokens
    if len(tokens) < n + ps:
        return None
    return (id(m.node), n, tokens[n: n + ps].tobytes())
