"""Growing draft trees (drafters/tree_search.py): cutting the frontier at the budget's bar keeps the same tree
and expands fewer nodes."""

from __future__ import annotations

import pytest
import torch

from specdecode.drafters.tree_search import RowTree, TreeShape, grow_trees, to_proposal

VOCAB = 12


def _logp(tree: RowTree, node: int) -> torch.Tensor:
    """[VOCAB] a fixed, peaked draft distribution for the path ending at `node`, whatever grew the tree."""
    path = []
    while node >= 0:
        path.append(tree.nodes[node].token)
        node = tree.nodes[node].parent
    g = torch.Generator().manual_seed(hash(tuple(path)) % 2**31)
    return (3 * torch.randn(VOCAB, generator=g)).log_softmax(-1)


def _grow(seed: int, budgets: list[int], shape: TreeShape) -> tuple[torch.Tensor, ...]:
    expanded = []

    def expand(trees, frontier):
        expanded.append(sum(len(f) for f in frontier))
        return [
            (torch.stack([_logp(t, i) for i in f]) if f else torch.zeros(0, VOCAB), None)
            for t, f in zip(trees, frontier, strict=True)
        ]

    g = torch.Generator().manual_seed(seed)
    root = (3 * torch.randn(len(budgets), VOCAB, generator=g)).log_softmax(-1)  # [rows, VOCAB]
    p = to_proposal(grow_trees(root, budgets, shape, expand), "cpu")
    return p.token_ids, p.num_tokens, p.parents, p.confidence, sum(expanded)


def _uncut(tree: RowTree) -> float:
    return -float("inf")


@pytest.mark.parametrize("fault", [False, True])
def test_the_bar_keeps_the_same_trees_and_expands_fewer_nodes(fault, monkeypatch):
    """Over many random draft distributions the proposals equal those grown without the bar, bit for bit, and
    the drafter expands fewer nodes. Control: a bar one nat too high (cutting nodes the kept set needs) is caught."""
    shape = TreeShape(top_m=4, beam=4, max_depth=6)
    cut_real = RowTree.bar
    if fault:
        monkeypatch.setattr(RowTree, "bar", lambda self: cut_real(self) + 1.0)
    differ, saved = 0, 0
    for seed in range(60):
        budgets = [8, 5, 0, 16][: 1 + seed % 4]
        cut = _grow(seed, budgets, shape)
        with monkeypatch.context() as m:
            m.setattr(RowTree, "bar", _uncut)
            full = _grow(seed, budgets, shape)
        differ += any(not torch.equal(a, b) for a, b in zip(cut[:4], full[:4], strict=True))
        saved += full[4] - cut[4]
        assert cut[4] <= full[4]
    if fault:
        assert differ > 10, differ
    else:
        assert differ == 0 and saved > 0, (differ, saved)
