"""Medusa: residual heads on the target's last feature, each guessing one more token ahead, grown into a tree.

Head d (0-based) sees the feature of the last cached token and predicts the token d + 1 places after the
pending one. The heads don't see the path above a node, so every node at depth d shares head d's
distribution; the tree takes the most likely combinations (tree_search.py) within the node budget.
"""

from __future__ import annotations

import torch

from specdecode.drafters.base import Proposal
from specdecode.drafters.features import FeatureStore
from specdecode.drafters.tree_search import RowTree, TreeShape, grow_trees, to_proposal
from specdecode.engine.sequence import Sequence
from specdecode.models.llama import LlamaModel
from specdecode.sampling import SamplingTensors


class MedusaDrafter:
    needs_features = True

    def __init__(self, target: LlamaModel, heads: torch.nn.Module, num_heads: int, shape: TreeShape) -> None:
        self.target = target
        self.heads = heads
        self.shape = TreeShape(shape.top_m, shape.beam, min(shape.max_depth, num_heads))
        self.features = FeatureStore(keep_last=True)

    def add_sequence(self, seq: Sequence) -> None:
        pass

    def observe_features(self, seq: Sequence, start: int, feats: torch.Tensor) -> None:
        self.features.add(seq, start, feats)

    def commit(self, seqs: list[Sequence]) -> None:
        pass

    def remove_sequence(self, seq: Sequence) -> None:
        self.features.drop(seq)

    @torch.inference_mode()
    def propose(self, seqs: list[Sequence], num_tokens: list[int], st: SamplingTensors) -> Proposal:
        device = self.target.embed.weight.device
        num_tokens = [k if self.features.ready(s) else 0 for s, k in zip(seqs, num_tokens, strict=True)]
        if max(num_tokens, default=0) == 0:
            return Proposal.from_lists([[] for _ in seqs], 0, device)
        last = self.features.last(seqs, self.target.embed.weight)  # [num_seqs, hidden]
        feats = self.heads(last)  # [num_seqs, num_heads, hidden]
        logp = self.target.lm_head(feats).float().log_softmax(-1)  # [num_seqs, num_heads, vocab]

        def expand(trees: list[RowTree], frontier: list[list[int]]) -> list[tuple[torch.Tensor, None]]:
            # node at depth d: its children are head d's guesses, whatever the path above
            pairs = enumerate(zip(trees, frontier, strict=True))
            return [(logp[b, [t.nodes[i].depth for i in f]], None) for b, (t, f) in pairs]

        return to_proposal(grow_trees(logp[:, 0], num_tokens, self.shape, expand), device)
