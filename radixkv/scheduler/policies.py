"""Admission policies: the order in which waiting requests are offered a place. No torch.

Each policy maps the waiting candidates (given oldest first) and, for the cache-aware ones,
their current prefix matches to a preference order (a list of candidate indices). The
starvation guard is applied on top of this order by `AdmissionRanker`.

- FCFS: arrival order.
- LPM: longest cached prefix first (ties keep arrival order).
- DFS_WEIGHT (SGLang's): weigh every tree node by the number of candidates whose match ends in
  its subtree, then walk the tree depth-first, heavier children first, emitting a node's
  candidates after its subtree's. Requests sharing a cached prefix are admitted together, and
  deeper matches come before shallower ones on the same path.
"""
from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Sequence
from typing import Protocol, TypeVar

from radixkv.config import Policy
from radixkv.cache.radix_tree import MatchResult, Node


def policy_order(policy: Policy, matches: Sequence[MatchResult] | None, num: int) -> list[int]:
    """Indices 0..num-1 of the candidates in the order `policy` prefers.

    matches[i] is candidate i's prefix match (needed by LPM and DFS_WEIGHT, ignored by FCFS).
    """
    if policy is Policy.FCFS:
        return list(range(num))
    if matches is None or len(matches) != num:
        raise ValueError(f"policy {policy.value} needs one match per candidate")
    if policy is Policy.LPM:
        return sorted(range(num), key=lambda i: -matches[i].num_tokens)  # stable: ties by arrival
    if policy is Policy.DFS_WEIGHT:
        return _dfs_weight_order(matches)
    raise ValueError(f"unknown policy {policy!r}")


def _dfs_weight_order(matches: Sequence[MatchResult]) -> list[int]:
    # Only nodes on some candidate's matched path are visited, never the whole tree.
    weight: dict[int, int] = {}  # id(node) -> candidates whose match ends in its subtree
    children: dict[int, list] = {}  # id(node) -> its children on some candidate's path
    at_node: dict[int, list[int]] = {}  # id(node) -> candidates whose match ends exactly there
    roots: dict[int, object] = {}  # id(root) -> root, in first-seen order
    for i, m in enumerate(matches):
        node = m.node
        at_node.setdefault(id(node), []).append(i)
        while True:
            key = id(node)
            seen = key in weight
            weight[key] = weight.get(key, 0) + 1
            parent = node.parent
            if parent is None:
                roots.setdefault(key, node)
                break
            if not seen:
                children.setdefault(id(parent), []).append(node)
            node = parent
    order: list[int] = []
    # Explicit stack (deep trees must not hit the recursion limit): (node, children expanded?)
    stack: list[tuple[object, bool]] = [(r, False) for r in
                                        sorted(reversed(list(roots.values())), key=lambda r: weight[id(r)])]
    while stack:
        node, expanded = stack.pop()
        key = id(node)
        if expanded:
            order.extend(at_node.get(key, ()))
            continue
        stack.append((node, True))
        # Lightest pushed first so the heaviest pops first; equal weights pop in first-seen order.
        kids = sorted(reversed(children.get(key, [])), key=lambda c: weight[id(c)])
        stack.extend((c, False) for c in kids)
    return order


class Queued(Protocol):
    """What ranking reads of a waiting request (the scheduler's entry for it)."""

    arrival: float
    score: int | None  # cached tokens at its last match (None: not matched yet)
    node: Node | None  # where that match ended


Q = TypeVar("Q", bound=Queued)


class AdmissionRanker:
    """Orders the waiting window each admission round: the starvation guard, then the policy.

    The guard: the oldest starved request (earliest arrival; equal arrivals in policy order)
    goes first; everyone else, starved or not, follows in policy order. The scheduler's
    head-of-line rule keeps later requests from taking the pages that head waits for, so one
    starved request is served per step, oldest first, while a saturated queue (everyone
    starved) keeps its cache-aware order.

    LPM and DFS_WEIGHT read each candidate's last match (`score`, `node`); a round re-matches
    at most `match_budget` of them through `match` (which updates them): never-matched ones
    first, then the current best (the likely admissions), then a round-robin over the rest,
    so a prefix cached since a request was last matched is found within
    ceil(len(window) / (match_budget - match_budget // 2)) rounds. A node evicted since its match just sorts as its own
    subtree until the request is re-matched.
    """

    def __init__(self, policy: Policy, match_budget: int, match: Callable[[Queued], None],
                 match_all: Callable[[list[Queued]], None] | None = None) -> None:
        """match(e) re-matches one candidate; match_all(picks), when given, the same for each of
        picks in order, in one call (the scheduler's, through RadixCache.match_many)."""
        if match_budget < 1:
            raise ValueError(f"match_budget must be >= 1, got {match_budget}")
        self.policy = policy
        self.match_budget = match_budget
        self._match = match
        self._match_all = match_all or (lambda picks: [match(e) for e in picks] and None)
        self._cursor = 0  # round-robin position over the window

    def order(self, cands: list[Q], starved: Callable[[Q], bool]) -> tuple[list[Q], bool]:
        """`cands` (sorted by arrival, oldest first) in the order they are offered a place;
        True when the first is a starved request."""
        if self.policy is Policy.LPM:
            self._refresh(cands)
            keys = [-(e.score or 0) for e in cands]
            rank = sorted(range(len(cands)), key=keys.__getitem__)  # stable: ties by arrival
        elif self.policy is Policy.DFS_WEIGHT:
            self._refresh(cands)
            known = [k for k, e in enumerate(cands) if e.node is not None]
            matches = [MatchResult(cands[k].score, [], cands[k].node) for k in known]
            rank = [known[i] for i in policy_order(self.policy, matches, len(known))]
            rank += [k for k, e in enumerate(cands) if e.node is None]  # not matched yet
        else:
            rank = policy_order(self.policy, None, len(cands))
        # cands are oldest first and waits only grow with age: if the oldest is not starved,
        # nobody is. Among equal arrivals (a burst) the policy's first starved one leads.
        if not cands or not starved(cands[0]):
            return [cands[k] for k in rank], False
        first = cands[0].arrival
        ties = 1  # cands[:ties] arrived with the oldest (sorted by arrival: a prefix)
        while ties < len(cands) and cands[ties].arrival == first:
            ties += 1
        head = 0 if ties == 1 else next(k for k in rank if k < ties and starved(cands[k]))
        return [cands[head]] + [cands[k] for k in rank if k != head], True

    def _refresh(self, cands: list[Q]) -> None:
        budget = self.match_budget
        if len(cands) <= budget:
            self._match_all(cands)
            return
        picks = [e for e in cands if e.score is None][:budget]
        want_best = budget // 2 - len(picks)
        if want_best > 0:
            picks += heapq.nlargest(want_best, (e for e in cands if e.score is not None),
                                    key=lambda e: e.score)
        chosen = {id(e) for e in picks}
        start = self._cursor % len(cands)
        for e in itertools.chain(cands[start:], cands[:start]):
            if len(picks) >= budget:
                break
            if id(e) not in chosen:
                picks.append(e)
            self._cursor += 1
        self._match_all(picks)
