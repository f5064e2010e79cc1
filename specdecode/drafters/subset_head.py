"""The target's LM head restricted to a vocabulary subset: the cheap head of a drafter that reuses the target's.

On a small target the LM head is a large share of a step (49k x 576 of SmolLM2-135M's weights, ~21%); scoring
only the S most frequent tokens reads S / V of it. Drafts then stay inside the subset: a sampled draft has
q = 0 outside it and a greedy or tree candidate is one-hot, so verification stays lossless either way.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import nn

from specdecode.config import ConfigError
from specdecode.models import packed_linear
from specdecode.models.llama import LlamaModel

VOCAB_FILE = "vocab.npy"  # beside a draft model or EAGLE head: the token ids it drafts from


class SubsetHead:
    def __init__(self, target: LlamaModel, subset: torch.Tensor) -> None:
        weight = target.lm_head_weight()
        self.subset = subset.to(weight.device)  # [S] int64 token ids
        self.vocab_size = target.cfg.vocab_size
        head = nn.Linear(weight.shape[1], len(self.subset), bias=False, device=weight.device, dtype=weight.dtype)
        head.weight.data.copy_(weight[self.subset])  # [S, hidden]
        holder = nn.Sequential(head.requires_grad_(False))
        if packed_linear.available(weight.device, weight.dtype):  # the same choice as for the target's own linears
            packed_linear.pack_linears(holder)
        self.linear = holder[0]

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [..., hidden] -> float logits [..., vocab], -inf outside the subset."""
        small = self.linear(hidden).float()  # [..., S]
        full = torch.full((*small.shape[:-1], self.vocab_size), float("-inf"), device=small.device)
        return full.index_copy_(-1, self.subset, small)


def load_subset(path: str | Path, vocab_size: int) -> torch.Tensor:
    """[S] int64 token ids from a .npy file: distinct, inside the vocabulary."""
    try:
        ids = torch.from_numpy(np.load(path).astype(np.int64)).flatten()
    except (OSError, ValueError) as e:
        raise ConfigError(f"{path}: cannot read a vocabulary subset ({e})") from None
    if len(ids) == 0 or int(ids.min()) < 0 or int(ids.max()) >= vocab_size or len(ids.unique()) != len(ids):
        raise ConfigError(f"{path}: a vocabulary subset must be distinct token ids in 0..{vocab_size - 1}")
    return ids


class SubsetLMHead(nn.Module):
    """A model's LM head restricted to a subset, as a module: a draft model scores only its drafting
    vocabulary. Installed by `install(model, subset)`; the model's forward then returns -inf outside it."""

    def __init__(self, head: SubsetHead) -> None:
        super().__init__()
        self.head = head

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.head.logits(hidden)  # [..., hidden] -> [..., vocab]

    @staticmethod
    def install(model: LlamaModel, subset: torch.Tensor) -> None:
        model.lm_head = SubsetLMHead(SubsetHead(model, subset))


def frequent_tokens(token_arrays: list[np.ndarray], size: int, always: list[int] | None = None) -> torch.Tensor:
    """[size] the most frequent token ids (a draft vocabulary subset), sorted by id; ids in `always` are in it
    whatever their count (they take the places of the least frequent)."""
    always = always or []
    counts = np.bincount(np.concatenate(token_arrays).astype(np.int64), minlength=max(always, default=-1) + 1)
    counts[always] = counts.max() + 1
    top = np.argsort(-counts, kind="stable")[:size]
    return torch.from_numpy(np.sort(top))
