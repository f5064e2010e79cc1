"""A drafter's proposal: up to k draft tokens per row, a chain or a token tree, with q and confidences."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specdecode.verify.sampling import PAD_TOKEN_ID
from specdecode.verify.tree_layout import check_parents


@dataclass
class Proposal:
    token_ids: torch.Tensor  # [num_seqs, k] int64, PAD_TOKEN_ID past each row's count
    num_tokens: torch.Tensor  # [num_seqs] int64, drafts per row (0 = plain decoding this step)
    probs: torch.Tensor | None  # [num_seqs, k, vocab] processed draft distribution q; None = one-hot drafts
    # [num_seqs, k] float32 the drafter's own confidence that draft j is right, known before verification; it
    # may depend on the drafts before j but, for sampled drafts, not on draft j itself (see truncated()).
    # None = the drafter has no such notion.
    confidence: torch.Tensor | None = None
    # [num_seqs, k] int64 tree position of each draft's parent (0 = the pending token; see verify/tree_layout.py).
    # None = a chain. Tree drafts may share a depth; truncated() keeps a topological prefix, still a tree.
    parents: torch.Tensor | None = None
    # A chain's confidences are frequencies over enough evidence to set its verify width (suffix: continuation
    # counts in a large corpus). Otherwise a chain's width follows the row's acceptance history: n-gram's
    # confidences come from a handful of occurrences in the request and set it worse (Spec-Bench, ngram goodput:
    # tau 1.31 by confidences against 1.36 by history). Trees always go by their confidences.
    confidence_sets_width: bool = False

    def __post_init__(self) -> None:
        # The drafter boundary: a malformed tree is refused here, before the controller or the verifier reads it.
        if self.parents is not None:
            if self.parents.shape != self.token_ids.shape:
                raise ValueError(f"tree parents {tuple(self.parents.shape)} != drafts {tuple(self.token_ids.shape)}")
            check_parents(self.parents, self.num_tokens)

    @classmethod
    def from_lists(
        cls,
        drafts: list[list[int]],
        k: int,
        device: torch.device | str,
        confidence: list[list[float]] | None = None,
        confidence_sets_width: bool = False,
    ) -> Proposal:
        """A deterministic proposal (q one-hot) from per-row token lists (and per-draft confidences)."""
        width = max(k, 1)
        ids = torch.full((len(drafts), width), PAD_TOKEN_ID, dtype=torch.long)
        conf = torch.zeros((len(drafts), width), dtype=torch.float32)
        for row, d in enumerate(drafts):
            ids[row, : len(d)] = torch.tensor(d, dtype=torch.long)
            if confidence is not None:
                conf[row, : len(d)] = torch.tensor(confidence[row], dtype=torch.float32)
        num = torch.tensor([len(d) for d in drafts], dtype=torch.long)
        conf_k = None if confidence is None else conf[:, :k].to(device)
        return cls(ids[:, :k].to(device), num.to(device), None, conf_k, None, confidence_sets_width)

    def truncated(self, num_tokens: torch.Tensor) -> Proposal:
        """Each row cut to its first min(num_tokens, current) drafts; the padded width shrinks to the longest row.

        Lossless as long as the cut is a function of draft-side information known before each draft is drawn:
        then every emitted token is still either a verified draft or a sample of p (the bonus at the cut).
        num_tokens: [num_seqs] int64.
        """
        num = torch.minimum(self.num_tokens, num_tokens)  # [num_seqs]
        width = int(num.max()) if num.numel() else 0
        ids = self.token_ids[:, :width]  # [num_seqs, width]
        ids = ids.masked_fill(torch.arange(width, device=ids.device)[None] >= num[:, None], PAD_TOKEN_ID)
        probs = None if self.probs is None else self.probs[:, :width]  # [num_seqs, width, vocab]
        conf = None if self.confidence is None else self.confidence[:, :width]  # [num_seqs, width]
        parents = None if self.parents is None else self.parents[:, :width]  # [num_seqs, width]
        return Proposal(ids, num, probs, conf, parents, self.confidence_sets_width)
