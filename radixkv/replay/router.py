"""Routers: which of N replicas serves a request. No torch.

    round-robin   replica 0, 1, ..., N-1, 0, ...: the placement-blind baseline
    least-loaded  fewest outstanding requests (waiting + running), then fewest uncomputed prompt tokens
    prefix        the replica where the request would start soonest: expected prefix hit from a
                  PrefixIndex fed by the replicas' KV events, against each replica's backlog, within
                  a cap on requests served per replica

Every router sees the same inputs: the request's tokens and namespace and one ReplicaLoad per
replica, taken at the request's arrival; `observe` hands it a replica's KV events (only `prefix`
reads them). `route` returns a replica index in 0..N-1.

The prefix router's rule. For replica r, with L prompt tokens, h_r the tokens of its leading blocks
the index says r holds and b_r r's backlog (uncomputed prompt tokens of its waiting and running
requests), the prefill work before this request's first token is about b_r + (L - h_r) tokens (the
step-time model is linear in prefill tokens); the router picks the smallest, ties to the longer hit,
then the fewer served. Replicas that already served more than `balance` x the mean plus `slack`
requests are passed over while another is below the cap, so max / mean requests served stays near
`balance` whatever the traffic's skew.
"""
from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple, Protocol

import numpy as np

from radixkv.cache.events import KVEventBatch
from radixkv.cache.node import Namespace
from .prefix_index import PrefixIndex


class RouterKind(enum.Enum):
    PREFIX = "prefix"
    ROUND_ROBIN = "round-robin"
    LEAST_LOADED = "least-loaded"


class ReplicaLoad(NamedTuple):
    """One replica's state when a request arrives."""

    waiting: int  # requests queued, not yet admitted
    running: int  # requests admitted, not finished
    backlog_tokens: int  # prompt tokens of those requests not computed yet
    served: int  # requests routed to it so far

    @property
    def outstanding(self) -> int:
        return self.waiting + self.running


class Router(Protocol):
    kind: RouterKind

    def route(self, tokens: np.ndarray, namespace: Namespace, loads: Sequence[ReplicaLoad]) -> int: ...

    def observe(self, replica: int, batch: KVEventBatch) -> None: ...


class RoundRobinRouter:
    kind = RouterKind.ROUND_ROBIN

    def __init__(self) -> None:
        self._next = 0

    def route(self, tokens: np.ndarray, namespace: Namespace, loads: Sequence[ReplicaLoad]) -> int:
        r = self._next % len(loads)
        self._next = r + 1
        return r

    def observe(self, replica: int, batch: KVEventBatch) -> None:
        pass


class LeastLoadedRouter:
    kind = RouterKind.LEAST_LOADED

    def route(self, tokens: np.ndarray, namespace: Namespace, loads: Sequence[ReplicaLoad]) -> int:
        return min(range(len(loads)), key=lambda r: (loads[r].outstanding, loads[r].backlog_tokens,
                                                     loads[r].served, r))

    def observe(self, replica: int, batch: KVEventBatch) -> None:
        pass


@dataclass
class PrefixRouter:
    """Expected prefix hit against backlog (module docstring), with a cap on requests served."""

    num_replicas: int
    balance: float = 1.15  # cap on served requests: balance x the mean so far, plus slack
    slack: int = 2
    backlog_weight: float = 1.0  # tokens of backlog worth one token of prefix hit
    block_size: int | None = None  # the replicas' page size: lets a routed prompt's blocks be expected at once
    kind = RouterKind.PREFIX

    def __post_init__(self) -> None:
        if self.balance < 1.0:
            raise ValueError(f"balance must be >= 1.0 (a cap below the mean), got {self.balance}")
        if self.slack < 0 or self.backlog_weight < 0:
            raise ValueError(f"slack and backlog_weight must be >= 0, got {self.slack}, {self.backlog_weight}")
        self.index = PrefixIndex(self.num_replicas, self.block_size)

    def observe(self, replica: int, batch: KVEventBatch) -> None:
        self.index.apply(replica, batch)

    def expected_hits(self, tokens: np.ndarray, namespace: Namespace) -> list[int]:
        """Tokens of `tokens` each replica would serve from its cache, by the index."""
        bs = self.index.block_size or 0
        return [b * bs for b in self.index.matched_blocks(tokens, namespace)]

    def route(self, tokens: np.ndarray, namespace: Namespace, loads: Sequence[ReplicaLoad]) -> int:
        if len(loads) != self.num_replicas:
            raise ValueError(f"{len(loads)} replica loads for a router of {self.num_replicas} replicas")
        hits = self.expected_hits(tokens, namespace)
        total = sum(x.served for x in loads) + 1
        cap = self.balance * total / self.num_replicas + self.slack
        open_ = [r for r in range(self.num_replicas) if loads[r].served + 1 <= cap]
        if not open_:
            open_ = list(range(self.num_replicas))
        n = len(tokens)
        w = self.backlog_weight
        choice = min(open_, key=lambda r: (w * loads[r].backlog_tokens + n - hits[r], -hits[r], loads[r].served, r))
        self.index.expect(choice, tokens, namespace)  # followers go here before its events arrive
        return choice


def make_router(kind: RouterKind, num_replicas: int, block_size: int | None = None) -> Router:
    """A fresh router of `kind` for `num_replicas` replicas (of `block_size`-token pages, when known)."""
    if num_replicas < 1:
        raise ValueError(f"num_replicas must be >= 1, got {num_replicas}")
    if kind is RouterKind.PREFIX:
        return PrefixRouter(num_replicas, block_size=block_size)
    if kind is RouterKind.ROUND_ROBIN:
        return RoundRobinRouter()
    if kind is RouterKind.LEAST_LOADED:
        return LeastLoadedRouter()
    raise TypeError(f"not a RouterKind: {kind!r}")
