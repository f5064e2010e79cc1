"""The n-gram lookup against the plain sliding-window search it replaced, on random histories."""

from __future__ import annotations

import numpy as np
import pytest
from numpy.lib.stride_tricks import sliding_window_view

from specdecode.drafters import ngram
from specdecode.drafters.ngram import lookup


def reference(tokens: np.ndarray, k: int, n_min: int, n_max: int, latest: bool = True) -> tuple[list, list]:
    """Every window of the history (the suffix itself excluded) compared with the suffix, longest n first."""
    length = len(tokens)
    for n in range(min(n_max, length - 1), n_min - 1, -1):
        windows = sliding_window_view(tokens[: length - 1], n)  # [length - n, n]
        hits = np.flatnonzero((windows == tokens[length - n :]).all(axis=1))
        if hits.size:
            start = (hits[-1] if latest else hits[0]) + n
            draft = tokens[start : start + k]
            return draft.tolist(), ngram._continuation_agreement(tokens, hits + n, draft).tolist()
    return [], []


def histories(count: int = 400) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    # A small vocabulary repeats n-grams often; lengths from 0 (nothing to match) up.
    return [rng.integers(0, 6, size=int(rng.integers(0, 60))).astype(np.int32) for _ in range(count)]


@pytest.mark.parametrize(("n_min", "n_max"), [(1, 4), (2, 4), (3, 3)])
def test_lookup_matches_the_sliding_window_search(n_min, n_max):
    found = 0
    for tokens in histories():
        got = lookup(tokens, 5, n_min, n_max)
        assert got == reference(tokens, 5, n_min, n_max)
        found += bool(got[0])
    assert found > 20  # the comparison is not vacuous: many histories have a match


def test_the_comparison_catches_a_wrong_match():
    """Control: the reference taking the earliest match instead of the latest disagrees with the lookup."""
    differ = sum(lookup(t, 5, 1, 4) != reference(t, 5, 1, 4, latest=False) for t in histories())
    assert differ > 50
