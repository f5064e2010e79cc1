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


def reference_probs(logits: torch.Tensor, params, strict: bool = True) -> torch.Tensor:
    """logits [vocab] -> [vocab] float64: the distribution a token is drawn from under `params` (SamplingParams),
    by brute force over the vocabulary from the spec in specdecode/verify/sampling.py, never by calling it: greedy is a
    one-hot on the first maximum; otherwise divide by the temperature, rank by logit, keep the top_k best (0 =
    all), then of those the fewest best whose renormalised mass reaches top_p (a token stays while the mass
    strictly before it is < top_p; the best token always stays), and renormalise what is kept.

    The engine ranks with an unstable sort, so where tokens of equal logit fall on both sides of a cut, or the
    mass before a cut is within fp32 rounding of top_p, the spec does not say which stays: this raises there
    rather than guess, and a test that meets it should change its logits or parameters. With strict=False it
    ranks tied tokens by id instead (then only the sorted probabilities are the spec's)."""
    x = logits.double()  # [vocab]
    vocab = x.numel()
    out = torch.zeros(vocab, dtype=torch.float64)
    if params.temperature == 0.0:
        out[int(x.argmax())] = 1.0  # argmax returns the first of tied maxima
        return out
    z = [v / params.temperature for v in x.tolist()]
    ranked = sorted(range(vocab), key=lambda t: -z[t])  # best first; stable, so ties by token id
    kept = ranked[: params.top_k or vocab]
    _check_cut(z, ranked, len(kept), strict)
    if params.top_p < 1.0:
        weights = [math.exp(z[t] - z[ranked[0]]) for t in kept]
        total = sum(weights)
        before, n = 0.0, 0  # mass strictly before rank n, and how many are kept
        for w in weights:
            if strict and n > 0 and abs(before - params.top_p) < 1e-5:
                raise ValueError(f"the mass before rank {n} is {before}, within fp32 rounding of top_p")
            if n > 0 and before >= params.top_p:
                break
            before, n = before + w / total, n + 1
        kept = kept[:n]
        _check_cut(z, ranked, n, strict)
    for t in kept:
        out[t] = math.exp(z[t] - z[ranked[0]])
    return out / out.sum()


def _check_cut(z: list[float], ranked: list[int], n: int, strict: bool) -> None:
    """Refuse a cut after rank n - 1 that separates finite tokens of equal logit (the sort's order decides)."""
    if strict and 0 < n < len(ranked) and z[ranked[n - 1]] == z[ranked[n]] != -math.inf:
        raise ValueError(f"tokens {ranked[n - 1]} and {ranked[n]} tie at logit {z[ranked[n]]} across a cut")
