"""Multi-token prediction modules (DeepSeek-MTP style), one per depth, each an input projection and a SwiGLU MLP.

No attention: the context comes in through the target's feature; a module only has to carry it one token on.
Module d maps (state h_d, token t at depth d) to h_{d+1}: x = W [norm(h_d); norm(embed(t))], h = x + MLP(x).
"""

from __future__ import annotations

import torch
from torch import nn

from specdecode.heads.config import HeadConfig
from specdecode.models.llama import MLP, RMSNorm


class MtpModule(nn.Module):
    def __init__(self, cfg: HeadConfig) -> None:
        super().__init__()
        t = cfg.target
        self.state_norm = RMSNorm(t.hidden_size, t.rms_eps)
        self.token_norm = RMSNorm(t.hidden_size, t.rms_eps)
        self.proj = nn.Linear(2 * t.hidden_size, t.hidden_size, bias=False)
        self.mlp_norm = RMSNorm(t.hidden_size, t.rms_eps)
        self.mlp = MLP(t)
        self.out_norm = RMSNorm(t.hidden_size, t.rms_eps)

    def forward(self, state: torch.Tensor, token_emb: torch.Tensor) -> torch.Tensor:
        """state [..., H], token_emb [..., H] -> next state [..., H] (normed, ready for the LM head)."""
        x = self.proj(torch.cat([self.state_norm(state), self.token_norm(token_emb)], dim=-1))
        return self.out_norm(x + self.mlp(self.mlp_norm(x)))


class MtpHeads(nn.Module):
    def __init__(self, cfg: HeadConfig) -> None:
        super().__init__()
        self.modules_by_depth = nn.ModuleList(MtpModule(cfg) for _ in range(cfg.num_heads))

    def forward_step(self, depth: int, state: torch.Tensor, tokens: torch.Tensor, embed: nn.Embedding) -> torch.Tensor:
        """state [..., H] at `depth`, tokens [...] there -> state [..., H] whose LM head guesses depth + 1."""
        return self.modules_by_depth[depth](state, embed(tokens))
