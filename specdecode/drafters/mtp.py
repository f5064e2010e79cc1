"""Multi-token prediction (DeepSeek-MTP style): sequential heads, each fed the previous head's state and token.

Module d maps (state h_d, token at depth d) to h_{d+1}, whose LM-head distribution guesses the token at depth
d + 1; h_0 is the target's feature of the last cached token and depth 0's token is the pending one. Unlike
Medusa, a node's children depend on its own path, so each expanded node runs its module once (no cache: the
modules have no attention, the target's feature carries the context).
"""

from __future__ import annotations

import torch

from specdecode.drafters.base import Proposal
from specdecode.drafters.last_feature import LastFeatureDrafter
from specdecode.drafters.tree_search import RowTree, grow_trees, to_proposal
from specdecode.step.sequence import Sequence
from specdecode.verify.sampling import SamplingTensors


class MtpDrafter(LastFeatureDrafter):
    def _step(self, depth: int, states: torch.Tensor, tokens: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """States [n, hidden] at `depth` and the tokens there -> (next states [n, hidden], log-probs [n, vocab])."""
        ids = torch.tensor(tokens, dtype=torch.long, device=states.device)
        nxt = self.heads.forward_step(depth, states, ids, self.target.embed)  # [n, hidden]
        return nxt, self.target.lm_head(nxt).float().log_softmax(-1)

    @torch.inference_mode()
    def propose(self, seqs: list[Sequence], num_tokens: list[int], st: SamplingTensors) -> Proposal:
        device = self.target.device
        num_tokens = self.ready_budgets(seqs, num_tokens)
        if max(num_tokens, default=0) == 0:
            return self.nothing(seqs)
        last = self.features.last(seqs, self.target.cfg.hidden_size, device, self.target.dtype)  # [num_seqs, hidden]
        root_state, root_logp = self._step(0, last, [s.token_ids[-1] for s in seqs])

        def expand(trees: list[RowTree], frontier: list[list[int]]) -> list[tuple[torch.Tensor, torch.Tensor]]:
            # the nodes of one level share a depth: one batched module call per level
            flat = [t.nodes[i] for t, f in zip(trees, frontier, strict=True) for i in f]
            states = torch.stack([n.state for n in flat])  # [n, hidden] the states that produced each node
            nxt, logp = self._step(flat[0].depth, states, [n.token for n in flat])
            out, at = [], 0
            for f in frontier:
                out.append((logp[at : at + len(f)], nxt[at : at + len(f)]))
                at += len(f)
            return out

        return to_proposal(grow_trees(root_logp, num_tokens, self.shape, expand, root_state), device)
