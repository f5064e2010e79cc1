"""The teacher's next-token distribution kept as its top-k tokens plus one "rest" bucket (what the cache stores).

KL(p || q) over the k + 1 buckets {x_1..x_k, rest} is the full-vocabulary KL minus a non-negative term for
how differently p and q spread the rest mass over the tail (the chain rule of KL); it is exact when k covers
the vocabulary, and its gradient pushes the student's top-k and tail masses towards the teacher's. Log-probs are
stored normalised over the whole vocabulary, so the rest mass is exact, not 1 - (a rounded sum).

For a draft vocabulary (`--draft-vocab`) the "vocabulary" is the subset: the teacher renormalised over it, as
distill_loss trains on the fly, with ids indexing the subset and the rest bucket holding the mass inside the
subset but outside the top-k; the argmax over the whole vocabulary is kept beside it for the accuracy.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch


@dataclass(frozen=True)
class TopKTeacher:
    """Any leading shape [...]; indexing (slices, boolean masks) applies to the leading dims of all three."""

    log_p: torch.Tensor  # [..., k] the teacher's log-probabilities of its top-k tokens, largest first
    ids: torch.Tensor  # [..., k] int64 token ids
    log_rest: torch.Tensor  # [...] log of the probability mass outside the top-k (-inf when k = vocab)
    vocab_size: int  # of the distribution: the vocabulary, or the draft vocabulary's size S
    top_token: torch.Tensor | None = None  # [...] int64 argmax over the whole vocabulary where ids index a subset

    @property
    def k(self) -> int:
        return self.ids.shape[-1]

    def __getitem__(self, index) -> TopKTeacher:
        top = None if self.top_token is None else self.top_token[index]
        return TopKTeacher(self.log_p[index], self.ids[index], self.log_rest[index], self.vocab_size, top)

    def to(self, device: torch.device | str) -> TopKTeacher:
        top = None if self.top_token is None else self.top_token.to(device).long()
        log_p, ids, rest = self.log_p.to(device).float(), self.ids.to(device).long(), self.log_rest.to(device).float()
        return TopKTeacher(log_p, ids, rest, self.vocab_size, top)

    def argmax(self) -> torch.Tensor:
        """[...] the teacher's most likely token id over the whole vocabulary."""
        return self.ids[..., 0] if self.top_token is None else self.top_token

    def kl(self, log_q: torch.Tensor) -> torch.Tensor:
        """[] mean over rows of KL(teacher || student) over the k + 1 buckets; log_q is [N, vocab], self is [N]."""
        p = self.log_p.exp()  # [N, k]
        kl = (p * (self.log_p - log_q.gather(-1, self.ids))).sum(-1)  # [N]
        if self.k < self.vocab_size:
            outside = log_q.scatter(-1, self.ids, float("-inf"))  # [N, vocab] the student's tail only
            log_q_rest = torch.logsumexp(outside, dim=-1)  # [N]
            p_rest = self.log_rest.exp()  # [N]
            kl = kl + torch.where(p_rest > 0, p_rest * (self.log_rest - log_q_rest), torch.zeros_like(p_rest))
        return kl.sum() / max(len(kl), 1)  # as F.kl_div(reduction="batchmean")


def topk_of(log_p: torch.Tensor, k: int) -> TopKTeacher:
    """log_p [N, vocab] (normalised) -> its top-k [N] with the exact log mass of the rest."""
    vocab = log_p.shape[-1]
    k = min(k, vocab)
    values, ids = log_p.topk(k, dim=-1)  # [N, k] each, sorted descending
    if k < vocab:
        log_rest = torch.logsumexp(log_p.scatter(-1, ids, float("-inf")), dim=-1)  # [N]
    else:
        log_rest = torch.full(values.shape[:-1], float("-inf"), device=log_p.device)
    return TopKTeacher(values, ids, log_rest, vocab)


def teacher_topk(logits: torch.Tensor, k: int, subset: torch.Tensor | None = None) -> TopKTeacher:
    """logits [N, vocab] (float) -> the top-k teacher over the vocabulary, or with `subset` ([S] sorted token ids)
    over the subset renormalised, exactly distill_loss's teacher: ids then index the subset, the rest mass is the
    subset's outside the top-k, and top_token keeps the argmax over the whole vocabulary."""
    if subset is None:
        return topk_of(logits.log_softmax(-1), k)
    return replace(topk_of(logits[:, subset].log_softmax(-1), k), top_token=logits.argmax(-1))
