"""Growing draft trees by the drafter's confidence (EAGLE-2's dynamic trees), shared by the head drafters.

Every node's score is the draft's log-probability of its whole path. Level by level, the `top_m` best tokens
under each frontier node become candidates and the `beam` best candidates of the level become the next
frontier; at the end the `budget` best nodes overall are kept. A path's score never exceeds its parent's, so
the kept set is closed under ancestors: a tree. For the same reason a frontier node scoring below the
`budget`-th best node found so far has no descendant the kept set could take: it is not expanded, and a row
whose whole frontier falls below that bar stops growing. The kept set is the same as without the cut (the
candidates it removes all score below the bar, so the beams keep the same nodes above it); only the drafter's
work shrinks, a level of head forward and LM head per node it spares. Candidates are fixed before verification
(no sampling), so verify_tree's one-hot rule keeps every row, greedy or sampled, lossless.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from specdecode.drafters.base import Proposal
from specdecode.verify.sampling import PAD_TOKEN_ID


@dataclass
class Node:
    token: int
    parent: int  # index of the parent in the row's node list, -1 = the root (pending token)
    depth: int  # 1 for the root's children
    score: float  # draft log-probability of the path root -> this node
    state: object = None  # whatever the drafter needs to expand this node (a feature row, a hidden state)


@dataclass
class TreeShape:
    top_m: int = 4  # candidates per expanded node
    beam: int = 4  # nodes expanded per level
    max_depth: int = 6


@dataclass
class RowTree:
    budget: int
    nodes: list[Node] = field(default_factory=list)
    frontier: list[int] = field(default_factory=list)  # indices into nodes; -1 = the root

    def bar(self) -> float:
        """The budget-th best score so far (-inf with fewer nodes): a node below it is never kept, nor is any
        descendant of it, whose score is at most its own."""
        if len(self.nodes) < self.budget:
            return -math.inf
        return heapq.nlargest(self.budget, (n.score for n in self.nodes))[-1]

    def add_children(self, at: int, logp: torch.Tensor, top_m: int, state: object = None) -> list[int]:
        """Candidates under node `at` (-1 = root) from its child log-probabilities logp [vocab]; `state` is what
        produced that distribution, kept on each child for its own expansion."""
        base = 0.0 if at < 0 else self.nodes[at].score
        depth = 1 if at < 0 else self.nodes[at].depth + 1
        values, tokens = logp.topk(top_m)
        start = len(self.nodes)
        for v, t in zip(values.tolist(), tokens.tolist(), strict=True):
            self.nodes.append(Node(t, at, depth, base + v, state))
        return list(range(start, len(self.nodes)))


# expand(rows, node indices per row) -> per row: child log-probs [n_b, vocab] and the states that produced them
# ([n_b, ...] or None), one per expanded node
Expand = Callable[[list[RowTree], list[list[int]]], list[tuple[torch.Tensor, torch.Tensor | None]]]


def grow_trees(
    root_logp: torch.Tensor,
    budgets: list[int],
    shape: TreeShape,
    expand: Expand,
    root_state: torch.Tensor | None = None,
) -> list[RowTree]:
    """root_logp [num_seqs, vocab]: the draft's log-probabilities for the first draft position of each row;
    root_state [num_seqs, ...]: what produced them (None when the drafter keeps no per-node state)."""
    trees = [RowTree(b) for b in budgets]
    level = [
        t.add_children(-1, root_logp[i], shape.top_m, None if root_state is None else root_state[i]) if t.budget else []
        for i, t in enumerate(trees)
    ]
    for depth in range(2, shape.max_depth + 1):
        frontier = [_best(t, lv, shape.beam) if t.budget >= depth else [] for t, lv in zip(trees, level, strict=True)]
        if not any(frontier):
            break
        outs = expand(trees, frontier)
        level = [_add_level(t, f, out, shape.top_m) for t, f, out in zip(trees, frontier, outs, strict=True)]
    return trees


def _add_level(tree: RowTree, frontier: list[int], out: tuple[torch.Tensor, torch.Tensor | None], top_m: int):
    logp, states = out  # [n, vocab], [n, ...] | None
    children = []
    for j, at in enumerate(frontier):
        children += tree.add_children(at, logp[j], top_m, None if states is None else states[j])
    return children


def _best(tree: RowTree, candidates: list[int], n: int) -> list[int]:
    """The next frontier: the n best candidates, less those below the bar (see the module docstring)."""
    bar = tree.bar()
    return [i for i in sorted(candidates, key=lambda i: -tree.nodes[i].score)[:n] if tree.nodes[i].score >= bar]


def kept_nodes(tree: RowTree) -> list[int]:
    """The budget best nodes, best first. That order is topological (a parent scores at least its child; ties go
    to the shallower node), so every prefix is again a tree: the best smaller tree, for a controller's cut."""
    order = sorted(range(len(tree.nodes)), key=lambda i: (-tree.nodes[i].score, tree.nodes[i].depth))
    return order[: tree.budget]


def to_proposal(trees: list[RowTree], device: torch.device | str) -> Proposal:
    """Kept nodes as a tree Proposal: tokens, parents as tree positions, confidence = path probability."""
    kept = [kept_nodes(t) for t in trees]
    width = max((len(k) for k in kept), default=0)
    ids = torch.full((len(trees), width), PAD_TOKEN_ID, dtype=torch.long)
    parents = torch.zeros((len(trees), width), dtype=torch.long)
    conf = torch.zeros((len(trees), width), dtype=torch.float32)
    for b, (tree, order) in enumerate(zip(trees, kept, strict=True)):
        position = {-1: 0} | {node: j + 1 for j, node in enumerate(order)}  # node index -> tree position
        for j, node in enumerate(order):
            n = tree.nodes[node]
            ids[b, j], parents[b, j] = n.token, position[n.parent]
            conf[b, j] = math.exp(n.score)
    num = torch.tensor([len(k) for k in kept], dtype=torch.long)
    return Proposal(ids.to(device), num.to(device), None, conf.to(device), parents.to(device))
