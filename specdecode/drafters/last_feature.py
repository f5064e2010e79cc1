"""What Medusa and MTP share: heads that read only the target's feature of the last cached token.

They keep no state of their own beyond that feature (FeatureStore with keep_last), so adding, committing and
removing a sequence are bookkeeping only; a subclass supplies `propose`.
"""

from __future__ import annotations

import torch

from specdecode.drafters.base import DrafterBase, Proposal
from specdecode.drafters.features import FeatureStore
from specdecode.drafters.tree_search import TreeShape
from specdecode.models.llama import LlamaModel
from specdecode.step.sequence import Sequence


class LastFeatureDrafter(DrafterBase):
    needs_features = True

    def __init__(self, target: LlamaModel, heads: torch.nn.Module, num_heads: int, shape: TreeShape) -> None:
        self.target = target
        self.heads = heads
        self.shape = TreeShape(shape.top_m, shape.beam, min(shape.max_depth, num_heads))  # no deeper than heads
        self.features = FeatureStore(keep_last=True)

    def observe_features(self, seq: Sequence, start: int, feats: torch.Tensor) -> None:
        self.features.add(seq, start, feats)

    def remove_sequence(self, seq: Sequence) -> None:
        self.features.drop(seq)

    def live_request_ids(self) -> set[str]:
        return self.features.request_ids()

    def ready_budgets(self, seqs: list[Sequence], num_tokens: list[int]) -> list[int]:
        """Each row's node budget, 0 for rows whose last feature has not arrived yet."""
        return [k if self.features.ready(s) else 0 for s, k in zip(seqs, num_tokens, strict=True)]

    def nothing(self, seqs: list[Sequence]) -> Proposal:
        return Proposal.from_lists([[] for _ in seqs], 0, self.target.device)
