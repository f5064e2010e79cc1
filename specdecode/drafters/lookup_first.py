"""Prompt lookup ahead of a draft model: rows whose own text predicts their next tokens take those, for free.

A code answer copies much of its prompt (a bug fixed, a function edited, names reused): where a row's last n tokens
occurred earlier in its prompt or output, what followed them there is a draft that costs no forward at all, and the
draft model drafts only the other rows (ArcticInference's hybrid of suffix decoding and a model speculator decides
the same way, per request and step). The lookup is the n-gram drafter's (ngram.py); the draft model reads what it
skipped when it next drafts for the row (draft_model.py's catch-up: one forward for all of it). Which source a row
draws from depends on its committed tokens alone, and lookup drafts are deterministic (q one-hot), so verification
stays exact.
"""

from __future__ import annotations

import torch

from specdecode.step.proposal import Proposal
from specdecode.verify.sampling import PAD_TOKEN_ID


def _widen(x: torch.Tensor, width: int, fill: float) -> torch.Tensor:
    """x [num_seqs, w, ...] padded with `fill` to [num_seqs, width, ...]."""
    out = x.new_full((x.shape[0], width, *x.shape[2:]), fill)
    out[:, : x.shape[1]] = x
    return out


def merge(model: Proposal, lookup: Proposal, vocab: int) -> Proposal:
    """The draft model's proposal [num_seqs, k] with each row the lookup found drafts for (lookup.num_tokens > 0)
    taking those in its place (such rows were asked nothing of the model, so their model row is empty). Sampled
    batches (model.probs given) get one-hot q for lookup rows; rows without confidences from the model get 1.0."""
    hit = lookup.num_tokens > 0  # [num_seqs]
    if not bool(hit.any()):
        return model
    width = max(model.token_ids.shape[1], lookup.token_ids.shape[1])
    found = _widen(lookup.token_ids, width, PAD_TOKEN_ID)  # [num_seqs, width]
    ids = torch.where(hit[:, None], found, _widen(model.token_ids, width, PAD_TOKEN_ID))  # [num_seqs, width]
    num = torch.where(hit, lookup.num_tokens, model.num_tokens)  # [num_seqs]
    ones = torch.ones(len(hit), width, device=ids.device)
    mine = ones if model.confidence is None else _widen(model.confidence, width, 1.0)  # [num_seqs, width]
    conf = torch.where(hit[:, None], _widen(lookup.confidence, width, 1.0), mine)  # [num_seqs, width]
    probs = None
    if model.probs is not None:
        valid = torch.arange(width, device=ids.device)[None] < num[:, None]  # [num_seqs, width]
        one_hot = torch.nn.functional.one_hot(found.clamp(min=0), vocab).to(model.probs.dtype)  # [.., width, vocab]
        one_hot *= valid[..., None]
        probs = torch.where(hit[:, None, None], one_hot, _widen(model.probs, width, 0.0))  # [num_seqs, width, vocab]
    return Proposal(ids, num, probs, conf)
