"""EAGLE head: (feature f_i, embedding of token t_{i+1}) -> predicted feature f_{i+1}, through one decoder layer.

The layer is the target's own Block type with its own one-layer KV cache, so drafting a tree uses the same
AttentionMetadata (positions by depth, tree mask) as the target. The predicted feature goes straight into the
target's LM head; the target's embedding and LM head are shared, never copied.
"""

from __future__ import annotations

import torch
from torch import nn

from specdecode.heads.config import HeadConfig
from specdecode.kv import KVCache
from specdecode.models.llama import AttentionMetadata, Block, RMSNorm, additive, rope_inv_freq, rope_tables


class EagleHead(nn.Module):
    def __init__(self, cfg: HeadConfig) -> None:
        super().__init__()
        t = cfg.target
        self.cfg = t
        self.fc = nn.Linear(2 * t.hidden_size, t.hidden_size, bias=False)
        self.layer = Block(t)
        self.norm = RMSNorm(t.hidden_size, t.rms_eps)  # the target's features are post-norm: so is the guess
        self.register_buffer("inv_freq", rope_inv_freq(t), persistent=False)  # [head_dim / 2]

    def new_cache(self, num_slots: int, max_len: int) -> KVCache:
        p = self.fc.weight
        t = self.cfg
        return KVCache(1, num_slots, max_len, t.num_kv_heads, t.head_dim, device=p.device, dtype=p.dtype)

    def forward(
        self,
        features: torch.Tensor,  # [B, T, H] f_i
        tokens: torch.Tensor,  # [B, T] int64 t_{i+1}
        embed: nn.Embedding,
        meta: AttentionMetadata,
        cache: KVCache,
        attend: torch.Tensor | None = None,  # [B, 1, T, kv_len] bool, in place of meta's mask (training's levels)
    ) -> torch.Tensor:
        """Predicted f_{i+1} [B, T, H]; writes this call's K/V into `cache` like the target's forward does."""
        t = tokens.shape[1]
        x = self.fc(torch.cat([features, embed(tokens).to(features.dtype)], dim=-1))  # [B, T, H]
        cos, sin = rope_tables(meta.positions, self.inv_freq, x.dtype)  # [B, T, 1, head_dim] each
        # in x's dtype, which autocast may have lowered
        mask = meta.additive_mask(t, x.dtype) if attend is None else additive(attend, x.dtype)  # [B, 1, T, kv_len]
        x = self.layer(x, cos, sin, cache.k, cache.v, 0, meta.slots, meta.write_pos, mask)
        return self.norm(x)
