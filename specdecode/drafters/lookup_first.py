"""Prompt lookup ahead of a draft model: rows whose own text predicts their next tokens take those, for free.

A code answer copies much of its prompt (a bug fixed, a function edited, names reused): where a row's last n tokens
occurred earlier in its prompt or output, what followed them there is a draft that costs no forward at all, and the
draft model drafts only the other rows (ArcticInference's hybrid of suffix decoding and a model speculator decides
the same way, per request and step). The draft model reads what it skipped when it next drafts for the row
(draft_model.py's catch-up: one forward for all of it). Which source a row draws from depends on its committed
tokens alone, and lookup drafts are deterministic (q one-hot), so verification stays exact.
"""

from __future__ import annotations

import torch

from specdecode.drafters.history import RequestHistory
from specdecode.drafters.ngram import lookup
from specdecode.step.proposal import Proposal
from specdecode.step.sequence import Sequence
from specdecode.verify.sampling import PAD_TOKEN_ID

Hit = tuple[list[int], list[float]] | None  # a row's lookup drafts and their confidences, or None: no match


class PromptLookup:
    """Per request, its text as an array; `find` looks each asking row's last n_min..n_max tokens up in it."""

    def __init__(self, n_min: int, n_max: int) -> None:
        self.n_min, self.n_max = n_min, max(n_min, n_max)
        self.histories: dict[str, RequestHistory] = {}

    def add(self, seq: Sequence) -> None:
        self.histories[seq.request_id] = RequestHistory(seq.max_len)

    def remove(self, seq: Sequence) -> None:
        self.histories.pop(seq.request_id, None)

    def find(self, seqs: list[Sequence], num_tokens: list[int]) -> list[Hit]:
        """Per row asked for k > 0 drafts: up to k tokens that followed the latest earlier occurrence of its
        longest recurring suffix (n_max down to n_min tokens), or None where none recurs."""
        hits: list[Hit] = []
        for seq, k in zip(seqs, num_tokens, strict=True):
            if k <= 0:
                hits.append(None)
                continue
            drafts, conf = lookup(self.histories[seq.request_id].sync(seq.token_ids), k, self.n_min, self.n_max)
            hits.append((drafts, conf) if drafts else None)
        return hits


def merge(model: Proposal, hits: list[Hit], vocab: int) -> Proposal:
    """The draft model's proposal [num_seqs, k] with each hit row's lookup drafts in its place (rows with a hit
    were asked nothing of the model, so their model row is empty). Sampled batches (model.probs given) get one-hot
    q for lookup rows; rows without confidences from the model get 1.0."""
    if not any(hits):
        return model
    device = model.token_ids.device
    width = max([model.token_ids.shape[1]] + [len(h[0]) for h in hits if h])
    rows = len(hits)
    ids = torch.full((rows, width), PAD_TOKEN_ID, dtype=torch.long, device=device)  # [num_seqs, width]
    ids[:, : model.token_ids.shape[1]] = model.token_ids
    num = model.num_tokens.clone()  # [num_seqs]
    conf = torch.ones((rows, width), dtype=torch.float32, device=device)  # [num_seqs, width]
    if model.confidence is not None:
        conf[:, : model.confidence.shape[1]] = model.confidence
    probs = None
    if model.probs is not None:
        probs = torch.zeros((rows, width, vocab), dtype=model.probs.dtype, device=device)  # [num_seqs, width, vocab]
        probs[:, : model.probs.shape[1]] = model.probs
    for b, hit in enumerate(hits):
        if hit is None:
            continue
        drafts, confidences = hit
        n = len(drafts)
        ids[b, :n] = torch.tensor(drafts, dtype=torch.long, device=device)
        conf[b, :n] = torch.tensor(confidences, dtype=torch.float32, device=device)
        num[b] = n
        if probs is not None:
            probs[b, :n] = 0.0
            probs[b, torch.arange(n, device=device), ids[b, :n]] = 1.0
    return Proposal(ids, num, probs, conf)
