"""suffix_tree's union of the histories' trees: one node per distinct path, best first, cut to a tree of k nodes."""

from __future__ import annotations

import numpy as np
import pytest

from specdecode.drafters import suffix
from specdecode.drafters.suffix import Draft, grow, merge
from specdecode.drafters.suffix_index import TokenScan
from tests.drafters.test_suffix_index import random_docs


def paths(d: Draft) -> dict[tuple[int, ...], float]:
    """Every node as its root path of tokens, with its probability."""
    out: dict[tuple[int, ...], float] = {}
    spelled = {0: ()}
    for j, (tok, parent, prob) in enumerate(zip(d.tokens, d.parents, d.probs, strict=True)):
        spelled[j + 1] = spelled[parent] + (tok,)
        out[spelled[j + 1]] = prob
    return out


def check_shared_paths_once() -> None:
    a = Draft([5, 6, 7], [0, 1, 2], [0.9, 0.5, 0.2])  # 5 6 7
    b = Draft([5, 8, 6], [0, 1, 1], [0.6, 0.4, 0.3])  # 5 8 and 5 6
    union = merge([a, b], k=8)
    assert paths(union) == {(5,): 0.9, (5, 6): 0.5, (5, 8): 0.4, (5, 6, 7): 0.2}
    assert len(union.tokens) == 4
    assert union.probs == sorted(union.probs, reverse=True)


def test_shared_paths_are_proposed_once_at_their_best_probability():
    check_shared_paths_once()


def test_a_union_that_repeats_shared_paths_is_caught(monkeypatch):
    """Negative control through the same check: a node key that never matches proposes shared paths twice."""
    fresh = iter(range(10**6))
    monkeypatch.setattr(suffix, "path_key", lambda parent, token: (parent, token, next(fresh)))
    with pytest.raises(AssertionError):
        check_shared_paths_once()


def test_the_cut_keeps_the_most_probable_nodes_as_a_tree():
    a = Draft([5, 6, 7], [0, 1, 2], [1.0, 1.0, 1.0])  # one occurrence in the request: certain
    b = Draft([9, 5], [0, 0], [0.7, 0.2])
    union = merge([a, b], k=4)
    assert paths(union) == {(5,): 1.0, (5, 6): 1.0, (5, 6, 7): 1.0, (9,): 0.7}


@pytest.mark.parametrize("seed", range(20))
def test_union_of_grown_trees_is_a_best_first_tree_of_their_paths(seed):
    """Trees grown from random histories over a small alphabet (they share prefixes and branch)."""
    rng = np.random.default_rng(seed)
    drafts = []
    for doc in random_docs(seed, 3, 4, 60):
        index = TokenScan(doc, len(doc))
        m, node = index.match(rng.integers(0, 4, 6).astype(np.int32))
        if m:
            drafts.append(grow(index, node, int(rng.integers(1, 10)), 0.05, True))
    k = int(rng.integers(1, 12))
    union = merge(drafts, k)
    assert len(union.tokens) == min(k, len(set().union(*(paths(d) for d in drafts))))
    assert all(0 <= p <= j for j, p in enumerate(union.parents))  # parents before children
    assert union.probs == sorted(union.probs, reverse=True)
    for path, prob in paths(union).items():  # a path some history drafted, at no more than its best probability
        assert 0 < prob <= max(paths(d).get(path, 0.0) for d in drafts)
