"""The target as its own draft: a test fixture for the engine (greedy acceptance must be exactly 1.0)."""

from __future__ import annotations

from specdecode.drafters.draft_model import DraftModelDrafter
from specdecode.models.llama import LlamaModel


def self_drafter(target: LlamaModel, max_num_seqs: int, max_len: int, prefill_budget: int = 512) -> DraftModelDrafter:
    """Drafts with the target's weights on a separate cache; costs a full target pass per draft token."""
    return DraftModelDrafter(target, max_num_seqs, max_len, prefill_budget)
