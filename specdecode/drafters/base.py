"""The drafter Protocol: every way of proposing tokens (draft model, n-gram lookup, heads) implements it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from specdecode.engine.sequence import Sequence
from specdecode.kv import KVCache
from specdecode.verify.sampling import PAD_TOKEN_ID, SamplingTensors
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


class Drafter(Protocol):
    """Proposes up to k tokens per sequence. Lossless verification only needs the drafts and their q.

    A drafter whose `propose` depends only on committed state (calling it again before `commit`, on any subset of
    the rows, proposes what it would have) sets `retryable_propose = True`: when a batch's proposal raises, the
    engine then finds the rows it raises for by proposing for each row alone, and fails those rows only. Other
    drafters (EAGLE consumes the features it is handed) leave a raising proposal to fail the step.
    """

    retryable_propose: bool = False
    needs_features: bool = False  # reads the target's hidden states through observe_features() (EAGLE, heads)

    def bind_target_cache(self, cache: KVCache) -> None:
        """The engine hands over the target's KV cache (drafters that read the target's own K/V: layer_skip)."""

    def add_sequence(self, seq: Sequence) -> None:
        """A sequence joined (its prompt is known); build any per-sequence state."""

    def propose(self, seqs: list[Sequence], num_tokens: list[int], st: SamplingTensors) -> Proposal:
        """Drafts continuing each sequence's token_ids (which end with the pending token)."""

    def commit(self, seqs: list[Sequence]) -> None:
        """Verification finished; seq.token_ids now holds what was kept. Roll back any speculative state."""

    def remove_sequence(self, seq: Sequence) -> None:
        """The sequence left the batch; free its state."""

    def live_request_ids(self) -> set[str]:
        """Request ids this drafter holds state for (tests check that only live requests are here)."""


class DrafterBase:
    """The Protocol's optional hooks, each doing nothing: a drafter inherits this and writes only `propose` and
    the hooks it needs, and the engine calls every hook without asking whether it exists."""

    retryable_propose: bool = False
    needs_features: bool = False

    def bind_target_cache(self, cache: KVCache) -> None:
        pass

    def add_sequence(self, seq: Sequence) -> None:
        pass

    def propose(self, seqs: list[Sequence], num_tokens: list[int], st: SamplingTensors) -> Proposal:
        raise NotImplementedError

    def commit(self, seqs: list[Sequence]) -> None:
        pass

    def remove_sequence(self, seq: Sequence) -> None:
        pass

    def live_request_ids(self) -> set[str]:
        return set()
