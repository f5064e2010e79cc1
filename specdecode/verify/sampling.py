"""Processed distributions, shared by the target (p) and draft (q) sides, and the batch's sampling parameters.

p and q must be processed identically (temperature, then top-k, then top-p) for speculative sampling to be
exact. Random draws (keyed per request when it has a seed) live in streams.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from specdecode.verify.logits_adjust import LogitAdjuster

PAD_TOKEN_ID = -1  # the one padding sentinel in token tensors (int64 everywhere)


class NonFiniteLogitsError(RuntimeError):
    """The model produced NaN or inf logits; no token can be trusted."""


@dataclass
class SamplingTensors:
    temperature: torch.Tensor  # [num_seqs] float32, 0 = greedy
    top_k: torch.Tensor  # [num_seqs] int64, 0 = off
    top_p: torch.Tensor  # [num_seqs] float32, 1 = off
    seeds: list[int | None]  # per row: the request's seed if it samples with one; None = the global RNG
    origins: list[int]  # per row: absolute position of the pending token, which keys the seeded streams
    device: torch.device
    any_top_k: bool
    any_top_p: bool
    all_greedy: bool
    adjust: LogitAdjuster | None = None  # penalties, logit_bias, grammar masks (logits_adjust.py); None = none

    @classmethod
    def from_params(cls, params: list, device: torch.device | str, origins: list[int] | None = None) -> SamplingTensors:
        return cls(
            temperature=torch.tensor([p.temperature for p in params], dtype=torch.float32, device=device),
            top_k=torch.tensor([p.top_k for p in params], dtype=torch.long, device=device),
            top_p=torch.tensor([p.top_p for p in params], dtype=torch.float32, device=device),
            seeds=[p.seed if p.temperature > 0.0 else None for p in params],  # greedy rows draw nothing
            origins=list(origins) if origins is not None else [0] * len(params),
            device=torch.device(device),
            any_top_k=any(p.top_k > 0 for p in params),
            any_top_p=any(p.top_p < 1.0 for p in params),
            all_greedy=all(p.temperature == 0.0 for p in params),
        )


def non_finite_flags(logits: torch.Tensor) -> list[bool]:
    """logits [num_seqs, ...] -> per row, whether it holds NaN or +inf. Read from each row's maximum (amax
    propagates NaN, and +inf is its own maximum): one pass and no full-size masks, ~0.04 ms where the two masks
    over a 5-token verify's 152k-token logits took ~1 ms; and judged in Python, where each operation on the
    [num_seqs] maxima cost ~10 us on the CPU. -inf is a token that may not follow (a grammar's mask)."""
    return [not top < math.inf for top in logits.flatten(1).amax(1).tolist()]  # NaN and +inf fail the test


def check_finite(logits: torch.Tensor) -> None:
    """NaN or +inf logits are a broken model; -inf is a token that may not follow (a grammar's mask)."""
    if logits.numel() and any(non_finite_flags(logits.reshape(1, -1))):
        raise NonFiniteLogitsError("the model produced NaN or inf logits")


def _filter_top_k_top_p(logits: torch.Tensor, st: SamplingTensors) -> torch.Tensor:
    """logits [num_seqs, n, vocab] -> same with filtered-out tokens at -inf."""
    vocab = logits.shape[-1]
    sorted_logits, order = logits.sort(dim=-1, descending=True)  # [num_seqs, n, vocab]
    drop = torch.zeros_like(sorted_logits, dtype=torch.bool)
    if st.any_top_k:
        k = torch.where(st.top_k > 0, st.top_k, vocab).clamp(max=vocab)  # [num_seqs]
        drop |= torch.arange(vocab, device=logits.device) >= k[:, None, None]
    if st.any_top_p:
        probs = sorted_logits.masked_fill(drop, float("-inf")).softmax(-1)
        mass_before = probs.cumsum(-1) - probs  # mass of strictly better tokens
        drop |= mass_before >= st.top_p[:, None, None]
        drop[..., 0] = False  # the most probable token stays, even where top_p rounds to 0 in fp32
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.empty_like(logits).scatter_(-1, order, sorted_logits)


def process_logits(logits: torch.Tensor, st: SamplingTensors) -> torch.Tensor:
    """logits [num_seqs, n, vocab] -> processed probs [num_seqs, n, vocab] (one-hot argmax for greedy rows)."""
    logits = logits.float()
    greedy = st.temperature == 0.0  # [num_seqs]
    onehot = torch.zeros_like(logits).scatter_(-1, logits.argmax(-1, keepdim=True), 1.0)
    if st.all_greedy:
        return onehot
    scaled = logits / torch.where(greedy, 1.0, st.temperature)[:, None, None]
    if st.any_top_k or st.any_top_p:
        scaled = _filter_top_k_top_p(scaled, st)
    probs = scaled.softmax(-1)
    return torch.where(greedy[:, None, None], onehot, probs)


def processed_logprobs(logits: torch.Tensor, st: SamplingTensors) -> torch.Tensor:
    """logits [num_seqs, n, vocab] (adjusted) -> log-probabilities [num_seqs, n, vocab] of the distribution each
    token is drawn from: temperature, top-k and top-p for sampled rows. Greedy rows get the adjusted logits'
    softmax at temperature 1, unfiltered: their literal one-hot would say nothing."""
    logits = logits.float()
    greedy = st.temperature == 0.0  # [num_seqs]
    scaled = logits / torch.where(greedy, 1.0, st.temperature)[:, None, None]
    if not st.all_greedy and (st.any_top_k or st.any_top_p):
        scaled = torch.where(greedy[:, None, None], scaled, _filter_top_k_top_p(scaled, st))
    return scaled.log_softmax(-1)


def draft_probs(logits: torch.Tensor, drafted: list[torch.Tensor], st: SamplingTensors) -> torch.Tensor:
    """A drafter's q for its next draft: logits [num_seqs, 1, vocab] -> processed probs [num_seqs, vocab], after
    the adjustments the target applies at that position, with the drafts so far (each [num_seqs]) counted."""
    if st.adjust is not None:
        num_seqs = logits.shape[0]
        empty = torch.full((num_seqs, 0), PAD_TOKEN_ID, dtype=torch.long, device=logits.device)
        paths = torch.stack(drafted, 1) if drafted else empty  # [num_seqs, drafts so far]
        logits = st.adjust(logits, paths[:, None, :])
    return process_logits(logits, st)[:, 0]
