"""Medusa: residual heads on the target's last feature, each guessing one more token ahead, grown into a tree.

Head d (0-based) sees the feature of the last cached token and predicts the token d + 1 places after the
pending one. The heads don't see the path above a node, so every node at depth d shares head d's
distribution; the tree takes the most likely combinations (tree_search.py) within the node budget.
"""

from __future__ import annotations

import torch

from specdecode.drafters.base import Proposal
from specdecode.drafters.last_feature import LastFeatureDrafter
from specdecode.drafters.tree_search import RowTree, grow_trees, to_proposal
from specdecode.step.sequence import Sequence
from specdecode.verify.sampling import SamplingTensors


class MedusaDrafter(LastFeatureDrafter):
    @torch.inference_mode()
    def propose(self, seqs: list[Sequence], num_tokens: list[int], st: SamplingTensors) -> Proposal:
        device = self.target.device
        num_tokens = self.ready_budgets(seqs, num_tokens)
        if max(num_tokens, default=0) == 0:
            return self.nothing(seqs)
        last = self.features.last(seqs, self.target.cfg.hidden_size, device, self.target.dtype)  # [num_seqs, hidden]
        feats = self.heads(last)  # [num_seqs, num_heads, hidden]
        logp = self.target.lm_head(feats).float().log_softmax(-1)  # [num_seqs, num_heads, vocab]

        def expand(trees: list[RowTree], frontier: list[list[int]]) -> list[tuple[torch.Tensor, None]]:
            # node at depth d: its children are head d's guesses, whatever the path above
            pairs = enumerate(zip(trees, frontier, strict=True))
            return [(logp[b, [t.nodes[i].depth for i in f]], None) for b, (t, f) in pairs]

        return to_proposal(grow_trees(logp[:, 0], num_tokens, self.shape, expand), device)
