"""Medusa heads: residual blocks on the target's last feature; head d guesses the token d + 2 places ahead."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from specdecode.heads.config import HeadConfig


class MedusaHeads(nn.Module):
    def __init__(self, cfg: HeadConfig) -> None:
        super().__init__()
        hidden = cfg.target.hidden_size
        self.blocks = nn.ModuleList(nn.Linear(hidden, hidden) for _ in range(cfg.num_heads))
        for block in self.blocks:  # zero: an untrained head predicts what the LM head on the feature predicts
            nn.init.zeros_(block.weight)
            nn.init.zeros_(block.bias)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [..., H] target features -> [..., num_heads, H]; feed to the target's LM head."""
        return torch.stack([hidden + F.silu(block(hidden)) for block in self.blocks], dim=-2)
