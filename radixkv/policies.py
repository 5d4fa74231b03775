"""Admission policies: the order in which waiting requests are offered a place. No torch.

Each policy maps the waiting candidates (given oldest first) and, for the cache-aware ones,
their current prefix matches to a preference order (a list of candidate indices). The
starvation guard is applied on top of this order by the scheduler, not here.

- FCFS: arrival order.
- LPM: longest cached prefix first (ties keep arrival order).
- DFS_WEIGHT (SGLang's): weigh every tree node by the number of candidates whose match ends in
  its subtree, then walk the tree depth-first, heavier children first, emitting a node's
  candidates after its subtree's. Requests sharing a cached prefix are admitted together, and
  deeper matches come before shallower ones on the same path.
"""
from __future__ import annotations

from collections.abc import Sequence

from .config import Policy
from .radix_tree import MatchResult


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
