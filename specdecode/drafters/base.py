"""The drafter Protocol: every way of proposing tokens (draft model, n-gram lookup, heads) implements it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from specdecode.engine.sequence import Sequence
from specdecode.sampling import PAD_TOKEN_ID, SamplingTensors


@dataclass
class Proposal:
    token_ids: torch.Tensor  # [num_seqs, k] int64, PAD_TOKEN_ID past each row's count
    num_tokens: torch.Tensor  # [num_seqs] int64, drafts per row (0 = plain decoding this step)
    probs: torch.Tensor | None  # [num_seqs, k, vocab] processed draft distribution q; None = one-hot drafts

    @classmethod
    def from_lists(cls, drafts: list[list[int]], k: int, device: torch.device | str) -> Proposal:
        """A deterministic proposal (q one-hot) from per-row token lists."""
        width = max(k, 1)
        ids = torch.full((len(drafts), width), PAD_TOKEN_ID, dtype=torch.long)
        for row, d in enumerate(drafts):
            ids[row, : len(d)] = torch.tensor(d, dtype=torch.long)
        num = torch.tensor([len(d) for d in drafts], dtype=torch.long)
        return cls(ids[:, :k].to(device), num.to(device), None)


class Drafter(Protocol):
    """Proposes up to k tokens per sequence. Lossless verification only needs the drafts and their q."""

    def add_sequence(self, seq: Sequence) -> None:
        """A sequence joined (its prompt is known); build any per-sequence state."""

    def propose(self, seqs: list[Sequence], num_tokens: list[int], st: SamplingTensors) -> Proposal:
        """Drafts continuing each sequence's token_ids (which end with the pending token)."""

    def commit(self, seqs: list[Sequence]) -> None:
        """Verification finished; seq.token_ids now holds what was kept. Roll back any speculative state."""

    def remove_sequence(self, seq: Sequence) -> None:
        """The sequence left the batch; free its state."""
