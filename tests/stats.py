"""Chi-square goodness of fit without scipy (Wilson-Hilferty approximation of the chi-square quantile), and the
one assertion every distribution test makes, with or without a fault injected into the code under test."""

from __future__ import annotations

import math

import torch

Z_1E4 = 3.719  # standard normal quantile for alpha = 1e-4: a strict threshold that still rejects wrong rules
MARGIN = 3.0  # a negative control must push chi-square past MARGIN x the critical value: a wide margin, not luck


def chi2_critical(df: int, z: float = Z_1E4) -> float:
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


def fits(counts: torch.Tensor, probs: torch.Tensor, min_expected: float = 5.0) -> tuple[bool, float, float]:
    """Do `counts` (any shape) look drawn from `probs` (same shape)? Small-expectation cells are pooled."""
    counts, probs = counts.flatten().double(), probs.flatten().double()
    n = counts.sum()
    expected = probs / probs.sum() * n
    big = expected >= min_expected
    obs = torch.cat([counts[big], counts[~big].sum()[None]])
    exp = torch.cat([expected[big], expected[~big].sum()[None]])
    if counts[probs == 0].sum() > 0:  # a token of probability zero was emitted: impossible under probs
        return False, float("inf"), 0.0
    keep = exp > 0
    stat = float(((obs[keep] - exp[keep]) ** 2 / exp[keep]).sum())
    crit = chi2_critical(int(keep.sum()) - 1)
    return stat < crit, stat, crit


def assert_follows(counts: torch.Tensor, probs: torch.Tensor, fault: str | None = None) -> float:
    """`counts` fit `probs` when the code is intact; with `fault` injected, the same statistic must exceed
    MARGIN x the critical value. Returns chi-square / critical (the margin a negative control reached)."""
    ok, stat, crit = fits(counts, probs)
    ratio = stat / crit if crit else math.inf
    if fault is None:
        assert ok, f"chi2 {stat:.1f} >= critical {crit:.1f}"
    else:
        assert ratio >= MARGIN, f"fault {fault!r} not caught by a wide margin: chi2 {stat:.1f} = {ratio:.2f} x critical"
    return ratio
